"""``mcq archive``: tasks read back from an archive folder."""

from __future__ import annotations

import click

from .errors import EXIT_BAD_INPUT, EXIT_REFUSED, fail, handle_errors
from .options import TASK_ID
from .output import emit_json
from .root import main


@main.group()
def archive() -> None:
    """Read tasks back from an archive folder (written by the sweeper's --archive or `mcq tasks purge`)."""


@archive.command("show")
@click.argument("task_id", type=TASK_ID)
@click.option("--dir", "archive_dir", required=True, metavar="DIR", help="The archive folder.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def archive_show(task_id: str, archive_dir: str, as_json: bool) -> None:
    """Show an archived task as `mcq show` showed it live (its last record, when written twice)."""
    from ..ops.archive import FileArchive
    from ..ops.render import print_task, task_json

    try:
        rec = FileArchive(archive_dir).find(task_id)
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
        return
    if rec is None:
        fail(f"task {task_id} is not in the archive under {archive_dir}", EXIT_REFUSED)
        return
    task, effects = rec.task(), rec.effects()
    if as_json:
        emit_json({**task_json(task, effects), "archived_at_ms": rec.archived_at_ms, "archive_reason": rec.reason})
        return
    click.echo(f"archived {rec.archived_at_ms} ms since the epoch: {rec.reason}")
    print_task(task, effects=effects)

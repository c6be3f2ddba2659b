"""``mcq status`` of every queue, and ``mcq queue`` pause and resume."""

from __future__ import annotations

from typing import Any

import click

from ..ops.render import print_status
from .errors import handle_errors
from .options import Ctx, Finite, check_reason
from .output import emit_json, exit_if_lost
from .root import main


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", type=Finite(0.1, 3600), default=None, metavar="SECONDS",
              help="Refresh every SECONDS (0.1 to 3600) until Ctrl-C.")
@click.pass_obj
@handle_errors
def status(obj: Ctx, as_json: bool, watch: float | None) -> None:
    """Per queue: tasks by state and queue age (the oldest claimable pending Attempt's wait)."""
    client = obj.reader
    if watch is not None and not as_json:
        import time

        from rich.live import Live

        from ..ops.render import status_table, text_console

        console = text_console()
        with Live(status_table(client.reads.status(), client.reads.overview(), console.width), console=console,
                  refresh_per_second=4) as live:
            while True:
                time.sleep(watch)
                live.update(status_table(client.reads.status(), client.reads.overview(), console.width))
    data = client.reads.status()
    overview = client.reads.overview()
    paused = client.reads.paused_queues()
    if as_json:
        emit_json({"namespace": client.keys.prefix, "queues": data, "overview": overview, "paused": paused})
    else:
        print_status(data, overview)
        _echo_paused(paused)
    exit_if_lost(client.reads.namespace())


def _echo_paused(paused: dict[str, dict[str, Any]]) -> None:
    """One line per paused queue (under `mcq status`)."""
    for q, info in paused.items():
        click.echo(f"queue {q} PAUSED by {info.get('actor', '?')}: {info.get('reason', '')} "
                   f"(claims refused, nothing dispatched; `mcq queue resume {q} --reason ..`)")


@main.group()
def queue() -> None:
    """Pause or resume a queue (recorded in the namespace log with who and why)."""


@queue.command("pause")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def queue_pause(obj: Ctx, queue_name: str, reason: str) -> None:
    """Claims of QUEUE's Attempts are refused (workers skip them, tasks stay pending) and the sweeper
    does not dispatch them, until `mcq queue resume`."""
    check_reason(reason)
    if obj.client.operator.pause_queue(queue_name, reason=reason, actor="operator"):
        click.echo(f"queue {queue_name} paused")
    else:
        click.echo(f"queue {queue_name} was already paused")


@queue.command("resume")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def queue_resume(obj: Ctx, queue_name: str, reason: str) -> None:
    """Undo `mcq queue pause`: the sweeper dispatches QUEUE's pending Attempts again."""
    check_reason(reason)
    if obj.client.operator.resume_queue(queue_name, reason=reason, actor="operator"):
        click.echo(f"queue {queue_name} resumed (the sweeper dispatches its pending Attempts)")
    else:
        click.echo(f"queue {queue_name} was not paused")

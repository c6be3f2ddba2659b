"""``mcq sweeper``: the loop that expires, reconciles, dispatches and retires."""

from __future__ import annotations

import click

from .errors import handle_errors
from .options import Ctx, Finite, duration_ms, load_app
from .output import emit_json
from .root import main

MIN_INTERVAL_S = 0.05  # the sweeper's shortest pause between passes (0 or less busy-looped)


@main.command()
@click.option("--once", is_flag=True, help="One pass, then print what it did.")
@click.option("--interval", type=Finite(MIN_INTERVAL_S, 3600), default=1.0, show_default=True,
              help=f"Seconds between passes ({MIN_INTERVAL_S:g} to 3600).")
@click.option("--app", "app_spec", default=None,
              help="package.module:app whose registered operations reconcile effects with their providers; its "
                   "retention policies and periodic schedules are published at start.")
@click.option("--archive", "archive_dir", default=None, metavar="DIR",
              help="Write each task retention deletes to this folder first (gzip JSON lines per queue and day).")
@click.option("--priority-aging", "aging", default=None, metavar="DUR",
              help="A message waits at most DUR per priority level (90s, 15m); then it moves one level up, so no "
                   "priority starves (the lowest reaches the most urgent after 8 x DUR). Off by default: strict.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def sweeper(obj: Ctx, once: bool, interval: float, app_spec: str | None, archive_dir: str | None,
            aging: str | None, as_json: bool) -> None:
    """Expire leases, reconcile suspects, send due dispatches, tick periodic schedules; pack, retire and
    archive ended tasks. Any number of sweepers may run: every decision is re-checked in its script."""
    import logging

    from ..ops.archive import FileArchive
    from ..ops.sweeper import Sweeper

    app = load_app(app_spec) if app_spec else None
    if app is not None:
        app.publish_retention(obj.client)
    aging_ms = duration_ms(aging, "--priority-aging")
    if aging_ms is not None and aging_ms <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--priority-aging")
    sw = Sweeper(obj.client, app=app, archive=FileArchive(archive_dir) if archive_dir else None,
                 priority_aging_ms=aging_ms)
    if once:
        report = sw.run_once().as_dict()
        if as_json:
            emit_json(report)
        else:
            click.echo(f"expired {len(report['expired'])}, reconciled {len(report['reconciled'])}, "
                       f"dispatched {len(report['dispatched'])}, packed {report['packed']}, "
                       f"retired {sum(report['retired'].values())}, errors {len(report['errors'])}")
        return
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sw.run(interval_s=interval)

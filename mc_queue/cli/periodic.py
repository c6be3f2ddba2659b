"""``mcq schedule``: the periodic schedules of a namespace (list, pause, resume, trigger)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from .errors import handle_errors
from .options import Ctx, check_reason
from .output import emit_json
from .root import main


def _when(ms: int | None) -> str:
    return "-" if not ms else datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@main.group()
def schedule() -> None:
    """Periodic schedules: declared on the App (app.periodic), ticked by the sweepers, one task per tick."""


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def schedule_list(obj: Ctx, as_json: bool) -> None:
    """Each published schedule: its rule, policies, next tick, last tick and its task, and its counts."""
    rows = obj.reader.periodic.status()
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no periodic schedule is published (declare one with app.periodic; `mcq sweeper --app` "
                   "publishes it)")
        return
    for r in rows:
        c: dict[str, Any] = r["counts"]
        paused = r["paused"]
        head = f"{r['name']}: {r['handler']} on {r['queue']}, {r['rule']}, overlap {r['overlap']}, catch-up " \
               f"{r['catch_up']}"
        click.echo(head + (f"  PAUSED by {paused.get('actor', '?')}: {paused.get('reason', '')}" if paused else ""))
        last = f"{_when(r['last_tick_ms'])} -> {r['last_task']} ({r['last_task_state'] or 'gone'})" \
            if r["last_task"] else "-"
        click.echo(f"  next tick {_when(r['next_tick_ms'])}; last {last}")
        click.echo(f"  ran {c['ran']}, skipped {c['skipped_overlap']} (overlap) {c['skipped_missed']} (missed) "
                   f"{c['skipped_paused']} (paused), failed {c['failed']}, triggered {c['triggered']}"
                   + (f"; tick {r['pending'].split(' ')[0]} being made" if r["pending"] else ""))


def _steer(obj: Ctx, name: str, action: str, reason: str) -> None:
    check_reason(reason)
    call = obj.client.periodic.pause if action == "pause" else obj.client.periodic.resume
    done = call(name, reason=reason, actor="operator")
    click.echo(f"schedule {name} " + (f"{action}d" if done else "was already paused" if action == "pause"
                                      else "was not paused"))


@schedule.command("pause")
@click.argument("name")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def schedule_pause(obj: Ctx, name: str, reason: str) -> None:
    """NAME's ticks are skipped as they come due (counted, never made later) until `mcq schedule resume`."""
    _steer(obj, name, "pause", reason)


@schedule.command("resume")
@click.argument("name")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def schedule_resume(obj: Ctx, name: str, reason: str) -> None:
    """NAME ticks again from its next tick (the ones skipped while paused stay skipped)."""
    _steer(obj, name, "resume", reason)


@schedule.command("trigger")
@click.argument("name")
@click.option("--request-id", default=None, help="The same id again returns the same task (default: a new one).")
@click.pass_obj
@handle_errors
def schedule_trigger(obj: Ctx, name: str, request_id: str | None) -> None:
    """Make NAME's task now, outside its ticks; prints the task id (the sweeper sends it to the workers)."""
    task = obj.client.periodic.trigger(name, actor="operator", request_id=request_id)
    click.echo(task.id)

"""``mcq retention``: how long each queue's ended tasks stay in Redis."""

from __future__ import annotations

from typing import Any

import click

from .errors import EXIT_BAD_INPUT, fail, handle_errors
from .options import Ctx, check_reason, duration_ms
from .output import emit_json
from .root import main


@main.group()
def retention() -> None:
    """How long each queue's ended tasks stay in Redis (the sweeper deletes the rest)."""


@retention.command("show")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def retention_show(obj: Ctx, as_json: bool) -> None:
    rows = []
    client = obj.reader
    for q in client.reads.queues():
        policy, source = client.reads.retention(q)
        rows.append({"queue": q, "source": source, **policy.model_dump()})
    if as_json:
        emit_json(rows)
        return
    def fmt(v: Any, unit: str = "") -> str:
        return "forever" if v is None else f"{v:g}{unit}"
    for r in rows:
        click.echo(f"{r['queue']}: finished {fmt(r['done_s'], 's')}"
                   f"{'' if r['done_keep'] is None else ' / newest ' + str(r['done_keep'])}, held "
                   f"{fmt(r['held_s'], 's')}{'' if r['held_keep'] is None else ' / newest ' + str(r['held_keep'])}, "
                   f"tombstone {fmt(r['tombstone_s'], 's')} ({r['source']})")


@retention.command("set")
@click.argument("queue_name")
@click.option("--done", "done_for", default=None, metavar="DUR|forever",
              help="Keep succeeded and canceled tasks this long after they finished.")
@click.option("--done-keep", type=click.IntRange(0, 10**9), default=None, help="... and at most the newest N.")
@click.option("--held", "held_for", default=None, metavar="DUR|forever",
              help="Keep failed, blocked and quarantined tasks this long.")
@click.option("--held-keep", type=click.IntRange(0, 10**9), default=None, help="... and at most the newest N.")
@click.option("--tombstone", default=None, metavar="DUR", help="Refuse a deleted task's id and producer key this long.")
@click.option("--clear", is_flag=True, help="Drop the operator's policy (the App's or the default applies).")
@click.option("--reason", required=True, help="Why (at least ten characters), recorded.")
@click.pass_obj
@handle_errors
def retention_set(obj: Ctx, queue_name: str, done_for: str | None, done_keep: int | None, held_for: str | None,
                  held_keep: int | None, tombstone: str | None, clear: bool, reason: str) -> None:
    """The operator's retention policy of a queue (it wins over the App's); fields not given keep their value."""
    from ..contracts.config import Retention

    check_reason(reason)
    c = obj.client
    if clear:
        c.operator.set_retention(queue_name, None, actor="operator", reason=reason)
        click.echo(f"queue {queue_name}: the operator's retention policy is dropped")
        return
    current, _ = c.reads.retention(queue_name)
    update: dict[str, Any] = {}

    def secs(text: str, param: str) -> float | None:
        if text == "forever":
            return None
        ms = duration_ms(text, param)
        return None if ms is None else ms / 1000

    if done_for is not None:
        update["done_s"] = secs(done_for, "--done")
    if held_for is not None:
        update["held_s"] = secs(held_for, "--held")
    if done_keep is not None:
        update["done_keep"] = done_keep
    if held_keep is not None:
        update["held_keep"] = held_keep
    if tombstone is not None:
        update["tombstone_s"] = secs(tombstone, "--tombstone") or 0.0
    try:
        policy = Retention.model_validate({**current.model_dump(), **update})
    except ValueError as exc:
        fail(f"invalid retention policy: {exc}", EXIT_BAD_INPUT)
        return
    c.operator.set_retention(queue_name, policy, actor="operator", reason=reason)
    click.echo(f"queue {queue_name}: retention set ({policy.model_dump()})")

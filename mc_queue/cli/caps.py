"""``mcq caps``: queue caps (backpressure) as they stand (each capped queue's cap and where it came from,
the tasks it holds that have not ended, the room left at the default priority, its oldest due task's
wait), and setting and deleting them (recorded in the namespace log)."""

from __future__ import annotations

from typing import Any

import click

from ..client.caps import MAX_BYTES, MAX_DEPTH, CapStatus
from ..client.slots import check_slot_key
from ..contracts.errors import InvalidArgument
from ..contracts.keys import check_queue
from ..ops.render import duration
from .errors import handle_errors
from .options import Ctx, check_reason
from .output import emit_json
from .root import main

ROOM_PRIORITY = 5  # the default priority, which may fill the whole cap (6-9 are shed first)


class QueueType(click.ParamType[str]):
    """A queue's name, checked before anything connects."""

    name = "queue"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            check_queue(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return value


QUEUE = QueueType()


class ScopeType(click.ParamType[str]):
    """A queue's name, or '@<fairness key>' (or a family '@tenant:*'), checked before anything connects."""

    name = "scope"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            if isinstance(value, str) and value.startswith("@"):
                check_slot_key(value[1:])
            else:
                check_queue(value)
        except (ValueError, InvalidArgument) as exc:
            self.fail(str(exc), param, ctx)
        return value


SCOPE = ScopeType()


def _row(s: CapStatus) -> dict[str, object]:
    return {"queue": s.queue, "max_depth": s.max_depth, "source": s.source, "depth": s.depth,
            "room": s.room(ROOM_PRIORITY), "age_ms": s.age_ms, "max_bytes": s.max_bytes, "bytes": s.bytes}


def _line(s: CapStatus) -> str:
    waited = f"oldest due task waited {duration(s.age_ms)}" if s.age_ms else "no due task waits"
    by_bytes = f"; {s.bytes:,} of {s.max_bytes:,} bytes of payload" if s.max_bytes is not None else ""
    if s.max_depth is None:
        return f"{s.queue}: no cap by count; {s.depth} not ended{by_bytes}; {waited}"
    return (f"{s.queue}: cap {s.max_depth} ({s.source}); {s.depth} not ended, room {s.room(ROOM_PRIORITY)} at "
            f"priority {ROOM_PRIORITY}{by_bytes}; {waited}")


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def caps(ctx: click.Context, as_json: bool) -> None:
    """Queue caps (backpressure): each capped queue's cap (an operator's or an App's), the tasks it holds
    that have not ended (pending, scheduled, backoff, running, waiting), the room left for priority 1-5
    (6 may fill four fifths of the cap ... 9 one fifth), and how long its oldest due task has waited.
    Beyond its cap, enqueue refuses new work with QueueFull and a retry-after."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    rows = obj.reader.caps.all()
    if as_json:
        emit_json({"caps": [_row(s) for s in rows]})
        return
    if not rows:
        click.echo("no queue caps (set one: mcq caps set QUEUE MAX_DEPTH --reason ..)")
        return
    for s in rows:
        click.echo(_line(s))


@caps.command("set")
@click.argument("queue", type=QUEUE)
@click.argument("max_depth", metavar="MAX_DEPTH", type=click.IntRange(1, MAX_DEPTH))
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def caps_set(obj: Ctx, queue: str, max_depth: int, reason: str) -> None:
    """Cap QUEUE at MAX_DEPTH tasks not ended: beyond it enqueue refuses new work (QueueFull, nothing
    written), the lowest priorities first. Work already admitted goes on. An App's cap does not replace it."""
    check_reason(reason)
    changed = obj.client.caps.set(queue, max_depth, reason=reason, actor="operator")
    click.echo(f"cap {queue}: {max_depth} task(s) not ended" + ("" if changed else " (unchanged)"))


@caps.command("delete")
@click.argument("queue", type=QUEUE)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def caps_delete(obj: Ctx, queue: str, reason: str) -> None:
    """Remove QUEUE's cap: enqueue admits its work again however deep it is."""
    check_reason(reason)
    ok = obj.client.caps.delete(queue, reason=reason, actor="operator")
    click.echo(f"cap {queue} deleted" if ok else f"cap {queue}: none set")


@caps.command("set-bytes")
@click.argument("scope", type=SCOPE)
@click.argument("max_bytes", metavar="MAX_BYTES", type=click.IntRange(1, MAX_BYTES))
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def caps_set_bytes(obj: Ctx, scope: str, max_bytes: int, reason: str) -> None:
    """Cap the bytes of payload in the tasks not ended of SCOPE (a queue, or '@KEY': the tasks naming fairness
    key KEY, '@tenant:*' each key of the family): a task whose payload would not fit is refused (QueueFull,
    nothing written), the lowest priorities first. An App's cap does not replace it."""
    check_reason(reason)
    changed = obj.client.caps.set_bytes(scope, max_bytes, reason=reason, actor="operator")
    click.echo(f"cap {scope}: {max_bytes:,} bytes of payload" + ("" if changed else " (unchanged)"))


@caps.command("delete-bytes")
@click.argument("scope", type=SCOPE)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def caps_delete_bytes(obj: Ctx, scope: str, reason: str) -> None:
    """Remove the cap by bytes of SCOPE (a queue or '@KEY')."""
    check_reason(reason)
    ok = obj.client.caps.delete_bytes(scope, reason=reason, actor="operator")
    click.echo(f"cap {scope}: bytes cap deleted" if ok else f"cap {scope}: no bytes cap set")

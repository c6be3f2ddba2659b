"""``mcq slots``: concurrency keys (bulkheads) as they stand (slots, running and waiting Attempts, the
writer fence, claims that waited or were rejected, the holders), and setting and deleting their slots
(recorded in the namespace log)."""

from __future__ import annotations

from typing import Any

import click

from ..client.slots import MAX_SLOTS, ON_FULL, SlotStatus, check_slot_key, family_of
from ..contracts.errors import InvalidArgument
from ..ops.render import duration
from .errors import handle_errors
from .options import Ctx, check_reason
from .output import emit_json
from .root import main


class SlotKeyType(click.ParamType[str]):
    """A concurrency key ('repo:acme.web') or a family ('repo:*'), checked before anything connects."""

    name = "key"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            check_slot_key(value)
        except InvalidArgument as exc:
            self.fail(str(exc), param, ctx)
        return value


SLOT_KEY = SlotKeyType()


def _setting(s: SlotStatus) -> str:
    """'own' (the key's own setting; a family '<name>:*' has only its own), 'family <name>:*' (the key
    falls back to its family's), or 'none': unlimited."""
    if s.slots is None:
        return "none"
    return f"family {family_of(s.key)}" if s.family else "own"


def _row(s: SlotStatus) -> dict[str, object]:
    return {"key": s.key, "slots": s.slots, "setting": _setting(s), "family": s.family, "on_full": s.on_full,
            "source": s.source, "running": s.running, "waiting": s.waiting, "writer_fence": s.writer_fence,
            "waited": s.waited, "rejected": s.rejected,
            "holders": [{"attempt_id": aid, "claimed_at_ms": at} for aid, at in s.holders]}


def _lines(s: SlotStatus, now_ms: int) -> list[str]:
    if s.slots is None:
        setting = "unlimited (no slots set)"
    else:
        each = " for each key of the family" if s.key.endswith(":*") else ""
        setting = f"{s.slots} slot(s){each} ({_setting(s)}, {s.source}), {s.on_full} when full"
    head = (f"{s.key}: {setting}; {s.running} running, {s.waiting} waiting; writer fence {s.writer_fence}; "
            f"{s.waited} claim(s) waited, {s.rejected} rejected so far")
    holders = sorted(s.holders, key=lambda h: h[1])  # oldest first, each id whole on a line of its own
    return [head, *(f"  {aid} running for {duration(now_ms - at)}" for aid, at in holders)]


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def slots(ctx: click.Context, as_json: bool) -> None:
    """Concurrency keys (bulkheads): each key's slots (its own, or its family's 'repo:*'), what it does when
    full, the Attempts running with a slot and waiting for one, its writer fence, and the claims that
    waited or were rejected. Tasks name their keys at enqueue, as they name rate limits."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    rows = obj.reader.slots.all()
    if as_json:
        emit_json({"slots": [_row(s) for s in rows]})
        return
    if not rows:
        click.echo("no concurrency keys (set one: mcq slots set KEY SLOTS --reason ..)")
        return
    now = obj.reader.backend.redis_time_ms()
    for s in rows:
        for line in _lines(s, now):
            click.echo(line)


@slots.command("set")
@click.argument("key", type=SLOT_KEY)
@click.argument("count", metavar="SLOTS", type=click.IntRange(1, MAX_SLOTS))
@click.option("--on-full", type=click.Choice(ON_FULL), default="wait", show_default=True,
              help="A full key: the new Attempt waits in line (wait), its task is canceled (reject), or it "
                   "waits while the oldest holder's task is canceled (supersede).")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def slots_set(obj: Ctx, key: str, count: int, on_full: str, reason: str) -> None:
    """Allow at most SLOTS running Attempts of the tasks naming KEY, fleet-wide (KEY 'repo:*': each key
    'repo:<name>' gets its own SLOTS). An App's declaration does not replace it."""
    check_reason(reason)
    changed = obj.client.slots.set(key, count, on_full=on_full, reason=reason, actor="operator")
    click.echo(f"slots {key}: {count} ({on_full} when full)" + ("" if changed else " (unchanged)"))


@slots.command("delete")
@click.argument("key", type=SLOT_KEY)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def slots_delete(obj: Ctx, key: str, reason: str) -> None:
    """Remove KEY's slots: its tasks are no longer held back (a key of a family falls back to the family's);
    the Attempts waiting are woken by the sweeper's next audit. The writer fence stays."""
    check_reason(reason)
    ok = obj.client.slots.delete(key, reason=reason, actor="operator")
    click.echo(f"slots {key} deleted" if ok else f"slots {key}: none set")

"""``mcq fair``: fair shares across keys as they stand (each fairness key's weight, its own, its family's or
the default, its messages queued in each queue's fair lanes, its cap and tasks not ended), and setting and
deleting weights and caps (recorded in the namespace log)."""

from __future__ import annotations

import click

from ..client.caps import MAX_DEPTH, KeyCapStatus
from ..client.fairness import MAX_WEIGHT, FairStatus
from ..client.slots import family_of
from .errors import handle_errors
from .options import Ctx, check_reason
from .output import emit_json
from .root import main
from .slots import SLOT_KEY


def _setting(s: FairStatus) -> str:
    if s.source is None:
        return "default"
    return f"family {family_of(s.key)}" if s.family else "own"


def _line(s: FairStatus, cap: KeyCapStatus | None) -> str:
    queued = ", ".join(f"{n} in {where}" for where, n in sorted(s.queued.items())) or "none"
    each = " for each key of the family" if s.key.endswith(":*") else ""
    source = f", {s.source}" if s.source else ""
    capped = ""
    if cap is not None and cap.max_open is not None:
        whose = f"family {family_of(cap.key)}" if cap.family else "own"
        capped = f"; cap {cap.max_open} task(s) not ended ({whose}, {cap.source}), {cap.open} now"
    elif cap is not None and cap.open:
        capped = f"; {cap.open} task(s) not ended"
    if cap is not None and cap.max_bytes is not None:
        capped += f"; {cap.bytes:,} of {cap.max_bytes:,} bytes of payload"
    return f"{s.key}: weight {s.weight}{each} ({_setting(s)}{source}); messages queued: {queued}{capped}"


@main.group(invoke_without_command=True)
@click.option("--queue", "queues", multiple=True, help="Only the fair lanes of this queue (repeatable).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def fair(ctx: click.Context, queues: tuple[str, ...], as_json: bool) -> None:
    """Fair shares across keys: each fairness key with a weight set or messages queued (a task names its
    key at enqueue: fair_key), its weight (1 unless set for it or its family 'tenant:*'), and its messages
    waiting in each queue's fair lanes (QUEUE@pPRIORITY). Workers take the lanes in turn, each key in
    proportion to its weight."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    rows = obj.reader.fairness.with_caps(obj.reader.caps, list(queues) or None)
    if as_json:
        emit_json({"fair": [{"key": s.key, "weight": s.weight, "setting": _setting(s), "family": s.family,
                             "source": s.source, "queued": s.queued, "cap": c.max_open if c else None,
                             "cap_family": c.family if c else False, "open": c.open if c else 0,
                             "max_bytes": c.max_bytes if c else None, "bytes": c.bytes if c else 0}
                            for s, c in rows]})
        return
    if not rows:
        click.echo("no fairness keys (tasks name one: enqueue(..., fair_key='tenant:acme'); "
                   "weigh one: mcq fair set KEY WEIGHT --reason ..)")
        return
    for s, c in rows:
        click.echo(_line(s, c))


@fair.command("set")
@click.argument("key", type=SLOT_KEY)
@click.argument("weight", type=click.IntRange(1, MAX_WEIGHT))
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def fair_set(obj: Ctx, key: str, weight: int, reason: str) -> None:
    """Give KEY WEIGHT turns for one of a key of weight 1 while both have messages queued (KEY 'tenant:*':
    each key 'tenant:<name>'). An App's declaration does not replace it."""
    check_reason(reason)
    changed = obj.client.fairness.set_weight(key, weight, reason=reason, actor="operator")
    click.echo(f"fair {key}: weight {weight}" + ("" if changed else " (unchanged)"))


@fair.command("delete")
@click.argument("key", type=SLOT_KEY)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def fair_delete(obj: Ctx, key: str, reason: str) -> None:
    """Remove KEY's weight (a key of a family falls back to the family's, else 1)."""
    check_reason(reason)
    ok = obj.client.fairness.delete_weight(key, reason=reason, actor="operator")
    click.echo(f"fair {key}: weight deleted" if ok else f"fair {key}: no weight set")


@fair.command("cap")
@click.argument("key", type=SLOT_KEY)
@click.argument("max_open", metavar="MAX_OPEN", type=click.IntRange(1, MAX_DEPTH))
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def fair_cap(obj: Ctx, key: str, max_open: int, reason: str) -> None:
    """Cap KEY at MAX_OPEN tasks naming it (fair_key) that have not ended, in every queue (KEY 'tenant:*':
    each key 'tenant:<name>'): beyond it enqueue refuses the key's new work (QueueFull, nothing written), the
    lowest priorities first. Work already admitted goes on. An App's cap does not replace it."""
    check_reason(reason)
    changed = obj.client.caps.set_key(key, max_open, reason=reason, actor="operator")
    click.echo(f"fair {key}: cap {max_open} task(s) not ended" + ("" if changed else " (unchanged)"))


@fair.command("uncap")
@click.argument("key", type=SLOT_KEY)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def fair_uncap(obj: Ctx, key: str, reason: str) -> None:
    """Remove KEY's cap (a key of a family falls back to the family's)."""
    check_reason(reason)
    ok = obj.client.caps.delete_key(key, reason=reason, actor="operator")
    click.echo(f"fair {key}: cap deleted" if ok else f"fair {key}: no cap set")

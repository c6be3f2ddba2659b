"""``mcq fair``: fair shares across keys as they stand (each fairness key's weight, its own, its family's or
the default, and its messages queued in each queue's fair lanes), and setting and deleting weights
(recorded in the namespace log)."""

from __future__ import annotations

import click

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


def _line(s: FairStatus) -> str:
    queued = ", ".join(f"{n} in {where}" for where, n in sorted(s.queued.items())) or "none"
    each = " for each key of the family" if s.key.endswith(":*") else ""
    source = f", {s.source}" if s.source else ""
    return f"{s.key}: weight {s.weight}{each} ({_setting(s)}{source}); messages queued: {queued}"


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
    rows = obj.reader.fairness.all(list(queues) or None)
    if as_json:
        emit_json({"fair": [{"key": s.key, "weight": s.weight, "setting": _setting(s), "family": s.family,
                             "source": s.source, "queued": s.queued} for s in rows]})
        return
    if not rows:
        click.echo("no fairness keys (tasks name one: enqueue(..., fair_key='tenant:acme'); "
                   "weigh one: mcq fair set KEY WEIGHT --reason ..)")
        return
    for s in rows:
        click.echo(_line(s))


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

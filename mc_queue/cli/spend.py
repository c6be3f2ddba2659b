"""``mcq spend``: spend ceilings (denial of wallet) as they stand (each key's ceilings and window, what its
Attempts spent in the window ending now and what running ones reserved, the claims deferred or rejected),
and setting and deleting them (recorded in the namespace log)."""

from __future__ import annotations

import click

from ..client.slots import family_of
from ..client.spend import MAX_COST, MAX_TOKENS, ON_OVER, SpendStatus
from .errors import handle_errors
from .options import Ctx, check_reason
from .output import emit_json
from .root import main
from .slots import SLOT_KEY


def _setting(s: SpendStatus) -> str:
    if s.window_s is None:
        return "none"
    return f"family {family_of(s.key)}" if s.family else "own"


def _row(s: SpendStatus) -> dict[str, object]:
    return {"key": s.key, "cost": s.cost, "tokens": s.tokens, "window_s": s.window_s, "on_over": s.on_over,
            "setting": _setting(s), "family": s.family, "source": s.source, "spent_cost": s.spent_cost,
            "spent_tokens": s.spent_tokens, "reserved_cost": s.reserved_cost, "reserved_tokens": s.reserved_tokens,
            "running": s.running, "deferred": s.deferred, "rejected": s.rejected}


def _line(s: SpendStatus) -> str:
    if s.window_s is None:
        setting = "no ceiling set"
    else:
        caps = " and ".join(x for x in (f"cost {s.cost:g}" if s.cost is not None else "",
                                        f"{s.tokens:,} tokens" if s.tokens is not None else "") if x)
        each = " for each key of the family" if s.key.endswith(":*") else ""
        setting = f"{caps} per {s.window_s:g} s{each} ({_setting(s)}, {s.source}), {s.on_over} when over"
    return (f"{s.key}: {setting}; spent cost {s.spent_cost:g}, {s.spent_tokens:,} tokens in the window; "
            f"{s.running} running Attempt(s) reserved cost {s.reserved_cost:g}, {s.reserved_tokens:,} tokens; "
            f"{s.deferred} claim(s) deferred, {s.rejected} rejected so far")


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def spend(ctx: click.Context, as_json: bool) -> None:
    """Spend ceilings (denial of wallet): what the Attempts of the tasks naming each key (or each key of a
    family 'tenant:*') may spend per window, what they spent in the window ending now, what the running
    ones reserved (their budgets' remainders), and the claims deferred or rejected."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    rows = obj.reader.spend.all()
    if as_json:
        emit_json({"spend": [_row(s) for s in rows]})
        return
    if not rows:
        click.echo("no spend ceilings (set one: mcq spend set KEY --cost 50 --per 3600 --reason ..)")
        return
    for s in rows:
        click.echo(_line(s))


@spend.command("set")
@click.argument("key", type=SLOT_KEY)
@click.option("--cost", type=click.FloatRange(0.001, MAX_COST), help="The cost ceiling per window.")
@click.option("--tokens", type=click.IntRange(1, MAX_TOKENS), help="The tokens ceiling per window.")
@click.option("--per", "per_s", type=click.FloatRange(0.001, 30 * 86_400), required=True,
              help="The window, in seconds.")
@click.option("--on-over", type=click.Choice(ON_OVER), default="wait", show_default=True,
              help="Over the ceiling: the Attempt waits, holding nothing (wait), or its task is canceled (reject).")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def spend_set(obj: Ctx, key: str, cost: float | None, tokens: int | None, per_s: float, on_over: str,
              reason: str) -> None:
    """Cap what the Attempts of the tasks naming KEY may spend in any --per seconds (KEY 'tenant:*': each key
    'tenant:<name>' its own ceiling). An App's declaration does not replace it."""
    check_reason(reason)
    if cost is None and tokens is None:
        raise click.UsageError("give --cost, --tokens or both")
    changed = obj.client.spend.set(key, cost=cost, tokens=tokens, per_s=per_s, on_over=on_over, reason=reason,
                                   actor="operator")
    click.echo(f"spend {key}: set ({on_over} when over)" + ("" if changed else " (unchanged)"))


@spend.command("delete")
@click.argument("key", type=SLOT_KEY)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def spend_delete(obj: Ctx, key: str, reason: str) -> None:
    """Remove KEY's spend ceiling (a key of a family falls back to the family's); its deferred Attempts are
    claimed when next due. Reservations of running Attempts are settled as they end."""
    check_reason(reason)
    ok = obj.client.spend.delete(key, reason=reason, actor="operator")
    click.echo(f"spend {key} deleted" if ok else f"spend {key}: none set")

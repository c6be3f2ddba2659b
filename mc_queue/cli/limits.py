"""``mcq limits``: rate limits as they stand (units used and left in the window ending now, pauses,
deferred claims), and setting, pausing, resuming and deleting them (recorded in the namespace log)."""

from __future__ import annotations

import click

from ..client.limits import LimitStatus
from ..ops.render import duration, fallback_name
from .errors import handle_errors
from .options import Ctx, check_reason, duration_ms
from .output import emit_json
from .root import main


def _row(s: LimitStatus) -> dict[str, object]:
    return {"key": s.key, "limit": s.limit, "window_ms": s.window_ms, "source": s.source, "used": s.used,
            "left": s.left, "paused_until_ms": s.paused_until_ms if s.paused else None,
            "pause_reason": s.pause_reason if s.paused else None, "deferred": s.deferred}


def _line(s: LimitStatus) -> str:
    setting = (f"{s.limit} per {duration(s.window_ms)} ({s.source}): {s.used} used, {s.left} left"
               if s.limit is not None and s.window_ms is not None else "no limit set")
    paused = (f"; PAUSED for {duration(max(0, (s.paused_until_ms or 0) - s.now_ms))}: {s.pause_reason}"
              if s.paused else "")
    return f"{s.key}: {setting}{paused}; {s.deferred} claim(s) deferred so far"


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def limits(ctx: click.Context, as_json: bool) -> None:
    """Rate limits: each key's units used and left in its window ending now (Redis clock), its pause, and the
    claims it deferred. Tasks name their keys at enqueue; every claim takes the units, all or none."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    rows = obj.reader.limits.all()
    if as_json:
        emit_json({"limits": [_row(s) for s in rows]})
        return
    if not rows:
        click.echo("no rate limits (set one: mcq limits set KEY --units N --per 1m --reason ..)")
    for s in rows:
        click.echo(_line(s))


@limits.command("set")
@click.argument("key")
@click.option("--units", type=click.IntRange(1, 999_999_999), required=True, help="Units admitted per window.")
@click.option("--per", "per", required=True, metavar="DUR", help="The sliding window (1s, 1m, 1h; at most 30d).")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def limits_set(obj: Ctx, key: str, units: int, per: str, reason: str) -> None:
    """Allow UNITS of KEY per sliding window PER, fleet-wide (an App's declaration does not replace it)."""
    check_reason(reason)
    window = duration_ms(per, "--per") or 0
    changed = obj.client.limits.set(key, units, per_s=window / 1000, reason=reason, actor="operator")
    click.echo(f"limit {key}: {units} per {duration(window)}" + ("" if changed else " (unchanged)"))


@limits.command("pause")
@click.argument("key")
@click.option("--for", "for_", required=True, metavar="DUR", help="How long (30s, 10m; at most 30d).")
@click.option("--reason", required=True, help="Why (at least ten characters); deferred claims say it.")
@click.pass_obj
@handle_errors
def limits_pause(obj: Ctx, key: str, for_: str, reason: str) -> None:
    """Hold every claim of a task naming KEY for DUR (a later pause already in force holds)."""
    check_reason(reason)
    until = obj.client.limits.pause(key, (duration_ms(for_, "--for") or 0) / 1000, reason=reason, actor="operator")
    click.echo(f"limit {key} paused until {until} ms (Redis clock)")


def _keyed(name: str, doc: str, done: str, not_done: str) -> None:
    """``mcq limits <name> KEY --reason``: one Limits call, its outcome in one line."""

    @limits.command(name, help=doc)
    @click.argument("key")
    @click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
    @click.pass_obj
    @handle_errors
    def command(obj: Ctx, key: str, reason: str) -> None:
        check_reason(reason)
        ok = getattr(obj.client.limits, name)(key, reason=reason, actor="operator")
        click.echo(f"limit {key} {done}" if ok else f"limit {key}: {not_done}")


_keyed("resume", "End a pause of KEY now (Attempts it deferred keep the due time they were given).", "resumed",
       "was not paused")
_keyed("delete", "Remove KEY's limit, its log and its pause: tasks naming it are no longer limited.", "deleted",
       "no such limit")


def _breaker_line(s: LimitStatus) -> str:
    b = s.breaker
    setting = (f"opens at {b.failure_rate:.0%} of >= {b.min_calls} calls failing in {duration(b.window_s * 1000)}"
               + (f" or {b.slow_rate:.0%} slower than {duration(b.slow_s * 1000)}" if b.slow_s else "")
               + (f" or one failure {b.same_failure} times" if b.same_failure else "")
               + f", for {duration(b.open_s * 1000)}, then {b.probes} probe(s) ({b.source})") if b else "set by hand"
    state = s.breaker_state.upper() if s.breaker_state != "closed" else "closed"
    if s.breaker_state == "open" and s.breaker_until_ms:
        state += f" for {duration(max(0, s.breaker_until_ms - s.now_ms))}"
    why = f": {s.breaker_why}" if s.breaker_why else ""
    fallbacks = f"; fallbacks {', '.join(map(fallback_name, s.fallbacks))}" if s.fallbacks else ""
    return (f"{s.key}: {state}{why}; {setting}{fallbacks}; opened {s.breaker_opened} time(s), "
            f"{s.breaker_deferred} claim(s) deferred")


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def breakers(ctx: click.Context, as_json: bool) -> None:
    """Circuit breakers of dependencies: state (closed, OPEN, HALF: half-open), why, setting, and what they
    held. While one is open no task naming its key is claimed; half-open, exactly its probes are."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    rows = [s for s in obj.reader.limits.all() if s.breaker is not None or s.breaker_state != "closed"]
    if as_json:
        emit_json({"breakers": [{"key": s.key, "state": s.breaker_state, "until_ms": s.breaker_until_ms,
                                 "why": s.breaker_why, "setting": vars(s.breaker) if s.breaker else None,
                                 "opened": s.breaker_opened, "deferred": s.breaker_deferred,
                                 "fallbacks": list(s.fallbacks)} for s in rows]})
        return
    if not rows:
        click.echo("no circuit breakers (an App declares one: app.breaker(key, ...))")
    for s in rows:
        click.echo(_breaker_line(s))


@breakers.command("open")
@click.argument("key")
@click.option("--for", "for_", required=True, metavar="DUR", help="How long (30s, 10m; at most 30d); then half-open.")
@click.option("--reason", required=True, help="Why (at least ten characters); deferred claims say it.")
@click.pass_obj
@handle_errors
def breakers_open(obj: Ctx, key: str, for_: str, reason: str) -> None:
    """Open KEY's breaker by hand: no task naming KEY is claimed for DUR, then it half-opens."""
    check_reason(reason)
    until = obj.client.limits.trip(key, (duration_ms(for_, "--for") or 0) / 1000, reason=reason, actor="operator")
    click.echo(f"breaker {key} open until {until} ms (Redis clock)")


@breakers.command("close")
@click.argument("key")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def breakers_close(obj: Ctx, key: str, reason: str) -> None:
    """Close KEY's breaker by hand (its window of outcomes cleared)."""
    check_reason(reason)
    ok = obj.client.limits.reset(key, reason=reason, actor="operator")
    click.echo(f"breaker {key} closed" if ok else f"breaker {key} was closed")

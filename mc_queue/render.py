"""How records are shown to people (rich) and to machines (JSON)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from .models import Attempt, EffectRecord, Event, Task

_EVENT_STYLE = {
    "stale_write_refused": "bold red",
    "claim_refused": "yellow",
    "retry_refused": "yellow",
    "completion_conflict": "bold red",
    "lease_expired": "magenta",
    "state_loss_detected": "bold red",
    "attempt_succeeded": "green",
    "attempt_failed": "red",
    "attempt_reconciled": "cyan",
}


def task_json(task: Task, effects: dict[str, EffectRecord] | None = None) -> dict[str, Any]:
    body = task.model_dump(mode="json", exclude={"attempts", "events"})
    out = {
        "task": body,
        "attempts": [a.model_dump(mode="json") for a in task.attempts],
        "events": [e.model_dump(mode="json") for e in task.events],
    }
    if effects is not None:
        out["effects"] = [e.model_dump(mode="json") for e in effects.values()]
        out["budget_left"] = budget_left(task)
    return out


def budget_left(task: Task) -> dict[str, Any]:
    """What the task's frozen budget still allows, from its Attempts' records."""
    from .config import Budget, parse_config

    b = parse_config(task.budget, Budget)
    cost = sum(a.cost for a in task.attempts)
    tokens = sum(a.tokens for a in task.attempts)
    return {
        "attempts": f"{len(task.attempts)} of {b.max_attempts}",
        "cost": f"{cost:g}" + (f" of {b.max_cost:g}" if b.max_cost is not None else " (no limit)"),
        "tokens": f"{tokens}" + (f" of {b.max_tokens}" if b.max_tokens is not None else " (no limit)"),
        "same_failure_repeats_allowed": b.max_same_fingerprint,
    }


def _t(value: datetime | None) -> str:
    return value.strftime("%H:%M:%S.%f")[:-3] if value else "-"


def describe_event(e: Event) -> str:
    f = e.fields
    typ = e.type
    if typ == "task_created":
        return (f"task created by {f.get('actor')} (handler {f.get('handler')}, "
                f"payload {f.get('payload_digest', '')[:12]})")
    if typ == "attempt_created":
        extra = f" hypothesis: {f['hypothesis']}" if f.get("hypothesis") else ""
        return f"attempt created by {f.get('actor')}: {f.get('reason')}.{extra}"
    if typ == "attempt_claimed":
        return f"claimed by {f.get('worker')} with fence {f.get('fence')}"
    if typ == "claim_refused":
        return f"claim by {f.get('worker')} refused: {f.get('reason')}"
    if typ == "stale_write_refused":
        return (f"{f.get('op')} from {f.get('worker') or '?'} REFUSED ({f.get('refusal')}): presented fence "
                f"{f.get('presented_fence')}, current {f.get('current_fence')}, "
                f"payload {f.get('payload_digest', '')[:12]}")
    if typ == "lease_expired":
        how = (f"voided with {f['left_ms']} ms left ({f.get('reason')})" if f.get("left_ms")
               else f"expired ({f.get('overdue_ms')} ms overdue)")
        return (f"lease of {f.get('worker')} {how}: attempt suspect, "
                f"fence {f.get('fence')} -> {f.get('new_fence')}")
    if typ == "reconciling_started":
        return f"reconciliation started by {f.get('actor')}"
    if typ == "attempt_reconciled":
        return (f"reconciled by {f.get('actor')}: {f.get('outcome')}, task {f.get('task_state')}; "
                f"evidence {f.get('evidence')}")
    if typ == "attempt_succeeded":
        return f"succeeded (worker {f.get('worker')}, fence {f.get('fence')})"
    if typ == "attempt_failed":
        return (f"failed: {f.get('failure_class')} ({f.get('fingerprint')}) "
                f"(worker {f.get('worker')}, fence {f.get('fence')})")
    if typ == "retry_refused":
        return f"retry by {f.get('actor')} refused: {f.get('reason')}"
    if typ == "completion_conflict":
        return f"completion from {f.get('worker')} conflicts with the recorded result"
    return " ".join(f"{k}={v}" for k, v in f.items())


def print_task(task: Task, console: Console | None = None, effects: dict[str, EffectRecord] | None = None) -> None:
    console = console or Console()
    console.print(f"[bold]{task.id}[/bold]  queue [cyan]{task.queue}[/cyan]  handler [cyan]{task.handler}[/cyan]  "
                  f"state [bold]{task.state.value}[/bold]  fence {task.fence}")
    attempts = Table(title="Attempts", show_lines=False)
    for col in ("#", "state", "worker", "fence", "started", "ended", "elapsed ms", "cost", "tokens",
                "reason / hypothesis", "failure", "evidence"):
        attempts.add_column(col)
    for a in task.attempts:
        attempts.add_row(*_attempt_row(a))
    console.print(attempts)
    if effects:
        fx = Table(title="Side effects (operation key -> provider receipt)")
        for col in ("key", "state", "by attempt", "receipt / note", "source"):
            fx.add_column(col)
        for fx_rec in effects.values():
            fx.add_row(fx_rec.key, fx_rec.state, str(fx_rec.receipt_attempt or fx_rec.attempt),
                       json.dumps(fx_rec.receipt) if fx_rec.receipt is not None else (fx_rec.note or ""),
                       fx_rec.source or "")
        console.print(fx)
    if effects is not None:
        console.print("budget: " + ", ".join(f"{k} {v}" for k, v in budget_left(task).items()))
    timeline = Table(title="Timeline")
    for col in ("time", "attempt", "event", "what happened"):
        timeline.add_column(col)
    for e in task.events:
        style = _EVENT_STYLE.get(e.type, "")
        timeline.add_row(_t(e.at), str(e.attempt or ""), f"[{style}]{e.type}[/{style}]" if style else e.type,
                         describe_event(e))
    console.print(timeline)


def _attempt_row(a: Attempt) -> list[str]:
    why = a.reason or ""
    if a.hypothesis:
        why += f" / {a.hypothesis}"
    failure = f"{a.failure.failure_class.value}: {a.failure.type}" if a.failure else ""
    evidence = a.evidence.get("conclusion", "") if isinstance(a.evidence, dict) else ""
    return [str(a.number), a.state.value, a.worker_id or "", str(a.fence or ""), _t(a.started_at), _t(a.ended_at),
            str(a.elapsed_ms if a.elapsed_ms is not None else ""), f"{a.cost:g}", str(a.tokens), why, failure,
            evidence]


def print_status(status: dict[str, dict[str, Any]], overview: dict[str, Any] | None = None,
                 console: Console | None = None) -> None:
    (console or Console()).print(status_table(status, overview))


def status_table(status: dict[str, dict[str, Any]], overview: dict[str, Any] | None = None) -> Table:
    states = ["pending", "backoff", "running", "succeeded", "failed", "blocked", "quarantined", "canceled"]
    table = Table(title="Queues")
    table.add_column("queue")
    for s in states:
        table.add_column(s, justify="right")
    table.add_column("queue age", justify="right")
    for queue, info in status.items():
        counts = info["counts"]
        table.add_row(queue, *[str(counts.get(s, 0)) for s in states], f"{info['queue_age_ms'] / 1000:.1f}s")
    if overview:
        table.caption = ("namespace " + str(overview["namespace_state"]) + ": " + ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in overview.items() if k != "namespace_state"))
    return table


def print_attention(items: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console()
    if not items:
        console.print("no attention items")
        return
    for item in items:
        console.print(f"[bold red]{item.get('kind')}[/bold red] {item.get('summary')}")
        console.print(f"  why another automatic attempt is unsafe: {item.get('why_unsafe')}")
        console.print(f"  budget: {item.get('budget')}")
        for row in item.get("tried", []):
            console.print(f"  tried attempt {row.get('attempt')}: {row.get('state')} "
                          f"{row.get('failure_class') or ''} {row.get('fingerprint') or ''} "
                          f"hypothesis={row.get('hypothesis')!r} reason={row.get('reason')!r}")
        for change in item.get("changed", []):
            console.print(f"  changed: {change}")
        console.print(f"  decide with: mcq retry {item.get('task_id')} --reason \"...\" --hypothesis \"...\"")

"""How records are shown to people (rich) and to machines (JSON)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import textwrap
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.text import Text

from ..contracts.keys import SKIP_STEP
from ..contracts.models import Attempt, EffectRecord, Event, Task, TaskState

MAX_WIDTH = 80  # every text command fits 80 columns: long values are wrapped, never cut
PREVIEW_CHARS = 600  # how much of a payload or a result `mcq show` prints

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
    from ..contracts.config import Budget, parse_config

    b = parse_config(task.budget, Budget)
    cost = sum(a.cost for a in task.attempts)
    tokens = sum(a.tokens for a in task.attempts)
    return {
        "attempts": f"{len(task.attempts)} of {b.max_attempts}",
        "cost": f"{cost:g}" + (f" of {b.max_cost:g}" if b.max_cost is not None else " (no limit)"),
        "tokens": f"{tokens}" + (f" of {b.max_tokens}" if b.max_tokens is not None else " (no limit)"),
        "same_failure_repeats_allowed": b.max_same_fingerprint,
    }


def _as_typed(path: str) -> str:
    """A path as a person would type it here: relative to the working directory when under it."""
    rel = os.path.relpath(path)
    if rel.startswith(".."):
        return shlex.quote(path)
    return shlex.quote(rel if os.sep in rel else f".{os.sep}{rel}")


def mcq_command() -> str:
    """How to run mcq again, as a command that works typed in this working directory: the console
    script running now (by its name when PATH finds that very file, else its path, e.g.
    ``.venv/bin/mcq``), else this interpreter with ``-m mc_queue``."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    if argv0 and name not in ("__main__.py", "-c") and os.path.isfile(argv0):
        found = shutil.which(name)
        if found and os.path.samefile(found, argv0):
            return name
        return _as_typed(os.path.abspath(argv0))
    return f"{_as_typed(sys.executable)} -m mc_queue"


def mcq_invocation(*, redis_url: str | None = None, prefix: str | None = None, home: str | None = None) -> str:
    """:func:`mcq_command` with the global options that reach the same namespace (those given)."""
    from ..store.urls import redacted

    parts = [mcq_command()]
    if redis_url:
        parts.append(f"--redis-url {shlex.quote(redacted(redis_url))}")
    if home:
        parts.append(f"--home {_as_typed(os.path.abspath(home))}")
    if prefix:
        parts.append(f"--prefix {shlex.quote(prefix)}")
    return " ".join(parts)


def text_console(console: Console | None = None) -> Console:
    """The console text commands print to: the terminal's width, at most :data:`MAX_WIDTH`."""
    console = console or Console()
    if console.width > MAX_WIDTH:
        console.width = MAX_WIDTH
    return console


def iso(value: datetime | None) -> str:
    """ISO-8601 in UTC with milliseconds, e.g. 2026-12-01T03:58:06.123Z; '-' for none."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def duration(ms: float) -> str:
    """A duration for people: 850 ms, 12.3s, 4m 05s, 2h 03m, 3d 04h."""
    ms = max(0.0, ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h:02d}h"


def fallback_name(key: str) -> str:
    """A declared fallback as people read it: its key, or what the optional step's skip means."""
    return "(skip the step)" if key == SKIP_STEP else key


def _between(a: datetime | None, b: datetime | None) -> str:
    return duration((b - a).total_seconds() * 1000) if a and b else ""


def wrap(text: str, width: int = MAX_WIDTH, indent: str = "", more: str = "  ") -> list[str]:
    """``text`` as lines of at most ``width`` columns: each of its lines keeps its own indentation
    after ``indent``; a line too long continues on the next, indented by ``more``; nothing is cut."""
    out: list[str] = []
    for raw in text.expandtabs(4).splitlines() or [""]:
        body = raw.lstrip()
        first = indent + raw[:len(raw) - len(body)]
        if len(first) > width // 2:  # a deeply indented line keeps some room for its text
            first = first[:width // 2]
        lines = textwrap.wrap(body, width, initial_indent=first, subsequent_indent=first + more,
                              break_long_words=True, break_on_hyphens=False, drop_whitespace=True)
        out.extend(lines or [first.rstrip()])
    return out


def _emit(console: Console, lines: Iterable[str], style: str = "") -> None:
    for line in lines:
        console.print(Text(line, style=style), soft_wrap=True, highlight=False)


def _field(console: Console, label: str, value: str, indent: str = "  ") -> None:
    """``label: value``, the value wrapped under the label's indentation."""
    _emit(console, wrap(f"{label}: {value}", console.width, indent, "    "))


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A JSON value as compact text with its size, cut after ``limit`` characters saying so."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "), default=str)
    size = len(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode())
    if len(text) > limit:
        text = f"{text[:limit]} ... [{len(text) - limit} more characters not shown; `--json` has all]"
    return f"({size} bytes) {text}"


def state_text(task: Task, now: datetime | None = None) -> str:
    """The task's state as people should read it: ``backoff`` and ``scheduled`` with their due time."""
    now = now or datetime.now(UTC)
    latest = task.latest
    if task.state in (TaskState.BACKOFF, TaskState.SCHEDULED) and latest is not None and latest.due_at is not None:
        left = (latest.due_at - now).total_seconds() * 1000
        if left > 0:
            when = f", at {latest.due_at.isoformat(timespec='seconds')}" if task.state == TaskState.SCHEDULED else ""
            return f"{task.state.value} (due in {duration(left)}{when})"
        return f"{task.state.value} (due since {duration(-left)}, waiting for a worker)"
    if task.state == TaskState.WAITING:
        return (f"waiting (for {len(task.after_left)} of {len(task.after)} task(s) to "
                f"{'succeed' if task.after_mode == 'succeeded' else 'end'}: {' '.join(task.after_left)})")
    if task.state == TaskState.PENDING and latest is not None and latest.due_at is not None \
            and latest.due_at < now and latest.state.value == "pending":
        return f"pending (due since {duration((now - latest.due_at).total_seconds() * 1000)}, waiting for a worker)"
    return task.state.value


def _int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


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
        left = _int(f.get("left_ms")) or max(0, -(_int(f.get("overdue_ms")) or 0))
        how = (f"voided with {left} ms left" + (f" ({f['reason']})" if f.get("reason") else "") if left
               else f"expired ({max(0, _int(f.get('overdue_ms')) or 0)} ms overdue)")
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
    if typ == "dependency_met":
        still = str(f.get("left", "?"))
        return (f"task {f.get('parent')} it waits for ended {f.get('parent_state')}: "
                + (f"{still} left" if still != "0" else f"released, {f.get('state', 'pending')}"))
    if typ == "retry_refused":
        return f"retry by {f.get('actor')} refused: {f.get('reason')}"
    if typ == "completion_conflict":
        return f"completion from {f.get('worker')} conflicts with the recorded result"
    return ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in f.items() if v != "")


def periodic_origin(key: str) -> str:
    """' (periodic schedule NAME, tick TIME)' for a producer key a periodic schedule made, else ''."""
    parts = key.split(":")
    if len(parts) < 3 or parts[0] != "periodic":
        return ""
    if len(parts) == 3 and parts[2].isdigit():
        return f" (periodic schedule {parts[1]}, tick {iso(datetime.fromtimestamp(int(parts[2]) / 1000, tz=UTC))})"
    return f" (periodic schedule {parts[1]}, triggered by hand)"


def print_task(task: Task, console: Console | None = None, effects: dict[str, EffectRecord] | None = None) -> None:
    """`mcq show`: the task, each Attempt (its failure and traceback), side effects and the timeline."""
    console = text_console(console)
    width = console.width
    _emit(console, [f"task {task.id}"], "bold")  # the id whole, even past the width: people copy it
    _field(console, "state", state_text(task))
    _field(console, "queue", f"{task.queue}, handler {task.handler}, fence {task.fence}"
           + (f", priority {task.priority}" if task.priority != 5 else ""))
    started = next((a.started_at for a in task.attempts if a.started_at), None)
    last = task.latest
    finished = last.ended_at if last and task.state.value in ("succeeded", "failed", "blocked", "quarantined",
                                                              "canceled") else None
    _field(console, "created", iso(task.created_at))
    _field(console, "started", iso(started) + (f" (waited {_between(task.created_at, started)})" if started else ""))
    _field(console, "finished",
           iso(finished) + (f" (took {_between(task.created_at, finished)} in all)" if finished else ""))
    if task.idempotency_key:
        key = task.idempotency_key
        _field(console, "idempotency key", key + periodic_origin(key))
    if task.fair_key:
        _field(console, "fair key", f"{task.fair_key} (its messages wait in the key's fair lane)")
    if task.start_by or task.finish_by:
        _field(console, "deadlines", ", ".join(
            f"{what} {iso(when)}" for what, when in (("start by", task.start_by), ("finish by", task.finish_by))
            if when))
    if task.after:
        _field(console, "after", f"{' '.join(task.after)} (each must "
               f"{'succeed' if task.after_mode == 'succeeded' else 'end'}"
               + (f"; still waiting for {' '.join(task.after_left)})" if task.after_left else ")"))
    if task.dependents:
        _field(console, "dependents", " ".join(task.dependents))
    _field(console, "payload", preview(task.payload))
    _field(console, "result", preview(task.result) if task.result is not None else "none")
    if task.cancel_requested:
        _field(console, "cancel requested", task.cancel_requested)
    for a in task.attempts:
        _print_attempt(console, a)
    if effects:
        _emit(console, ["", "Side effects (operation key -> provider receipt)"], "bold")
        for fx in effects.values():
            note = json.dumps(fx.receipt) if fx.receipt is not None else (fx.note or "")
            _emit(console, wrap(f"{fx.key}: {fx.state}, by attempt {fx.receipt_attempt or fx.attempt}"
                                + (f", source {fx.source}" if fx.source else ""), width, "  ", "    "))
            if note:
                _emit(console, wrap(note, width, "    ", "  "))
    if effects is not None:
        _emit(console, [""])
        _emit(console, wrap("budget: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in budget_left(task).items()),
                            width, "", "  "))
    _emit(console, ["", "Timeline"], "bold")
    for e in task.events:
        style = _EVENT_STYLE.get(e.type, "")
        head = f"{iso(e.at)}  " + (f"#{e.attempt}  " if e.attempt else "") + e.type
        _emit(console, wrap(head, width, "  ", "    "), style)
        _emit(console, wrap(describe_event(e), width, "      ", "  "))


def _print_attempt(console: Console, a: Attempt) -> None:
    width = console.width
    _emit(console, [""])
    _emit(console, wrap(f"Attempt {a.number}: {a.state.value}", width), "bold")
    if a.worker_id or a.fence is not None:
        _field(console, "worker", f"{a.worker_id or '-'}, fence {a.fence if a.fence is not None else '-'}")
    if a.reason:
        _field(console, "reason", a.reason)
    if a.hypothesis:
        _field(console, "hypothesis", a.hypothesis)
    _field(console, "created", iso(a.created_at))
    if a.due_at and a.due_at != a.created_at:
        _field(console, "due", iso(a.due_at))
    if a.started_at:
        _field(console, "started", iso(a.started_at) + (f" (waited {_between(a.due_at or a.created_at, a.started_at)})"
                                                        if a.due_at or a.created_at else ""))
    if a.deadline_at:
        budget = _between(a.started_at, a.deadline_at) if a.started_at else None
        _field(console, "timeout budget",
               f"ends {iso(a.deadline_at)}" + (f" ({budget} from its start)" if budget else ""))
    if a.ended_at:
        ran = duration(a.elapsed_ms) if a.elapsed_ms is not None else _between(a.started_at, a.ended_at)
        _field(console, "finished", iso(a.ended_at) + (f" (ran {ran})" if ran else ""))
    if a.cost or a.tokens:
        _field(console, "cost", f"{a.cost:g}, tokens {a.tokens}")
    if a.spend:  # spend ceilings it reserved on at claim (its budget's rest), replaced by its cost as it ends
        _field(console, "spend reserved", "; ".join(f"{k}: cost {c:g}, tokens {t}" for k, (c, t) in a.spend.items()))
    if a.admitted_via:
        _field(console, "claimed while down", "; ".join(
            f"{k} (its step can be skipped)" if v == SKIP_STEP else f"{k} (its fallback {v} was up)"
            for k, v in a.admitted_via.items()))
    if a.fallbacks:  # a provider failover: what it ran on is not what its task named first
        _field(console, "fallbacks used", "; ".join(f"{k} -> {'(step skipped)' if v == SKIP_STEP else v}"
                                                   for k, v in a.fallbacks.items()))
    if a.phase:
        _field(console, "phase", a.phase)
    f = a.failure
    if f is not None:
        _emit(console, wrap(f"failure: {f.failure_class.value} / {f.type}"
                            + (f" (fingerprint {f.fingerprint})" if f.fingerprint else "")
                            + (", not retryable" if f.retryable is False else ""), width, "  ", "    "), "red")
        _field(console, "message", f.message or "(none)", "    ")
        if f.traceback:
            _emit(console, ["    traceback:"])
            _emit(console, wrap(f.traceback.rstrip("\n"), width, "      ", "    "))
        else:
            _emit(console, ["    traceback: none recorded"])
    if a.result is not None:
        _field(console, "result", preview(a.result))
    if a.evidence is not None:
        conclusion = a.evidence.get("conclusion") if isinstance(a.evidence, dict) else None
        _field(console, "evidence", str(conclusion) if conclusion else preview(a.evidence, 300))
    if a.settled_by:
        _field(console, "settled by", a.settled_by)


def status_lines(status: dict[str, dict[str, Any]], overview: dict[str, Any] | None = None,
                 width: int = MAX_WIDTH) -> list[str]:
    states = ["scheduled", "waiting", "pending", "backoff", "running", "succeeded", "failed", "blocked", "quarantined",
              "canceled"]
    lines = wrap("Queues (tasks by state; queue age: the oldest due pending Attempt's wait)", width, "", "  ")
    if not status:
        lines.append("  no queues")
    for queue, info in status.items():
        counts = info["counts"]
        lines.extend(wrap(f"{queue}: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in states)
                          + f"; queue age {info['queue_age_ms'] / 1000:.1f}s", width, "  ", "    "))
    if overview:
        lines.extend(wrap("namespace " + str(overview["namespace_state"]) + ": " + ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in overview.items()
            if k != "namespace_state" and v not in (None, "")), width, "", "  "))
    return lines


def print_status(status: dict[str, dict[str, Any]], overview: dict[str, Any] | None = None,
                 console: Console | None = None) -> None:
    console = text_console(console)
    _emit(console, status_lines(status, overview, console.width))


def status_table(status: dict[str, dict[str, Any]], overview: dict[str, Any] | None = None,
                 width: int = MAX_WIDTH) -> Text:
    """What `mcq status --watch` refreshes (the same lines as `mcq status`)."""
    return Text("\n".join(status_lines(status, overview, width)))


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value if v is not None)
    if isinstance(value, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {_plain(v)}" for k, v in value.items() if v not in (None, ""))
    return str(value)


def _kv_lines(data: dict[str, Any], width: int, indent: str) -> list[str]:
    """A dict as ``key: value`` lines (nested dicts indented, None and empty values left out)."""
    out: list[str] = []
    for k, v in data.items():
        if v is None or v == "" or v == [] or v == {}:
            continue
        label = str(k).replace("_", " ")
        if isinstance(v, dict):
            out.append(f"{indent}{label}:")
            out.extend(_kv_lines(v, width, indent + "  "))
        else:
            out.extend(wrap(f"{label}: {_plain(v)}", width, indent, "    "))
    return out


QUARANTINE_KINDS = ("quarantined", "poison")


def next_step(item: dict[str, Any], quarantined: bool | None = None) -> str:
    """The command that moves the task on: a quarantined task is replayed from the dead-letter
    queue (`mcq retry` refuses it); a blocked or failed one is retried."""
    if quarantined is None:
        quarantined = item.get("kind") in QUARANTINE_KINDS
    task = item.get("task_id") or "TASK"
    if quarantined:
        return f'mcq dlq replay {task} --reason "..." [--hypothesis "..."]'
    return f'mcq retry {task} --reason "..." [--hypothesis "..."]'


def print_attention(items: list[dict[str, Any]], console: Console | None = None,
                    quarantined: set[str] | None = None) -> None:
    """`mcq attention`: each stopped task in plain words and the command that moves it on.
    ``quarantined``: the ids in the dead-letter queue (else the item's kind says)."""
    console = text_console(console)
    width = console.width
    if not items:
        console.print("no attention items")
        return
    for number, item in enumerate(items):
        if number:
            _emit(console, [""])
        in_dlq = None if quarantined is None else item.get("task_id") in quarantined
        _emit(console, wrap(f"{item.get('kind')}: {item.get('summary')}", width, "", "  "), "bold red")
        if item.get("why_unsafe"):
            _emit(console, wrap(f"why another automatic attempt is unsafe: {item['why_unsafe']}", width, "  ", "    "))
        budget = item.get("budget")
        if isinstance(budget, dict) and budget:
            _emit(console, ["  budget used:"])
            _emit(console, _kv_lines(budget, width, "    "))
        elif budget:
            _emit(console, wrap(f"budget: {_plain(budget)}", width, "  ", "    "))
        tried = item.get("tried") or []
        if tried:
            _emit(console, ["  tried:"])
        for row in tried:
            head = f"attempt {row.get('attempt')}: {row.get('state')}"
            if row.get("failure_class"):
                head += f", {row['failure_class']} failure"
            if row.get("fingerprint"):
                head += f" (fingerprint {row['fingerprint']})"
            _emit(console, wrap(head, width, "    ", "    "))
            rest = {k: v for k, v in row.items() if k not in ("attempt", "state", "failure_class", "fingerprint")
                    and not (k in ("cost", "tokens") and not v)}
            _emit(console, _kv_lines(rest, width, "      "))
        changed = item.get("changed") or []
        if changed:
            _emit(console, ["  changed between attempts:"])
        for change in changed:
            _emit(console, wrap(str(change), width, "    ", "    "))
        if item.get("pending_effects"):
            _emit(console, wrap(f"effects not confirmed: {_plain(item['pending_effects'])}", width, "  ", "    "))
        _emit(console, wrap(f"next step: {next_step(item, in_dlq)}", width, "  ", "    "), "bold")


def print_dlq(rows: list[dict[str, Any]], console: Console | None = None, again: str = "mcq") -> None:
    """`mcq dlq list`: each quarantined task's id whole on a line of its own (never cut nor broken,
    even past the console's width: `mcq dlq replay` needs it), its summary and why, wrapped."""
    console = text_console(console)
    width = console.width
    if not rows:
        console.print("the dead-letter queue is empty")
        return
    for number, r in enumerate(rows):
        if number:
            _emit(console, [""])
        at = datetime.fromtimestamp(int(r["quarantined_at_ms"]) / 1000, UTC)
        _emit(console, [str(r["task_id"])], "bold")
        _emit(console, wrap(f"quarantined {iso(at)}", width, "  ", "    "))
        if r.get("summary"):
            _emit(console, wrap(f"summary: {r['summary']}", width, "  ", "    "))
        if r.get("why"):
            _emit(console, wrap(f"why another attempt is unsafe: {r['why']}", width, "  ", "    "))
    _emit(console, [""])
    _emit(console, wrap(f"{len(rows)} quarantined; the story: {again} dlq show TASK; run again: {again} dlq replay "
                        'TASK --reason "..."', width, "", "  "))


def print_workers(rows: list[dict[str, Any]], console: Console | None = None) -> None:
    """`mcq workers`: one block a worker (health, queues, leases), wrapped to the console."""
    console = text_console(console)
    width = console.width
    if not rows:
        console.print("no live workers")
        return
    for r in rows:
        beat = "no heartbeat" if r["last_heartbeat_s_ago"] is None else f"heartbeat {r['last_heartbeat_s_ago']}s ago"
        pid = f" (pid {r['pid']})" if r.get("pid") else ""
        _emit(console, wrap(f"{r['worker']}{pid}: {r['state']}, {'healthy' if r['healthy'] else 'NOT healthy'}, "
                            f"{beat}", width, "", "  "), "" if r["healthy"] else "bold red")
        _emit(console, wrap(f"queues: {', '.join(r['queues']) or '-'}", width, "  ", "    "))
        leases = ", ".join(le["attempt"] for le in r["leases"]) or "none"
        _emit(console, wrap(f"leases: {leases}", width, "  ", "    "))
        if r.get("probes"):  # its health probes (app.probe): a failing one holds what needs its key
            said = "; ".join(f"{key} {state}" for key, state in r["probes"].items())
            _emit(console, wrap(f"probes: {said}", width, "  ", "    "),
                  "bold red" if any(s != "ok" for s in r["probes"].values()) else "")

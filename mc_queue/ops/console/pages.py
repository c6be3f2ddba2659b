"""What each page shows, read through the same Client calls and indexes the command line uses.

Each function returns the template's context (plain dicts and records). Nothing here scans the
keyspace: the overview reads the counts hash, the indexes, the stats and sweeper hashes, the
console's own samples and RQ's worker registry (as ``mcq workers``), the task list pages through
``Reads.list_tasks``, the task page is ``Reads.get_task`` + ``Reads.effects``.

Every list is paged, and a page reads what it shows: the overview the samples of its queues, the
attention page the items of its page (``HMGET``, never the whole hash), the DLQ page the summaries of
the tasks it lists. Per-queue and per-task reads go in one pipeline.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import urlencode

from ...client import Client
from ...client.reads import LISTABLE_STATES
from ...client.slots import family_of
from ...contracts.errors import InvalidArgument
from ...contracts.models import Attempt, Event, Task, TaskState
from ...worker.runner import live_workers
from ..render import (
    budget_left,
    describe_event,
    duration,
    fallback_name,
    iso,
    next_step,
    periodic_origin,
    preview,
    state_text,
)
from .samples import chart, finished_totals, read_series, redis_now_ms

STATES = [s.value for s in TaskState]  # the order the overview's depth columns use
SWEEPER_LATE_S = 30.0  # a sweeper whose last pass is older than this is shown as not running
PAGE_SIZE = 25  # tasks, attention items
OVERVIEW_PAGE_SIZE = 20  # queue cards (each with its chart of the hour)
DLQ_GROUPS_PAGE = 10  # fingerprint groups of the DLQ per page
DLQ_TASKS_SHOWN = 10  # tasks listed in one group (its bulk forms carry up to BULK_MAX)
BULK_MAX = 500  # tasks one "replay all" / "purge all" form names: what the operator saw, and acts on
MAX_LIST_PAGE = 100_000
EVENT_TEXT_CHARS = 240  # an event's sentence on the timeline; its fields hold the whole of it
MAX_PAGES = 40  # list_tasks looks at 10 x (page x size) index entries at most: bounded by the page asked for
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

EVENT_KIND = {
    "stale_write_refused": "refused", "claim_refused": "refused", "retry_refused": "refused",
    "completion_conflict": "refused", "cancel_refused": "refused", "checkpoint_refused": "refused",
    "effect_refused": "refused", "effect_conflict": "refused", "failure_conflict": "refused",
    "replay_refused": "refused", "purge_refused": "refused", "settle_refused": "refused",
    "reconcile_refused": "refused", "cancel_ack_refused": "refused", "enqueue_refused": "refused",
    "state_loss_detected": "refused",
    "lease_expired": "lease", "reconciling_started": "reconcile", "attempt_reconciled": "reconcile",
    "attempt_succeeded": "ok", "attempt_failed": "failed", "task_quarantined": "failed", "attention_raised": "warn",
    "task_created": "info", "attempt_created": "info", "attempt_claimed": "info", "dlq_replayed": "info",
    "effect_intent": "effect", "effect_receipt": "effect", "effect_replayed": "effect", "effect_absent": "effect",
    "effect_unknown": "warn", "late_receipt": "effect",
    "cancel_requested": "lease", "cancel_acknowledged": "lease", "task_canceled": "lease",
}


def parse_duration(text: str, what: str) -> int | None:
    """'90s', '15m', '2h', '7d', '500ms' or bare seconds -> ms; '' -> None; else InvalidArgument."""
    if not text.strip():
        return None
    m = _DURATION.fullmatch(text)
    if not m:
        raise InvalidArgument(f"{what} {text[:40]!r} is not a duration: use e.g. 90s, 15m, 2h, 7d")
    return int(float(m.group(1)) * _UNITS[m.group(2) or "s"])


def page_number(text: Any, *, high: int = MAX_LIST_PAGE, beyond: str = "") -> int:
    """A page asked for in the address: '' -> 1; a number from 1 to ``high``; else InvalidArgument
    (``beyond``: what to do instead, said when the number is out of range)."""
    raw = str(text or "1").strip()
    if not raw.isdigit() or len(raw) > 9:
        raise InvalidArgument(f"page {raw[:20]!r} is not a number")
    page = int(raw)
    if not 1 <= page <= high:
        raise InvalidArgument(f"page must be between 1 and {high}{beyond}")
    return page


def paging(total: int, page: int, size: int) -> dict[str, Any]:
    """Where page ``page`` of ``total`` rows starts and stops, and the pager's links (``prev`` of a
    page beyond the last is the last one)."""
    pages = max(1, -(-total // size))
    return {"page": page, "pages": pages, "total": total, "start": (page - 1) * size, "stop": page * size,
            "prev": min(page - 1, pages) if page > 1 else None, "next": page + 1 if page < pages else None}


def _number(value: str | None) -> float:
    """A number another process wrote (``pass_ms`` is fractional); 0 for none or garbage."""
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


def ago(ms: int | None, now_ms: int) -> str:
    if not ms:
        return "-"
    return f"{duration(now_ms - ms)} ago" if now_ms >= ms else f"in {duration(ms - now_ms)}"


def when(value: datetime | None, now_ms: int) -> str:
    """ISO time and how long ago (Redis's clock)."""
    if value is None:
        return "-"
    return f"{iso(value).replace('T', ' ')} ({ago(int(value.timestamp() * 1000), now_ms)})"


def _json_pretty(text: str) -> str | None:
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(value, (dict, list)):
        return None
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


# ---------------------------------------------------------------------- the overview


def namespace_advice(state: str, prefix: str) -> str:
    if state == "lost":
        return (f"Redis lost acknowledged state: claims and transitions are refused. The way out: "
                f"`mcq --prefix {prefix} recover` (new epoch, fence floor raised, live leases voided and reconciled).")
    if state == "recovering":
        return (f"A recovery is under way: transitions wait for it. If it was interrupted, run "
                f"`mcq --prefix {prefix} recover` again; it finishes once no lease from before it is left.")
    if state == "missing":
        return "No namespace yet: it is created by the first enqueue (or any worker or sweeper start)."
    return ""


def overview(client: Client, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``params``: page (of the queue cards). Every queue's counts and age are read (one pipeline);
    the samples only of the page's queues."""
    page = page_number((params or {}).get("page"))
    ns = client.reads.namespace()
    status = client.reads.status()
    ov = client.reads.overview()
    paused = client.reads.paused_queues()
    pipe = client.redis.pipeline(transaction=False)
    pipe.hgetall(client.keys.stats)
    pipe.hgetall(client.keys.sweeper)
    stats, sweeper = cast(tuple[dict[str, str], dict[str, str]], tuple(pipe.execute()))
    now = redis_now_ms(client)
    workers = live_workers(client)
    totals = finished_totals(stats)
    pager = paging(len(status), page, OVERVIEW_PAGE_SIZE)
    queues = sorted(status)[pager["start"]:pager["stop"]]
    series = read_series(client, queues, now)
    rows = []
    for q in queues:
        counts = status[q]["counts"]
        s = series[q]
        serving = [w for w in workers if q in w["queues"]]
        rows.append({
            "name": q, "counts": [(st, int(counts.get(st, 0))) for st in STATES],
            "depth": int(counts.get("pending", 0)) + int(counts.get("backoff", 0)),
            "age_ms": int(status[q]["queue_age_ms"]), "age": duration(status[q]["queue_age_ms"]),
            "chart": chart(s), "rates": s.rates(), "totals": totals.get(q, {}),
            "paused": paused.get(q),
            "workers_alive": sum(1 for w in serving if w["alive"]),
            "workers_healthy": sum(1 for w in serving if w["healthy"]),
        })
    last_pass = int(_number(sweeper.get("last_pass_ms")))  # the sweeper host's clock, like metrics reads it
    sweeper_row = {
        "last_pass": ago(last_pass, now) if last_pass else "never",
        "alive": bool(last_pass) and now - last_pass < SWEEPER_LATE_S * 1000,
        "pass_ms": _number(sweeper.get("pass_ms")), "passes": int(_number(sweeper.get("passes"))),
    }
    memory = {k: ov.get(k) for k in ("memory_used_bytes", "memory_max_bytes", "enqueue_headroom_bytes")}
    return {
        "ns": ns, "advice": namespace_advice(ns.state, ns.prefix), "queues": rows, "pager": pager, "ov": ov,
        "sweeper": sweeper_row, "memory": memory,
        "workers_alive": sum(1 for w in workers if w["alive"]), "workers_total": len(workers),
        "workers_healthy": sum(1 for w in workers if w["healthy"]),
        "stale_refused": int(_number(stats.get("stale_write_refused"))),
        "reconciled": sum(int(_number(v)) for k, v in stats.items() if k.startswith("reconciled:")),
        "now_iso": iso(datetime.fromtimestamp(now / 1000, tz=UTC)),
    }


# ---------------------------------------------------------------------- the task list


def task_list(client: Client, params: dict[str, Any]) -> dict[str, Any]:
    """``params``: queue, states (list), handler, older_than, since (durations), page (1-based)."""
    queue = str(params.get("queue") or "").strip() or None
    states = [s for s in params.get("states", []) if s]
    handler = str(params.get("handler") or "").strip() or None
    page = page_number(params.get("page"), high=MAX_PAGES, beyond=": narrow the filters to see older tasks")
    older = parse_duration(str(params.get("older_than") or ""), "older than")
    newer = parse_duration(str(params.get("since") or ""), "since")
    now = redis_now_ms(client)
    rows, truncated = client.reads.list_tasks(
        queue=queue, states=states or None, handler=handler, limit=page * PAGE_SIZE + 1,
        created_before_ms=None if older is None else now - older,
        created_after_ms=None if newer is None else now - newer)
    shown = rows[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
    for r in shown:
        r["age"] = duration(max(0, now - r["created_at_ms"]))
        r["updated"] = ago(r["updated_at_ms"], now)
    filters = {"queue": queue or "", "states": states, "handler": handler or "",
               "older_than": str(params.get("older_than") or ""), "since": str(params.get("since") or "")}
    return {"rows": shown, "page": page, "has_next": len(rows) > page * PAGE_SIZE, "truncated": truncated,
            "queues": client.reads.queues(), "listable": list(LISTABLE_STATES), "filters": filters,
            "query_without_page": _query(filters)}


def _query(filters: dict[str, Any]) -> str:
    """The filters as a query string ending in '&' (or ''), for the pager's links."""
    pairs = [(k, v) for k, v in filters.items() if k != "states" and v]
    pairs += [("state", s) for s in filters.get("states", [])]
    return urlencode(pairs) + "&" if pairs else ""


def empty_task_list(client: Client, params: dict[str, Any]) -> dict[str, Any]:
    """The list page with no rows (its filters as given): after a filter was refused."""
    filters: dict[str, Any] = {k: str(params.get(k) or "") for k in ("queue", "handler", "older_than", "since")}
    filters["states"] = [s for s in params.get("states", []) if s]
    return {"rows": [], "page": 1, "has_next": False, "truncated": False, "queues": client.reads.queues(),
            "listable": list(LISTABLE_STATES), "filters": filters, "query_without_page": _query(filters)}


# ---------------------------------------------------------------------- one task's story


def _event_row(e: Event, now_ms: int) -> dict[str, Any]:
    f = e.fields
    row: dict[str, Any] = {"type": e.type, "at": iso(e.at), "ago": ago(int(e.at.timestamp() * 1000), now_ms),
                           "clock": e.at.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3], "id": e.id,
                           "attempt": e.attempt, "kind": EVENT_KIND.get(e.type, "info"), "text": _cut(sentence(e)),
                           "fields": sorted(f.items()), "evidence": None, "fences": None, "conclusion": None}
    if e.type == "stale_write_refused":
        row["fences"] = {"presented": f.get("presented_fence", "?"), "current": f.get("current_fence", "?"),
                         "op": f.get("op", "?"), "worker": f.get("worker") or "?", "refusal": f.get("refusal", "")}
    if f.get("evidence"):
        row["evidence"] = _json_pretty(f["evidence"]) or f["evidence"]
        try:
            found = json.loads(f["evidence"])
        except ValueError:
            found = None
        if isinstance(found, dict) and found.get("conclusion"):
            row["conclusion"] = str(found["conclusion"])
    if e.type == "attempt_reconciled":  # the sentence without the evidence: shown below it, whole
        row["text"] = (f"reconciled by {f.get('actor', '?')}: Attempt {f.get('outcome', '?')}, "
                       f"task {f.get('task_state', '?')}")
    return row


def sentence(e: Event) -> str:
    """An event as one sentence: ``mcq show``'s (:func:`mc_queue.ops.render.describe_event`), shorter for
    the frequent checkpoint and effect events (their digests and receipts stay in the fields)."""
    f = e.fields
    by = f"worker {f.get('worker', '?')}, fence {f.get('fence', '?')}"
    if e.type == "checkpoint_recorded":
        return f"phase {f.get('phase', '?')} reached ({by})"
    if e.type == "effect_intent":
        return (f"intent to {f.get('operation') or 'act'} recorded before calling the provider: "
                f"{f.get('key', '?')} ({by})")
    if e.type == "effect_receipt":
        return f"receipt of {f.get('key', '?')} recorded ({f.get('source') or 'perform'}, by {f.get('actor', '?')})"
    if e.type == "effect_replayed":
        return (f"{f.get('key', '?')} already done by Attempt {f.get('receipt_attempt', '?')}: its receipt replayed, "
                f"the provider not called again (worker {f.get('worker', '?')})")
    if e.type in ("effect_absent", "effect_unknown"):
        what = "absent at the provider" if e.type == "effect_absent" else "UNKNOWN at the provider"
        return f"{f.get('key', '?')} {what} ({f.get('source') or '?'}, by {f.get('actor', '?')}): {f.get('note', '')}"
    return describe_event(e)


def _cut(text: str, limit: int = EVENT_TEXT_CHARS) -> str:
    """An event's sentence, cut after ``limit`` characters (its fields, below it, have everything)."""
    return text if len(text) <= limit else text[:limit].rstrip() + " … (the fields have the rest)"


def _attempt_row(a: Attempt, now_ms: int) -> dict[str, Any]:
    f = a.failure
    evidence = None
    if a.evidence is not None:
        evidence = json.dumps(a.evidence, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return {
        "a": a, "state": a.state.value, "created": when(a.created_at, now_ms), "due": when(a.due_at, now_ms),
        "started": when(a.started_at, now_ms), "ended": when(a.ended_at, now_ms),
        "lease_expires": when(a.lease_expires_at, now_ms), "heartbeat": when(a.heartbeat_at, now_ms),
        "deadline": when(a.deadline_at, now_ms) if a.deadline_at else None,
        "suspect": when(a.suspect_at, now_ms) if a.suspect_at else None,
        "ran": duration(a.elapsed_ms) if a.elapsed_ms is not None else None,
        "failure": f, "evidence": evidence,
        "conclusion": a.evidence.get("conclusion") if isinstance(a.evidence, dict) else None,
        "checkpoints": [(k, json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)[:400])
                        for k, v in sorted(a.checkpoints.items())],
        "result": preview(a.result) if a.result is not None else None,
        "manifest": a.manifest,
    }


def task_page(client: Client, task_id: str) -> dict[str, Any]:
    task: Task = client.reads.get_task(task_id)
    effects = client.reads.effects(task_id)
    now = redis_now_ms(client)
    raw_item = client.redis.hget(client.keys.attention, task_id)
    item = cast(dict[str, Any], json.loads(cast(str, raw_item))) if raw_item else None
    quarantined = task.state is TaskState.QUARANTINED
    fx = []
    for rec in effects.values():
        fx.append({"r": rec, "intent_at": _ms_iso(rec.intent_at), "receipt_at": _ms_iso(rec.receipt_at),
                   "receipt": json.dumps(rec.receipt, sort_keys=True, ensure_ascii=False, default=str)
                   if rec.receipt is not None else None})
    events = [_event_row(e, now) for e in task.events]
    return {
        "task": task, "state_text": state_text(task, datetime.fromtimestamp(now / 1000, tz=UTC)),
        "created": when(task.created_at, now), "updated": when(task.updated_at, now),
        "payload": preview(task.payload), "result": preview(task.result) if task.result is not None else None,
        "attempts": [_attempt_row(a, now) for a in task.attempts],
        "events": events, "effects": fx, "budget": budget_left(task), "attention": item,
        "lease_left": duration(task.lease_pttl_ms) if task.lease_pttl_ms is not None else None,
        "refused": sum(1 for e in events if e["kind"] == "refused"),
        "reconciled": sum(1 for e in events if e["type"] == "attempt_reconciled"),
        "can_retry": task.state in (TaskState.FAILED, TaskState.BLOCKED),
        "can_replay": quarantined,
        "can_cancel": task.state in (TaskState.PENDING, TaskState.BACKOFF, TaskState.SCHEDULED, TaskState.WAITING,
                                     TaskState.RUNNING,
                                     TaskState.FAILED, TaskState.BLOCKED),
        "origin": periodic_origin(task.idempotency_key or "").strip(" ()"),
        "deadlines": ", ".join(f"{what} {when(at, now)}" for what, at in (("start by", task.start_by),
                                                                          ("finish by", task.finish_by)) if at),
        "next_step": next_step(item or {"task_id": task_id}, quarantined) if item or quarantined else None,
    }


def _ms_iso(ms: int | None) -> str:
    return iso(datetime.fromtimestamp(ms / 1000, tz=UTC)) if ms else "-"


# ---------------------------------------------------------------------- attention, DLQ, workers


def attention(client: Client, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``params``: page. The items of that page, by task id (as ``Reads.attention_items``): the
    hash's field names, then that page's items and their DLQ membership in one pipeline."""
    page = page_number((params or {}).get("page"))
    ids = sorted(str(k) for k in cast(list[str], client.redis.hkeys(client.keys.attention)))
    pager = paging(len(ids), page, PAGE_SIZE)
    shown = ids[pager["start"]:pager["stop"]]
    found, since = _attention_of(client, shown)
    items = []
    for field_id in shown:
        item = found.get(field_id)
        if item is None:
            continue  # settled between the two reads
        tid = str(item.get("task_id") or field_id)
        budget = item.get("budget")
        quarantined = since[field_id] is not None
        items.append({"item": item, "task_id": tid, "quarantined": quarantined,
                      "budget": sorted(budget.items()) if isinstance(budget, dict) else [],
                      "tried": [_tried(row) for row in item.get("tried") or [] if isinstance(row, dict)],
                      "next_step": next_step(item, quarantined)})
    return {"items": items, "pager": pager}


def _attention_of(client: Client, task_ids: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """These tasks' attention items (those that have one) and DLQ scores (None: not quarantined), in
    one pipeline."""
    if not task_ids:
        return {}, {}
    pipe = client.redis.pipeline(transaction=False)
    pipe.hmget(client.keys.attention, task_ids)
    for tid in task_ids:
        pipe.zscore(client.keys.dlq, tid)
    raw, *scores = pipe.execute()
    items = {t: cast(dict[str, Any], json.loads(text)) for t, text in zip(task_ids, raw, strict=True) if text}
    return items, dict(zip(task_ids, scores, strict=True))


def _tried(row: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in row.items() if k not in ("attempt", "state", "failure_class", "fingerprint")
            and v not in (None, "", [], {}) and not (k in ("cost", "tokens") and not v)}
    return {"attempt": row.get("attempt"), "state": row.get("state"), "failure_class": row.get("failure_class"),
            "fingerprint": row.get("fingerprint"), "rest": sorted((str(k), str(v)) for k, v in rest.items())}


def dlq(client: Client, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``params``: page (of the fingerprint groups, biggest first). A group lists its oldest
    DLQ_TASKS_SHOWN tasks (their quarantine time and attention summary read in one pipeline); its
    bulk forms name its oldest BULK_MAX tasks, the ones a bulk action acts on."""
    page = page_number((params or {}).get("page"))
    everything = sorted(client.reads.dlq_fingerprints().items(), key=lambda g: (-len(g[1]), g[0]))
    pager = paging(len(everything), page, DLQ_GROUPS_PAGE)
    shown = everything[pager["start"]:pager["stop"]]
    listed = [t for _, ids in shown for t in ids[:DLQ_TASKS_SHOWN]]
    items, since = _attention_of(client, listed)
    now = redis_now_ms(client)
    groups = []
    for fp, ids in shown:
        tasks = [{"task_id": t, "since": ago(int(since[t]) if since.get(t) else None, now),
                  "summary": items.get(t, {}).get("summary", ""), "why": items.get(t, {}).get("why_unsafe", "")}
                 for t in ids[:DLQ_TASKS_SHOWN]]
        bulk = ids[:BULK_MAX]
        groups.append({"fingerprint": fp, "count": len(ids), "tasks": tasks, "more": len(ids) - len(tasks),
                       "bulk": len(bulk), "bulk_ids": " ".join(bulk)})
    return {"groups": groups, "total": sum(len(ids) for _, ids in everything), "pager": pager}


def workers(client: Client) -> dict[str, Any]:
    now = redis_now_ms(client)
    rows = []
    for w in live_workers(client):
        leases = [{"attempt": le["attempt"], "task_id": le["attempt"].rpartition("/")[0],
                   "expires": ago(le["lease_expires_ms"], now)} for le in w["leases"]]
        beat = w["last_heartbeat_s_ago"]
        rows.append({**w, "leases": leases,
                     "beat": "never" if beat is None else f"{duration(float(beat) * 1000)} ago"})
    rows.sort(key=lambda r: (not r["alive"], str(r["worker"])))
    return {"workers": rows, "alive": sum(1 for r in rows if r["alive"])}


def limits(client: Client) -> dict[str, Any]:
    """The rate limits and circuit breakers now (Redis clock): each key's setting, units used and left,
    pause, breaker state, deferred claims; the concurrency keys (as ``mcq slots``) and the queue caps (as
    ``mcq caps``)."""
    rows = []
    for st in client.limits.all():
        rows.append({
            "key": st.key, "limit": st.limit, "per": duration(st.window_ms) if st.window_ms else None,
            "source": st.source, "used": st.used, "left": st.left, "paused": st.paused,
            "paused_for": duration(max(0, (st.paused_until_ms or 0) - st.now_ms)) if st.paused else None,
            "why": st.pause_reason if st.paused else None, "deferred": st.deferred,
            "full": st.left == 0 if st.left is not None else False,
            "breaker": st.breaker is not None or st.breaker_state != "closed", "bstate": st.breaker_state,
            "bfor": duration(max(0, (st.breaker_until_ms or 0) - st.now_ms)) if st.breaker_until_ms else None,
            "bwhy": st.breaker_why, "bopened": st.breaker_opened, "bheld": st.breaker_deferred,
            "fallbacks": [fallback_name(f) for f in st.fallbacks]})
    return {"limits": rows, "paused": sum(1 for r in rows if r["paused"]),
            "open": sum(1 for r in rows if r["bstate"] != "closed"), **concurrency_keys(client),
            **queue_caps(client), **spend_ceilings(client), **fair_shares(client)}


def concurrency_keys(client: Client) -> dict[str, Any]:
    """Each concurrency key now (``mcq slots``'s columns): its slots and where they come from, what it does
    when full, running and waiting Attempts, writer fence, claims that waited or were rejected, and its
    holders (oldest first, each with its task and how long it has held the slot, Redis's clock)."""
    statuses = client.slots.all()
    now = redis_now_ms(client) if any(st.holders for st in statuses) else 0
    slots = []
    for st in statuses:
        holders = [{"attempt": aid, "task_id": aid.rpartition("/")[0], "held": duration(max(0, now - at))}
                   for aid, at in sorted(st.holders, key=lambda h: h[1])]
        slots.append({"key": st.key, "slots": st.slots, "family": family_of(st.key) if st.family else None,
                      "each": st.key.endswith(":*"), "source": st.source, "on_full": st.on_full,
                      "running": st.running, "waiting": st.waiting, "fence": st.writer_fence, "waited": st.waited,
                      "rejected": st.rejected, "holders": holders,
                      "full": st.slots is not None and st.running >= st.slots})
    return {"slots": slots, "slots_waiting": sum(r["waiting"] for r in slots)}


def queue_caps(client: Client) -> dict[str, Any]:
    """Each capped queue now (``mcq caps``'s columns): its cap and who set it, the tasks it holds that have
    not ended, the room left at the default priority 5 (and at 9, shed first), its cap by bytes of payload
    and the bytes held, and its oldest due task's wait (Redis's clock)."""
    caps = [{"queue": st.queue, "cap": st.max_depth, "source": st.source, "depth": st.depth,
             "room": st.room(5), "room9": st.room(9), "age": duration(st.age_ms) if st.age_ms else None,
             "bytes": f"{st.bytes:,} of {st.max_bytes:,}" if st.max_bytes is not None else None,
             "full": st.room(5) == 0 or (st.max_bytes is not None and st.bytes >= st.max_bytes)}
            for st in client.caps.all() if st.max_depth is not None or st.max_bytes is not None]
    return {"caps": caps, "caps_full": sum(1 for r in caps if r["full"])}


def spend_ceilings(client: Client) -> dict[str, Any]:
    """Each spend ceiling now (``mcq spend``'s columns): its ceilings, window and where they come from, what
    was spent in the window and what running Attempts reserved, per kind, and the claims it deferred or
    rejected; 'over' when nothing is left of a kind (Attempts of the key wait or are rejected)."""
    rows = []
    for st in client.spend.all():
        kinds = [(kind, cap, spent, held) for kind, cap, spent, held in
                 (("cost", st.cost, st.spent_cost, st.reserved_cost),
                  ("tokens", st.tokens, st.spent_tokens, st.reserved_tokens)) if cap is not None]
        rows.append({"key": st.key, "family": family_of(st.key) if st.family else None, "each": st.key.endswith(":*"),
                     "source": st.source, "on_over": st.on_over, "per": duration(round(st.window_s * 1000))
                     if st.window_s else None, "running": st.running, "deferred": st.deferred,
                     "rejected": st.rejected,
                     "kinds": [{"kind": k, "cap": f"{c:g}" if k == "cost" else f"{c:,}", "spent": f"{s:g}" if
                                k == "cost" else f"{s:,}", "reserved": f"{h:g}" if k == "cost" else f"{h:,}",
                                "over": s + h >= c} for k, c, s, h in kinds],
                     "over": any(s + h >= c for _, c, s, h in kinds)})
    return {"spend": rows, "spend_over": sum(1 for r in rows if r["over"])}


def fair_shares(client: Client) -> dict[str, Any]:
    """Each fairness key now (``mcq fair``'s columns): its weight and where it comes from, and its messages
    waiting in each queue's fair lanes."""
    rows = []
    for st, c in client.fairness.with_caps(client.caps):
        rows.append({"key": st.key, "weight": st.weight, "family": family_of(st.key) if st.family else None,
                     "each": st.key.endswith(":*"), "source": st.source or "default",
                     "queued": sorted(st.queued.items()), "backlog": sum(st.queued.values()),
                     "open": c.open if c else 0, "cap": c.max_open if c else None,
                     "bytes": c.bytes if c else 0, "max_bytes": c.max_bytes if c else None,
                     "full": bool(c and c.max_open is not None and c.open >= c.max_open)})
    return {"fair": rows, "fair_backlogged": sum(1 for r in rows if r["backlog"])}

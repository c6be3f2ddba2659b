"""Every Lua contract against a real redis-server, through the public Client, on both sides of each boundary.

Conventions:
- ``snapshot(q)`` is every key of the test's namespace except the event streams. A refusal must leave it
  equal; the refusal itself must be exactly one new event in the task's stream.
- Times are compared with Redis's clock (``TIME``), never the test process's.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mc_queue
from mc_queue import (
    AttemptNotRunning,
    AttemptState,
    ClaimRejected,
    ExpiredLease,
    FailureClass,
    IdempotencyConflict,
    InvalidArgument,
    InvalidPayload,
    LeaseExpired,
    McqError,
    NamespaceLost,
    ResultConflict,
    RetryRefused,
    StaleFence,
    TaskNotFound,
    TaskState,
    TransitionRefused,
    make_failure,
    reconcile_attempt,
    recover,
)
from mc_queue.contracts.codec import MAX_PAYLOAD_BYTES, canonical_json, digest, model_json
from mc_queue.contracts.history import history
from mc_queue.testing import RedisServer

QUEUE = "jobs"
HANDLER = "build.run"
WORKER = "worker-1"
LONG_LEASE_MS = 60_000
SHORT_LEASE_MS = 150
REASON = "provider returned 429, retrying after the limit reset"
RESULT = {"answer": 42, "files": ["a.py", "b.py"]}
RESULT_REORDERED = {"files": ["a.py", "b.py"], "answer": 42}
OTHER_RESULT = {"answer": 43}
FAILURE = make_failure(FailureClass.PROVIDER, "RateLimited", "429 Too Many Requests")
OTHER_FAILURE = make_failure(FailureClass.VALIDATION, "BadOutput", "the tests did not pass")
OPS = ("renew", "complete", "fail")


# --------------------------------------------------------------------------- helpers


def redis_now_ms(q: mc_queue.Client) -> int:
    s, us = q.redis.time()
    return int(s) * 1000 + int(us) // 1000


def wait_past(q: mc_queue.Client, ms: int, timeout: float = 5.0) -> None:
    """Sleep until Redis's clock has passed ``ms``."""
    deadline = time.monotonic() + timeout
    while redis_now_ms(q) <= ms:
        assert time.monotonic() < deadline, "Redis's clock did not reach the deadline"
        time.sleep(0.01)


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    """Every key of the namespace and its value, except the append-only event streams and the metrics
    counters (a refusal is counted there, as it is recorded in the events)."""
    out: dict[str, Any] = {}
    for key in sorted(q.redis.scan_iter(match=q.keys.tag + "*", count=1000)):
        if key == q.keys.stats:
            continue
        kind = q.redis.type(key)
        if kind == "hash":
            out[key] = q.redis.hgetall(key)
        elif kind == "zset":
            out[key] = q.redis.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[key] = sorted(q.redis.smembers(key))
        elif kind == "string":
            out[key] = q.redis.get(key)
        elif kind not in ("stream", "list"):  # histories: refusals append to them
            out[key] = kind
    return out


def events(q: mc_queue.Client, task_id: str) -> list[dict[str, str]]:
    tk = q.keys.task(task_id)
    return [dict(f, id=i) for i, f in history(q.redis.hgetall(tk.task), q.redis.lrange(tk.events, 0, -1),
                                               q.redis.hgetall(tk.attempts))]


def event_types(q: mc_queue.Client, task_id: str) -> list[str]:
    return [e["type"] for e in events(q, task_id)]


def task_hash(q: mc_queue.Client, task_id: str) -> dict[str, str]:
    return q.redis.hgetall(q.keys.task(task_id).task)


def fence_of(q: mc_queue.Client, task_id: str) -> str:
    """The task's fence counter (field fence of its hash: HINCRBY at each claim, expiry and cancel ack)."""
    return str(q.redis.hget(q.keys.task(task_id).task, "fence") or "0")  # (no key of its own: checked below)


def attempts_hash(q: mc_queue.Client, task_id: str) -> dict[str, str]:
    return q.redis.hgetall(q.keys.task(task_id).attempts)


def attempt_fields(q: mc_queue.Client, task_id: str, n: int) -> dict[str, str]:
    p = f"{n}."
    return {k[len(p):]: v for k, v in attempts_hash(q, task_id).items() if k.startswith(p)}


def counts(q: mc_queue.Client, queue: str = QUEUE) -> dict[str, int]:
    return q.reads.status().get(queue, {}).get("counts", {})


def refused(q: mc_queue.Client, task_id: str, exc_type: type[BaseException], fn: Callable[[], Any],
            event: str | None) -> tuple[Any, dict[str, str] | None]:
    """Run ``fn``, expect ``exc_type``, nothing changed but exactly one new ``event`` (or none)."""
    before = snapshot(q)
    n_events = len(events(q, task_id))
    with pytest.raises(exc_type) as info:
        fn()
    assert snapshot(q) == before, "a refused call changed state"
    new = events(q, task_id)[n_events:]
    assert [e["type"] for e in new] == ([event] if event else [])
    return info.value, (new[0] if new else None)


def enqueue(q: mc_queue.Client, n: int = 0, queue: str = QUEUE) -> mc_queue.Task:
    return q.producer.enqueue(queue, HANDLER, {"n": n})


def fenced(q: mc_queue.Client, op: str, attempt_id: str, fence: int, *, worker: str = WORKER,
           result: Any = RESULT, failure: Any = FAILURE) -> Any:
    if op == "renew":
        return q.leases.renew_lease(attempt_id, fence, worker_id=worker)
    if op == "complete":
        return q.leases.complete_attempt(attempt_id, fence, result, worker_id=worker)
    if op == "fail":
        return q.leases.fail_attempt(attempt_id, fence, failure, worker_id=worker)
    raise AssertionError(op)


def op_digest(op: str) -> str:
    if op == "renew":
        return "renew:"  # renew records "renew:<lease length>": checked as a prefix
    if op == "complete":
        return digest(canonical_json(RESULT))
    return digest(model_json(FAILURE))


def check_stale_event(ev: dict[str, str] | None, exc: Any, *, op: str, n: int, presented: int, current: int,
                      refusal: str) -> None:
    assert ev is not None
    assert ev["type"] == "stale_write_refused"
    assert ev["attempt"] == str(n)
    assert ev["op"] == op
    assert ev["refusal"] == refusal
    assert ev["presented_fence"] == str(presented)
    assert ev["current_fence"] == str(current)
    assert ev["worker"] == WORKER
    if op == "renew":
        assert ev["payload_digest"].startswith(op_digest(op))
    else:
        assert ev["payload_digest"] == op_digest(op)
    assert exc.presented_fence == presented
    assert exc.current_fence == current


def claimed(q: mc_queue.Client, lease_ms: int = LONG_LEASE_MS, n: int = 0) -> tuple[mc_queue.Task, mc_queue.Lease]:
    task = enqueue(q, n)
    return task, q.leases.claim_attempt(task.id, WORKER, lease_ms)


def failed_task(q: mc_queue.Client, n: int = 0) -> tuple[mc_queue.Task, mc_queue.Lease]:
    task, lease = claimed(q, n=n)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id=WORKER)
    return task, lease


def suspect_task(q: mc_queue.Client, n: int = 0) -> tuple[mc_queue.Task, mc_queue.Lease]:
    task, lease = claimed(q, SHORT_LEASE_MS, n=n)
    wait_past(q, lease.expires_at_ms)
    assert [e.attempt_id for e in q.maintenance.expire_leases()] == [lease.attempt_id]
    return task, lease


# --------------------------------------------------------------------------- enqueue


def test_enqueue_creates_task_with_one_pending_first_dispatch_attempt(q: mc_queue.Client) -> None:
    t0 = redis_now_ms(q)
    task = q.producer.enqueue(QUEUE, HANDLER, {"b": 2, "a": [1, 2]})
    t1 = redis_now_ms(q)

    assert task.state == TaskState.PENDING
    assert task.queue == QUEUE and task.handler == HANDLER
    assert task.payload == {"a": [1, 2], "b": 2}
    assert task.payload_digest == digest(canonical_json({"a": [1, 2], "b": 2}))
    assert task.fence == 0 and task.attempt_count == 1 and task.active_attempt == 1
    assert len(task.attempts) == 1
    a = task.attempts[0]
    assert a.number == 1 and a.id == f"{task.id}/1"
    assert a.state == AttemptState.PENDING
    assert a.reason == "first dispatch" and a.worktree == a.id  # (filled in by the reader: not stored)
    stored = set(q.redis.hkeys(q.keys.task(task.id).attempts))
    assert not {"1.reason", "1.worktree", "1.created_at", "1.due_at"} & stored
    assert a.created_at == a.due_at == task.created_at  # the task's, filled in by the reader
    assert task.idempotency_key is None and not q.redis.hexists(q.keys.task(task.id).task, "idem_key")
    assert a.previous is None and a.fence is None and a.worker_id is None
    assert a.manifest == task.manifest and a.manifest is not None
    assert a.manifest.handler == HANDLER and a.manifest.payload_digest == task.payload_digest
    assert [e.type for e in task.events] == ["task_created", "attempt_created"]
    assert task.events[1].attempt == 1 and task.events[1].fields["reason"] == "first dispatch"
    assert task.events[0].fields["payload_digest"] == task.payload_digest
    assert task.events[0].fields["handler"] == HANDLER
    # Nothing of it is stored: the task hash implies both events (and has no history key yet).
    assert not q.redis.exists(q.keys.task(task.id).events)
    assert [e.id for e in task.events] == [f"{task_hash(q, task.id)['created_at']}-{n}" for n in (0, 1)]
    assert q.reads.get_task(task.id).events == task.events
    score = q.redis.zscore(q.keys.pending(QUEUE), task.id)
    assert score is not None and t0 <= score <= t1
    assert counts(q) == {"pending": 1}


def test_the_first_stored_event_comes_after_the_two_enqueue_implies_even_with_the_clock_behind(
        q: mc_queue.Client) -> None:
    """Enqueue stores no event (the task hash implies task_created and attempt_created, ids
    '<created_at>-0' and '-1'): the first one stored must come after them, in the same millisecond and
    when Redis's clock is behind the task's created_at (a failover to a server whose clock is late)."""
    now = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    late = q.producer.enqueue(QUEUE, HANDLER, {"n": 2})
    ahead = redis_now_ms(q) + 3_600_000
    q.redis.hset(q.keys.task(late.id).task, "created_at", str(ahead))  # Redis's clock is an hour behind it
    q.redis.hset(q.keys.task(late.id).attempts, "1.due_at", str(ahead - 7_200_000))  # (due all the same)
    for t in (now, late):
        q.leases.claim_attempt(t.id, "w1")
        ids = [e.id for e in q.reads.get_task(t.id).events]
        order = [tuple(int(x) for x in i.split("-")) for i in ids]
        assert order == sorted(order) and len(set(ids)) == len(ids) == 3, ids
    assert q.reads.get_task(late.id).events[2].id == f"{ahead}-2"
    # A refusal about a queued task (no history key yet) starts its history: it is not sent to the log.
    third = q.producer.enqueue(QUEUE, HANDLER, {"n": 3})
    with pytest.raises(mc_queue.IdempotencyConflict):
        q.producer.enqueue(QUEUE, HANDLER, {"n": 4}, task_id=third.id)
    assert [e.type for e in q.reads.get_task(third.id).events] == ["task_created", "attempt_created", "enqueue_refused"]


def test_a_task_written_before_enqueue_stopped_storing_its_events_is_read_as_stored(q: mc_queue.Client) -> None:
    """A task hash without 'actor' (an earlier version's) stored both events itself: nothing is implied."""
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    tk = q.keys.task(t.id)
    c = task_hash(q, t.id)["created_at"]
    q.redis.hdel(tk.task, "actor")
    q.redis.rpush(tk.events, f'["{c}-0","type","task_created","actor","old"]',
                  f'["{c}-1","type","attempt_created","attempt","1","actor","old"]')
    q.leases.claim_attempt(t.id, "w1")
    events = q.reads.get_task(t.id).events
    assert [(e.type, e.fields.get("actor")) for e in events[:2]] == [("task_created", "old"),
                                                                      ("attempt_created", "old")]
    assert [e.type for e in events[2:]] == ["attempt_claimed"] and events[2].id > events[1].id


def test_enqueue_same_idempotency_key_same_payload_returns_same_task(q: mc_queue.Client) -> None:
    first = q.producer.enqueue(QUEUE, HANDLER, {"x": 1, "y": {"p": 1, "q": 2}}, "order-17")
    before = snapshot(q)
    again = q.producer.enqueue(QUEUE, HANDLER, {"y": {"q": 2, "p": 1}, "x": 1}, "order-17")
    assert again.id == first.id
    assert snapshot(q) == before
    assert event_types(q, first.id) == ["task_created", "attempt_created"]
    assert counts(q) == {"pending": 1}


@pytest.mark.parametrize("change", ["payload", "handler", "queue"])
def test_enqueue_same_idempotency_key_different_request_conflicts_and_writes_nothing(
        q: mc_queue.Client, change: str) -> None:
    first = q.producer.enqueue(QUEUE, HANDLER, {"x": 1}, "order-17")
    before = snapshot(q)
    counts_before = {queue: s["counts"] for queue, s in q.reads.status().items()}
    queue = "other" if change == "queue" else QUEUE
    handler = "build.other" if change == "handler" else HANDLER
    payload = {"x": 2} if change == "payload" else {"x": 1}
    with pytest.raises(IdempotencyConflict) as info:
        q.producer.enqueue(queue, handler, payload, "order-17")
    assert first.id in str(info.value)
    assert snapshot(q) == before
    assert {queue: s["counts"] for queue, s in q.reads.status().items()} == counts_before
    assert event_types(q, first.id) == ["task_created", "attempt_created"]


def test_enqueue_same_task_id_is_idempotent_and_conflicts_on_a_different_payload(q: mc_queue.Client) -> None:
    first = enqueue(q, 1)
    before = snapshot(q)
    assert q.producer.enqueue(QUEUE, HANDLER, {"n": 1}, task_id=first.id).id == first.id
    assert snapshot(q) == before
    with pytest.raises(IdempotencyConflict):
        q.producer.enqueue(QUEUE, HANDLER, {"n": 2}, task_id=first.id)
    assert snapshot(q) == before


class _Opaque:
    pass


@pytest.mark.parametrize("payload", [
    pytest.param([1, 2], id="list"),
    pytest.param("text", id="str"),
    pytest.param(None, id="none"),
    pytest.param(7, id="int"),
    pytest.param({"x": float("nan")}, id="nan"),
    pytest.param({"x": float("inf")}, id="inf"),
    pytest.param({"x": _Opaque()}, id="object"),
    pytest.param({"x": {1, 2}}, id="set"),
    pytest.param({"x": b"bytes"}, id="bytes"),
    pytest.param({1: "a", "b": 2}, id="mixed-keys"),
    pytest.param({"x": "a" * MAX_PAYLOAD_BYTES}, id="too-large"),
])
def test_enqueue_invalid_payload_is_refused_and_writes_nothing(q: mc_queue.Client, payload: Any) -> None:
    q.backend.open_namespace()
    before = snapshot(q)
    with pytest.raises(InvalidPayload):
        q.producer.enqueue(QUEUE, HANDLER, payload)
    assert snapshot(q) == before
    assert q.reads.status() == {}


def test_enqueue_payload_size_limit_both_sides(q: mc_queue.Client) -> None:
    overhead = len(canonical_json({"x": ""}).encode())
    at_limit = {"x": "a" * (MAX_PAYLOAD_BYTES - overhead)}
    assert len(canonical_json(at_limit).encode()) == MAX_PAYLOAD_BYTES
    task = q.producer.enqueue(QUEUE, HANDLER, at_limit)
    assert task.payload == at_limit
    before = snapshot(q)
    with pytest.raises(InvalidPayload):
        q.producer.enqueue(QUEUE, HANDLER, {"x": "a" * (MAX_PAYLOAD_BYTES - overhead + 1)})
    assert snapshot(q) == before


@pytest.mark.parametrize("queue", ["", "-dash-first", "has space", "with:colon", "with/slash", "{tag}", "a" * 65, None])
def test_enqueue_invalid_queue_name_is_refused(q: mc_queue.Client, queue: Any) -> None:
    q.backend.open_namespace()
    before = snapshot(q)
    with pytest.raises(InvalidArgument):
        q.producer.enqueue(queue, HANDLER, {"x": 1})
    assert snapshot(q) == before


@pytest.mark.parametrize("handler", ["", "has space", "bad/slash", "{tag}", "h" * 129, None, 5])
def test_enqueue_invalid_handler_is_refused(q: mc_queue.Client, handler: Any) -> None:
    q.backend.open_namespace()
    before = snapshot(q)
    with pytest.raises(InvalidArgument):
        q.producer.enqueue(QUEUE, handler, {"x": 1})
    assert snapshot(q) == before


def test_enqueue_longest_valid_queue_and_handler_are_accepted(q: mc_queue.Client) -> None:
    task = q.producer.enqueue("q" * 64, "h" * 128, {"x": 1})
    assert task.queue == "q" * 64 and task.handler == "h" * 128


# --------------------------------------------------------------------------- claim


def test_claim_moves_pending_to_running_with_fence_one(q: mc_queue.Client) -> None:
    task = enqueue(q)
    lease = q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS)
    assert lease.fence == 1 and lease.number == 1 and lease.attempt_id == f"{task.id}/1"
    t = q.reads.get_task(task.id)
    assert t.state == TaskState.RUNNING and t.fence == 1
    a = t.attempts[0]
    assert a.state == AttemptState.RUNNING and a.fence == 1 and a.worker_id == WORKER
    assert a.lease_ms == LONG_LEASE_MS
    assert q.redis.zscore(q.keys.pending(QUEUE), task.id) is None
    assert q.redis.zscore(q.keys.leases, lease.attempt_id) == lease.expires_at_ms
    assert counts(q) == {"running": 1}
    ev = events(q, task.id)[-1]
    assert ev["type"] == "attempt_claimed" and ev["fence"] == "1" and ev["worker"] == WORKER


def test_fences_strictly_increase_across_claims_of_a_task(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    fences = [lease.fence]
    q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id=WORKER)
    q.operator.retry_task(task.id, REASON)
    lease = q.leases.claim_attempt(task.id, WORKER, SHORT_LEASE_MS)
    fences.append(lease.fence)
    wait_past(q, lease.expires_at_ms)
    q.maintenance.expire_leases()  # bumps the fence once more
    reconcile_attempt(q, lease.attempt_id)
    q.operator.retry_task(task.id, REASON)
    fences.append(q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS).fence)
    assert fences == [1, 2, 4]


def test_second_claim_is_refused_with_claim_refused_event(q: mc_queue.Client) -> None:
    task, _ = claimed(q)
    exc, ev = refused(q, task.id, ClaimRejected, lambda: q.leases.claim_attempt(task.id, "worker-2", LONG_LEASE_MS),
                      "claim_refused")
    assert ev is not None and ev["worker"] == "worker-2" and ev["holder"] == WORKER
    assert WORKER in str(exc)


@pytest.mark.parametrize("state", ["running", "succeeded", "failed", "suspect"])
def test_claim_of_a_task_not_pending_is_refused(q: mc_queue.Client, state: str) -> None:
    task, lease = claimed(q, SHORT_LEASE_MS if state == "suspect" else LONG_LEASE_MS)
    if state == "succeeded":
        q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER)
    elif state == "failed":
        q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id=WORKER)
    elif state == "suspect":
        wait_past(q, lease.expires_at_ms)
        q.maintenance.expire_leases()
    _, ev = refused(q, task.id, ClaimRejected, lambda: q.leases.claim_attempt(task.id, "worker-2", LONG_LEASE_MS),
                    "claim_refused")
    assert ev is not None and ev["worker"] == "worker-2" and ev["reason"]


def test_claim_resent_with_same_request_id_returns_the_same_lease(q: mc_queue.Client) -> None:
    task = enqueue(q)
    lease = q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS, request_id="req-1")
    before = snapshot(q)
    n_events = len(events(q, task.id))
    again = q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS, request_id="req-1")
    assert again == lease
    assert snapshot(q) == before  # fence, claim sequence, lease: nothing bumped
    assert len(events(q, task.id)) == n_events
    refused(q, task.id, ClaimRejected, lambda: q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS,
                                                                      request_id="req-2"),
            "claim_refused")


def test_claim_lease_expiry_is_computed_from_redis_time(q: mc_queue.Client) -> None:
    task = enqueue(q)
    t0 = redis_now_ms(q)
    lease = q.leases.claim_attempt(task.id, WORKER, 5_000)
    t1 = redis_now_ms(q)
    assert t0 + 5_000 <= lease.expires_at_ms <= t1 + 5_000
    f = attempt_fields(q, task.id, 1)
    assert int(f["lease_exp"]) == lease.expires_at_ms
    assert t0 <= int(f["started_at"]) <= t1
    assert int(f["started_at"]) + 5_000 == lease.expires_at_ms
    assert q.redis.zscore(q.keys.leases, lease.attempt_id) == lease.expires_at_ms


@pytest.mark.parametrize(("worker", "lease_ms"), [("", 1000), (WORKER, 0), (WORKER, -5)])
def test_claim_bad_arguments_are_refused_and_write_nothing(q: mc_queue.Client, worker: str, lease_ms: int) -> None:
    task = enqueue(q)
    refused(q, task.id, InvalidArgument, lambda: q.leases.claim_attempt(task.id, worker, lease_ms), None)


def test_claim_with_one_ms_lease_is_accepted(q: mc_queue.Client) -> None:
    task = enqueue(q)
    assert q.leases.claim_attempt(task.id, WORKER, 1).fence == 1


def test_claim_of_a_missing_task_is_refused(q: mc_queue.Client) -> None:
    missing = mc_queue.contracts.keys.new_task_id(QUEUE)
    q.backend.open_namespace()
    before = snapshot(q)
    with pytest.raises(TaskNotFound):
        q.leases.claim_attempt(missing, WORKER)
    assert snapshot(q) == before


def test_backoff_attempt_is_refused_before_due_and_claimable_after(q: mc_queue.Client) -> None:
    task, _ = failed_task(q)
    attempt = q.operator.retry_task(task.id, REASON, delay_ms=400)
    assert attempt.due_at is not None
    due_ms = int(attempt_fields(q, task.id, 2)["due_at"])
    assert q.reads.get_task(task.id).state == TaskState.BACKOFF
    assert counts(q) == {"backoff": 1}
    assert redis_now_ms(q) < due_ms
    exc, _ = refused(q, task.id, ClaimRejected, lambda: q.leases.claim_attempt(task.id, WORKER), "claim_refused")
    assert "not due" in str(exc)
    wait_past(q, due_ms - 1)
    lease = q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS)
    assert lease.number == 2 and lease.fence == 2
    assert counts(q) == {"running": 1}


# --------------------------------------------------------------------------- renew / complete / fail


def test_renew_with_current_fence_and_live_lease_extends_from_redis_time(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    n_events = len(events(q, task.id))
    t0 = redis_now_ms(q)
    exp = q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id=WORKER, lease_ms=9_000)
    t1 = redis_now_ms(q)
    assert t0 + 9_000 <= exp <= t1 + 9_000
    f = attempt_fields(q, task.id, 1)
    assert int(f["lease_exp"]) == exp and f["state"] == "running" and t0 <= int(f["hb_at"]) <= t1
    assert q.redis.zscore(q.keys.leases, lease.attempt_id) == exp
    assert fence_of(q, task.id) == "1"
    assert len(events(q, task.id)) == n_events
    # without lease_ms: the length granted at claim
    t0 = redis_now_ms(q)
    exp = q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id=WORKER)
    assert t0 + LONG_LEASE_MS <= exp <= redis_now_ms(q) + LONG_LEASE_MS


def test_complete_with_current_fence_and_live_lease_succeeds(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    attempt = q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER, cost=0.25, tokens=99)
    assert attempt.state == AttemptState.SUCCEEDED and attempt.result == RESULT
    assert attempt.cost == 0.25 and attempt.tokens == 99 and attempt.ended_at is not None
    t = q.reads.get_task(task.id)
    assert t.state == TaskState.SUCCEEDED and t.result == RESULT and t.active_attempt is None
    assert q.redis.zscore(q.keys.leases, lease.attempt_id) is None
    assert counts(q) == {"succeeded": 1}
    ev = events(q, task.id)[-1]
    assert ev["type"] == "attempt_succeeded" and ev["fence"] == "1"
    assert ev["result_digest"] == digest(canonical_json(RESULT))


def test_fail_with_current_fence_and_live_lease_records_the_failure(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    attempt = q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id=WORKER)
    assert attempt.state == AttemptState.FAILED and attempt.failure == FAILURE
    t = q.reads.get_task(task.id)
    assert t.state == TaskState.FAILED and t.active_attempt is None
    assert q.redis.zscore(q.keys.leases, lease.attempt_id) is None
    assert counts(q) == {"failed": 1}
    ev = events(q, task.id)[-1]
    assert ev["type"] == "attempt_failed" and ev["failure_class"] == "provider"
    assert ev["fingerprint"] == FAILURE.fingerprint


@pytest.mark.parametrize("op", OPS)
def test_fenced_write_with_stale_fence_is_refused(q: mc_queue.Client, op: str) -> None:
    task, lease = claimed(q)
    exc, ev = refused(q, task.id, StaleFence, lambda: fenced(q, op, lease.attempt_id, lease.fence - 1),
                      "stale_write_refused")
    check_stale_event(ev, exc, op=op, n=1, presented=0, current=1, refusal="stale_fence")
    fenced(q, op, lease.attempt_id, lease.fence)  # the holder of the current fence is unaffected


@pytest.mark.parametrize("op", OPS)
def test_fenced_write_with_current_fence_after_lease_expired_is_refused(q: mc_queue.Client, op: str) -> None:
    task, lease = claimed(q, SHORT_LEASE_MS)
    wait_past(q, lease.expires_at_ms)
    exc, ev = refused(q, task.id, LeaseExpired, lambda: fenced(q, op, lease.attempt_id, lease.fence),
                      "stale_write_refused")
    check_stale_event(ev, exc, op=op, n=1, presented=1, current=1, refusal="lease_expired")


@pytest.mark.parametrize(("settle", "op"), [
    ("complete", "renew"), ("complete", "fail"), ("fail", "renew"), ("fail", "complete"),
])
def test_fenced_write_after_attempt_settled_is_refused(q: mc_queue.Client, settle: str, op: str) -> None:
    task, lease = claimed(q)
    fenced(q, settle, lease.attempt_id, lease.fence)
    exc, ev = refused(q, task.id, AttemptNotRunning, lambda: fenced(q, op, lease.attempt_id, lease.fence),
                      "stale_write_refused")
    settled = "succeeded" if settle == "complete" else "failed"
    check_stale_event(ev, exc, op=op, n=1, presented=1, current=1, refusal=f"attempt_{settled}")


@pytest.mark.parametrize("op", ["renew", "complete"])
def test_fenced_write_on_a_superseded_attempt_is_refused_as_stale(q: mc_queue.Client, op: str) -> None:
    task, lease = failed_task(q)
    q.operator.retry_task(task.id, REASON)  # attempt 2 exists; the task's fence is still 1
    exc, ev = refused(q, task.id, StaleFence, lambda: fenced(q, op, lease.attempt_id, lease.fence),
                      "stale_write_refused")
    check_stale_event(ev, exc, op=op, n=1, presented=1, current=1, refusal="stale_fence")


def test_complete_twice_with_same_fence_and_result_is_a_noop(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    first = q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER)
    before = snapshot(q)
    n_events = len(events(q, task.id))
    again = q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT_REORDERED, worker_id=WORKER)
    assert again == first
    assert snapshot(q) == before
    assert len(events(q, task.id)) == n_events
    assert event_types(q, task.id).count("attempt_succeeded") == 1


def test_complete_with_same_fence_and_different_result_conflicts(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER)
    refused(q, task.id, ResultConflict,
            lambda: q.leases.complete_attempt(lease.attempt_id, lease.fence, OTHER_RESULT, worker_id=WORKER),
            "completion_conflict")
    assert q.reads.get_task(task.id).attempts[0].result == RESULT


def test_fail_twice_with_same_failure_is_a_noop(q: mc_queue.Client) -> None:
    task, lease = failed_task(q)
    before = snapshot(q)
    n_events = len(events(q, task.id))
    again = q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id=WORKER)
    assert again.state == AttemptState.FAILED and again.failure == FAILURE
    assert snapshot(q) == before
    assert len(events(q, task.id)) == n_events
    assert event_types(q, task.id).count("attempt_failed") == 1


def test_fail_with_same_fence_and_different_failure_conflicts(q: mc_queue.Client) -> None:
    task, lease = failed_task(q)
    before = snapshot(q)
    with pytest.raises(ResultConflict):
        q.leases.fail_attempt(lease.attempt_id, lease.fence, OTHER_FAILURE, worker_id=WORKER)
    assert snapshot(q) == before
    assert q.reads.get_task(task.id).attempts[0].failure == FAILURE


# --------------------------------------------------------------------------- expire


def test_expire_leases_expires_only_leases_past_their_expiry(q: mc_queue.Client) -> None:
    live, live_lease = claimed(q, LONG_LEASE_MS, n=1)
    dead, dead_lease = claimed(q, SHORT_LEASE_MS, n=2)
    wait_past(q, dead_lease.expires_at_ms)
    live_before = (task_hash(q, live.id), attempts_hash(q, live.id), events(q, live.id),
                   q.redis.zscore(q.keys.leases, live_lease.attempt_id))

    expired = q.maintenance.expire_leases(actor="sweeper-1")

    assert expired == [ExpiredLease(dead_lease.attempt_id, old_fence=1, new_fence=2)]
    assert (task_hash(q, live.id), attempts_hash(q, live.id), events(q, live.id),
            q.redis.zscore(q.keys.leases, live_lease.attempt_id)) == live_before
    f = attempt_fields(q, dead.id, 1)
    assert f["state"] == "suspect" and int(f["suspect_at"]) >= dead_lease.expires_at_ms
    assert f["fence"] == "1"  # the attempt keeps the fence it ran with
    t = task_hash(q, dead.id)
    assert fence_of(q, dead.id) == "2" and t["state"] == "running" and t["active"] == "1"
    assert q.redis.zscore(q.keys.leases, dead_lease.attempt_id) is None
    assert q.redis.zscore(q.keys.suspect, dead_lease.attempt_id) is not None
    ev = events(q, dead.id)[-1]
    assert ev["type"] == "lease_expired" and ev["fence"] == "1" and ev["new_fence"] == "2"
    assert ev["worker"] == WORKER and ev["actor"] == "sweeper-1"

    before = snapshot(q)
    n_events = len(events(q, dead.id))
    assert q.maintenance.expire_leases() == []
    assert snapshot(q) == before
    assert len(events(q, dead.id)) == n_events


def test_the_lease_key_dies_at_exactly_the_indexed_expiry(q: mc_queue.Client) -> None:
    """The lease key and the expiry index agree to the millisecond, at claim and at renew: a key that
    outlived its index entry made expire() answer 'lease is live' for a lease the index called due."""
    task, lease = claimed(q)
    tk = q.keys.task(task.id)
    member = lease.attempt_id
    assert q.redis.execute_command("PEXPIRETIME", tk.lease) == int(q.redis.zscore(q.keys.leases, member) or 0)
    assert int(q.redis.zscore(q.keys.leases, member) or 0) == lease.expires_at_ms
    new_exp = q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id=WORKER, lease_ms=LONG_LEASE_MS + 5000)
    assert q.redis.execute_command("PEXPIRETIME", tk.lease) == new_exp
    assert int(q.redis.zscore(q.keys.leases, member) or 0) == new_exp


@pytest.mark.parametrize("op", OPS)
def test_old_holder_is_refused_after_its_lease_expired(q: mc_queue.Client, op: str) -> None:
    task, lease = suspect_task(q)
    exc, ev = refused(q, task.id, StaleFence, lambda: fenced(q, op, lease.attempt_id, lease.fence),
                      "stale_write_refused")
    check_stale_event(ev, exc, op=op, n=1, presented=1, current=2, refusal="stale_fence")


@pytest.mark.parametrize("op", OPS)
def test_old_holder_is_refused_as_stale_after_reconciliation(q: mc_queue.Client, op: str) -> None:
    """A zombie worker coming back after its Attempt was reconciled gets StaleFence, like any stale holder."""
    task, lease = suspect_task(q)
    reconcile_attempt(q, lease.attempt_id)
    exc, ev = refused(q, task.id, StaleFence, lambda: fenced(q, op, lease.attempt_id, lease.fence),
                      "stale_write_refused")
    check_stale_event(ev, exc, op=op, n=1, presented=1, current=2, refusal="stale_fence")


@pytest.mark.parametrize("op", OPS)
def test_zombie_holder_is_refused_on_the_next_attempt(q: mc_queue.Client, op: str) -> None:
    task, lease = suspect_task(q)
    reconcile_attempt(q, lease.attempt_id)
    q.operator.retry_task(task.id, REASON)
    new = q.leases.claim_attempt(task.id, "worker-2", LONG_LEASE_MS)
    assert new.fence == 3
    exc, ev = refused(q, task.id, StaleFence, lambda: fenced(q, op, new.attempt_id, lease.fence),
                      "stale_write_refused")
    check_stale_event(ev, exc, op=op, n=2, presented=1, current=3, refusal="stale_fence")


# --------------------------------------------------------------------------- reconcile


@pytest.mark.parametrize("state", ["pending", "running", "succeeded", "failed"])
def test_reconcile_is_refused_unless_the_attempt_is_suspect(q: mc_queue.Client, state: str) -> None:
    task = enqueue(q)
    aid = f"{task.id}/1"
    if state != "pending":
        lease = q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS)
        if state in ("succeeded", "failed"):
            fenced(q, "complete" if state == "succeeded" else "fail", lease.attempt_id, lease.fence)
    _, ev = refused(q, task.id, TransitionRefused, lambda: reconcile_attempt(q, aid), "reconcile_refused")
    assert ev is not None and ev["attempt_state"] == state and ev["attempt"] == "1"


def test_reconcile_settles_a_suspect_attempt_as_failed_executor_with_evidence(q: mc_queue.Client) -> None:
    task, lease = suspect_task(q)
    attempt = reconcile_attempt(q, lease.attempt_id, actor="reconciler-1")
    assert attempt.state == AttemptState.FAILED
    assert attempt.failure is not None and attempt.failure.failure_class == FailureClass.EXECUTOR
    assert attempt.settled_by == "reconcile"
    assert isinstance(attempt.evidence, dict) and attempt.evidence
    t = q.reads.get_task(task.id)
    assert t.state == TaskState.FAILED and t.active_attempt is None
    assert t.attempts[0] == attempt
    assert q.redis.zscore(q.keys.suspect, lease.attempt_id) is None
    assert counts(q) == {"failed": 1}
    evs = events(q, task.id)
    assert [e["type"] for e in evs[-2:]] == ["reconciling_started", "attempt_reconciled"]
    assert evs[-1]["failure_class"] == "executor" and evs[-1]["actor"] == "reconciler-1"
    assert evs[-1]["evidence"] == canonical_json(attempt.evidence)

    refused(q, task.id, McqError, lambda: reconcile_attempt(q, lease.attempt_id), "reconcile_refused")


# --------------------------------------------------------------------------- retry


@pytest.mark.parametrize("situation", ["pending", "running", "suspect", "succeeded"])
def test_retry_is_refused_while_an_attempt_is_active_or_after_success(q: mc_queue.Client, situation: str) -> None:
    if situation == "suspect":
        task, _ = suspect_task(q)
    else:
        task = enqueue(q)
        if situation != "pending":
            lease = q.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS)
            if situation == "succeeded":
                q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER)
    _, ev = refused(q, task.id, RetryRefused, lambda: q.operator.retry_task(task.id, REASON), "retry_refused")
    assert ev is not None and ev["reason"]


def test_retry_is_refused_when_the_latest_attempt_succeeded_whatever_the_task_says(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER)
    q.redis.hset(q.keys.task(task.id).task, "state", "blocked")  # only the attempt rule can refuse now
    _, ev = refused(q, task.id, RetryRefused, lambda: q.operator.retry_task(task.id, REASON), "retry_refused")
    assert ev is not None and "succeeded" in ev["reason"]


@pytest.mark.parametrize("reason", ["too short", "   too short    ", "", " " * 30])
def test_retry_is_refused_with_a_reason_under_ten_characters(q: mc_queue.Client, reason: str) -> None:
    task, _ = failed_task(q)
    _, ev = refused(q, task.id, RetryRefused, lambda: q.operator.retry_task(task.id, reason), "retry_refused")
    assert ev is not None and "ten characters" in ev["reason"]


def test_retry_reason_of_exactly_ten_characters_after_trimming_is_accepted(q: mc_queue.Client) -> None:
    task, _ = failed_task(q)
    assert q.operator.retry_task(task.id, "   0123456789   ").reason == "0123456789"


def test_retry_reason_length_counts_characters_not_bytes(q: mc_queue.Client) -> None:
    """Five characters are too short, even when UTF-8 spends ten bytes on them."""
    task, _ = failed_task(q)
    refused(q, task.id, RetryRefused, lambda: q.operator.retry_task(task.id, "ééééé"), "retry_refused")


def test_retry_after_failure_appends_a_pending_attempt(q: mc_queue.Client) -> None:
    task, _ = failed_task(q)
    attempt = q.operator.retry_task(task.id, f"  {REASON}  ", "a smaller batch stays under the limit",
                           actor="operator-1", request_id="retry-1")
    assert attempt.number == 2 and attempt.id == f"{task.id}/2"
    assert attempt.state == AttemptState.PENDING
    assert attempt.previous == f"{task.id}/1"
    assert attempt.reason == REASON
    assert attempt.hypothesis == "a smaller batch stays under the limit"
    t = q.reads.get_task(task.id)
    assert attempt.manifest == t.manifest == t.attempts[0].manifest and attempt.manifest is not None
    assert t.state == TaskState.PENDING and t.attempt_count == 2 and t.active_attempt == 2 and t.fence == 1
    assert t.attempts[1] == attempt
    assert q.redis.zscore(q.keys.pending(QUEUE), task.id) is not None
    assert counts(q) == {"pending": 1}
    ev = events(q, task.id)[-1]
    assert ev["type"] == "attempt_created" and ev["attempt"] == "2" and ev["retry_of"] == "1"
    assert ev["reason"] == REASON and ev["actor"] == "operator-1"

    before = snapshot(q)
    n_events = len(events(q, task.id))
    again = q.operator.retry_task(task.id, f"  {REASON}  ", "a smaller batch stays under the limit",
                         actor="operator-1", request_id="retry-1")
    assert again == attempt
    assert snapshot(q) == before
    assert len(events(q, task.id)) == n_events
    refused(q, task.id, RetryRefused, lambda: q.operator.retry_task(task.id, REASON, request_id="retry-2"),
            "retry_refused")


def test_retry_negative_delay_is_refused(q: mc_queue.Client) -> None:
    task, _ = failed_task(q)
    refused(q, task.id, InvalidArgument, lambda: q.operator.retry_task(task.id, REASON, delay_ms=-1), None)


@pytest.mark.parametrize("reason", ["\t123456789\n", "a reason that\nforges a second line", "nul\x00 in a reason"])
def test_retry_reason_with_a_control_character_is_bad_input(q: mc_queue.Client, reason: str) -> None:
    task, _ = failed_task(q)
    refused(q, task.id, InvalidArgument, lambda: q.operator.retry_task(task.id, reason), None)


# --------------------------------------------------------------------------- immutability


def _try_everything(q: mc_queue.Client, task_id: str, attempt_id: str, max_fence: int) -> None:
    for fence in range(max_fence + 1):
        for op in OPS:
            for result, failure in ((RESULT, FAILURE), (OTHER_RESULT, OTHER_FAILURE)):
                with contextlib.suppress(McqError):
                    fenced(q, op, attempt_id, fence, result=result, failure=failure)
    for fn in (lambda: q.leases.claim_attempt(task_id, WORKER, SHORT_LEASE_MS), q.maintenance.expire_leases,
               lambda: reconcile_attempt(q, attempt_id)):
        with contextlib.suppress(McqError):
            fn()


@pytest.mark.parametrize("how", ["completed", "failed", "reconciled"])
def test_a_terminal_attempt_never_changes(q: mc_queue.Client, how: str) -> None:
    if how == "reconciled":
        task, lease = suspect_task(q)
        reconcile_attempt(q, lease.attempt_id)
    else:
        task, lease = claimed(q)
        fenced(q, "complete" if how == "completed" else "fail", lease.attempt_id, lease.fence)
    frozen = attempt_fields(q, task.id, 1)

    _try_everything(q, task.id, lease.attempt_id, int(fence_of(q, task.id)))
    assert attempt_fields(q, task.id, 1) == frozen

    if how != "completed":
        q.operator.retry_task(task.id, REASON)
        new = q.leases.claim_attempt(task.id, "worker-2", LONG_LEASE_MS)
        _try_everything(q, task.id, lease.attempt_id, new.fence)
        q.leases.complete_attempt(new.attempt_id, new.fence, RESULT, worker_id="worker-2")
        _try_everything(q, task.id, lease.attempt_id, new.fence)
        assert attempt_fields(q, task.id, 1) == frozen

    current = int(fence_of(q, task.id))
    with pytest.raises(StaleFence):  # a fence from the future that this client was never issued
        q.leases.renew_lease(lease.attempt_id, current + 1, worker_id=WORKER)
    assert attempt_fields(q, task.id, 1) == frozen
    assert q.reads.namespace().state == "ok"


# --------------------------------------------------------------------------- status


def test_status_counts_match_the_tasks_after_a_mixed_sequence(q: mc_queue.Client) -> None:
    assert q.reads.status() == {}
    tasks = [enqueue(q, i, "qa") for i in range(6)] + [enqueue(q, i, "qb") for i in range(2)]
    tasks.append(enqueue(q, 0, "qc"))
    a = [t.id for t in tasks[:6]]
    b = [t.id for t in tasks[6:8]]
    c = tasks[8].id

    la = [q.leases.claim_attempt(t, WORKER, LONG_LEASE_MS) for t in a[:3]]
    q.leases.complete_attempt(la[0].attempt_id, la[0].fence, RESULT, worker_id=WORKER)
    q.leases.fail_attempt(la[1].attempt_id, la[1].fence, FAILURE, worker_id=WORKER)
    short = q.leases.claim_attempt(a[3], WORKER, SHORT_LEASE_MS)
    wait_past(q, short.expires_at_ms)
    q.maintenance.expire_leases()
    reconcile_attempt(q, short.attempt_id)
    q.operator.retry_task(a[3], REASON)  # pending again, attempt 2
    lb = [q.leases.claim_attempt(t, WORKER, LONG_LEASE_MS) for t in b]
    q.leases.complete_attempt(lb[1].attempt_id, lb[1].fence, RESULT, worker_id=WORKER)
    lc = q.leases.claim_attempt(c, WORKER, LONG_LEASE_MS)
    q.leases.fail_attempt(lc.attempt_id, lc.fence, FAILURE, worker_id=WORKER)
    q.operator.retry_task(c, REASON, delay_ms=600_000)  # backoff, not claimable for ten minutes

    reality: dict[str, Counter[str]] = {}
    for t in tasks:
        got = q.reads.get_task(t.id)
        reality.setdefault(got.queue, Counter())[got.state.value] += 1
    status = q.reads.status()
    assert {queue: s["counts"] for queue, s in status.items()} == {k: dict(v) for k, v in reality.items()}
    assert status["qa"]["counts"] == {"succeeded": 1, "failed": 1, "running": 1, "pending": 3}
    assert status["qc"]["counts"] == {"backoff": 1}

    oldest = min(int(task_hash(q, t)["created_at"]) for t in a[4:])
    before = redis_now_ms(q)
    status = q.reads.status()
    after = redis_now_ms(q)
    assert before - oldest <= status["qa"]["queue_age_ms"] <= after - oldest
    assert status["qa"]["queue_age_ms"] > 0
    assert status["qb"]["queue_age_ms"] == 0  # every task claimed
    assert status["qc"]["queue_age_ms"] == 0  # its only pending attempt is not due


# --------------------------------------------------------------------------- state loss


def test_lost_namespace_meta_refuses_transitions_until_recover(q: mc_queue.Client) -> None:
    t_run, running = claimed(q, n=1)
    t_other, first = failed_task(q, n=2)
    q.operator.retry_task(t_other.id, REASON)
    second = q.leases.claim_attempt(t_other.id, WORKER, LONG_LEASE_MS)
    t_new = enqueue(q, 3)
    issued = [running.fence, first.fence, second.fence]
    untouched = (task_hash(q, t_new.id), attempts_hash(q, t_new.id), events(q, t_new.id))

    q.redis.delete(q.keys.meta)

    with pytest.raises(NamespaceLost):
        q.leases.claim_attempt(t_new.id, WORKER)
    assert (task_hash(q, t_new.id), attempts_hash(q, t_new.id), events(q, t_new.id)) == untouched
    assert q.reads.namespace().state == "lost"
    with pytest.raises(NamespaceLost):
        q.leases.claim_attempt(t_new.id, WORKER)
    with pytest.raises(NamespaceLost):
        enqueue(q, 4)
    with pytest.raises(NamespaceLost):
        q.leases.renew_lease(running.attempt_id, running.fence, worker_id=WORKER)
    with pytest.raises(NamespaceLost):
        q.leases.complete_attempt(running.attempt_id, running.fence, RESULT, worker_id=WORKER)
    assert any(e["type"] == "state_loss_detected" for e in q.reads.namespace_events())

    report = recover(q)

    assert set(report["voided_leases"]) == {running.attempt_id, second.attempt_id}
    assert q.reads.namespace().state == "ok"
    lease = q.leases.claim_attempt(t_new.id, WORKER, LONG_LEASE_MS)
    assert lease.fence > max(issued)
    assert lease.fence > report["fence_floor"]
    assert attempt_fields(q, t_run.id, 1)["state"] == "suspect"
    assert int(fence_of(q, t_run.id)) > report["fence_floor"]
    refused(q, t_run.id, StaleFence,
            lambda: q.leases.complete_attempt(running.attempt_id, running.fence, RESULT, worker_id=WORKER),
            "stale_write_refused")


def test_every_worker_can_claim_again_after_recovering_from_lost_meta(
        q: mc_queue.Client, redis_server: RedisServer) -> None:
    """A worker process that knew the namespace before the loss must not re-break it after `mcq recover`."""
    with mc_queue.connect(redis_server.url, prefix=q.keys.prefix) as worker:
        t1, t2 = enqueue(q, 1), enqueue(q, 2)
        old = worker.leases.claim_attempt(t1.id, "worker-2", LONG_LEASE_MS)
        q.redis.delete(q.keys.meta)
        with pytest.raises(NamespaceLost):
            q.leases.claim_attempt(t2.id, WORKER)
        recover(q)
        lease = worker.leases.claim_attempt(t2.id, "worker-2", LONG_LEASE_MS)
        assert lease.fence > old.fence
        assert q.reads.namespace().state == "ok"


def test_claim_sequence_going_backwards_marks_the_namespace_lost(
        q: mc_queue.Client, redis_server: RedisServer) -> None:
    with mc_queue.connect(redis_server.url, prefix=q.keys.prefix) as worker:
        t1, t2, t3, t4 = (enqueue(q, i) for i in range(4))
        q.leases.claim_attempt(t1.id, WORKER, LONG_LEASE_MS)
        worker.leases.claim_attempt(t2.id, "worker-2", LONG_LEASE_MS)
        seq = int(q.redis.hget(q.keys.meta, "seq") or 0)
        assert seq == 2
        q.redis.hset(q.keys.meta, "seq", seq)  # equal to what the worker saw: fine
        assert worker.leases.claim_attempt(t3.id, "worker-2", LONG_LEASE_MS).fence == 1
        q.redis.hset(q.keys.meta, "seq", 2)  # the worker has seen 3
        with pytest.raises(NamespaceLost):
            worker.leases.claim_attempt(t4.id, "worker-2", LONG_LEASE_MS)
        assert q.reads.namespace().state == "lost"
        recover(q)
        # the epoch the worker knew was retired: it refreshes transparently and claims
        assert worker.leases.claim_attempt(t4.id, "worker-2", LONG_LEASE_MS).fence > 1


def test_a_fence_above_the_current_one_without_a_claim_record_is_refused_not_a_loss(q: mc_queue.Client) -> None:
    """A caller's mistake (a fence this client was never issued) is refused and audited; it does not
    stop every producer of the namespace."""
    task, lease = claimed(q)
    q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id=WORKER)  # the current fence: fine
    _, ev = refused(q, task.id, StaleFence, lambda: q.leases.renew_lease(lease.attempt_id, lease.fence + 1,
                                                                  worker_id=WORKER), "stale_write_refused")
    assert ev is not None and ev["refusal"] == "fence_ahead" and ev["presented_fence"] == "2"
    assert q.reads.namespace().state == "ok"
    other = mc_queue.Client(q.url, prefix=q.keys.prefix)  # another process holds no claim record either
    with pytest.raises(StaleFence):
        other.leases.complete_attempt(lease.attempt_id, lease.fence + 5, RESULT, worker_id=WORKER)
    other.close()
    assert q.reads.namespace().state == "ok"


def test_a_fence_this_client_was_issued_and_redis_forgot_marks_the_namespace_lost(q: mc_queue.Client) -> None:
    task, lease = claimed(q)
    q.redis.hset(q.keys.task(task.id).task, "fence", lease.fence - 1)  # Redis went back to before the claim
    frozen = (task_hash(q, task.id), attempts_hash(q, task.id))
    with pytest.raises(NamespaceLost):
        q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id=WORKER)
    assert (task_hash(q, task.id), attempts_hash(q, task.id)) == frozen
    ev = events(q, task.id)[-1]
    assert ev["type"] == "state_loss_detected" and ev["presented_fence"] == "1" and ev["current_fence"] == "0"
    assert ev["claim_seq"] == str(lease.seq)
    assert q.reads.namespace().state == "lost"


def test_redis_restart_with_its_data_keeps_every_lease(own_redis: RedisServer, tmp_path: Path) -> None:
    with mc_queue.connect(own_redis.url, prefix="p", witness_path=tmp_path / "witness.json") as c:
        task = c.producer.enqueue(QUEUE, HANDLER, {"x": 1})
        lease = c.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS)
        own_redis.restart(keep_data=True)
        assert c.reads.namespace().state == "ok"
        assert c.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER).state == "succeeded"


def test_redis_restart_without_its_data_is_detected(own_redis: RedisServer, tmp_path: Path) -> None:
    witness = tmp_path / "witness.json"
    with mc_queue.connect(own_redis.url, prefix="p", witness_path=witness) as c:
        task = c.producer.enqueue(QUEUE, HANDLER, {"x": 1})
        lease = c.leases.claim_attempt(task.id, WORKER, LONG_LEASE_MS)
        own_redis.restart(keep_data=False)
        with mc_queue.connect(own_redis.url, prefix="p", witness_path=witness) as fresh:
            assert fresh.reads.namespace().state == "lost"  # the witness remembers an epoch Redis forgot
            with pytest.raises(NamespaceLost):
                fresh.producer.enqueue(QUEUE, HANDLER, {"x": 2})
        with pytest.raises(NamespaceLost):
            c.producer.enqueue(QUEUE, HANDLER, {"x": 2})
        recover(c)
        again = c.producer.enqueue(QUEUE, HANDLER, {"x": 3})
        assert c.leases.claim_attempt(again.id, WORKER, LONG_LEASE_MS).fence > lease.fence

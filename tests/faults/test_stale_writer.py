"""A frozen worker wakes up after its lease moved on: its writes are refused and kept as audit.

Worker 1 (a real process) claims with a 300 ms lease and is SIGSTOPped. The sweeper turns its
Attempt suspect, the reconciler settles it, a retry appends Attempt 2 and worker 2 (another
process) claims it. Worker 1 is SIGCONTed and renews and completes with its old fence: both are
refused, each refusal is a stale_write_refused event, and worker 2's completion stands.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import mc_queue
from mc_queue import reconcile_attempt
from mc_queue.contracts.codec import canonical_json, digest
from mc_queue.testing import RedisServer

from .helpers import attempt_fields, events_of
from .workerproc import WorkerProc

LEASE_MS = 300


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return WorkerProc.write_script(tmp_path)


@pytest.fixture
def procs() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for p in started:
        p.close()


def _redis_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def _wait_stopped(w: WorkerProc) -> None:
    deadline = time.monotonic() + 5
    while w.state() not in ("T", "t"):
        assert time.monotonic() < deadline, f"{w.worker} did not stop (state {w.state()})"
        time.sleep(0.005)


def _wait_redis_past(r: redis.Redis, ms: int) -> None:
    deadline = time.monotonic() + 5
    while _redis_ms(r) <= ms:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_stale_writer_refused_and_audited_new_holder_stands(
    redis_server: RedisServer, prefix: str, script: Path, procs: list[WorkerProc]
) -> None:
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    r = redis_server.client()
    try:
        tid = q.producer.enqueue("stale", "edit_file", {"path": "a.txt"}).id
        r1, r2 = {"by": "worker-1", "diff": "old"}, {"by": "worker-2", "diff": "new"}
        w1 = WorkerProc(script, redis_server.url, prefix, tid, "worker-1", LEASE_MS, r1)
        procs.append(w1)
        assert w1.claim["ok"] and (w1.claim["number"], w1.claim["fence"]) == (1, 1), w1.claim
        aid1 = w1.claim["attempt_id"]
        assert w1.call("renew")["ok"]  # while the lease is live the holder may renew

        # Freeze worker 1 and let its lease run out on Redis's clock.
        w1.stop()
        _wait_stopped(w1)
        lease_exp = int(attempt_fields(r, prefix, tid, 1)["lease_exp"])
        _wait_redis_past(r, lease_exp)
        expired = q.maintenance.expire_leases()
        assert [(e.attempt_id, e.old_fence, e.new_fence) for e in expired] == [(aid1, 1, 2)]
        assert q.reads.get_task(tid).attempts[0].state == mc_queue.AttemptState.SUSPECT
        settled = reconcile_attempt(q, aid1)
        assert settled.state == mc_queue.AttemptState.FAILED and settled.settled_by == "reconcile"
        a2 = q.operator.retry_task(tid, "worker-1 froze past its lease", hypothesis="a live worker finishes it")
        assert a2.number == 2 and a2.previous == aid1

        w2 = WorkerProc(script, redis_server.url, prefix, tid, "worker-2", 30_000, r2)
        procs.append(w2)
        assert w2.claim["ok"] and (w2.claim["number"], w2.claim["fence"]) == (2, 3), w2.claim
        assert w1.state() in ("T", "t"), "worker 1 must still be frozen while ownership moved"
        attempt1_before = attempt_fields(r, prefix, tid, 1)

        # Worker 1 wakes up and writes with fence 1: refused, while Attempt 2 is running ...
        w1.cont()
        renew = w1.call("renew")
        complete = w1.call("complete")
        for got in (renew, complete):
            assert got["ok"] is False and got["error"] == "StaleFence", got
            assert (got["code"], got["presented"], got["current"]) == ("E_STALE", 1, 3), got
            assert "stale_write_refused" in got["message"]

        # ... the new holder's lease was not disturbed: it renews and completes.
        assert w2.call("renew")["ok"]
        done = w2.call("complete")
        assert done == {"op": "complete", "ok": True, "state": "succeeded", "fence": 3, "result": r2}

        # ... and worker 1 is still refused after Attempt 2 succeeded; worker 2's resend is a no-op.
        late = w1.call("complete")
        assert (late["error"], late["presented"], late["current"]) == ("StaleFence", 1, 3), late
        assert w2.call("complete")["ok"]

        # Redis side: the task succeeded with Attempt 2's result; Attempt 1 is exactly as it was.
        task = q.reads.get_task(tid)
        assert task.state == mc_queue.TaskState.SUCCEEDED and task.result == r2
        assert task.fence == 3 and task.attempt_count == 2
        assert [a.state for a in task.attempts] == [mc_queue.AttemptState.FAILED, mc_queue.AttemptState.SUCCEEDED]
        assert task.attempts[1].worker_id == "worker-2" and task.attempts[1].result == r2
        assert task.attempts[0].result is None
        assert attempt_fields(r, prefix, tid, 1) == attempt1_before
        succeeded = events_of(r, prefix, tid, "attempt_succeeded")
        assert [(e["attempt"], e["worker"], e["fence"]) for e in succeeded] == [("2", "worker-2", "3")]

        # Every refusal is an audit event: op, presented and current fence, worker, payload digest.
        refused = events_of(r, prefix, tid, "stale_write_refused")
        want_digest = digest(canonical_json(r1))
        assert [(e["op"], e["attempt"], e["presented_fence"], e["current_fence"], e["worker"], e["refusal"],
                 e["attempt_state"]) for e in refused] == [
            ("renew", "1", "1", "3", "worker-1", "stale_fence", "failed"),
            ("complete", "1", "1", "3", "worker-1", "stale_fence", "failed"),
            ("complete", "1", "1", "3", "worker-1", "stale_fence", "failed"),
        ]
        assert refused[0]["payload_digest"].startswith("renew:")  # what the renew asked for
        assert refused[1]["payload_digest"] == refused[2]["payload_digest"] == want_digest
        assert want_digest != digest(canonical_json(r2))
        assert events_of(r, prefix, tid, "state_loss_detected") == []
        assert q.reads.namespace().state == "ok"
    finally:
        q.close()
        r.close()


def test_woken_before_the_sweeper_gets_lease_expired(
    redis_server: RedisServer, prefix: str, script: Path, procs: list[WorkerProc]
) -> None:
    """The lease ran out but nobody has expired it yet: the fence is current, the lease is not."""
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    r = redis_server.client()
    try:
        tid = q.producer.enqueue("stale", "edit_file", {"path": "b.txt"}).id
        w1 = WorkerProc(script, redis_server.url, prefix, tid, "worker-1", LEASE_MS, {"by": "worker-1"})
        procs.append(w1)
        assert w1.claim["fence"] == 1
        w1.stop()
        _wait_stopped(w1)
        _wait_redis_past(r, w1.claim["expires_at_ms"])
        w1.cont()
        for op in ("renew", "complete"):
            got = w1.call(op)
            assert (got["ok"], got["error"], got["code"], got["presented"], got["current"]) == \
                (False, "LeaseExpired", "E_EXPIRED", 1, 1), got
        refused = events_of(r, prefix, tid, "stale_write_refused")
        assert [(e["op"], e["refusal"], e["presented_fence"], e["current_fence"], e["attempt_state"])
                for e in refused] == [("renew", "lease_expired", "1", "1", "running"),
                                      ("complete", "lease_expired", "1", "1", "running")]
        task = q.reads.get_task(tid)
        assert task.state == mc_queue.TaskState.RUNNING and task.result is None  # the late result did not land
        # The sweeper then moves it on as usual; the fence is bumped past the frozen worker's.
        assert [(e.old_fence, e.new_fence) for e in q.maintenance.expire_leases()] == [(1, 2)]
        got = w1.call("complete")
        assert (got["error"], got["presented"], got["current"]) == ("StaleFence", 1, 2), got
    finally:
        q.close()
        r.close()


@pytest.mark.parametrize("op", ["fail", "complete"])
def test_stale_write_after_reconcile_without_retry_is_refused_and_audited(
    redis_server: RedisServer, prefix: str, script: Path, procs: list[WorkerProc], op: str
) -> None:
    """The frozen worker wakes up after its Attempt was expired and reconciled (settled failed), before
    any retry: its fail or complete must be refused as stale and kept as a stale_write_refused event,
    like every other write with an old fence."""
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    r = redis_server.client()
    try:
        tid = q.producer.enqueue("stale", "edit_file", {"path": f"{op}.txt"}).id
        w1 = WorkerProc(script, redis_server.url, prefix, tid, "worker-1", LEASE_MS, {"by": "worker-1"})
        procs.append(w1)
        aid = w1.claim["attempt_id"]
        w1.stop()
        _wait_stopped(w1)
        _wait_redis_past(r, w1.claim["expires_at_ms"])
        assert [(e.old_fence, e.new_fence) for e in q.maintenance.expire_leases()] == [(1, 2)]
        reconcile_attempt(q, aid)
        settled = attempt_fields(r, prefix, tid, 1)
        assert settled["state"] == "failed" and settled["settled_by"] == "reconcile"
        w1.cont()
        got = w1.call(op)
        assert (got["ok"], got.get("error"), got.get("presented"), got.get("current")) == \
            (False, "StaleFence", 1, 2), got
        refused = events_of(r, prefix, tid, "stale_write_refused")
        assert [(e["op"], e["refusal"], e["presented_fence"], e["current_fence"], e["worker"]) for e in refused] == \
            [(op, "stale_fence", "1", "2", "worker-1")]
        assert attempt_fields(r, prefix, tid, 1) == settled  # the reconciled record is untouched
        assert q.reads.get_task(tid).state == mc_queue.TaskState.FAILED
    finally:
        q.close()
        r.close()

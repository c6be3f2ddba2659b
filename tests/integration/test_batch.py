"""Batch mode (issue 17): many Attempts per round trip, each still fenced, leased and evented on its own.

The client's ``leases.batch`` (completions, renewals and claims in one pipeline of the same scripts),
the heartbeat thread renewing every lease of a process in one round trip, and ``mcq worker --kind batch``
draining many short Attempts per RQ dequeue: both sides of each boundary (an item refused / the rest
written, a fence current / stale, a bad argument / nothing sent, a message duplicated / run once, a
forged one / refused alone, a batch worker killed or stopped mid-batch / its leases voided at once and
what it had not claimed handed back).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job

import mc_queue
from mc_queue import StaleFence, TaskState
from mc_queue.client.holder import Completion
from mc_queue.contracts.models import AttemptState
from mc_queue.producer.transport import job_id
from mc_queue.worker.context import Context, renew_together
from tests.apps import basic
from tests.harness import BASIC, Harness, events, harness_fixture, wait_for

QUEUE = "jobs"
h = harness_fixture(Harness)


def _snapshot(r: redis.Redis, prefix: str) -> dict[str, Any]:
    return {k: r.dump(k) for k in sorted(r.scan_iter(match=f"{{{prefix}}}*", count=1000))}


class Trips:
    """Counts the round trips the client's script connection makes (each pipeline execute is one)."""

    def __init__(self, q: mc_queue.Client, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        writer = q.backend.writer
        real = writer.pipeline

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = real(*args, **kwargs)
            execute = pipe.execute

            def counted(*a: Any, **k: Any) -> Any:
                self.n += 1
                return execute(*a, **k)

            pipe.execute = counted
            return pipe

        monkeypatch.setattr(writer, "pipeline", pipeline)


# --------------------------------------------------------------------------- the client's batch


def _warm(q: mc_queue.Client) -> None:
    """Every script a batch sends, loaded once (a script's first call loads it: a round trip more)."""
    t = q.producer.enqueue(QUEUE, "h", {"warm": True})
    lease = q.leases.claim_attempt(t.id, "warm", 60_000)
    q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="warm")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, None, worker_id="warm")


def test_claims_and_completions_of_a_batch_are_each_their_own_transition(q: mc_queue.Client,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [q.producer.enqueue(QUEUE, "h", {"n": i}) for i in range(5)]
    _warm(q)
    trips = Trips(q, monkeypatch)
    got = q.leases.batch("w1", claim=[q.leases.claim_request(t.id, expect_attempt=1) for t in tasks])
    assert trips.n == 1
    leases = [lease for lease in got.claimed if isinstance(lease, mc_queue.Lease)]
    assert len(leases) == 5 and len({lease.fence for lease in leases}) == 1  # a fence per task, each its first
    assert all(lease.task is not None and lease.task.state is TaskState.RUNNING for lease in leases)
    done = q.leases.batch("w1", complete=[Completion(lease.attempt_id, lease.fence, {"i": i})
                                          for i, lease in enumerate(leases)])
    assert trips.n == 2 and done.completed == [None] * 5
    for i, t in enumerate(tasks):
        final = q.reads.get_task(t.id)
        assert final.state is TaskState.SUCCEEDED and final.result == {"i": i}
        assert [e.type for e in final.events].count("attempt_claimed") == 1
        assert [e.type for e in final.events].count("attempt_succeeded") == 1


def test_completing_one_chunk_and_claiming_the_next_is_one_round_trip(q: mc_queue.Client,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = q.producer.enqueue(QUEUE, "h", {"n": 1}), q.producer.enqueue(QUEUE, "h", {"n": 2})
    lease = q.leases.claim_attempt(first.id, "w1", with_task=True)
    _warm(q)
    trips = Trips(q, monkeypatch)
    got = q.leases.batch("w1", complete=[Completion(lease.attempt_id, lease.fence, {"done": 1})],
                         claim=[q.leases.claim_request(second.id, expect_attempt=1)])
    assert trips.n == 1 and got.completed == [None] and isinstance(got.claimed[0], mc_queue.Lease)
    assert q.reads.get_task(first.id).state is TaskState.SUCCEEDED
    assert q.reads.get_task(second.id).state is TaskState.RUNNING


def test_a_stale_completion_in_a_batch_is_refused_alone_and_kept_as_audit(q: mc_queue.Client) -> None:
    tasks = [q.producer.enqueue(QUEUE, "h", {"n": i}) for i in range(3)]
    leases = [q.leases.claim_attempt(t.id, "w1", 60_000) for t in tasks]
    # Attempt of the middle task voided (the fence moves on): its holder is now a zombie
    q.operator.void_leases([leases[1].attempt_id], actor="op", reason="the operator took it back")
    got = q.leases.batch("w1", complete=[Completion(lease.attempt_id, lease.fence, {"n": i})
                                         for i, lease in enumerate(leases)])
    assert got.completed[0] is None and got.completed[2] is None
    assert isinstance(got.completed[1], StaleFence)
    assert q.reads.get_task(tasks[0].id).state is TaskState.SUCCEEDED
    assert q.reads.get_task(tasks[2].id).state is TaskState.SUCCEEDED
    middle = q.reads.get_task(tasks[1].id)
    assert middle.state is not TaskState.SUCCEEDED and middle.attempts[0].state is not AttemptState.SUCCEEDED
    refused = events(middle, "stale_write_refused")
    assert len(refused) == 1 and refused[0].fields["presented_fence"] == str(leases[1].fence)


def test_a_claim_in_a_batch_for_a_taken_attempt_is_refused_alone(q: mc_queue.Client) -> None:
    a, b = q.producer.enqueue(QUEUE, "h", {"n": 1}), q.producer.enqueue(QUEUE, "h", {"n": 2})
    q.leases.claim_attempt(a.id, "w0", 60_000)
    got = q.leases.batch("w1", claim=[q.leases.claim_request(a.id, expect_attempt=1),
                                      q.leases.claim_request(b.id, expect_attempt=1)])
    assert isinstance(got.claimed[0], mc_queue.ClaimRejected) and "held by w0" in str(got.claimed[0])
    assert isinstance(got.claimed[1], mc_queue.Lease)


@pytest.mark.parametrize(("field", "bad"), [
    ("cost", math.nan), ("cost", math.inf), ("cost", -1.0), ("cost", 1e30), ("tokens", -1), ("tokens", 10**30),
    ("tokens", True), ("result", math.nan), ("result", b"bytes"), ("result", object()), ("fence", -1),
    ("fence", "7"), ("fence", 2**64), ("attempt_id", "jobs:x\ny/1"), ("attempt_id", "not an attempt"),
])
def test_one_bad_item_sends_nothing_at_all(q: mc_queue.Client, field: str, bad: Any) -> None:
    tasks = [q.producer.enqueue(QUEUE, "h", {"n": i}) for i in range(3)]
    leases = [q.leases.claim_attempt(t.id, "w1", 60_000) for t in tasks]
    c = q.producer.enqueue(QUEUE, "h", {"n": 9})
    before = _snapshot(q.redis, q.keys.prefix)
    items = [Completion(lease.attempt_id, lease.fence, {"ok": i}) for i, lease in enumerate(leases)]
    items[1] = dataclasses.replace(items[1], **{field: bad})
    with pytest.raises(mc_queue.InvalidArgument):
        q.leases.batch("w1", complete=items, claim=[q.leases.claim_request(c.id)])
    assert _snapshot(q.redis, q.keys.prefix) == before


@pytest.mark.parametrize("worker", ["", "a b", "x" * 201, "line\nbreak"])
def test_a_bad_worker_id_sends_nothing(q: mc_queue.Client, worker: str) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    before = _snapshot(q.redis, q.keys.prefix)
    with pytest.raises(mc_queue.InvalidArgument):
        q.leases.batch(worker, claim=[q.leases.claim_request(t.id)])
    assert _snapshot(q.redis, q.keys.prefix) == before


def test_a_batch_of_more_than_the_cap_is_refused(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    with pytest.raises(mc_queue.InvalidArgument, match="at most 1000"):
        q.leases.batch("w1", claim=[q.leases.claim_request(t.id)] * 1001)


def test_the_heartbeats_of_a_process_renew_every_lease_in_one_round_trip(q: mc_queue.Client, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [q.producer.enqueue(QUEUE, "noop", {"n": i}, lease_ms=5_000) for i in range(4)]
    leases = [q.leases.claim_attempt(t.id, "w1", 5_000, with_task=True) for t in tasks]
    spec = basic.app.spec("noop")
    ctxs = []
    for lease in leases:
        assert lease.task is not None
        ctx = Context(q, spec, lease.task, lease.task.attempts[0], lease.fence, "w1", tmp_path)
        ctx.start_heartbeats(3600)  # registered, beating; the process's thread would renew it in an hour
        ctxs.append(ctx)
    q.operator.void_leases([leases[2].attempt_id], actor="op", reason="taken back by the operator")
    _warm(q)
    time.sleep(0.3)
    before = [q.redis.pttl(q.keys.task(t.id).lease) for t in tasks]
    trips = Trips(q, monkeypatch)
    gone = renew_together(ctxs)
    for ctx in ctxs:
        ctx.stop_heartbeats()
    assert trips.n == 1
    assert gone == [ctxs[2]] and ctxs[2].lease_lost and not any(c.lease_lost for i, c in enumerate(ctxs) if i != 2)
    after = [q.redis.pttl(q.keys.task(t.id).lease) for t in tasks]
    assert all(before[i] < 4_800 < after[i] for i in (0, 1, 3)) and after[2] == -2, (before, after)


# --------------------------------------------------------------------------- the batch worker


def _rq_clean(h: Harness, task_ids: list[str]) -> None:
    """RQ holds nothing of these tasks' drained jobs: no message, no job hash, no registry entry."""
    q = h.rq_queue()
    assert q.count == 0 and h.rq.llen(q.intermediate_queue_key) == 0
    jids = [job_id(h.prefix, f"{tid}/1") for tid in task_ids]
    assert not any(Job.exists(j, connection=h.rq) for j in jids)
    for registry in (q.started_job_registry, q.failed_job_registry, q.finished_job_registry):
        assert registry.count == 0, registry.key


def test_a_batch_worker_drains_many_attempts_each_fenced_and_evented(h: Harness) -> None:
    ok = [h.basic.enqueue("noop", {"n": i}).id for i in range(120)]
    crash = h.basic.enqueue("crashes", {}).id
    out = h.run_worker("batch", BASIC, "--batch", "50", "--name", "w-batch")
    assert out.returncode == 0
    for tid in ok:
        t = h.task(tid)
        assert t.state is TaskState.SUCCEEDED and len(t.attempts) == 1 and t.attempts[0].worker_id == "w-batch"
        assert len(events(t, "attempt_claimed")) == 1 and len(events(t, "attempt_succeeded")) == 1
    assert h.task(crash).state is TaskState.QUARANTINED  # a failure in a batch is decided as on the plain path
    _rq_clean(h, [*ok, crash])
    assert int(h.rq.hget("rq:worker:w-batch", "successful_job_count") or 0) == 121


def test_a_forged_job_among_a_batch_is_refused_alone(h: Harness) -> None:
    ok = [h.basic.enqueue("noop", {"n": i}).id for i in range(6)]
    q = h.rq_queue()
    forged = q.enqueue_call(func="os.system", args=("touch /tmp/mcq-pwned",), job_id="forged-1")
    h.rq.lrem(q.key, 0, forged.id)
    h.rq.linsert(q.key, "BEFORE", job_id(h.prefix, f"{ok[3]}/1"), forged.id)  # in the middle of the batch
    h.run_worker("batch", BASIC, "--batch", "20")
    assert all(h.task(tid).state is TaskState.SUCCEEDED for tid in ok)
    assert not os.path.exists("/tmp/mcq-pwned")
    refused = [f for _, f in h.client.redis.xrange(h.client.keys.refused)]
    assert any(f.get("job_id") == "forged-1" and "os.system" in f.get("reason", "") for f in refused), refused
    assert not Job.exists("forged-1", connection=h.rq)


def test_a_message_delivered_twice_in_one_batch_runs_its_attempt_once(h: Harness) -> None:
    ok = [h.basic.enqueue("noop", {"n": i}).id for i in range(4)]
    q = h.rq_queue()
    twice = job_id(h.prefix, f"{ok[1]}/1")
    h.rq.rpush(q.key, twice)  # a second message for Attempt 1 of the second task, in the same batch
    h.run_worker("batch", BASIC, "--batch", "20")
    for tid in ok:
        t = h.task(tid)
        assert t.state is TaskState.SUCCEEDED and len(t.attempts) == 1
        assert len(events(t, "attempt_claimed")) == 1
    assert len(events(h.task(ok[1]), "claim_refused")) == 1
    _rq_clean(h, ok)


def _holding(h: Harness, worker_prefix: str) -> list[str]:
    out = []
    for aid in h.client.redis.zrange(h.client.keys.leases, 0, -1):
        tid, _, n = str(aid).rpartition("/")
        worker = h.client.redis.hget(h.client.keys.task(tid).task, f"{n}.worker") or ""
        if worker.startswith(worker_prefix):
            out.append(str(aid))
    return out


def _all_succeed_once(h: Harness, ids: list[str]) -> None:
    """Sweeps and burst batch workers until every task succeeded; each has exactly one succeeded Attempt."""
    for _ in range(6):
        h.sweeper.run_once()
        h.run_worker("batch", BASIC, "--batch", "24")
        if all(h.task(t).state is TaskState.SUCCEEDED for t in ids):
            break
        time.sleep(0.3)
    finals = [h.task(t) for t in ids]
    assert all(t.state is TaskState.SUCCEEDED for t in finals), [t.state for t in finals]
    assert all(sum(a.state is AttemptState.SUCCEEDED for a in t.attempts) == 1 for t in finals)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_killed_batch_worker_of_a_pool_has_every_lease_of_its_chunk_voided_at_once(h: Harness) -> None:
    """Chunks grow while they run fast (1, 2, 4, 8 ...): a pool's batch worker killed while it holds a chunk
    of several 60 s leases has all of them voided by the pool within moments, each reconciled; nothing
    runs twice once they are run again."""
    ids = [h.basic.enqueue("sleepy", {"seconds": 0.15, "n": i}).id for i in range(24)]
    pool = h.start_worker("batch", BASIC, "--batch", "24", "--chunk-ms", "60000", "--pool", "1", "--name", "w-b")
    held = wait_for(lambda: (lambda x: x if len(x) >= 4 else None)(_holding(h, "w-b-")), 30,
                    "a chunk of at least 4 leases")
    children = wait_for(lambda: _children(pool.pid), 10, "the pool's worker")
    killed_at = time.monotonic()
    for child in children:
        os.kill(child, signal.SIGKILL)
    wait_for(lambda: not _holding(h, "w-b-"), 10, "every lease of the killed worker voided")
    took = time.monotonic() - killed_at
    assert took < 5, f"took {took:.1f} s (the leases are 60 s: only the pool's watch can have voided them)"
    pool.kill()
    pool.wait(10)
    voided = [aid for aid in held]
    for aid in voided:
        tid = aid.rpartition("/")[0]
        t = h.task(tid)
        exp = events(t, "lease_expired", attempt=1)
        assert len(exp) == 1 and "ended (signal 9)" in exp[0].fields["reason"], [e.type for e in t.events]
    _all_succeed_once(h, ids)  # what was voided is retried (the sweeper sends it again)


def test_a_stop_mid_batch_gives_back_what_it_did_not_run(h: Harness) -> None:
    """SIGTERM while a batch runs: the Attempt running finishes; those claimed and not started have their
    leases voided at once (nothing of theirs ran); messages not claimed go back to the front of RQ's queue."""
    ids = [h.basic.enqueue("sleepy", {"seconds": 0.3, "n": i}).id for i in range(16)]
    w = h.start_worker("batch", BASIC, "--batch", "16", "--chunk-ms", "60000", "--name", "w-stop")
    wait_for(lambda: len(_holding(h, "w-stop")) >= 4, 30, "a chunk of at least 4 leases")
    w.send_signal(signal.SIGTERM)
    assert w.wait(30) == 0, h.worker_log(w)
    assert not _holding(h, "w-stop")
    states = [h.task(t) for t in ids]
    ran = [t for t in states if t.state is TaskState.SUCCEEDED]
    voided = [t for t in states if events(t, "lease_expired")]
    untouched = [t for t in states if not t.attempts[0].worker_id]
    assert ran and voided and untouched, ([t.state for t in states])
    assert all("ended before running it" in events(t, "lease_expired")[0].fields["reason"] for t in voided)
    assert h.rq_queue().count == len(untouched)  # given back, each its own message
    assert h.rq.llen(h.rq_queue().intermediate_queue_key) == 0
    _all_succeed_once(h, ids)  # the rest runs: voided ones by their retry, the others by their message

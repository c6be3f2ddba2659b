"""Transport and process faults under real `mcq worker` processes: the records stay right.

- a duplicated RQ message runs the Attempt once; the duplicate is refused by the claim;
- a lost RQ message is sent again from the outbox by the sweeper; nothing is lost;
- a worker frozen (SIGSTOP) past its lease: the sweeper makes the Attempt suspect, reconciles it,
  a retry runs elsewhere; woken up, the old worker's writes are refused and kept as audit events;
- a hung handler is ended by RQ's job timeout; its worker gives up the lease and the sweeper reconciles
  it as an executor failure.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from rq.job import Job

from mc_queue import TaskState
from mc_queue.contracts import failpoints
from mc_queue.contracts.models import AttemptState, FailureClass
from mc_queue.ops.sweeper import Sweeper
from mc_queue.producer.transport import ENTRY, job_id
from mc_queue.testing import RedisServer
from tests.harness import BASIC, FAULTY, Harness, events, harness_fixture, proc_state, redis_ms, wait_for

h = harness_fixture(Harness)


# --------------------------------------------------------------------------- 3. duplicated and lost messages


def test_duplicate_message_after_completion_is_refused_by_the_claim(h: Harness) -> None:
    task = h.basic.enqueue("noop", {})
    aid = task.attempts[0].id
    h.run_worker("fork")
    done = h.task(task.id)
    assert done.state is TaskState.SUCCEEDED

    # The transport delivers the same message again (same job id, same arguments).
    q = h.rq_queue()
    q.enqueue_call(func=ENTRY, args=(h.prefix, aid, 3000), job_id=job_id(h.prefix, aid), result_ttl=0)
    assert q.count == 1
    h.run_worker("simple")
    assert q.count == 0, "the duplicate was not consumed"

    final = h.task(task.id)
    assert final.state is TaskState.SUCCEEDED and final.result == done.result
    assert len(final.attempts) == 1 and final.attempts[0] == done.attempts[0]
    assert len(events(final, "attempt_claimed")) == 1
    assert len(events(final, "attempt_succeeded")) == 1
    refused = events(final, "claim_refused")
    assert len(refused) == 1 and refused[0].attempt == 1
    assert "succeeded" in refused[0].fields["reason"]


def test_duplicate_message_while_the_attempt_runs_is_refused_by_the_claim(h: Harness) -> None:
    task = h.basic.enqueue("long", {"seconds": 3})
    aid = task.attempts[0].id
    jid = job_id(h.prefix, aid)
    first = h.start_worker("fork", BASIC, "--name", f"first-{uuid.uuid4().hex[:8]}")
    wait_for(lambda: events(h.task(task.id), "attempt_claimed"), 15, "the first worker to claim the Attempt")

    # The same message a second time, while Attempt 1 runs (its RQ job still exists).
    assert Job.exists(jid, connection=h.rq)
    h.rq.rpush(h.rq_queue().key, jid)
    h.run_worker("simple")
    assert first.wait(30) == 0, h.worker_log(first)

    final = h.task(task.id)
    assert final.state is TaskState.SUCCEEDED and final.result == {"slept": 3}
    assert len(final.attempts) == 1
    claimed = events(final, "attempt_claimed")
    assert len(claimed) == 1 and claimed[0].fields["worker"].startswith("first-")
    assert len(events(final, "attempt_succeeded")) == 1
    refused = events(final, "claim_refused")
    assert len(refused) == 1 and refused[0].attempt == 1
    assert "running" in refused[0].fields["reason"]
    assert refused[0].fields["holder"] == claimed[0].fields["worker"]


def test_late_message_for_an_earlier_attempt_does_not_run_the_next_one(h: Harness) -> None:
    task = h.basic.enqueue("flaky-capacity", {"fail_times": 1})
    a1 = task.attempts[0].id
    h.run_worker("fork")
    failed = h.task(task.id)
    assert [a.state for a in failed.attempts] == [AttemptState.FAILED, AttemptState.PENDING]

    # Attempt 1's message arrives again while Attempt 2 waits for its backoff and dispatch.
    h.rq_queue().enqueue_call(func=ENTRY, args=(h.prefix, a1, 3000), job_id=job_id(h.prefix, a1), result_ttl=0)
    h.run_worker("simple")
    late = h.task(task.id)
    assert [a.state for a in late.attempts] == [AttemptState.FAILED, AttemptState.PENDING]
    assert late.attempts[0] == failed.attempts[0]
    refused = events(late, "claim_refused")
    assert len(refused) == 1 and "attempt 1" in refused[0].fields["reason"] and refused[0].attempt == 2

    final = h.drive(task.id, "simple", until=lambda t: t.state is TaskState.SUCCEEDED)
    assert [e.attempt for e in events(final, "attempt_claimed")] == [1, 2]
    assert len(final.attempts) == 2 and final.result == {"ok": True, "attempt": 2}


@pytest.mark.parametrize("loss", ["job-hash", "queue-entry"])
def test_lost_message_is_sent_again_from_the_outbox(h: Harness, loss: str) -> None:
    """The outbox is the pending index and each Attempt's dispatch time: the sweeper's walk sends again
    an Attempt nobody claimed within its recheck time of the last dispatch."""
    recheck_ms = 800
    sweeper = Sweeper(h.client, recheck_ms=recheck_ms)
    task = h.enqueue_undispatched(h.basic, "noop", {})
    attempt = task.attempts[0]
    h.basic.dispatch(task, attempt, recheck_ms=recheck_ms)
    jid = job_id(h.prefix, attempt.id)
    q = h.rq_queue()
    assert q.job_ids == [jid]
    if loss == "job-hash":
        h.rq.delete(Job.key_for(jid))  # the id stays queued, pointing at nothing
    else:
        assert h.rq.lrem(q.key, 0, jid) == 1  # the job stays, nothing points at it

    h.run_worker("simple")
    lost = h.task(task.id)
    assert lost.state is TaskState.PENDING and lost.attempts[0].state is AttemptState.PENDING
    assert events(lost, "attempt_claimed") == []
    assert h.client.redis.zscore(h.client.keys.pending("jobs"), task.id) is not None, "the index forgot the task"
    assert lost.attempts[0].dispatches == 1

    # Before the recheck time the sweeper leaves it alone; after it, it sends the same job again.
    recheck_at = int(h.client.redis.hget(h.client.keys.task(task.id).task, "1.dispatched_at") or 0) + recheck_ms
    if redis_ms(h.client.redis) < recheck_at - 100:
        assert sweeper.run_once().dispatched == []
    wait_for(lambda: redis_ms(h.client.redis) >= recheck_at, 5, "the recheck time")
    assert sweeper.run_once().dispatched == [attempt.id]
    assert q.job_ids == [jid]
    h.run_worker("simple")

    final = h.task(task.id)
    assert final.state is TaskState.SUCCEEDED
    assert len(final.attempts) == 1 and final.attempts[0].dispatches == 2
    assert len(events(final, "attempt_claimed")) == 1 and events(final, "claim_refused") == []
    assert h.client.redis.zscore(h.client.keys.pending("jobs"), task.id) is None
    assert sweeper.run_once().dispatched == []


# --------------------------------------------------------------------------- 5. frozen worker


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_sigstopped_worker_past_its_lease_is_fenced_out_and_audited(h: Harness, kind: str, tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    task = h.faulty.enqueue("records-pid-report", {"dir": str(evidence), "steps": 30, "step_s": 0.2})
    name_a, name_b = f"frozen-{uuid.uuid4().hex[:8]}", f"second-{uuid.uuid4().hex[:8]}"
    wa = h.start_worker(kind, FAULTY, "--name", name_a)
    pidfile = evidence / "pid-1"
    wait_for(lambda: pidfile.exists() and pidfile.read_text(), 15, "the handler to write its pid")
    handler_pid = int(pidfile.read_text())
    if kind == "fork":
        assert handler_pid != wa.pid  # the work horse runs the handler
    else:
        assert handler_pid == wa.pid
    h.sigstop(*{handler_pid, wa.pid})  # the horse and its worker both

    running = h.task(task.id)
    a1 = running.attempts[0]
    assert a1.state is AttemptState.RUNNING and a1.worker_id == name_a and a1.fence is not None

    # The sweeper: lease expired -> suspect -> reconciled (executor) -> Attempt 2 in backoff.
    def reconciled() -> bool:
        assert not h.sweeper.run_once().errors
        t = h.task(task.id)
        return len(t.attempts) == 2 and t.attempts[0].state is AttemptState.FAILED

    wait_for(reconciled, 15, "the sweeper to reconcile Attempt 1 and create Attempt 2", interval=0.2)
    settled = h.task(task.id)
    snapshot = (settled.attempts[0], h.raw_attempt(task.id, 1))
    first = settled.attempts[0]
    assert first.failure is not None and first.failure.failure_class is FailureClass.EXECUTOR
    assert first.settled_by == "reconcile"
    assert settled.attempts[1].previous == first.id and settled.attempts[1].reason

    # Attempt 2 runs to success on another worker while the first is still frozen.
    final = h.drive(task.id, kind, FAULTY, "--name", name_b, until=lambda t: t.state is TaskState.SUCCEEDED)
    assert proc_states_stopped(h)

    # Wake the frozen worker: its handler learns LeaseLost at its next heartbeat, nothing it does counts.
    h.sigcont()
    assert wa.wait(30) == 0, h.worker_log(wa)
    report = json.loads((evidence / "report-1").read_text())
    assert report["heartbeat_raised"] == "LeaseLost" and report["lease_lost_flag"] is True
    assert report["steps_done"] < 30
    assert report["context_checkpoint"] == "LeaseLost"  # refused locally: never sent
    assert report["raw_checkpoint"] == "StaleFence" and report["raw_complete"] == "StaleFence"

    after = h.task(task.id)
    assert after.state is TaskState.SUCCEEDED and after.result == final.result == {"steps": 2, "attempt": 2}
    assert [a.state for a in after.attempts] == [AttemptState.FAILED, AttemptState.SUCCEEDED]
    assert (after.attempts[0], h.raw_attempt(task.id, 1)) == snapshot, "Attempt 1 changed after it settled"
    assert after.attempts[1].worker_id == name_b
    assert [e.attempt for e in events(after, "attempt_succeeded")] == [2]
    assert [(e.attempt, e.fields["worker"]) for e in events(after, "attempt_claimed")] == [(1, name_a), (2, name_b)]
    assert [e.attempt for e in events(after, "lease_expired")] == [1]
    assert [e.attempt for e in events(after, "attempt_reconciled")] == [1]
    assert events(after, "attempt_failed") == []  # the frozen worker recorded no failure either

    stale = events(after, "stale_write_refused")
    ops = sorted(e.fields["op"] for e in stale)
    assert "renew" in ops and "checkpoint" in ops and "complete" in ops, ops
    assert set(ops) <= {"renew", "checkpoint", "complete"}
    for e in stale:
        assert e.attempt == 1 and e.fields["worker"] == name_a
        assert int(e.fields["presented_fence"]) == a1.fence and e.fields["refusal"] == "stale_fence"
    # Everything worker A wrote after it froze was a refusal (lease_expired names it, the sweeper wrote it).
    expired = events(after, "lease_expired")[0]
    assert expired.fields["worker"] == name_a and expired.fields["actor"] == h.sweeper.actor
    by_a = [e.type for e in after.events if e.fields.get("worker") == name_a and e.type != "lease_expired"]
    assert set(by_a) == {"attempt_claimed", "stale_write_refused"}
    assert "workspace_prepared" not in after.attempts[0].checkpoints


def proc_states_stopped(h: Harness) -> bool:
    return all(proc_state(pid) in ("T", "t") for pid in h.stopped)


# --------------------------------------------------------------------------- 6. hung handler


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_hung_handler_is_ended_by_the_job_timeout_and_reconciled_as_an_executor_failure(h: Harness,
                                                                                     kind: str) -> None:
    """RQ's job timeout ends a hung handler, maybe in the middle of a side effect, so the worker does
    not fail the Attempt itself: it gives up the lease (the Attempt turns suspect, the fence moves)
    and the sweeper reconciles it before the retry policy decides, like any executor failure."""
    spec = h.basic.app.spec("hangs")
    task = h.basic.enqueue("hangs", {})
    t0 = time.monotonic()
    h.run_worker(kind, timeout=60)
    assert time.monotonic() - t0 < 20, "the hung handler was not ended by its job timeout"

    timed_out = h.task(task.id)
    a1 = timed_out.attempts[0]
    assert a1.state is AttemptState.SUSPECT, [e.type for e in timed_out.events]
    assert events(timed_out, "attempt_failed") == [], "the timeout went straight to fail.lua"
    assert events(timed_out, "stale_write_refused") == []
    [voided] = events(timed_out, "lease_expired")
    assert "job timeout" in voided.fields["reason"] and int(voided.fields["left_ms"]) > 0  # live when given up
    # The heartbeat kept the lease while it hung: the timeout ended it, at the handler's timeout_s
    # (RQ's timer starts when the job starts, a moment before the claim).
    [claimed] = events(timed_out, "attempt_claimed")
    held_ms = (voided.at - claimed.at).total_seconds() * 1000
    assert spec.timeout_s * 1000 - 500 <= held_ms < spec.timeout_s * 1000 + 5000, held_ms

    report = h.sweeper.run_once()
    assert list(report.reconciled) == [a1.id] and not report.errors  # decided: Attempt 2 in backoff
    after = h.task(task.id)
    first = after.attempts[0]
    assert first.state is AttemptState.FAILED and first.settled_by == "reconcile"
    assert first.failure is not None and first.failure.failure_class is FailureClass.EXECUTOR
    assert [e.attempt for e in events(after, "attempt_reconciled")] == [1]
    assert len(after.attempts) == 2 and after.attempts[1].previous == first.id and after.attempts[1].reason


def test_a_worker_outlives_a_redis_outage_and_serves_again(own_redis: RedisServer, tmp_path: Path) -> None:
    """redis-server SIGKILLed under a running (non-burst) worker and started again a few seconds
    later: the worker process is still there and runs the next task."""
    import os
    import signal
    import subprocess
    import sys

    import mc_queue
    from mc_queue.testing import unique_prefix
    from tests.apps.basic import app

    prefix = unique_prefix()
    ac = app.connect(own_redis.url, prefix=prefix)
    first = ac.enqueue("noop", {"n": 1})
    env = {**os.environ, "MCQ_HOME": str(tmp_path / "home")}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", own_redis.url, "--prefix", prefix,
                             "worker", "--app", "tests.apps.basic:app", "--kind", "simple", "--name", "survivor"],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: ac.client.reads.get_task(first.id).state is TaskState.SUCCEEDED, 30, "the first task")
        own_redis.stop(signal.SIGKILL)
        time.sleep(3)
        assert proc.poll() is None, "the worker exited during the outage"
        own_redis.start()
        q = mc_queue.connect(own_redis.url, prefix=prefix)
        second = app.connect(own_redis.url, prefix=prefix).enqueue("noop", {"n": 2})
        wait_for(lambda: q.reads.get_task(second.id).state is TaskState.SUCCEEDED, 40, "the task after the outage")
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_stop_signal_between_two_jobs_stops_the_worker(h: Harness, tmp_path: Path) -> None:
    """SIGTERM reaching the worker's main process while it records a job's success with RQ (no longer busy,
    not yet waiting for the next job): RQ raised StopRequested inside that Redis call, where the job's
    handling swallowed it, and the worker then waited in its next dequeue until killed (seen under load
    by bench_priority's smoke run: 1 stop in 8 lost). The worker must stop, having recorded the job. (A
    simple worker: it records the success in its main process; a forking worker's work horse does.)"""
    points = tmp_path / "points"
    points.mkdir()
    h.extra_env[failpoints.ENV] = str(points)
    failpoints.arm(points, "worker.between_jobs", "stop")
    task = h.basic.enqueue("noop", {})
    w = h.spawn(h.worker_cmd("simple", BASIC, burst=False))  # (a burst worker would stop after the job anyway)
    wait_for(lambda: proc_state(w.pid) == "T", 30, "the worker to freeze between two jobs")
    h.stopped.add(w.pid)
    os.kill(w.pid, signal.SIGTERM)  # delivered when it resumes, right where it froze
    h.sigcont(w.pid)
    assert w.wait(20) == 0, h.worker_log(w)
    assert h.task(task.id).state is TaskState.SUCCEEDED

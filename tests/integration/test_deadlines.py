"""Deadlines (issue 18): start_by and finish_by on Redis's clock, both sides of each boundary.

A task not started by its start_by is never claimed after it and the sweeper cancels it with the
deadline as its reason; one that started in time is left alone until its finish_by; one not ended by its
finish_by is canceled (a running Attempt signalled). A deadline that could never be met is refused at
enqueue with nothing written, and a task without deadlines stores nothing more.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import mc_queue
from mc_queue import Sweeper, TaskState
from mc_queue.testing import RedisServer

QUEUE = "jobs"


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def redis_now(q: mc_queue.Client) -> datetime:
    return datetime.fromtimestamp(q.backend.redis_time_ms() / 1000, tz=UTC)


def wait_past(when: datetime, q: mc_queue.Client) -> None:
    while redis_now(q) <= when:
        time.sleep(0.02)


@pytest.mark.parametrize("kwargs", [
    {"start_by": "past"}, {"finish_by": "past"}, {"start_by": "soon", "delay_s": 60},
    {"start_by": "later", "finish_by": "soon"}, {"start_by": datetime(2030, 1, 1)},  # no time zone
    {"start_by": timedelta(0)}, {"finish_by": timedelta(seconds=-5)}, {"start_by": 1234},
])
def test_a_deadline_that_could_never_be_met_is_refused_with_nothing_written(q: mc_queue.Client,
                                                                             kwargs: dict[str, Any]) -> None:
    q.producer.enqueue(QUEUE, "h", {"n": 0})
    now = redis_now(q)
    moments = {"past": now - timedelta(seconds=1), "soon": now + timedelta(seconds=5),
               "later": now + timedelta(seconds=30)}
    args = {k: moments.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    before = snapshot(q)
    with pytest.raises(mc_queue.InvalidArgument, match=r"start_by|finish_by"):
        q.producer.enqueue(QUEUE, "h", {"n": 1}, **args)
    assert snapshot(q) == before


def test_a_task_without_deadlines_stores_nothing_more(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    fields = q.redis.hgetall(q.keys.task(t.id).task)
    assert "start_by" not in fields and "finish_by" not in fields
    assert not q.redis.exists(q.keys.deadlines(QUEUE))
    assert t.start_by is None and t.finish_by is None


def test_claimed_before_its_start_by_it_runs_after_it_it_is_canceled(q: mc_queue.Client) -> None:
    sweeper = Sweeper(q)
    in_time = q.producer.enqueue(QUEUE, "h", {"n": 1}, start_by=timedelta(milliseconds=400))
    late = q.producer.enqueue(QUEUE, "h", {"n": 2}, start_by=timedelta(milliseconds=400))
    assert late.start_by is not None and abs((late.start_by - redis_now(q)).total_seconds() - 0.4) < 0.2
    lease = q.leases.claim_attempt(in_time.id, "w1", 60_000)  # before its start_by: taken
    wait_past(late.start_by, q)
    with pytest.raises(mc_queue.ClaimRejected, match="start_by"):  # after it: no claim takes it
        q.leases.claim_attempt(late.id, "w1", 60_000)
    report = sweeper.run_once()
    assert report.deadlines == [f"{late.id} start_by"]
    gone = q.reads.get_task(late.id)
    assert gone.state is TaskState.CANCELED and "deadline missed: not started by its start_by" in \
        (gone.cancel_requested or "")
    assert gone.attempts[0].state.value == "canceled"
    # the one that started in time is left alone, and nothing waits in the deadline index for either
    assert q.reads.get_task(in_time.id).state is TaskState.RUNNING
    assert q.redis.zcard(q.keys.deadlines(QUEUE)) == 0
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1")
    assert int(q.redis.hget(q.keys.stats, f"deadline_missed|{QUEUE}|start_by")) == 1


def test_started_in_time_it_is_checked_again_at_its_finish_by_and_canceled_then(q: mc_queue.Client) -> None:
    sweeper = Sweeper(q)
    t = q.producer.enqueue(QUEUE, "h", {"n": 1}, start_by=timedelta(milliseconds=300),
                           finish_by=timedelta(milliseconds=900))
    lease = q.leases.claim_attempt(t.id, "w1", 60_000)
    assert t.start_by is not None and t.finish_by is not None
    wait_past(t.start_by, q)
    assert sweeper.run_once().deadlines == []  # started in time: its finish_by is next
    assert q.redis.zscore(q.keys.deadlines(QUEUE), t.id) == round(t.finish_by.timestamp() * 1000)
    wait_past(t.finish_by, q)
    assert sweeper.run_once().deadlines == [f"{t.id} finish_by"]
    running = q.reads.get_task(t.id)
    assert running.state is TaskState.RUNNING and "not ended by its finish_by" in (running.cancel_requested or "")
    with pytest.raises(mc_queue.CancelRequested):  # the executor hears it and acknowledges instead
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"late": True}, worker_id="w1")
    q.leases.acknowledge_cancel(lease.attempt_id, lease.fence, worker_id="w1")
    sweeper.run_once()
    assert q.reads.get_task(t.id).state is TaskState.CANCELED


def test_a_finish_by_before_it_ever_started_cancels_a_waiting_task(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1}, finish_by=datetime.now(UTC) + timedelta(seconds=0.3))
    assert t.finish_by is not None
    wait_past(t.finish_by, q)
    Sweeper(q).run_once()
    assert q.reads.get_task(t.id).state is TaskState.CANCELED


def test_a_task_that_ended_in_time_leaves_the_deadline_index(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1}, start_by=timedelta(milliseconds=200))
    lease = q.leases.claim_attempt(t.id, "w1", 60_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1")
    assert t.start_by is not None
    wait_past(t.start_by, q)
    assert Sweeper(q).run_once().deadlines == []
    assert q.redis.zcard(q.keys.deadlines(QUEUE)) == 0
    assert q.reads.get_task(t.id).state is TaskState.SUCCEEDED


def test_a_retry_after_the_start_by_of_a_task_that_started_in_time_runs(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1}, start_by=timedelta(milliseconds=300))
    lease = q.leases.claim_attempt(t.id, "w1", 60_000)
    retry = mc_queue.Decision("retry", "transient", 0.0, next_reason="a transient failure, try again")
    q.leases.fail_attempt(lease.attempt_id, lease.fence,
                          mc_queue.make_failure(mc_queue.FailureClass.PROVIDER, "Timeout", "slow"), worker_id="w1",
                          decision=retry)
    assert t.start_by is not None
    wait_past(t.start_by, q)
    Sweeper(q).run_once()
    second = q.leases.claim_attempt(t.id, "w1", 60_000)  # Attempt 2: the task started in time
    assert second.number == 2


def _mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          capture_output=True, text=True, timeout=60)


def test_mcq_enqueue_with_deadlines_and_mcq_show(redis_server: RedisServer, prefix: str, q: mc_queue.Client) -> None:
    made = _mcq(redis_server, prefix, "enqueue", "noop", "--app", "tests.apps.basic:app", "--payload", "{}",
                "--start-by", "10m", "--finish-by", "2027-01-01T00:00:00Z")
    assert made.returncode == 0, made.stderr
    tid = made.stdout.strip()
    task = q.reads.get_task(tid)
    assert task.start_by is not None and task.finish_by == datetime(2027, 1, 1, tzinfo=UTC)
    assert 590 < (task.start_by - redis_now(q)).total_seconds() <= 600
    shown = _mcq(redis_server, prefix, "show", tid).stdout
    assert "deadlines: start by" in shown and "2027-01-01T00:00:00.000Z" in shown
    bad = _mcq(redis_server, prefix, "enqueue", "noop", "--app", "tests.apps.basic:app", "--payload", "{}",
               "--start-by", "2020-01-01T00:00:00Z")
    assert bad.returncode == 2 and "could never start in time" in bad.stderr

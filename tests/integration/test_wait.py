"""Waiting for a result (``client.results.wait`` / ``wait_many``, ``mcq wait``): no lost wakeup, and
every way a task ends ends the wait with its reason. Both sides of each boundary: finished before /
during / after the waiter started, succeeded / canceled / failed / blocked / quarantined / purged,
ended / not yet (timeout), a retry in between (not an end), a task that never existed."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, make_failure
from mc_queue.client.results import WaitTimedOut
from mc_queue.contracts.keys import new_task_id
from mc_queue.testing import RedisServer

QUEUE = "jobs"
FAILURE = make_failure(FailureClass.VALIDATION, "TestsFailed", "3 tests failed")


def finish(q: mc_queue.Client, tid: str, result: Any = None) -> None:
    lease = q.leases.claim_attempt(tid, "w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, result or {"ok": tid[-4:]}, worker_id="w1")


def test_a_task_that_finished_before_the_wait_returns_at_once(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    finish(q, t.id, {"answer": 42})
    t0 = time.monotonic()
    out = q.results.wait(t.id, timeout_s=5)
    assert time.monotonic() - t0 < 0.2
    assert out.succeeded and out.state == "succeeded" and out.result == {"answer": 42}
    assert out.reason == "attempt 1 succeeded" and out.task is not None and out.task.id == t.id


def test_a_task_that_finishes_during_the_wait_wakes_it(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    timer = threading.Timer(0.3, finish, (q, t.id, {"late": True}))
    timer.start()
    t0 = time.monotonic()
    out = q.results.wait(t.id, timeout_s=10, max_poll_s=0.05)
    took = time.monotonic() - t0
    timer.join()
    assert out.result == {"late": True} and 0.25 <= took < 1.0


def test_the_timeout_is_mandatory_and_ends_the_wait_with_the_state(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    with pytest.raises(TypeError):
        q.results.wait(t.id)  # type: ignore[call-arg]
    t0 = time.monotonic()
    with pytest.raises(WaitTimedOut, match=r"had not ended after 0\.3s") as exc:
        q.results.wait(t.id, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 1.0
    assert exc.value.states == {t.id: "pending"}


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan, True, "5", 8 * 86_400])
def test_a_bad_timeout_is_refused(q: mc_queue.Client, timeout: Any) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    with pytest.raises(mc_queue.InvalidArgument, match="timeout_s"):
        q.results.wait(t.id, timeout_s=timeout)


def test_a_task_that_never_existed_is_not_waited_for(q: mc_queue.Client) -> None:
    with pytest.raises(mc_queue.TaskNotFound):
        q.results.wait(new_task_id(QUEUE), timeout_s=5)
    with pytest.raises(mc_queue.InvalidArgument):
        q.results.wait("not a task id", timeout_s=5)


def test_cancel_ends_the_wait_with_its_reason(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    threading.Timer(0.2, q.operator.cancel_task, (t.id, "the issue was closed upstream")).start()
    out = q.results.wait(t.id, timeout_s=10)
    assert out.state == "canceled" and out.result is None
    assert out.reason == "canceled: the issue was closed upstream"


@pytest.mark.parametrize(("decision", "state", "words"), [
    (Decision("wait", "a person looks first"), "failed", "waits for a person to retry it: a person looks first"),
    (Decision("stop", "the budget is spent", attention={"task_id": "x", "why_unsafe": "a test"}), "blocked",
     "blocked: waits for a person"),
    (Decision("quarantine", "the same failure three times", attention={"task_id": "x", "why_unsafe": "a test"}),
     "quarantined", "quarantined (in the DLQ)"),
])
def test_a_failure_that_waits_for_a_person_ends_the_wait(q: mc_queue.Client, decision: Decision, state: str,
                                                         words: str) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w1", decision=decision)
    out = q.results.wait(t.id, timeout_s=5)
    assert out.state == state and out.result is None
    assert out.reason.startswith("attempt 1 failed (validation TestsFailed: 3 tests failed)") and words in out.reason


def test_a_retry_is_not_an_end_the_wait_goes_on_to_the_next_attempt(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    retry = Decision("retry", "transient", 0.2, next_reason="transient failure, try again", next_hypothesis="")
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.PROVIDER, "Timeout", "slow"),
                          worker_id="w1", decision=retry)

    def second() -> None:
        time.sleep(0.4)
        finish(q, t.id, {"second": True})

    threading.Thread(target=second).start()
    out = q.results.wait(t.id, timeout_s=10, max_poll_s=0.05)
    assert out.result == {"second": True} and out.reason == "attempt 2 succeeded"


def test_a_purge_ends_the_wait_with_who_and_why(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    q.operator.cancel_task(t.id, "not needed any more")
    q.operator.retire_task(t.id, states=["canceled"], reason="purged by the test")
    out = q.results.wait(t.id, timeout_s=5)
    assert out.state == "purged" and out.task is None and "purged by the test" in out.reason


def test_no_wakeup_is_lost_before_during_or_after_the_waiter_starts(q: mc_queue.Client) -> None:
    """2,000 tasks: a third finish before wait_many starts, the rest while it waits, in random order
    from two threads; every one is returned with its own result (bench_schedule counts 100,000)."""
    ids = [q.producer.enqueue(QUEUE, "h", {"n": i}).id for i in range(2000)]
    rng = random.Random(7)
    before, rest = ids[:700], ids[700:]
    for tid in before:
        finish(q, tid)
    rng.shuffle(rest)
    halves = [rest[::2], rest[1::2]]

    def worker(part: list[str]) -> None:
        for i, tid in enumerate(part):
            finish(q, tid)
            if i % 50 == 0:
                time.sleep(0.01)

    threads = [threading.Thread(target=worker, args=(h,)) for h in halves]
    for th in threads:
        th.start()
    out = q.results.wait_many(ids, timeout_s=120, max_poll_s=0.05)
    for th in threads:
        th.join()
    assert len(out) == 2000 and all(o.result == {"ok": tid[-4:]} for tid, o in out.items())


def _mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          capture_output=True, text=True, timeout=60)


def test_mcq_wait_prints_the_outcome_and_exits_by_it(redis_server: RedisServer, prefix: str,
                                                     q: mc_queue.Client) -> None:
    done, stuck, canceled = (q.producer.enqueue(QUEUE, "h", {"n": i}).id for i in range(3))
    finish(q, done, {"answer": 42})
    q.operator.cancel_task(canceled, "the issue was closed upstream")
    ok = _mcq(redis_server, prefix, "wait", done, "--timeout", "5s")
    assert ok.returncode == 0 and ok.stdout.strip() == f'{done} succeeded: attempt 1 succeeded; result {{"answer": 42}}'
    other = _mcq(redis_server, prefix, "wait", done, canceled, "--timeout", "5s")
    assert other.returncode == 7 and "canceled: the issue was closed upstream" in other.stdout
    late = _mcq(redis_server, prefix, "wait", stuck, "--timeout", "300ms")
    assert late.returncode == 8 and f"{stuck} pending" in late.stderr
    missing = _mcq(redis_server, prefix, "wait", new_task_id(QUEUE), "--timeout", "1s")
    assert missing.returncode == 2 and "no task" in missing.stderr
    assert _mcq(redis_server, prefix, "wait", done).returncode == 2  # --timeout is required

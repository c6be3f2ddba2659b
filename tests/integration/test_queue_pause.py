"""Queue pause and resume (issue 10): claims of a paused queue's Attempts are refused, the sweeper does
not dispatch them, a real burst worker process takes nothing and runs the task after the resume; every
change is in the namespace log with who and why; `mcq status` shows the paused queue."""

from __future__ import annotations

import json

import pytest

import mc_queue
from mc_queue import TaskState
from mc_queue.contracts.errors import ClaimRejected, InvalidArgument
from tests.harness import Harness, harness_fixture

REASON = "the provider is down for maintenance"


h = harness_fixture(Harness)


def test_a_paused_queue_refuses_claims_and_the_task_stays_pending(q: mc_queue.Client) -> None:
    task = q.producer.enqueue("jobs", "h", {"n": 1})
    other = q.producer.enqueue("other", "h", {"n": 2})
    assert q.operator.pause_queue("jobs", reason=REASON, actor="alice") is True
    assert q.operator.pause_queue("jobs", reason=REASON) is False  # already paused: nothing changes
    with pytest.raises(ClaimRejected, match="queue jobs is paused"):
        q.leases.claim_attempt(task.id, "w1", 60_000)
    after = q.reads.get_task(task.id)
    assert after.state is TaskState.PENDING and after.attempts[0].state.value == "pending"
    assert [e for e in after.events if e.type == "claim_refused"]
    q.leases.claim_attempt(other.id, "w1", 60_000)  # another queue is not affected
    assert q.reads.paused_queues()["jobs"]["actor"] == "alice"
    assert q.reads.paused_queues()["jobs"]["reason"] == REASON
    assert q.operator.resume_queue("jobs", reason="maintenance is over now", actor="bob") is True
    assert q.operator.resume_queue("jobs", reason="maintenance is over now") is False
    assert q.leases.claim_attempt(task.id, "w1", 60_000).fence > 0
    log = [e for e in q.reads.namespace_events() if e["type"] in ("queue_paused", "queue_resumed")]
    assert [(e["type"], e["queue"], e["actor"], e["reason"]) for e in log] == [
        ("queue_paused", "jobs", "alice", REASON), ("queue_resumed", "jobs", "bob", "maintenance is over now")]


def test_pause_arguments_are_checked(q: mc_queue.Client) -> None:
    with pytest.raises(InvalidArgument):
        q.operator.pause_queue("jobs", reason="short")
    with pytest.raises(InvalidArgument):
        q.operator.pause_queue("bad queue", reason=REASON)
    assert q.reads.paused_queues() == {}


def test_a_burst_worker_takes_nothing_from_a_paused_queue_and_runs_it_after_resume(h: Harness) -> None:
    task = h.basic.enqueue("noop", {})  # dispatched to RQ at once
    out = h.mcq("queue", "pause", "jobs", "--reason", REASON)
    assert out.returncode == 0, out.stderr
    h.run_worker("fork")  # takes the message, its claim is refused: ends quietly
    t = h.task(task.id)
    assert t.state is TaskState.PENDING and t.attempts[0].state.value == "pending"
    assert any(e.type == "claim_refused" and "paused" in (e.fields.get("reason") or "") for e in t.events)
    # the sweeper does not send it again while the queue is paused (its recheck is due at once)
    h.client.redis.hset(h.client.keys.task(task.id).task, "1.dispatched_at", 0)
    report = h.sweeper.run_once()
    assert report.paused == [t.attempts[0].id] and not report.dispatched, report.as_dict()
    h.run_worker("fork")
    assert h.task(task.id).state is TaskState.PENDING
    status = h.mcq("status", "--json")
    assert json.loads(status.stdout)["paused"]["jobs"]["reason"] == REASON
    text = h.mcq("status")
    assert "queue jobs PAUSED" in text.stdout, text.stdout
    out = h.mcq("queue", "resume", "jobs", "--reason", "maintenance is over now")
    assert out.returncode == 0, out.stderr
    assert json.loads(h.mcq("status", "--json").stdout)["paused"] == {}
    report = h.sweeper.run_once()
    assert report.dispatched == [t.attempts[0].id], report.as_dict()
    h.run_worker("fork")
    done = h.task(task.id)
    assert done.state is TaskState.SUCCEEDED, [e.type for e in done.events]
    events = [e for e in h.client.reads.namespace_events() if e["type"] in ("queue_paused", "queue_resumed")]
    assert [(e["type"], e["actor"]) for e in events] == [("queue_paused", "operator"), ("queue_resumed", "operator")]


def test_the_cli_refuses_a_short_reason(h: Harness) -> None:
    out = h.mcq("queue", "pause", "jobs", "--reason", "short")
    assert out.returncode == 2
    assert h.client.reads.paused_queues() == {}


def test_a_paused_queue_does_not_hold_back_other_queues(q: mc_queue.Client) -> None:
    """More due dispatches of a paused queue than one sweeper batch, ahead of another queue's: the
    other queue's Attempt is still dispatched in the same pass; the paused ones are not sent."""
    from mc_queue.ops.sweeper import Sweeper

    held = [q.producer.enqueue("jobs", "h", {"n": i}) for i in range(12)]
    q.operator.pause_queue("jobs", reason=REASON)
    other = q.producer.enqueue("other", "h", {"n": 99})
    report = Sweeper(q, batch=5).run_once()
    assert report.dispatched == [f"{other.id}/1"], report
    assert report.paused and set(report.paused) <= {f"{t.id}/1" for t in held}  # (a page of its walk)
    assert all(q.reads.get_task(t.id).attempts[0].dispatches == 0 for t in held)
    # An outbox entry of a version before 2026-12 of a paused queue stays in it, and does not hold
    # back the other queue's either.
    q.redis.zadd(q.keys.outbox, {f"{t.id}/1": 0 for t in held})
    late = q.producer.enqueue("other", "h", {"n": 100})
    report = Sweeper(q, batch=5).run_once()
    assert report.dispatched == [f"{late.id}/1"], report
    assert all(q.redis.zscore(q.keys.outbox, f"{t.id}/1") is not None for t in held)

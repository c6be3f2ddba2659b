"""The claim hands the worker what it runs from (issue 17: one round trip less per Attempt).

``claim_attempt(with_task=True)`` returns the task as the claim left it (``Lease.task``): the same task
``get_task`` reads right after, less its events; a resend of the same claim (same request id) returns
it again; without the flag the reply is what it was. A refused claim carries no task.
"""

from __future__ import annotations

import pytest

import mc_queue
from mc_queue.contracts.errors import ClaimRejected


def _without_events(task: mc_queue.Task) -> dict[str, object]:
    return task.model_dump(exclude={"events"})


def test_a_claim_with_the_task_returns_what_get_task_reads_after_it(q: mc_queue.Client) -> None:
    task = q.producer.enqueue("jobs", "h", {"n": 1, "text": "é" * 10}, "key-1", context={"repo": "a/b"})
    lease = q.leases.claim_attempt(task.id, "w1", 30_000, with_task=True, request_id="r1")
    assert lease.task is not None and lease.task.events == []
    read = q.reads.get_task(task.id)
    claimed, after = _without_events(lease.task), _without_events(read)
    # the lease's remaining time is read at different moments: compare the rest exactly
    assert abs((claimed.pop("lease_pttl_ms") or 0) - (after.pop("lease_pttl_ms") or 0)) < 5_000
    assert claimed == after
    assert lease.task.attempts[0].fence == lease.fence and lease.task.payload == task.payload
    again = q.leases.claim_attempt(task.id, "w1", 30_000, with_task=True, request_id="r1")  # a resend
    assert again.fence == lease.fence and again.task is not None and again.task.id == task.id


def test_without_the_flag_the_lease_carries_no_task(q: mc_queue.Client) -> None:
    task = q.producer.enqueue("jobs", "h", {"n": 2})
    assert q.leases.claim_attempt(task.id, "w1", 30_000).task is None


def test_a_refused_claim_with_the_flag_changes_nothing_and_carries_no_task(q: mc_queue.Client) -> None:
    task = q.producer.enqueue("jobs", "h", {"n": 3})
    q.leases.claim_attempt(task.id, "w1", 30_000)
    before = q.reads.get_task(task.id)
    with pytest.raises(ClaimRejected):
        q.leases.claim_attempt(task.id, "w2", 30_000, with_task=True)
    after = q.reads.get_task(task.id)
    assert after.attempts == before.attempts and after.state == before.state
    assert [e.type for e in after.events][-1] == "claim_refused"


def test_enqueue_returns_the_task_get_task_reads_after_it(q: mc_queue.Client) -> None:
    """The enqueue script hands back the task it wrote (one round trip per enqueue, not two); a resend
    with the same producer key (DUP) reads the task as it is now."""
    task = q.producer.enqueue("jobs", "h", {"n": 4, "text": "é" * 10}, "key-4", context={"repo": "a/b"}, timeout_s=30)
    assert task == q.reads.get_task(task.id)
    assert [e.type for e in task.events] == ["task_created", "attempt_created"]
    lease = q.leases.claim_attempt(task.id, "w1", 30_000)
    again = q.producer.enqueue("jobs", "h", {"n": 4, "text": "é" * 10}, "key-4", context={"repo": "a/b"},
                               timeout_s=30)
    assert again.id == task.id and again.latest is not None and again.latest.fence == lease.fence

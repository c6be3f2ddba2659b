"""Attempt 1's compact claim and success are implied by the task hash while the task stored no event
(issue 17: no history key on the plain path, ~350 bytes less per finished task). Every reader gets
the events it got when they were stored: the same types, ids (as ``emit`` makes them) and fields.
A result of at most 64 bytes keeps no digest: it is computed from the result where it is read (the
event) and in the script where a replay or a conflict must name it.

Both sides of each boundary: nothing stored before the claim / an event stored before it; nothing
between claim and success / an event between them; events after an implied success; a packed task;
a result of 64 / 65 bytes; a worker's success / a reconciled one."""

from __future__ import annotations

from itertools import pairwise

import pytest

import mc_queue
from mc_queue.contracts.codec import canonical_json, digest
from mc_queue.contracts.errors import ResultConflict
from mc_queue.contracts.failures import make_failure
from mc_queue.contracts.history import event_id
from mc_queue.contracts.models import FailureClass

QUEUE = "jobs"


def _raw(q: mc_queue.Client, task_id: str) -> dict[str, str]:
    return dict(q.redis.hgetall(q.keys.task(task_id).task))


def _ids_increase(ids: list[str]) -> bool:
    pairs = [tuple(int(p) for p in i.split("-")) for i in ids]
    return all(a < b for a, b in pairwise(pairs))


def test_the_plain_path_stores_no_history_and_reads_every_event(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1", 30_000)
    tk = q.keys.task(t.id)
    assert q.redis.exists(tk.events) == 0 and _raw(q, t.id)["ev"] == "c"
    claimed = q.reads.get_task(t.id)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    assert q.redis.exists(tk.events) == 0 and _raw(q, t.id)["ev"] == "cs"
    task = q.reads.get_task(t.id)
    assert [e.type for e in task.events] == ["task_created", "attempt_created", "attempt_claimed",
                                             "attempt_succeeded"]
    assert [e.id for e in claimed.events] == [e.id for e in task.events][:3]
    raw = _raw(q, t.id)
    created, started, ended = raw["created_at"], raw["1.started_at"], raw["1.ended_at"]
    claim_id = event_id(int(started), f"{created}-1")
    assert [e.id for e in task.events] == [f"{created}-0", f"{created}-1", claim_id, event_id(int(ended), claim_id)]
    assert _ids_increase([e.id for e in task.events])
    a = task.attempts[0]
    assert task.events[2].attempt == 1 and task.events[2].fields == {
        "worker": "w1", "fence": str(lease.fence), "lease_exp": str(int(started) + 30_000), "lease_ms": "30000"}
    assert task.events[3].attempt == 1 and task.events[3].fields["worker"] == "w1"
    assert task.events[3].fields["result_digest"] == digest(canonical_json({"ok": True})) and a.result == {"ok": True}
    assert task.events[2].at == a.started_at and task.events[3].at == a.ended_at


def test_an_event_stored_before_the_claim_keeps_the_claim_stored(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 2})
    q.reads.get_task(t.id)
    # a refused claim (it names Attempt 2, which does not exist) stores its audit event first
    try:
        q.leases.claim_attempt(t.id, "w9", 30_000, expect_attempt=2)
    except mc_queue.McqError:
        pass
    tk = q.keys.task(t.id)
    assert q.redis.llen(tk.events) == 1
    lease = q.leases.claim_attempt(t.id, "w1", 30_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    assert "ev" not in _raw(q, t.id) and q.redis.llen(tk.events) == 3
    task = q.reads.get_task(t.id)
    assert [e.type for e in task.events] == ["task_created", "attempt_created", "claim_refused", "attempt_claimed",
                                             "attempt_succeeded"]
    assert _ids_increase([e.id for e in task.events])


def test_an_event_between_claim_and_success_stores_the_success(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 3})
    lease = q.leases.claim_attempt(t.id, "w1", 30_000)
    try:  # another worker's claim is refused: stored after the implied claim
        q.leases.claim_attempt(t.id, "w2", 30_000)
    except mc_queue.McqError:
        pass
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    tk = q.keys.task(t.id)
    assert _raw(q, t.id)["ev"] == "c" and q.redis.llen(tk.events) == 2
    task = q.reads.get_task(t.id)
    assert [e.type for e in task.events] == ["task_created", "attempt_created", "attempt_claimed", "claim_refused",
                                             "attempt_succeeded"]
    assert _ids_increase([e.id for e in task.events])
    assert task.events[4].fields["worker"] == "w1" and task.events[4].fields["fence"] == str(lease.fence)


def test_events_after_an_implied_success_come_after_it(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 4})
    lease = q.leases.claim_attempt(t.id, "w1", 30_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    for _ in range(2):  # a stale write and a conflicting completion: both refused, both stored
        try:
            q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": False}, worker_id="w1")
        except mc_queue.McqError:
            pass
    task = q.reads.get_task(t.id)
    assert [e.type for e in task.events][:4] == ["task_created", "attempt_created", "attempt_claimed",
                                                 "attempt_succeeded"]
    assert len(task.events) == 6 and _ids_increase([e.id for e in task.events])
    assert _raw(q, t.id)["ev"] == "cs"


def test_a_retry_after_an_implied_claim_reads_in_order(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 5})
    lease = q.leases.claim_attempt(t.id, "w1", 30_000)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.INTERNAL, "Bug", "boom"),
                           worker_id="w1")
    task = q.reads.get_task(t.id)
    types = [e.type for e in task.events]
    assert types[:4] == ["task_created", "attempt_created", "attempt_claimed", "attempt_failed"]
    assert _ids_increase([e.id for e in task.events]) and _raw(q, t.id)["ev"] == "c"


def test_a_packed_task_reads_the_events_it_read_before(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 6})
    lease = q.leases.claim_attempt(t.id, "w1", 30_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    before = q.reads.get_task(t.id)
    while q.maintenance.pack_due(limit=100, min_age_ms=0):
        pass
    assert q.reads.is_packed(t.id)
    after = q.reads.get_task(t.id)
    assert [(e.id, e.type, e.attempt, e.fields) for e in after.events] == \
        [(e.id, e.type, e.attempt, e.fields) for e in before.events]


def test_a_short_result_keeps_no_digest_and_a_long_one_does(q: mc_queue.Client) -> None:
    for result, kept in (({"t": "x" * 56}, False), ({"t": "x" * 57}, True)):  # canonical: 64 / 65 bytes
        text = canonical_json(result)
        t = q.producer.enqueue(QUEUE, "h", {"r": len(text)})
        lease = q.leases.claim_attempt(t.id, "w1", 30_000)
        q.leases.complete_attempt(lease.attempt_id, lease.fence, result, worker_id="w1")
        assert ("1.result_digest" in _raw(q, t.id)) is kept, len(text)
        task = q.reads.get_task(t.id)
        assert task.events[-1].fields["result_digest"] == digest(text) and task.result == result
        # A resend of the same completion is the same success (DUP); another result with the same fence
        # is a conflict that names the recorded digest, in its error and in its audit event.
        assert q.leases.complete_attempt(lease.attempt_id, lease.fence, result, worker_id="w1").result == result
        with pytest.raises(ResultConflict, match=digest(text)):
            q.leases.complete_attempt(lease.attempt_id, lease.fence, {"other": 1}, worker_id="w1")
        refused = q.reads.get_task(t.id).events[-1]
        assert refused.type == "completion_conflict" and refused.fields["recorded_digest"] == digest(text)
        assert refused.fields["payload_digest"] == digest(canonical_json({"other": 1}))


def test_a_reconciled_success_is_not_a_replay(q: mc_queue.Client) -> None:
    """A success settled by reconciliation keeps no digest either: a worker's completion with the same
    fence afterwards is refused as before (stale), not taken for a resend."""
    t = q.producer.enqueue(QUEUE, "h", {"n": 7})
    lease = q.leases.claim_attempt(t.id, "w1", 30_000)
    raw_before = _raw(q, t.id)
    q.redis.hset(q.keys.task(t.id).task, mapping={"1.state": "succeeded", "1.settled_by": "reconcile",
                                                  "1.result": canonical_json({"ok": True}), "state": "succeeded"})
    with pytest.raises(mc_queue.McqError) as err:
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    assert not isinstance(err.value, ResultConflict) and raw_before["1.fence"] == str(lease.fence)

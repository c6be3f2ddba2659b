"""What the scripts do not store twice is read back as if it were: a claim's and a completion's events
say once what their Attempt's fields say (marked '~'), and a task's result is its succeeded Attempt's.
Each side of each boundary: compact / full (the completing worker or fence not the Attempt's), a task
written before (its own result field, full events) read as stored."""

from __future__ import annotations

import json

import mc_queue
from mc_queue.contracts.codec import canonical_json, digest
from mc_queue.contracts.history import decode_events
from mc_queue.contracts.states import TaskState

QUEUE = "jobs"
HANDLER = "build.run"


def stored(q: mc_queue.Client, task_id: str) -> list[dict[str, str]]:
    return [f for _, f in decode_events(q.redis.lrange(q.keys.task(task_id).events, 0, -1))]


def test_a_claim_and_a_completion_store_compact_events_and_read_back_whole(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1", lease_ms=30_000)
    q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1", lease_ms=60_000)  # the Attempt's lease moves
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1")
    # Nothing else stored before them: both stay implied by the task hash (test_implied_events.py)
    assert stored(q, t.id) == [] and q.redis.hget(q.keys.task(t.id).task, "ev") == "cs"
    task = q.reads.get_task(t.id)
    claimed, succeeded = task.events[2], task.events[3]
    assert (claimed.type, claimed.attempt) == ("attempt_claimed", 1)
    assert claimed.fields == {"worker": "w1", "fence": "1", "lease_exp": str(lease.expires_at_ms), "lease_ms": "30000"}
    assert task.attempts[0].lease_expires_at is not None  # (renewed: later than the claim's expiry)
    assert int(task.attempts[0].lease_expires_at.timestamp() * 1000) > lease.expires_at_ms
    assert (succeeded.type, succeeded.attempt) == ("attempt_succeeded", 1)
    assert succeeded.fields == {"worker": "w1", "fence": "1", "result_digest": digest(canonical_json({"ok": 1}))}
    # The packed task reads back the same events.
    while q.maintenance.pack_due(limit=10, min_age_ms=0):
        pass
    assert q.reads.is_packed(t.id) and q.reads.get_task(t.id).events == task.events


def test_a_completion_by_another_worker_name_keeps_its_whole_event(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1})  # no worker id given
    succeeded = stored(q, t.id)[-1]
    assert "~" not in succeeded and succeeded["fence"] == "1" and "worker" not in succeeded
    last = q.reads.get_task(t.id).events[-1]  # nothing filled in: read as stored
    assert {"type": last.type, "attempt": str(last.attempt), **last.fields} == succeeded


def test_a_task_keeps_no_copy_of_its_result_and_reads_it_from_the_attempt(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"answer": [4, 2]}, worker_id="w1")
    assert not q.redis.hexists(q.keys.task(t.id).task, "result")
    task = q.reads.get_task(t.id)
    assert task.state == TaskState.SUCCEEDED and task.result == {"answer": [4, 2]} == task.attempts[0].result
    # A task written before kept its own copy: that is what it reads.
    q.redis.hset(q.keys.task(t.id).task, "result", json.dumps({"answer": "old"}))
    assert q.reads.get_task(t.id).result == {"answer": "old"}


def test_a_task_not_succeeded_has_no_result(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    q.leases.fail_attempt(lease.attempt_id, lease.fence, {"type": "Boom", "failure_class": "provider", "message": "x"},
                          worker_id="w1")
    assert q.reads.get_task(t.id).result is None


def test_an_old_full_claim_event_is_read_as_stored(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    k = q.keys.task(t.id).events
    # as a task claimed before claims were implied (test_implied_events.py) stored it: in its list
    q.redis.hdel(q.keys.task(t.id).task, "ev")
    q.redis.rpush(k, json.dumps([f"{lease.claimed_now_ms}-9", "type", "attempt_claimed", "attempt", "1", "~", "1"]))
    first = json.loads(q.redis.lindex(k, 0))
    full = [first[0], "type", "attempt_claimed", "attempt", "1", "worker", "old-w", "fence", "7", "lease_exp", "5",
            "lease_ms", "9"]
    q.redis.lset(k, 0, json.dumps(full))
    fields = q.reads.get_task(t.id).events[2].fields
    assert fields == {"worker": "old-w", "fence": "7", "lease_exp": "5", "lease_ms": "9"}


def test_a_task_keeps_its_attempts_in_its_own_hash_and_one_written_before_keeps_its_attempts_hash(
        q: mc_queue.Client) -> None:
    """A task is one hash: its Attempts are fields "<n>.<field>" of it. A task written before 2026-12
    keeps them in a hash of their own (TaskKeys.attempts_v1): every script uses that one while it
    exists, and every read finds them there."""
    new = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    old = q.producer.enqueue(QUEUE, HANDLER, {"n": 2})
    tk_new, tk_old = q.keys.task(new.id), q.keys.task(old.id)
    assert q.redis.hget(tk_new.task, "1.state") == "pending" and not q.redis.exists(tk_new.attempts_v1)
    moved = {k: v for k, v in q.redis.hgetall(tk_old.task).items() if k[:1].isdigit()}
    q.redis.hdel(tk_old.task, *moved)
    q.redis.hset(tk_old.attempts_v1, mapping=moved)  # as an earlier version wrote it
    for t in (new, old):
        lease = q.leases.claim_attempt(t.id, "w1")
        assert q.reads.leases_held_by("w1").count(lease.attempt_id) == 1
        q.leases.fail_attempt(lease.attempt_id, lease.fence, {"type": "Boom", "failure_class": "provider",
                                                              "message": "down"}, worker_id="w1")
        q.operator.retry_task(t.id, "the provider is back up")
        lease = q.leases.claim_attempt(t.id, "w1")
        done = q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": t.payload["n"]}, worker_id="w1")
        assert done.number == 2 and done.result == {"ok": t.payload["n"]}
        task = q.reads.get_task(t.id)
        assert [a.state.value for a in task.attempts] == ["failed", "succeeded"] and task.result == done.result
        assert task.attempts[0].failure is not None and task.attempts[0].failure.message == "down"
    assert not q.redis.exists(tk_new.attempts_v1) and not any(k[:1].isdigit() for k in q.redis.hgetall(tk_old.task))
    assert q.redis.hget(tk_old.attempts_v1, "2.state") == "succeeded"
    while q.maintenance.pack_due(limit=10, min_age_ms=0):
        pass
    for t in (new, old):
        assert q.reads.is_packed(t.id) and q.reads.get_task(t.id).result == {"ok": t.payload["n"]}
    assert not q.redis.exists(tk_old.attempts_v1)  # packed: its Attempts are in the document

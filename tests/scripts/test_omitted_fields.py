"""A queued task stores no field that says nothing: its updated_at while it is its created_at, its fence
counter before the first fence, a retry policy or budget at version 1's base. Every read returns what
it returned when they were stored. Both sides of each boundary: the default left out / another value
stored, before / after the first write that changes it, a task written before (the fields stored)."""

from __future__ import annotations

import pytest

import mc_queue
from mc_queue.contracts.config import Backoff, Budget, RetryPolicy
from mc_queue.contracts.frozen import OMITTED, expand

QUEUE = "jobs"
HANDLER = "build.run"
LEFT_OUT = ("updated_at", "fence", "retry_policy", "budget")


def raw(q: mc_queue.Client, task_id: str) -> dict[str, str]:
    return dict(q.redis.hgetall(q.keys.task(task_id).task))


def test_a_default_task_stores_none_of_them_and_reads_them_back(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    assert not set(LEFT_OUT) & set(raw(q, t.id))
    task = q.reads.get_task(t.id)
    assert task.updated_at == task.created_at and task.fence == 0
    assert task.retry_policy == expand("retry_policy", OMITTED) == expand("retry_policy", '{"$v":1}')
    assert task.budget == expand("budget", OMITTED)
    assert RetryPolicy.model_validate_json(task.retry_policy or "") == RetryPolicy()
    assert Budget.model_validate_json(task.budget or "") == Budget()
    # The first claim writes the fence and the update time.
    lease = q.leases.claim_attempt(t.id, "w1")
    fields = raw(q, t.id)
    assert fields["fence"] == "1" == str(lease.fence) and int(fields["updated_at"]) >= int(fields["created_at"])
    assert q.reads.get_task(t.id).fence == 1


def test_a_policy_or_budget_other_than_the_default_is_stored(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1}, retry_policy=RetryPolicy(backoff=Backoff(base_s=2.0)),
                           budget=Budget(max_attempts=2))
    fields = raw(q, t.id)
    assert fields["retry_policy"] != OMITTED and fields["budget"] == '{"$v":1,"max_attempts":2}'
    task = q.reads.get_task(t.id)
    assert Budget.model_validate_json(task.budget or "").max_attempts == 2
    assert RetryPolicy.model_validate_json(task.retry_policy or "").backoff.base_s == 2.0


def test_a_task_written_with_the_fields_reads_the_same_as_one_without(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    before = q.reads.get_task(t.id)
    created = raw(q, t.id)["created_at"]
    q.redis.hset(q.keys.task(t.id).task, mapping={"updated_at": created, "fence": "0", "retry_policy": OMITTED,
                                                   "budget": OMITTED})
    assert q.reads.get_task(t.id) == before
    lease = q.leases.claim_attempt(t.id, "w1")  # the stored '0' counts up like the missing one
    assert lease.fence == 1


def test_a_packed_default_task_reads_them_back(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    live = q.reads.get_task(t.id)
    while q.maintenance.pack_due(limit=10, min_age_ms=0):
        pass
    assert q.reads.is_packed(t.id)
    assert q.reads.get_task(t.id) == live
    assert live.retry_policy == expand("retry_policy", OMITTED) and live.budget == expand("budget", OMITTED)


def test_the_first_claim_of_a_task_kept_in_one_hash_looks_for_no_fence_key_of_the_old_kind(
        q: mc_queue.Client) -> None:
    """Such a task was written after its fence counter moved into its hash: no ':fence' key to look for
    (a GET per claim saved); a task with an Attempts hash of its own still looks (tests/scripts/
    test_regressions.py covers the counter kept as a key)."""
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    q.redis.config_resetstat()
    lease = q.leases.claim_attempt(t.id, "w1")
    stats = q.redis.info("commandstats")
    assert lease.fence == 1 and "cmdstat_get" not in stats, stats.get("cmdstat_get")


def test_a_finished_attempt_stores_none_of_what_its_other_fields_say(q: mc_queue.Client) -> None:
    """Issue 17: no heartbeat time until a renewal (the claim is the last heartbeat), no elapsed time of a
    worker's success (ended_at less started_at), no claim request id once it stopped running, no dispatch
    time once claimed; each read as before. Both sides: renewed / not, succeeded / failed."""
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    q.schedule.mark_dispatched(t.id + "/1", recheck_ms=60_000)
    assert "1.dispatched_at" in raw(q, t.id)
    lease = q.leases.claim_attempt(t.id, "w1", request_id="req-1")
    fields = raw(q, t.id)
    assert "1.hb_at" not in fields and "1.dispatched_at" not in fields and fields["1.claim_req"] == "req-1"
    running = q.reads.get_task(t.id).attempts[0]
    assert running.heartbeat_at == running.started_at is not None and running.dispatches == 1
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    fields = raw(q, t.id)
    assert not {"1.hb_at", "1.elapsed_ms", "1.claim_req"} & set(fields)
    done = q.reads.get_task(t.id).attempts[0]
    assert done.started_at and done.ended_at and done.heartbeat_at == done.started_at
    assert done.elapsed_ms == int(fields["1.ended_at"]) - int(fields["1.started_at"])
    # Renewed, then failed: the renewal's heartbeat and the failure's elapsed time are stored and read.
    t2 = q.producer.enqueue(QUEUE, HANDLER, {"n": 2})
    lease = q.leases.claim_attempt(t2.id, "w1")
    q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1")
    q.leases.fail_attempt(lease.attempt_id, lease.fence, {"type": "Boom", "failure_class": "provider", "message": "x"},
                          worker_id="w1")
    fields = raw(q, t2.id)
    failed = q.reads.get_task(t2.id).attempts[0]
    assert "1.hb_at" in fields and failed.heartbeat_at is not None
    assert int(failed.heartbeat_at.timestamp() * 1000) == int(fields["1.hb_at"])
    assert failed.elapsed_ms == int(fields["1.elapsed_ms"])


def test_a_short_payload_keeps_no_digest_and_every_read_has_it(q: mc_queue.Client) -> None:
    """Issue 17: a payload of at most 64 bytes (kept whole) is its own digest's source: the hash stores
    none, every read computes it (the task, its manifest, task_created, a claim's snapshot), the same
    payload sent again under the same task id is the same task and another one a conflict that names the
    digest; a longer payload stores its digest as before. Both sides: 64 / 65 bytes of canonical JSON."""
    from mc_queue.contracts.codec import canonical_json, digest
    from mc_queue.contracts.errors import IdempotencyConflict
    from mc_queue.contracts.keys import new_task_id

    for payload, kept in (({"t": "x" * 56}, False), ({"t": "x" * 57}, True)):
        text = canonical_json(payload)
        tid = new_task_id(QUEUE)
        t = q.producer.enqueue(QUEUE, HANDLER, payload, task_id=tid)
        assert ("payload_digest" in raw(q, t.id)) is kept, len(text)
        task = q.reads.get_task(t.id)
        assert task.payload_digest == t.payload_digest == digest(text)
        assert task.attempts[0].manifest is not None and task.attempts[0].manifest.payload_digest == digest(text)
        assert task.events[0].type == "task_created" and task.events[0].fields["payload_digest"] == digest(text)
        lease = q.leases.claim_attempt(t.id, "w1", with_task=True)
        assert lease.task is not None and lease.task.payload_digest == digest(text)
        again = q.producer.enqueue(QUEUE, HANDLER, payload, task_id=tid)  # the same work: the same task
        assert again.id == t.id
        with pytest.raises(IdempotencyConflict):
            q.producer.enqueue(QUEUE, HANDLER, {"other": 1}, task_id=tid)
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
        while q.maintenance.pack_due(limit=100, min_age_ms=0):
            pass
        packed = q.reads.get_task(t.id)
        assert q.reads.is_packed(t.id) and packed.payload_digest == digest(text) == packed.events[0].fields[
            "payload_digest"]


def test_a_purge_leaves_the_producer_key_entry_it_always_left(q: mc_queue.Client) -> None:
    """The retired task's producer key entry keeps the digest the producer sent, short payload or not."""
    from mc_queue.contracts.codec import canonical_json, digest

    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 9}, "key-9")
    lease = q.leases.claim_attempt(t.id, "w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    score = int(q.redis.zscore(q.keys.done(QUEUE), t.id) or 0)
    q.maintenance.retire_batch([(t.id, score)], states=["succeeded"], reason="the test retires it", tombstone_s=3600)
    entry = str(q.redis.hget(q.keys.idem, "key-9"))
    assert entry.startswith(f"{t.id} {digest(canonical_json({'n': 9}))}|{HANDLER} purged ")

"""A task's frozen records are stored compactly and every read gives back what it gave before
(mc_queue/contracts/frozen.py), against a real redis-server: get_task, the claim's task, the
Attempt a completion returns, a packed task; and the task hash stays a compact listpack."""

from __future__ import annotations

import mc_queue
from mc_queue.contracts.codec import model_json
from mc_queue.contracts.config import Backoff, Budget, RetryPolicy


def test_the_records_are_a_few_bytes_and_read_back_in_full(q: mc_queue.Client) -> None:
    policy = RetryPolicy(backoff=Backoff(base_s=2.0, max_s=60.0))
    budget = Budget(max_attempts=2, max_cost=4.5)
    task = q.producer.enqueue("jobs", "fix", {"n": 1}, retry_policy=policy, budget=budget, lease_ms=20_000,
                              model="m1", context={"repo": "example/app"}, timeout_s=90)
    plain = q.producer.enqueue("jobs", "fix", {"n": 2})  # a handler's defaults and a small payload
    raw = q.redis.hgetall(q.keys.task(plain.id).task)
    # (a retry policy and a budget at version 1's base are not stored at all: OMITTED)
    assert [raw.get(k) for k in ("manifest", "retry_policy", "budget")] == ['{"$v":1,"lease_ms":10000}', None, None]
    assert plain.retry_policy == model_json(RetryPolicy()) and plain.budget == model_json(Budget())
    assert q.redis.object("encoding", q.keys.task(plain.id).task) == "listpack"
    assert len(q.redis.hget(q.keys.task(task.id).task, "retry_policy") or "") <= 64
    manifest = task.manifest
    assert manifest is not None and manifest.handler == "fix" and manifest.payload_digest == task.payload_digest
    assert (manifest.model, manifest.context, manifest.lease_ms, manifest.timeout_s) == (
        "m1", {"repo": "example/app"}, 20_000, 90)
    assert task.retry_policy == model_json(policy) and task.budget == model_json(budget)
    assert task.attempts[0].manifest == manifest

    lease = q.leases.claim_attempt(task.id, "w1", with_task=True)
    assert lease.task is not None and lease.task.manifest == manifest
    assert lease.task.retry_policy == model_json(policy)
    done = q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    assert done.manifest == manifest

    assert q.maintenance.pack_due(limit=10, min_age_ms=0)
    packed = q.reads.get_task(task.id)
    assert packed.manifest == manifest and packed.retry_policy == model_json(policy)
    assert packed.budget == model_json(budget) and packed.attempts[0].manifest == manifest

"""A finished task costs no entry of its own in a to-pack index: the sweeper walks each queue's done index
in order of finishing (Maintenance.pack_due). Both sides of each boundary: finished long enough / not
yet, a page boundary inside a run of equal finishing times, a task written to between its read and its
pack (tried again) / not, a topack entry left by a version before 2026-12 (drained)."""

from __future__ import annotations

import time

import mc_queue
from mc_queue.contracts.errors import StaleFence

QUEUE = "jobs"


def finish(q: mc_queue.Client, n: int) -> list[str]:
    ids = []
    for i in range(n):
        t = q.producer.enqueue(QUEUE, "h", {"n": i})
        lease = q.leases.claim_attempt(t.id, "w1")
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": i}, worker_id="w1")
        ids.append(t.id)
    return ids


def test_a_finished_task_is_packed_by_the_walk_and_listed_nowhere_else(q: mc_queue.Client) -> None:
    ids = finish(q, 3)
    assert not q.redis.exists(q.keys.topack)
    assert q.maintenance.pack_due(limit=10, min_age_ms=60_000) == 0  # not finished long enough
    assert q.maintenance.pack_due(limit=10, min_age_ms=0) == 3
    assert all(q.reads.is_packed(t) for t in ids)
    assert q.maintenance.pack_due(limit=10, min_age_ms=0) == 0  # the walk goes on from where it was
    later = finish(q, 1)
    time.sleep(0.002)
    assert q.maintenance.pack_due(limit=10, min_age_ms=0) == 1 and q.reads.is_packed(later[0])


def test_a_run_of_equal_finishing_times_across_pages_is_packed_whole(q: mc_queue.Client) -> None:
    ids = finish(q, 7)
    q.redis.zadd(q.keys.done(QUEUE), {t: 1_000 for t in ids})  # all finished in the same millisecond
    packed = 0
    for _ in range(5):
        packed += q.maintenance.pack_due(limit=2, min_age_ms=0)
    assert packed == 7 and all(q.reads.is_packed(t) for t in ids)
    assert q.redis.hget(q.keys.sweeper, f"pack|{QUEUE}") == "1000 7"


def test_a_task_written_between_its_read_and_its_pack_is_tried_again(q: mc_queue.Client) -> None:
    (tid,) = finish(q, 1)
    runner = q.maintenance.runner
    real = runner.run_many

    def zombie_first(name: str, calls: list) -> list:  # type: ignore[type-arg]
        if name == "pack":  # a refused stale write lands after the sweeper read the task
            try:
                q.leases.complete_attempt(f"{tid}/1", 99, {"x": 1}, worker_id="zombie")
            except StaleFence:
                pass
        return real(name, calls)

    runner.run_many = zombie_first  # type: ignore[method-assign]
    try:
        assert q.maintenance.pack_due(limit=10, min_age_ms=0) == 0
    finally:
        runner.run_many = real  # type: ignore[method-assign]
    assert not q.reads.is_packed(tid) and q.redis.zscore(q.keys.topack, tid) is not None
    assert q.maintenance.pack_due(limit=10, min_age_ms=0) == 1
    assert q.reads.is_packed(tid) and q.redis.zscore(q.keys.topack, tid) is None
    assert q.reads.get_task(tid).events[-1].type == "stale_write_refused"


def test_a_topack_entry_of_a_version_before_is_packed_and_drained(q: mc_queue.Client) -> None:
    (tid,) = finish(q, 1)
    q.redis.hset(q.keys.sweeper, f"pack|{QUEUE}", "99999999999999 0")  # the walk is past it
    q.redis.zadd(q.keys.topack, {tid: 1})
    assert q.maintenance.pack_due(limit=10, min_age_ms=0) == 1
    assert q.reads.is_packed(tid) and not q.redis.exists(q.keys.topack)

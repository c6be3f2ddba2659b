"""The dispatch schedule is the pending index and each Attempt's dispatched_at: no second index entry per
queued task. The sweeper's walk (Maintenance.dispatch_walk) finds what must be sent. Both sides of each
boundary: never dispatched / dispatched, within / past the recheck time, due / not yet due (backoff),
claimed / not, a backlog inside one page / across pages, an outbox entry of a version before 2026-12
drained / a task that has none."""

from __future__ import annotations

import time

import mc_queue
from mc_queue.ops.sweeper import Sweeper

QUEUE = "jobs"


def walk_all(q: mc_queue.Client, *, limit: int, recheck_ms: int) -> list[str]:
    """Every page of one walk, from rank 0 until it wraps."""
    found, offset = [], 0
    while True:
        page, offset = q.schedule.dispatch_walk(QUEUE, offset=offset, limit=limit, recheck_ms=recheck_ms)
        found += page
        if offset == 0:
            return found


def test_a_queued_task_has_one_index_entry(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    assert q.redis.zscore(q.keys.pending(QUEUE), t.id) is not None
    assert not q.redis.exists(q.keys.outbox)


def test_the_walk_finds_what_was_never_sent_and_what_was_not_claimed_in_time(q: mc_queue.Client) -> None:
    never, sent, claimed = (q.producer.enqueue(QUEUE, "h", {"n": i}) for i in range(3))
    assert q.schedule.mark_dispatched(f"{sent.id}/1", recheck_ms=60_000)
    q.leases.claim_attempt(claimed.id, "w1")
    # within the recheck time: only the one never sent
    assert walk_all(q, limit=10, recheck_ms=60_000) == [f"{never.id}/1"]
    # past it (a recheck of 1 ms): the unclaimed one too, never the claimed one
    time.sleep(0.005)
    assert sorted(walk_all(q, limit=10, recheck_ms=1)) == sorted([f"{never.id}/1", f"{sent.id}/1"])
    assert q.reads.get_task(sent.id).attempts[0].dispatches == 1


def test_a_retry_in_backoff_is_walked_only_once_it_is_due(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    q.schedule.mark_dispatched(f"{t.id}/1", recheck_ms=60_000)
    now = q.backend.redis_time_ms()
    q.redis.zadd(q.keys.pending(QUEUE), {t.id: now + 60_000})  # as a retry due in a minute is scored
    assert walk_all(q, limit=10, recheck_ms=1) == []
    q.redis.zadd(q.keys.pending(QUEUE), {t.id: now - 1})
    time.sleep(0.005)
    assert walk_all(q, limit=10, recheck_ms=1) == [f"{t.id}/1"]


def test_a_backlog_larger_than_a_page_is_walked_page_by_page(q: mc_queue.Client) -> None:
    ids = [q.producer.enqueue(QUEUE, "h", {"n": i}).id for i in range(23)]
    page, offset = q.schedule.dispatch_walk(QUEUE, offset=0, limit=10, recheck_ms=60_000)
    assert len(page) == 10 and offset == 10
    assert sorted(walk_all(q, limit=10, recheck_ms=60_000)) == sorted(f"{t}/1" for t in ids)
    last, offset = q.schedule.dispatch_walk(QUEUE, offset=20, limit=10, recheck_ms=60_000)
    assert len(last) == 3 and offset == 0  # the end: the next walk starts over


def test_the_sweeper_sends_each_due_attempt_once_per_recheck(q: mc_queue.Client) -> None:
    ids = [q.producer.enqueue(QUEUE, "h", {"n": i}).id for i in range(7)]
    sweeper = Sweeper(q, batch=3, recheck_ms=60_000, tidy_every_s=0)
    sent: list[str] = []
    for _ in range(5):
        sent += sweeper.run_once().dispatched
    assert sorted(sent) == sorted(f"{t}/1" for t in ids)  # every one, once (the rest were rechecked later)
    assert all(q.reads.get_task(t).attempts[0].dispatches == 1 for t in ids)


def test_an_outbox_entry_of_a_version_before_is_sent_and_drained(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, "h", {"n": 1})
    q.schedule.mark_dispatched(f"{t.id}/1", recheck_ms=60_000)  # the walk has nothing to do for it
    q.redis.zadd(q.keys.outbox, {f"{t.id}/1": 0})  # as an older version left it: due
    report = Sweeper(q, recheck_ms=60_000, tidy_every_s=0).run_once()
    assert report.dispatched == [f"{t.id}/1"], report.as_dict()
    assert not q.redis.exists(q.keys.outbox)  # drained: mark_dispatched dropped the entry
    assert Sweeper(q, recheck_ms=60_000, tidy_every_s=0).run_once().dispatched == []

"""Backpressure (issue 19): a queue's cap bounds the tasks it holds that have not ended, checked in the
enqueue scripts (bulk too: all or nothing) with a retry-after; the lowest priorities are shed first; a
task whose start_by the queue's age already makes impossible is refused rather than promised. Both sides
of each boundary, against the session's real redis-server; a refused enqueue writes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

import mc_queue
from mc_queue import QueueFull, TaskState
from mc_queue.client.producer import NewTask
from mc_queue.contracts.errors import InvalidArgument
from mc_queue.contracts.failures import make_failure
from mc_queue.contracts.models import FailureClass


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


@contextmanager
def shed(q: mc_queue.Client, queue: str, reason: str) -> Iterator[None]:
    """A refused enqueue inside: nothing changed but the refusal counter of ``queue`` and ``reason`` (what the
    metric mcq_enqueue_refused_total reads), up by one."""
    before, counted = snapshot(q), q.redis.hgetall(q.keys.stats)
    yield
    after, now = snapshot(q), q.redis.hgetall(q.keys.stats)
    stats = q.keys.stats
    assert {k: v for k, v in after.items() if k != stats} == {k: v for k, v in before.items() if k != stats}
    field = f"enqueue_refused|{queue}|{reason}"
    assert now == {**counted, field: str(int(counted.get(field, 0)) + 1)}, (counted, now)


def fill(q: mc_queue.Client, n: int, queue: str = "jobs", **kw: Any) -> list[mc_queue.Task]:
    return [q.producer.enqueue(queue, "h", {"n": i, **kw}) for i in range(n)]


def test_a_queue_at_its_cap_refuses_new_work_and_writes_nothing(q: mc_queue.Client) -> None:
    assert q.caps.set("jobs", 3, reason="at most three agents' work queued")
    fill(q, 3)
    with shed(q, "jobs", "queue"), pytest.raises(QueueFull, match="queue jobs holds 3 tasks, its cap is 3") as full:
        q.producer.enqueue("jobs", "h", {"n": "over"})
    assert 1 <= full.value.retry_after_s <= 60
    q.producer.enqueue("other", "h", {"n": "another queue"})  # no cap there
    s = q.caps.status("jobs")
    assert (s.max_depth, s.depth, s.room()) == (3, 3, 0)


def test_room_returns_as_tasks_end_and_running_ones_still_count(q: mc_queue.Client) -> None:
    q.caps.set("jobs", 2, reason="two at most")
    a, _ = fill(q, 2)
    lease = q.leases.claim_attempt(a.id, "w", 60_000)
    with pytest.raises(QueueFull):  # running: not ended, it still counts
        q.producer.enqueue("jobs", "h", {"n": 3})
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w")
    q.producer.enqueue("jobs", "h", {"n": 3})  # ended: room for one
    with pytest.raises(QueueFull):
        q.producer.enqueue("jobs", "h", {"n": 4})


def test_a_failed_task_waiting_for_a_person_does_not_hold_room(q: mc_queue.Client) -> None:
    q.caps.set("jobs", 1, reason="one at most")
    (a,) = fill(q, 1)
    lease = q.leases.claim_attempt(a.id, "w", 60_000)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.INTERNAL, "Bug", "x"),
                          worker_id="w", decision=mc_queue.Decision("wait", "a person looks at it"))
    assert q.reads.get_task(a.id).state is TaskState.FAILED
    q.producer.enqueue("jobs", "h", {"n": 2})


def test_the_lowest_priorities_are_shed_first(q: mc_queue.Client) -> None:
    q.caps.set("jobs", 10, reason="ten at most")
    fill(q, 2)
    with pytest.raises(QueueFull, match="2 for priority 9: the lowest are shed first"):
        q.producer.enqueue("jobs", "h", {"p": 9}, priority=9)  # priority 9 may fill a fifth: 2 of 10
    q.producer.enqueue("jobs", "h", {"p": 8}, priority=8)  # 8: two fifths, 4
    fill(q, 5)  # 8 now
    with pytest.raises(QueueFull, match="8 for priority 6"):
        q.producer.enqueue("jobs", "h", {"p": 6}, priority=6)
    q.producer.enqueue("jobs", "h", {"p": 5}, priority=5)
    q.producer.enqueue("jobs", "h", {"p": 1}, priority=1)
    with pytest.raises(QueueFull, match="holds 10 tasks"):
        q.producer.enqueue("jobs", "h", {"p": 1, "n": 2}, priority=1)


def test_a_bulk_enqueue_over_the_cap_writes_none_and_names_the_item(q: mc_queue.Client) -> None:
    q.caps.set("jobs", 4, reason="four at most")
    fill(q, 2)
    items = [NewTask("jobs", "h", {"bulk": i}) for i in range(3)]
    with shed(q, "jobs", "queue"), pytest.raises(QueueFull, match="item 3: queue jobs holds 4 tasks"):
        q.producer.enqueue_many(items)
    assert len(q.producer.enqueue_many(items[:2])) == 2  # exactly to the cap: admitted


def test_a_start_by_the_queue_age_makes_impossible_is_refused_not_promised(q: mc_queue.Client) -> None:
    q.caps.set("jobs", 100, reason="a cap, so deadlines are judged")
    fill(q, 1)
    time.sleep(0.3)  # the head of the queue has now waited 300 ms
    with shed(q, "jobs", "deadline"), pytest.raises(QueueFull, match="would not start by its start_by") as late:
        q.producer.enqueue("jobs", "h", {"n": "late"}, start_by=timedelta(seconds=0.1))
    assert late.value.retry_after_s == 0
    q.producer.enqueue("jobs", "h", {"n": "in time"}, start_by=timedelta(seconds=5))


def test_an_app_cap_does_not_replace_an_operators_and_bad_settings_change_nothing(q: mc_queue.Client) -> None:
    assert q.caps.set("jobs", 5, reason="the operator's")
    assert not q.caps.set("jobs", 50, source="app", reason="the app's")
    assert q.caps.status("jobs").max_depth == 5
    before = snapshot(q)
    for bad in (0, -1, 100_000_001):
        with pytest.raises(InvalidArgument):
            q.caps.set("jobs", bad)
    with pytest.raises(InvalidArgument):
        q.caps.set("bad queue", 5)
    assert snapshot(q) == before
    assert q.caps.delete("jobs", reason="no cap any more")
    fill(q, 6)

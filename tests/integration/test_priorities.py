"""Priorities (issue 18): nine strict levels per queue, and optional aging so that none starves.

Both sides of each boundary: a priority in range / out of it (nothing written), the default stores nothing
and keeps the queue's plain RQ queue, a more urgent task claimed before a less urgent one (one worker:
exactly in order; several: nothing out of order beyond what the workers hold at once), a message on one
of its own queue's RQ queues accepted / another queue's refused, and aging moving a waiting message up one
level per period and not before.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from rq import Queue

import mc_queue
from mc_queue import Sweeper, TaskState
from mc_queue.producer.dispatch import dispatch
from mc_queue.producer.transport import job_id, rq_queue_name, split_rq_name
from tests.harness import BASIC, Harness, harness_fixture

QUEUE = "jobs"
h = harness_fixture(Harness)


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def rq_list(h: Harness, priority: int) -> list[str]:
    return [j.decode() for j in h.rq.lrange(Queue(rq_queue_name(h.prefix, QUEUE, priority), connection=h.rq).key,
                                             0, -1)]


@pytest.mark.parametrize("bad", [0, 10, -1, True, "1", 1.5, None.__class__])
def test_a_priority_out_of_range_is_refused_with_nothing_written(q: mc_queue.Client, bad: Any) -> None:
    q.producer.enqueue(QUEUE, "h", {"n": 0})
    before = snapshot(q)
    with pytest.raises(mc_queue.InvalidArgument, match="priority"):
        q.producer.enqueue(QUEUE, "h", {"n": 1}, priority=bad)
    assert snapshot(q) == before


def test_the_default_priority_stores_nothing_and_keeps_the_plain_rq_queue(h: Harness) -> None:
    plain = h.basic.enqueue("noop", {"n": 1})
    urgent = h.basic.enqueue("noop", {"n": 2}, priority=1)
    assert "priority" not in h.client.redis.hgetall(h.client.keys.task(plain.id).task)
    assert plain.priority == 5 and urgent.priority == 1
    assert h.client.redis.hget(h.client.keys.task(urgent.id).task, "priority") == "1"
    assert rq_list(h, 5) == [job_id(h.prefix, f"{plain.id}/1")]
    assert rq_list(h, 1) == [job_id(h.prefix, f"{urgent.id}/1")]
    assert rq_queue_name(h.prefix, QUEUE) == f"mcq:{h.prefix}:{QUEUE}"
    assert split_rq_name(rq_queue_name(h.prefix, QUEUE, 3)) == (h.prefix, QUEUE, 3)


def _claim_order(h: Harness, ids: list[str]) -> list[tuple[int, int]]:
    """(claim sequence, priority) of each task's first Attempt, in claim order."""
    rows = []
    for tid in ids:
        t = h.task(tid)
        assert t.state is TaskState.SUCCEEDED, t.state
        rows.append((int(h.client.redis.hget(h.client.keys.task(tid).task, "1.seq")), t.priority))
    return sorted(rows)


def test_one_worker_takes_every_more_urgent_task_first(h: Harness) -> None:
    rng = random.Random(7)
    prios = [rng.randint(1, 9) for _ in range(40)]
    ids = [h.basic.enqueue("noop", {"n": i}, priority=p).id for i, p in enumerate(prios)]
    h.run_worker("simple", BASIC)
    order = [p for _, p in _claim_order(h, ids)]
    assert order == sorted(order), order  # no inversion at all
    # and within a priority, first come first served
    seqs = {tid: int(h.client.redis.hget(h.client.keys.task(tid).task, "1.seq")) for tid in ids}
    for p in set(prios):
        same = [tid for tid, pr in zip(ids, prios, strict=True) if pr == p]
        assert [seqs[t] for t in same] == sorted(seqs[t] for t in same)


def test_several_workers_never_take_a_less_urgent_task_beyond_what_they_hold(h: Harness) -> None:
    rng = random.Random(11)
    prios = [rng.randint(1, 9) for _ in range(60)]
    ids = [h.basic.enqueue("sleepy", {"seconds": 0.02, "n": i}, priority=p).id for i, p in enumerate(prios)]
    workers = [h.start_worker("simple", BASIC) for _ in range(3)]
    for w in workers:
        assert w.wait(120) == 0, h.worker_log(w)
    order = [p for _, p in _claim_order(h, ids)]
    window = len(workers)  # each worker holds at most one message it took and has not claimed yet
    late = [(i, j) for i in range(len(order)) for j in range(i + window, len(order)) if order[j] < order[i]]
    assert late == [], (order, late[:5])


def test_a_job_on_another_queues_priority_is_refused_and_one_of_its_own_runs(h: Harness) -> None:
    task = h.basic.enqueue("noop", {"n": 1}, priority=2)
    own = rq_list(h, 2)
    assert own == [job_id(h.prefix, f"{task.id}/1")]
    h.run_worker("simple", BASIC)
    assert h.task(task.id).state is TaskState.SUCCEEDED
    other = h.basic.enqueue("noop", {"n": 2}, priority=3)
    jid = job_id(h.prefix, f"{other.id}/1")
    foreign = Queue(f"mcq:{h.prefix}:elsewhere@p3", connection=h.rq)
    q3 = Queue(rq_queue_name(h.prefix, QUEUE, 3), connection=h.rq)
    h.rq.lrem(q3.key, 0, jid)
    h.rq.hset(f"rq:job:{jid}", "origin", foreign.name)
    h.rq.rpush(foreign.key, jid)
    h.run_worker("simple", BASIC, "--queue", "elsewhere")
    assert h.task(other.id).state is TaskState.PENDING  # refused, untouched
    refused = [f for _, f in h.client.redis.xrange(h.client.keys.refused)]
    assert any("is on queue 'jobs'" in f.get("reason", "") for f in refused), refused


def test_aging_moves_a_waiting_message_up_a_level_per_period_and_not_before(h: Harness) -> None:
    low = h.basic.enqueue("noop", {"n": 1}, priority=9)
    jid = job_id(h.prefix, f"{low.id}/1")
    strict = Sweeper(h.client)
    aging = Sweeper(h.client, priority_aging_ms=300)
    assert strict.run_once().aged == [] and rq_list(h, 9) == [jid]  # off by default: strict priorities
    assert aging.run_once().aged == [] and rq_list(h, 9) == [jid]  # younger than one period: stays
    time.sleep(0.35)
    assert aging.run_once().aged == [f"{low.id}/1 p9->p8"] and rq_list(h, 8) == [jid] and rq_list(h, 9) == []
    assert h.rq.hget(f"rq:job:{jid}", "origin").decode() == rq_queue_name(h.prefix, QUEUE, 8)
    time.sleep(0.65)
    aging.run_once()
    level = next(p for p in range(1, 10) if jid in rq_list(h, p))
    assert level <= 6  # two periods or more since: as many levels at once
    time.sleep(2.0)
    aging.run_once()
    assert rq_list(h, 1) == [jid]  # at the top, it waits its turn there
    h.run_worker("simple", BASIC)  # the moved message is still accepted (its origin moved with it)
    assert h.task(low.id).state is TaskState.SUCCEEDED


def test_a_message_aging_moved_is_still_waiting_and_not_sent_again(h: Harness) -> None:
    low = h.basic.enqueue("noop", {"n": 1}, priority=9)
    jid = job_id(h.prefix, f"{low.id}/1")
    tk = h.client.keys.task(low.id).task
    h.client.redis.hset(tk, "1.dispatched_at", str(h.client.backend.redis_time_ms() - 650))
    assert Sweeper(h.client, priority_aging_ms=300).run_once().aged == [f"{low.id}/1 p9->p7"]
    task = h.task(low.id)
    assert task.latest is not None
    assert not dispatch(h.client, h.rq, task, task.latest, claim_grace_ms=0)  # the walk's recheck: still queued
    assert rq_list(h, 7) == [jid] and rq_list(h, 9) == []  # where aging put it, its climb not undone


def test_mcq_tasks_filters_by_priority(h: Harness) -> None:
    urgent = h.basic.enqueue("noop", {"n": 1}, priority=1)
    plain = h.basic.enqueue("noop", {"n": 2})
    out = h.mcq("tasks", "--priority", "1")
    assert out.returncode == 0 and urgent.id in out.stdout and plain.id not in out.stdout and "priority 1" in out.stdout
    out = h.mcq("tasks", "--priority", "5")
    assert plain.id in out.stdout and urgent.id not in out.stdout


def test_mcq_workers_names_each_queue_once(h: Harness) -> None:
    from mc_queue.worker.runner import live_workers

    w = h.spawn(h.worker_cmd("simple", BASIC, "--name", "w-prio", burst=False))
    deadline = time.monotonic() + 20
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = [r for r in live_workers(h.client) if r["worker"] == "w-prio"]
        if rows:
            break
        time.sleep(0.1)
    w.terminate()
    w.wait(20)
    assert rows and sorted(rows[0]["queues"]) == sorted(set(rows[0]["queues"])) and QUEUE in rows[0]["queues"]

"""Tombstones live many to a bucket (lua/includes/common.lua tomb_put), not a key each, and every read
answers as a tombstone key did. Both sides of each boundary: a bucket with room / full (the next entry
goes one level down, and the lookup follows it), an id purged once / again (one entry, the new one),
inside / past the window, a tombstone of the old kind (a key) still honoured, a path bucket kept
alive as long as an entry below it."""

from __future__ import annotations

import json
import random
import time

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, make_failure
from mc_queue.contracts.errors import TaskPurged
from mc_queue.contracts.keys import TOMB_FULL, new_task_id

QUEUE = "jobs"
HANDLER = "build.run"
REASON = "the test retires ended tasks"
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def task_id(prefix: str) -> str:
    """A task id of QUEUE whose ULID starts with prefix (the rest random)."""
    return f"{QUEUE}:{prefix}" + "".join(random.choice(ALPHABET) for _ in range(26 - len(prefix)))


def retire(q: mc_queue.Client, ids: list[str], *, tombstone_s: float = 3600, reason: str = REASON) -> None:
    for tid in ids:
        q.producer.enqueue(QUEUE, HANDLER, {"id": tid}, task_id=tid)
        q.operator.cancel_task(tid, "the test cancels it before it runs")
    rows = [(tid, int(q.redis.zscore(q.keys.done(QUEUE), tid) or 0)) for tid in ids]
    out = q.maintenance.retire_batch(rows, states=["canceled"], reason=reason, tombstone_s=tombstone_s)
    assert out["retired"] == len(ids), out


def test_a_retired_task_leaves_an_entry_in_its_bucket_and_no_key(q: mc_queue.Client) -> None:
    tid = task_id("01M8X8K")
    retire(q, [tid])
    tk = q.keys.task(tid)
    assert not q.redis.exists(tk.tomb) and q.redis.exists(tk.tombs[0]) and not q.redis.exists(tk.tombs[1])
    assert [k for k in q.redis.scan_iter(match=q.keys.tag + "*") if tid in k] == []
    tomb = q.reads.tombstone(tid)
    assert tomb is not None
    assert tomb["task"] == tid and tomb["state"] == "canceled" and tomb["reason"] == REASON
    assert tomb["until_ms"] - tomb["purged_at"] == 3_600_000 and tomb["attempts"] == 1
    assert 3_500_000 < q.redis.pttl(tk.tombs[0]) <= 3_600_000
    with pytest.raises(TaskPurged):
        q.producer.enqueue(QUEUE, HANDLER, {"id": tid}, task_id=tid)
    # Its neighbour in the bucket was never purged: enqueued as usual.
    other = task_id("01M8X8K")
    assert q.producer.enqueue(QUEUE, HANDLER, {"x": 1}, task_id=other).id == other


def test_a_full_bucket_sends_the_next_entry_one_level_down_and_the_lookup_follows(q: mc_queue.Client) -> None:
    first = [task_id("01M8X8KA") for _ in range(TOMB_FULL)]
    retire(q, first)  # a bucket is full at TOMB_FULL fields, its shared record included: the last one overflows
    tk = q.keys.task(first[0])
    entries = [{f for f in q.redis.hkeys(b) if len(f) == 19} for b in tk.tombs]
    assert q.redis.hlen(tk.tombs[0]) == TOMB_FULL and entries[1] and not entries[2]
    assert entries[0] | entries[1] == {t[-19:] for t in first} and first[-1][-19:] in entries[1]
    more = [task_id("01M8X8KA") for _ in range(TOMB_FULL)]  # level 1 (the same 8 characters) fills too
    retire(q, more)
    deepest = task_id("01M8X8KA")
    retire(q, [deepest])
    assert q.redis.hlen(tk.tombs[1]) == TOMB_FULL
    assert q.redis.hexists(q.keys.task(deepest).tombs[2], deepest[-19:])
    assert q.redis.object("encoding", tk.tombs[0]) == "listpack"
    assert q.redis.object("encoding", tk.tombs[1]) == "listpack"
    for tid in (first[0], first[-1], more[0], more[-1], deepest):
        assert (q.reads.tombstone(tid) or {}).get("task") == tid
        with pytest.raises(TaskPurged):
            q.producer.enqueue(QUEUE, HANDLER, {"id": tid}, task_id=tid)
    # The buckets on the path live as long as the deepest entry's end, written last.
    tombs = q.keys.task(deepest).tombs
    assert all(q.redis.pttl(b) > 3_500_000 for b in tombs)


def test_a_path_bucket_is_kept_alive_by_a_longer_entry_below_it(q: mc_queue.Client) -> None:
    first = [task_id("01M8X8KB") for _ in range(TOMB_FULL)]
    retire(q, first, tombstone_s=60)
    tk = q.keys.task(first[0])
    assert q.redis.pttl(tk.tombs[0]) <= 60_000
    late = task_id("01M8X8KB")
    retire(q, [late], tombstone_s=7200)
    assert q.redis.pttl(tk.tombs[0]) > 7_000_000 and q.redis.pttl(q.keys.task(late).tombs[1]) > 7_000_000


def test_an_id_purged_again_keeps_one_entry_the_new_one(q: mc_queue.Client) -> None:
    tid = task_id("01M8X8KC")
    retire(q, [tid], tombstone_s=0.001)  # a window that ends at once: the id is free again
    time.sleep(0.005)  # (the 1 ms window has surely ended: enqueued within it, the id is still refused)
    q.redis.pexpire(q.keys.task(tid).tombs[0], 1)
    b = q.keys.task(tid).tombs[0]
    retire(q, [tid], tombstone_s=3600, reason="the second retirement of this id")
    tomb = q.reads.tombstone(tid) or {}
    assert tomb["reason"] == "the second retirement of this id"
    fields = [f for f in q.redis.hkeys(b) if not f.startswith("r:")]
    assert fields == [tid[-19:]]


def test_a_window_that_ended_frees_the_id_even_while_its_bucket_lives(q: mc_queue.Client) -> None:
    short, long_ = task_id("01M8X8KD"), task_id("01M8X8KD")
    retire(q, [long_], tombstone_s=3600)
    retire(q, [short], tombstone_s=0.001)
    assert q.redis.hexists(q.keys.task(short).tombs[0], short[-19:])  # still in the live bucket
    time.sleep(0.005)  # (the 1 ms window has surely ended)
    assert q.reads.tombstone(short) is None
    assert q.producer.enqueue(QUEUE, HANDLER, {"again": 1}, task_id=short).id == short


def test_a_tombstone_of_the_old_kind_is_still_honoured(q: mc_queue.Client) -> None:
    tid = task_id("01M8X8KE")
    now = q.backend.redis_time_ms()
    old = {"task": tid, "state": "succeeded", "idem_key": "", "reason": REASON, "actor": "old", "purged_at": now,
           "until_ms": now + 3_600_000, "attempts": 2, "fence": 2}
    q.redis.set(q.keys.task(tid).tomb, json.dumps(old), px=3_600_000)
    assert q.reads.tombstone(tid) == old
    with pytest.raises(TaskPurged):
        q.producer.enqueue(QUEUE, HANDLER, {"id": tid}, task_id=tid)


def test_a_purge_keeps_its_request_id_and_producer_key_in_the_bucket(q: mc_queue.Client) -> None:
    tid = new_task_id(QUEUE)
    key = "k-" + "x" * 150  # a long producer key: kept in chunks, the bucket stays a listpack
    q.producer.enqueue(QUEUE, HANDLER, {"n": 1}, idempotency_key=key, task_id=tid)
    lease = q.leases.claim_attempt(tid, "w1")
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.INTERNAL, "Bug", "it broke"),
                          worker_id="w1", decision=Decision("quarantine", "poison", attention={"task_id": tid}))
    assert q.reads.get_task(tid).state.value == "quarantined"
    n = q.operator.dlq_purge(tid, reason="the operator purges it", request_id="req-1")
    assert q.operator.dlq_purge(tid, reason="the operator purges it", request_id="req-1") == n  # DUP
    tomb = q.reads.tombstone(tid) or {}
    assert tomb["idem_key"] == key and tomb["request_id"] == "req-1" and "state" not in tomb
    assert q.redis.object("encoding", q.keys.task(tid).tombs[0]) == "listpack"

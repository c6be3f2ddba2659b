"""Values over 64 bytes are written in chunks so that the task and Attempts hashes stay compact
listpacks (lua/includes/common.lua ``put``; mc_queue.contracts.packing.join_long): every read returns
exactly what was written, on both sides of each boundary (64 / 65 bytes, the largest chunked value and
one byte more, a character of several bytes cut by a chunk's end)."""

from __future__ import annotations

from typing import Any

import pytest

import mc_queue
from mc_queue.contracts.packing import LONG_CHUNK, LONG_MAX_CHUNKS, join_long
from mc_queue.contracts.states import TaskState

QUEUE = "jobs"
HANDLER = "build.run"
BIGGEST = LONG_CHUNK * LONG_MAX_CHUNKS


def payload_of(total: int, filler: str = "x") -> dict[str, Any]:
    """A payload whose canonical JSON is exactly ``total`` bytes: {"t":"xxx..."} is 8 bytes around its text."""
    text = filler * ((total - 8) // len(filler.encode()))
    assert len(f'{{"t":"{text}"}}'.encode()) == total, "pick a total the filler divides"
    return {"t": text}


def encoding(q: mc_queue.Client, key: str) -> str:
    return str(q.redis.object("encoding", key))


@pytest.mark.parametrize("size, chunked", [(64, False), (65, True), (BIGGEST, True), (BIGGEST + 1, False)])
def test_a_payload_reads_back_exactly_and_keeps_the_hash_compact_up_to_the_largest_chunked_value(
        q: mc_queue.Client, size: int, chunked: bool) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, payload_of(size))
    tk = q.keys.task(t.id)
    stored = q.redis.hgetall(tk.task)
    assert ("payload#0" in stored) is chunked
    assert (stored["payload"][:1] == "\udcff") is chunked  # the byte 0xFF and the count
    assert q.producer.enqueue(QUEUE, HANDLER, payload_of(size), task_id=t.id).payload == payload_of(size)  # DUP
    assert encoding(q, tk.task) == ("hashtable" if size > BIGGEST else "listpack")
    assert t.payload == payload_of(size) == q.reads.get_task(t.id).payload
    lease = q.leases.claim_attempt(t.id, "w1", with_task=True)
    assert lease.task is not None and lease.task.payload == payload_of(size)


def test_a_character_cut_by_a_chunks_end_reads_back_whole(q: mc_queue.Client) -> None:
    """A chunk is 64 bytes, not 64 characters: 3-byte characters straddle the ends."""
    payload = {"t": "ab" + "\u20ac" * 100}  # 2 + 300 bytes of text: chunk ends fall inside characters
    t = q.producer.enqueue(QUEUE, HANDLER, payload)
    assert q.reads.get_task(t.id).payload == payload
    assert encoding(q, q.keys.task(t.id).task) == "listpack"


def test_a_long_result_and_a_long_failure_read_back_and_the_packed_task_keeps_them(q: mc_queue.Client) -> None:
    result = {"summary": "r" * 900, "files": ["a\u00e9.py"] * 20}
    t = q.producer.enqueue(QUEUE, HANDLER, {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1")
    q.leases.fail_attempt(lease.attempt_id, lease.fence,
                          {"type": "ProviderDown", "failure_class": "provider", "message": "m" * 500}, worker_id="w1")
    q.operator.retry_task(t.id, "the provider was down: " + "y" * 300, "it is back: " + "z" * 300)
    lease = q.leases.claim_attempt(t.id, "w1")
    done = q.leases.complete_attempt(lease.attempt_id, lease.fence, result, worker_id="w1")
    assert done.result == result
    tk = q.keys.task(t.id)
    assert encoding(q, tk.task) == "listpack" and encoding(q, tk.attempts) == "listpack"
    task = q.reads.get_task(t.id)
    assert task.state == TaskState.SUCCEEDED and task.result == result
    a1, a2 = task.attempts
    assert a1.failure is not None and a1.failure.message == "m" * 500
    assert a2.reason == "the provider was down: " + "y" * 300 and a2.hypothesis == "it is back: " + "z" * 300
    assert a2.result == result
    while q.maintenance.pack_due(limit=10, min_age_ms=0):
        pass
    assert q.reads.is_packed(t.id)
    packed = q.reads.get_task(t.id)
    assert packed.result == result and packed.attempts[0].failure == a1.failure
    assert packed.attempts[1].reason == a2.reason


def test_a_chunk_that_is_missing_is_named_not_read_as_something_else(q: mc_queue.Client) -> None:
    t = q.producer.enqueue(QUEUE, HANDLER, payload_of(200))
    q.redis.hdel(q.keys.task(t.id).task, "payload#2")
    with pytest.raises(mc_queue.McqError, match=r"payload.*missing one of its 4 chunks"):
        q.reads.get_task(t.id)


def test_join_long_leaves_alone_what_is_not_a_long_field() -> None:
    # A packed document's chunk may start with the byte 0xFF: it is not a long value's mark.
    raw = {"z0": "\udcff3", "payload": '{"a":1}', "1.result": "\udcff2", "1.result#0": "[1,", "1.result#1": "2]"}
    assert join_long(raw) == {"z0": "\udcff3", "payload": '{"a":1}', "1.result": "[1,2]"}


def test_the_sweeper_leaves_a_task_missing_a_chunk_unpacked_and_packs_the_others(q: mc_queue.Client) -> None:
    ids = []
    for n in range(2):
        t = q.producer.enqueue(QUEUE, HANDLER, payload_of(200 + 8 * n))
        lease = q.leases.claim_attempt(t.id, "w1")
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": n}, worker_id="w1")
        ids.append(t.id)
    q.redis.hdel(q.keys.task(ids[0]).task, "payload#1")
    while q.maintenance.pack_due(limit=10, min_age_ms=0):
        pass
    assert not q.reads.is_packed(ids[0]) and q.reads.is_packed(ids[1])
    assert q.redis.zscore(q.keys.topack, ids[0]) is None  # not tried again at every pass

"""Memory safety on a real redis-server: an evicting maxmemory-policy is refused at connect, and
enqueue sheds load above 90% of maxmemory while work already admitted goes on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import mc_queue
from mc_queue.testing import RedisServer, unique_prefix
from tests.integration.test_caps import shed
from tests.integration.test_cli import APP, mcq

MEM_READING_S = 1.0  # lua/includes/common.lua MEM_READING_MS


def namespace_keys(server: RedisServer, prefix: str) -> dict[str, Any]:
    """Every key of the namespace and its DUMP (streams and hashes alike)."""
    r = server.client()
    try:
        return {k: r.dump(k) for k in sorted(r.scan_iter(match=f"{{{prefix}}}*", count=1000))}
    finally:
        r.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "allkeys-random", "volatile-ttl"])
def test_an_evicting_policy_is_refused_at_connect_and_nothing_is_written(own_redis: RedisServer,
                                                                          policy: str) -> None:
    r = own_redis.client()
    r.config_set("maxmemory-policy", policy)
    prefix = unique_prefix()
    q = mc_queue.Client(own_redis.url, prefix=prefix)
    try:
        with pytest.raises(mc_queue.ConfigurationError, match=f"maxmemory-policy is '{policy}'.*noeviction"):
            q.producer.enqueue("jobs", "h", {"n": 1})
        assert namespace_keys(own_redis, prefix) == {}
    finally:
        q.close()
    out = mcq(own_redis, prefix, "enqueue", "fix-issue", *APP, "--payload", "{}")
    assert out.returncode == 2 and "maxmemory-policy" in out.stderr and "Traceback" not in out.stderr
    # The operator may allow it, knowingly.
    allowed = mc_queue.Client(own_redis.url, prefix=prefix, allow_eviction=True)
    try:
        assert allowed.producer.enqueue("jobs", "h", {"n": 1}).state is mc_queue.TaskState.PENDING
    finally:
        allowed.close()
    r.config_set("maxmemory-policy", "noeviction")
    ok = mc_queue.Client(own_redis.url, prefix=prefix)
    try:
        assert ok.backend.check_memory_policy() == "noeviction"
    finally:
        ok.close()
        r.close()


@pytest.fixture
def crowded(own_redis: RedisServer) -> Iterator[tuple[RedisServer, mc_queue.Client, Any]]:
    q = mc_queue.Client(own_redis.url, prefix=unique_prefix())
    r = own_redis.client()
    # Ballast: with ~20 MB in use, the 5-10% between the mark and maxmemory is room enough for the
    # transient buffers of a test (a bare server's 1 MB would leave only tens of KB).
    r.setrange("ballast", 20_000_000, "x")  # allocated by Redis (no 20 MB query buffer to free later)
    yield own_redis, q, r
    r.config_set("maxmemory", 0)
    q.close()
    r.close()


def squeeze(r: Any, share: float) -> None:
    """Set maxmemory so that what Redis uses now is ``share`` of it, and wait until enqueue's last reading
    of INFO memory (kept in meta for at most a second: lua/includes/common.lua) has aged out."""
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", int(used / share))
    time.sleep(MEM_READING_S)


def test_enqueue_sheds_load_above_the_high_water_mark_and_admitted_work_goes_on(crowded: Any) -> None:
    server, q, r = crowded
    admitted = q.producer.enqueue("jobs", "h", {"n": 1}, "key-1")
    waiting = q.producer.enqueue("jobs", "h", {"n": 2}, "key-2")
    lease = q.leases.claim_attempt(admitted.id, "w1", 60_000)
    squeeze(r, 0.95)

    # a refused enqueue writes nothing but its refusal's counter (mcq_enqueue_refused_total)
    with shed(q, "jobs", "overloaded"), pytest.raises(mc_queue.Overloaded, match=r"maxmemory.*new work is refused"):
        q.producer.enqueue("jobs", "h", {"n": 3}, "key-3")
    with shed(q, "jobs", "overloaded"), pytest.raises(mc_queue.Overloaded):
        q.producer.enqueue("jobs", "h", {"n": 4})

    # A resend of work already admitted still answers with its task; admitted work goes on.
    assert q.producer.enqueue("jobs", "h", {"n": 2}, "key-2").id == waiting.id
    done = q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    assert done.state is mc_queue.AttemptState.SUCCEEDED
    second = q.leases.claim_attempt(waiting.id, "w1", 60_000)
    assert q.leases.complete_attempt(second.attempt_id, second.fence, {"ok": 2},
                                     worker_id="w1").state.value == "succeeded"

    # The CLI says so with an exit code of its own, in one line; `mcq status` shows the headroom gone.
    squeeze(r, 0.95)  # (what Redis uses moves a little with every call)
    mem = q.reads.memory()
    assert mem["memory_max_bytes"] and mem["enqueue_headroom_bytes"] is not None
    assert mem["enqueue_headroom_bytes"] < 0 and mem["memory_used_bytes"] > 0.9 * mem["memory_max_bytes"]
    out = mcq(server, q.keys.prefix, "enqueue", "fix-issue", *APP, "--payload", '{"issue": 1}')
    assert out.returncode == 6, (out.returncode, out.stderr)
    assert "new work is refused" in out.stderr and "Traceback" not in out.stderr

    # Below the mark again (the operator raised maxmemory): new work is admitted.
    squeeze(r, 0.5)
    assert q.producer.enqueue("jobs", "h", {"n": 3}, "key-3").state is mc_queue.TaskState.PENDING


def test_below_the_mark_and_without_maxmemory_enqueue_is_admitted(crowded: Any) -> None:
    _server, q, r = crowded
    assert q.producer.enqueue("jobs", "h", {"n": 1}).state is mc_queue.TaskState.PENDING  # maxmemory 0: no limit
    squeeze(r, 0.8)
    assert q.producer.enqueue("jobs", "h", {"n": 2}).state is mc_queue.TaskState.PENDING


def info_calls(r: Any) -> int:
    """INFO commands the server ran so far (the scripts' own included), from INFO commandstats."""
    return int(r.info("commandstats").get("cmdstat_info", {}).get("calls", 0))


def test_enqueue_reads_info_memory_at_most_once_a_second_with_room_to_spare(crowded: Any) -> None:
    _server, q, r = crowded
    squeeze(r, 0.5)  # a mark far away: every enqueue's cost fits in the reading's room
    q.producer.enqueue("jobs", "h", {"n": 0})  # the first reading
    calls, started = info_calls(r), time.monotonic()
    for n in range(50):
        q.producer.enqueue("jobs", "h", {"n": n + 1})
    elapsed = time.monotonic() - started
    took = info_calls(r) - calls - 1  # (this read itself is one INFO)
    assert took <= 1 + int(elapsed / MEM_READING_S), (took, elapsed)
    meta = r.hgetall(q.keys.meta)
    assert int(meta["mem_room"]) > 0 and int(meta["mem_at"]) > 0


def test_a_reading_is_not_trusted_past_its_room_and_the_mark_is_not_overrun(crowded: Any) -> None:
    """Big payloads on a short headroom: the enqueues admitted on one reading use up its room long
    before the second is over, and then each one reads INFO again; the refusal comes while a reading is
    still young, and no enqueue was admitted far past the mark (at most one enqueue's own size)."""
    _server, q, r = crowded
    payload = {"blob": "x" * 200_000}
    cost = 4096 + 2 * len('{"blob":"' + "x" * 200_000 + '"}')  # an over-estimate of what one enqueue adds
    for _ in range(3):  # a loaded machine may let a reading age out on the way: then try again
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory", int((used + 2_500_000) / 0.9))  # ~2.5 MB below the mark
        time.sleep(MEM_READING_S)
        admitted = 0
        with pytest.raises(mc_queue.Overloaded):
            for _ in range(40):
                q.producer.enqueue("jobs", "h", payload)
                admitted += 1
        now_s, now_us = r.time()
        mem_at = int(r.hget(q.keys.meta, "mem_at"))
        info = r.info("memory")
        assert info["used_memory"] <= 0.9 * info["maxmemory"] + cost, "admitted past the mark"
        assert admitted >= 3
        if now_s * 1000 + now_us // 1000 - mem_at < 1000 * MEM_READING_S:
            return  # refused on a young reading: its room was used up, so INFO was read again
        r.config_set("maxmemory", 0)
        q.reads.memory()
    pytest.fail("every try outlived a reading's second: the room check was not shown")

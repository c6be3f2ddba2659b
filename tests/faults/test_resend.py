"""No silent retry: when a reply is lost, the script ran once, and mc_queue's own resend is visible.

A TcpProxy (``drop_responses``) sits between the client and a private redis-server. It forwards a
request, lets Redis run it, then closes the client's connection instead of relaying the reply. Three
counts are then compared: what mc_queue says it sent (a recorder around its script caller), what the
proxy forwarded, and what the server executed (INFO commandstats, cmdstat_evalsha).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

import mc_queue
from mc_queue.contracts.keys import Keys
from mc_queue.store.scripts import RESENDS as _RESENDS
from mc_queue.store.scripts import ScriptRunner
from mc_queue.testing import RedisServer, TcpProxy

from .helpers import SendRecorder, attempt_fields, evalsha_calls, events_of, meta


@dataclass
class Rig:
    server: RedisServer
    proxy: TcpProxy
    q: mc_queue.Client  # talks through the proxy
    direct: redis.Redis  # talks to redis-server directly (for counters and raw views)
    prefix: str

    def new_task(self, n: int = 0) -> str:
        return self.q.producer.enqueue("resend", "noop", {"n": n}).id


@pytest.fixture
def rig(own_redis: RedisServer, prefix: str) -> Iterator[Rig]:
    proxy = TcpProxy(("127.0.0.1", own_redis.port)).start()
    q = mc_queue.connect(proxy.url, prefix=prefix, socket_timeout=5.0)
    direct = own_redis.client()
    try:
        # Warm up: scripts loaded (no NOSCRIPT round trips later), namespace known, connections open.
        t = q.producer.enqueue("resend", "noop", {"warm": True})
        lease = q.leases.claim_attempt(t.id, "warm", lease_ms=60_000)
        q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="warm")
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="warm")
        q.reads.get_task(t.id)
        yield Rig(own_redis, proxy, q, direct, prefix)
    finally:
        q.close()
        direct.close()
        proxy.close()


def test_dropped_claim_reply_runs_once_and_resend_returns_same_lease(rig: Rig) -> None:
    tid = rig.new_task()
    seq_before = int(meta(rig.direct, rig.prefix)["seq"])
    evalsha_before, matched_before = evalsha_calls(rig.direct), rig.proxy.matched_requests
    rec = SendRecorder(rig.q)
    rig.proxy.drop_responses(1)
    try:
        lease = rig.q.leases.claim_attempt(tid, "w1", lease_ms=60_000)
    finally:
        rec.restore()

    # What mc_queue sent == what the proxy forwarded == what the server executed: 2.
    assert rec.sends("claim") == ["ConnectionError", "DUP"]
    assert rig.proxy.dropped_responses == 1
    assert rig.proxy.matched_requests - matched_before == 2
    assert evalsha_calls(rig.direct) - evalsha_before == 2

    # The claim itself happened exactly once on the server.
    a1 = attempt_fields(rig.direct, rig.prefix, tid, 1)
    assert (lease.fence, lease.number) == (1, 1)
    assert a1["state"] == "running" and a1["worker"] == "w1" and a1["fence"] == "1"
    assert int(a1["lease_exp"]) == lease.expires_at_ms
    assert rig.direct.hget(Keys(rig.prefix).task(tid).task, "fence") == "1"
    assert len(events_of(rig.direct, rig.prefix, tid, "attempt_claimed")) == 1
    assert events_of(rig.direct, rig.prefix, tid, "claim_refused") == []
    assert int(meta(rig.direct, rig.prefix)["seq"]) == seq_before + 1  # one claim sequence number used

    # The lease the caller got back is the real one: others are refused, the holder can finish.
    with pytest.raises(mc_queue.ClaimRejected, match="held by w1"):
        rig.q.leases.claim_attempt(tid, "w2")
    done = rig.q.leases.complete_attempt(lease.attempt_id, lease.fence, {"r": 1}, worker_id="w1")
    assert done.state == mc_queue.AttemptState.SUCCEEDED and done.fence == 1


def test_dropped_complete_reply_is_a_noop_resend(rig: Rig) -> None:
    tid = rig.new_task()
    lease = rig.q.leases.claim_attempt(tid, "w1", lease_ms=60_000)
    evalsha_before = evalsha_calls(rig.direct)
    rec = SendRecorder(rig.q)
    rig.proxy.drop_responses(1)
    try:
        att = rig.q.leases.complete_attempt(lease.attempt_id, lease.fence, {"answer": 42}, worker_id="w1")
    finally:
        rec.restore()
    assert rec.sends("complete") == ["ConnectionError", "DUP"]
    assert evalsha_calls(rig.direct) - evalsha_before == 2
    assert att.state == mc_queue.AttemptState.SUCCEEDED and att.result == {"answer": 42}
    assert len(events_of(rig.direct, rig.prefix, tid, "attempt_succeeded")) == 1
    assert events_of(rig.direct, rig.prefix, tid, "stale_write_refused") == []
    assert events_of(rig.direct, rig.prefix, tid, "completion_conflict") == []
    task = rig.q.reads.get_task(tid)
    assert task.state == mc_queue.TaskState.SUCCEEDED and task.result == {"answer": 42}
    counts = rig.direct.hgetall(Keys(rig.prefix).counts)
    assert counts["resend|succeeded"] == "2" and counts["resend|running"] == "0"  # moved once, not twice


def test_every_reply_lost_bounded_resends_then_caller_resend_gets_same_lease(rig: Rig) -> None:
    tid = rig.new_task()
    evalsha_before, conns_before = evalsha_calls(rig.direct), rig.proxy.connections
    rec = SendRecorder(rig.q)
    rig.proxy.drop_responses(_RESENDS + 1)
    try:
        with pytest.raises(redis.ConnectionError):
            rig.q.leases.claim_attempt(tid, "w1", lease_ms=60_000, request_id="req-lost")
    finally:
        rec.restore()
    assert rig.proxy.armed == 0
    sends = rec.sends("claim")
    assert sends == ["ConnectionError"] * (_RESENDS + 1)
    assert evalsha_calls(rig.direct) - evalsha_before == _RESENDS + 1 == len(sends)
    assert rig.proxy.connections - conns_before == _RESENDS  # one reconnect per resend, nothing hidden

    # "Accepted, then the reply was lost": the claim is held although the caller saw an error.
    a1 = attempt_fields(rig.direct, rig.prefix, tid, 1)
    assert a1["state"] == "running" and a1["fence"] == "1" and a1["claim_req"] == "req-lost"
    assert len(events_of(rig.direct, rig.prefix, tid, "attempt_claimed")) == 1
    assert events_of(rig.direct, rig.prefix, tid, "claim_refused") == []

    # The caller resends with the same request id: the same lease, not a ClaimRejected.
    lease = rig.q.leases.claim_attempt(tid, "w1", lease_ms=60_000, request_id="req-lost")
    assert (lease.number, lease.fence, lease.expires_at_ms) == (1, 1, int(a1["lease_exp"]))
    assert len(events_of(rig.direct, rig.prefix, tid, "attempt_claimed")) == 1
    # A different request id is a different claim: refused and recorded.
    with pytest.raises(mc_queue.ClaimRejected):
        rig.q.leases.claim_attempt(tid, "w1", request_id="req-other")
    assert len(events_of(rig.direct, rig.prefix, tid, "claim_refused")) == 1


def _claim_call_for(rig: Rig, tid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The KEYS and ARGV mc_queue itself sends to claim.lua, for task ``tid`` (taken from a real
    claim of a throwaway task, so the test follows the script's contract as it changes)."""
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    scripts = rig.q.runner
    orig = scripts.call

    def spy(name: str, keys: Any, argv: Any, *a: Any, **kw: Any) -> Any:
        if name == "claim":
            seen.append((dict(keys), dict(argv)))
        return orig(name, keys, argv, *a, **kw)

    scripts.call = spy
    try:
        dummy = rig.new_task(-1)
        rig.q.leases.claim_attempt(dummy, "spy", lease_ms=60_000)
    finally:
        scripts.call = orig
    keys, argv = seen[-1]

    def swap(v: Any) -> Any:
        return v.replace(dummy, tid) if isinstance(v, str) else v

    return {k: swap(v) for k, v in keys.items()}, {k: swap(v) for k, v in argv.items()}


def test_raw_redis_py_default_retry_resends_silently(rig: Rig) -> None:
    """The hazard mc_queue avoids: redis-py's default Retry re-sends the script without telling."""
    tid = rig.new_task()
    # redis.Redis(host, port) gets redis-py's default Retry (10 retries, jittered backoff).
    # (Redis.from_url in redis-py 8.1 builds connections with 0 retries; the constructor does not.)
    raw = redis.Redis(host="127.0.0.1", port=rig.proxy.port, decode_responses=True)
    try:
        assert raw.get_retry() is not None and raw.get_retry()._retries > 0
        scripts = ScriptRunner(raw)
        claim_keys, argv = _claim_call_for(rig, tid)
        argv.update(worker="raw", request_id="")  # a caller without request ids
        raw.ping()
        before = evalsha_calls(rig.direct)
        rig.proxy.drop_responses(1)
        reply = scripts.call("claim", claim_keys, argv)  # one call, no exception seen by the caller
        sent = evalsha_calls(rig.direct) - before
    finally:
        raw.close()
    assert sent == 2, "redis-py's default retry re-sent the script once, silently"
    # The caller is told its claim was rejected, while it is in fact the holder.
    assert reply[0] == "E_CLAIM" and reply[2] == "raw"
    a1 = attempt_fields(rig.direct, rig.prefix, tid, 1)
    assert a1["state"] == "running" and a1["worker"] == "raw" and a1["fence"] == "1"
    assert len(events_of(rig.direct, rig.prefix, tid, "attempt_claimed")) == 1
    assert len(events_of(rig.direct, rig.prefix, tid, "claim_refused")) == 1

    # mc_queue's transition connection never retries inside redis-py: its one explicit resend is
    # the only extra send, and it is counted.
    assert rig.q.writer.get_retry()._retries == 0
    tid2 = rig.new_task(2)
    before = evalsha_calls(rig.direct)
    rec = SendRecorder(rig.q)
    rig.proxy.drop_responses(1)
    try:
        lease = rig.q.leases.claim_attempt(tid2, "w1")
    finally:
        rec.restore()
    assert evalsha_calls(rig.direct) - before == len(rec.sends("claim")) == 2
    assert lease.fence == 1
    assert events_of(rig.direct, rig.prefix, tid2, "claim_refused") == []

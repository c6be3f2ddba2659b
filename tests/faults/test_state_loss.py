"""Redis loses acknowledged state: mc_queue notices, refuses to run, and never issues a fence twice.

(a) Redis restarts empty (no persistence, lost disk).
(b) Redis restarts from an older copy of its AOF (restore, failover to a lagging replica).
(c) SIGKILL of redis-server with appendonly yes + appendfsync always: nothing acknowledged is lost.
(d) The embedded server's witness remembers the epoch after its data folder was deleted.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

import mc_queue
from mc_queue import reconcile_attempt, recover
from mc_queue.contracts.keys import Keys
from mc_queue.store.embedded import stop_server
from mc_queue.testing import RedisServer

from .helpers import attempt_fields, copy_data, dump_namespace, events_of, meta, restore_data

LONG = 60_000


@pytest.fixture
def clients(own_redis: RedisServer, prefix: str) -> Iterator[list[mc_queue.Client]]:
    made: list[mc_queue.Client] = []
    yield made
    for c in made:
        c.close()


def _connect(server: RedisServer, prefix: str, made: list[mc_queue.Client]) -> mc_queue.Client:
    c = mc_queue.connect(server.url, prefix=prefix)
    made.append(c)
    return c


def _nslog_types(r: redis.Redis, prefix: str) -> list[str]:
    return [f["type"] for _, f in r.xrange(f"{Keys(prefix).tag}:nslog")]


# --------------------------------------------------------------------------- (a) empty restart


def test_empty_restart_holders_next_renew_raises_namespace_lost(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client]
) -> None:
    """The lease holder's heartbeat is the first call after the loss: it must say NamespaceLost."""
    worker = _connect(own_redis, prefix, clients)
    tid = worker.producer.enqueue("sl", "noop", {"i": 1}).id
    lease = worker.leases.claim_attempt(tid, "w1", lease_ms=LONG)
    own_redis.restart(keep_data=False)

    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
        worker.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1")  # the lease length granted at claim
    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
        worker.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1", lease_ms=LONG)
    assert _connect(own_redis, prefix, clients).reads.namespace().state == "lost"


def test_empty_restart_refuses_until_recover_and_never_reuses_a_fence(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client]
) -> None:
    worker = _connect(own_redis, prefix, clients)
    t1 = worker.producer.enqueue("sl", "noop", {"i": 1}).id
    t2 = worker.producer.enqueue("sl", "noop", {"i": 2}).id
    lease = worker.leases.claim_attempt(t1, "w1", lease_ms=LONG)
    f = lease.fence
    own_redis.restart(keep_data=False)
    r = own_redis.client()

    # The same client: its next claim and its completion are refused; Redis is marked lost.
    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
        worker.leases.claim_attempt(t2, "w1")
    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
        worker.leases.complete_attempt(lease.attempt_id, f, {"done": True}, worker_id="w1")
    assert meta(r, prefix)["state"] == "lost"
    assert "state_loss_detected" in _nslog_types(r, prefix)

    # A new client sees 'lost' and is refused too, with a message that says what to do.
    fresh = _connect(own_redis, prefix, clients)
    info = fresh.reads.namespace()
    assert info.state == "lost"
    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover") as exc:
        fresh.producer.enqueue("sl", "noop", {"i": 3})
    assert exc.value.code == "E_NSLOST"
    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
        fresh.leases.claim_attempt(t2, "w2")
    assert r.exists(Keys(prefix).task(t2).task) == 0  # nothing was written by the refused calls
    assert r.exists(Keys(prefix).queues) == 0

    # Recover, then claims work again; every new fence is above every fence issued before.
    out = recover(fresh, reason="test: redis came back empty")
    assert out["fence_floor"] > f and out["voided_leases"] == []
    assert fresh.reads.namespace().state == "ok"
    t3 = fresh.producer.enqueue("sl", "noop", {"i": 3}).id
    new = fresh.leases.claim_attempt(t3, "w2", lease_ms=LONG)
    assert new.fence > f and new.fence > out["fence_floor"] - 1
    assert fresh.leases.complete_attempt(new.attempt_id, new.fence, {"ok": 1}, worker_id="w2").fence == new.fence
    types = _nslog_types(r, prefix)
    assert types.index("state_loss_detected") < types.index("recovery_started") < types.index("recovery_finished")
    r.close()


def test_empty_restart_clients_from_before_the_loss_work_after_recovery(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client]
) -> None:
    """After `recover`, a process still holding the pre-loss epoch must not knock the namespace back
    into 'lost': its epoch is from before the recovery (retired), not from a Redis that lost data again.
    """
    worker = _connect(own_redis, prefix, clients)
    sender = _connect(own_redis, prefix, clients)
    t1 = worker.producer.enqueue("sl", "noop", {"i": 1}).id
    sender.producer.enqueue("sl", "noop", {"i": 0})
    lease = worker.leases.claim_attempt(t1, "w1", lease_ms=LONG)
    own_redis.restart(keep_data=False)
    with pytest.raises(mc_queue.NamespaceLost):
        worker.leases.claim_attempt(t1, "w1")
    ops = _connect(own_redis, prefix, clients)
    recover(ops, reason="test: redis came back empty")
    assert ops.reads.namespace().state == "ok"

    # The producer never saw the loss; it enqueues again (its old epoch is retired, it refreshes).
    t2 = sender.producer.enqueue("sl", "noop", {"i": 2}).id
    assert ops.reads.namespace().state == "ok"
    # The old worker's lease is gone with the data: its write is refused as such, not as a new loss.
    with pytest.raises((mc_queue.TaskNotFound, mc_queue.WriteRefused)):
        worker.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1", lease_ms=LONG)
    assert ops.reads.namespace().state == "ok"
    new = worker.leases.claim_attempt(t2, "w1", lease_ms=LONG)
    assert new.fence > lease.fence
    assert ops.reads.namespace().state == "ok"


# --------------------------------------------------------------------------- (b) older snapshot


@dataclass
class Snapshot:
    """An AOF copy taken mid-way, and what was issued after it (lost when the copy is restored)."""

    server: RedisServer
    prefix: str
    ops: mc_queue.Client
    w1: mc_queue.Client
    w2: mc_queue.Client
    ta: str = ""
    tb: str = ""
    td: str = ""
    lease_a1: mc_queue.Lease | None = None
    lease_a2: mc_queue.Lease | None = None
    lease_b: mc_queue.Lease | None = None
    issued: dict[str, list[int]] = field(default_factory=dict)

    def max_issued(self) -> int:
        return max(f for fences in self.issued.values() for f in fences)


def _older_snapshot(server: RedisServer, prefix: str, made: list[mc_queue.Client], tmp: Path) -> Snapshot:
    """Before the copy: A claimed (fence 1, 1 ms lease), B and C pending. After it: A expired (2),
    reconciled, retried and claimed again (3); B claimed (1); D enqueued and claimed (1).
    Then Redis is restarted from the copy: A is back at fence 1, B pending, D unknown."""
    s = Snapshot(server, prefix, _connect(server, prefix, made), _connect(server, prefix, made),
                 _connect(server, prefix, made))
    s.ta = s.ops.producer.enqueue("snap", "noop", {"t": "a"}).id
    s.tb = s.ops.producer.enqueue("snap", "noop", {"t": "b"}).id
    s.ops.producer.enqueue("snap", "noop", {"t": "c"})
    s.lease_a1 = s.w1.leases.claim_attempt(s.ta, "w1", lease_ms=1)
    server.stop()  # clean shutdown: the AOF is complete on disk
    copy = copy_data(server, tmp / "older-copy")
    assert (copy / "appendonlydir").is_dir()
    server.start()

    time.sleep(0.005)
    expired = s.ops.maintenance.expire_leases()
    # The first fence after a restart lies above the restart time (Redis TIME in microseconds).
    assert [e.old_fence for e in expired] == [1] and expired[0].new_fence > 10**15
    reconcile_attempt(s.ops, s.lease_a1.attempt_id)
    s.ops.operator.retry_task(s.ta, "worker w1 lost its lease; run it again")
    s.lease_a2 = s.w2.leases.claim_attempt(s.ta, "w2", lease_ms=LONG)
    s.lease_b = s.w2.leases.claim_attempt(s.tb, "w2", lease_ms=LONG)
    s.td = s.ops.producer.enqueue("snap", "noop", {"t": "d"}).id
    lease_d = s.w2.leases.claim_attempt(s.td, "w2", lease_ms=LONG)
    assert s.lease_a2.fence == expired[0].new_fence + 1
    assert s.lease_b.fence > 10**15 and lease_d.fence > 10**15  # above the floor the restart raised
    s.issued = {s.ta: [1, expired[0].new_fence, s.lease_a2.fence], s.tb: [s.lease_b.fence], s.td: [lease_d.fence]}

    server.stop()
    restore_data(server, copy)
    server.start()
    r = server.client()
    assert r.hget(Keys(prefix).task(s.ta).task, "fence") == "1"  # Redis went back in time
    assert r.exists(Keys(prefix).task(s.td).task) == 0
    assert meta(r, prefix)["state"] == "ok"  # nothing noticed yet
    r.close()
    return s


def _recover_and_check_no_reuse(s: Snapshot) -> None:
    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
        s.ops.leases.claim_attempt(s.tb, "w3")
    with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
        s.ops.producer.enqueue("snap", "noop", {"t": "e"})
    assert s.lease_a1 and s.lease_a2 and s.lease_b
    out = recover(s.ops, reason="test: restored from an older copy")
    assert out["voided_leases"] == [s.lease_a1.attempt_id]  # A/1 was running in the older copy
    assert out["fence_floor"] > s.max_issued()
    r = s.server.client()
    voided_to = int(r.hget(Keys(s.prefix).task(s.ta).task, "fence") or 0)
    assert voided_to > s.max_issued()

    # Writes with any fence issued before the recovery are refused (recorded, not applied).
    with pytest.raises(mc_queue.StaleFence):
        s.w1.leases.complete_attempt(s.lease_a1.attempt_id, s.lease_a1.fence, {"by": "w1"}, worker_id="w1")
    with pytest.raises(mc_queue.StaleFence):
        s.w2.leases.complete_attempt(s.lease_a2.attempt_id, s.lease_a2.fence, {"by": "w2"}, worker_id="w2")
    assert s.ops.reads.namespace().state == "ok"

    # New fences: all above every fence issued before, none twice.
    reconcile_attempt(s.ops, s.lease_a1.attempt_id)
    s.ops.operator.retry_task(s.ta, "recovered: run A again after the restore")
    new_a = s.w2.leases.claim_attempt(s.ta, "w2", lease_ms=LONG)
    new_b = s.w1.leases.claim_attempt(s.tb, "w1", lease_ms=LONG)
    te = s.ops.producer.enqueue("snap", "noop", {"t": "e"}).id
    new_e = s.w1.leases.claim_attempt(te, "w1", lease_ms=LONG)
    for lease in (new_a, new_b, new_e):
        assert lease.fence > s.max_issued()
        assert lease.fence not in s.issued.get(lease.task_id, [])
    assert new_a.fence > voided_to
    assert s.w2.leases.complete_attempt(new_a.attempt_id, new_a.fence, {"by": "w2"},
                                        worker_id="w2").fence == new_a.fence
    r.close()


def test_older_snapshot_newer_fence_is_detected(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client], tmp_path: Path
) -> None:
    """The holder's own client presents the fence it was issued (it holds the claim record): Redis
    holds 1, so Redis forgot a fence it handed out. (Its claim sequence is caught first when its
    client has seen a later claim: test_older_snapshot_claim_sequence_going_back_is_detected.)"""
    s = _older_snapshot(own_redis, prefix, clients, tmp_path)
    assert s.lease_a2 is not None
    s.w2.backend.ns.seq_seen = 0  # as if w2 had seen no claim after A/2's: only the fence can tell
    with pytest.raises(mc_queue.NamespaceLost, match=f"presented fence {s.lease_a2.fence} .*but Redis holds 1"):
        s.w2.leases.complete_attempt(s.lease_a2.attempt_id, s.lease_a2.fence, {"by": "w2"}, worker_id="w2")
    r = own_redis.client()
    assert meta(r, prefix)["state"] == "lost"
    ev = events_of(r, prefix, s.ta, "state_loss_detected")
    assert [(e["op"], e["presented_fence"], e["current_fence"], e["worker"], e["claim_seq"]) for e in ev] == [
        ("complete", str(s.lease_a2.fence), "1", "w2", str(s.lease_a2.seq))]
    assert events_of(r, prefix, s.ta, "attempt_succeeded") == []
    with pytest.raises(mc_queue.NamespaceLost):
        s.w2.leases.renew_lease(s.lease_a2.attempt_id, s.lease_a2.fence, worker_id="w2", lease_ms=LONG)
    r.close()
    _recover_and_check_no_reuse(s)


def test_older_snapshot_fence_from_a_process_without_its_claim_record_is_refused_not_a_loss(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client], tmp_path: Path
) -> None:
    """A fresh process that only knows a fence number has no evidence Redis issued it: its write is
    refused as stale (fence_ahead) and audited; the namespace is not stopped by it. The restored
    data cannot reissue that fence anyway: the first fence after the restart lies above the boot floor."""
    s = _older_snapshot(own_redis, prefix, clients, tmp_path)
    assert s.lease_a2 is not None
    restarted_worker = _connect(own_redis, prefix, clients)
    with pytest.raises(mc_queue.StaleFence):
        restarted_worker.leases.complete_attempt(s.lease_a2.attempt_id, s.lease_a2.fence, {"by": "w2"}, worker_id="w2")
    r = own_redis.client()
    assert meta(r, prefix)["state"] == "ok"
    refused = events_of(r, prefix, s.ta, "stale_write_refused")
    assert [(e["refusal"], e["presented_fence"], e["current_fence"]) for e in refused] == [
        ("fence_ahead", str(s.lease_a2.fence), "1")]
    assert events_of(r, prefix, s.ta, "attempt_succeeded") == []
    r.close()
    # A sweep and a new claim on the restored data never hand out a fence issued before the restore.
    expired = s.ops.maintenance.expire_leases()
    assert all(e.new_fence > s.max_issued() for e in expired)


def test_older_snapshot_claim_sequence_going_back_is_detected(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client], tmp_path: Path
) -> None:
    """The holder's own client has seen a higher claim sequence: its next renew is refused."""
    s = _older_snapshot(own_redis, prefix, clients, tmp_path)
    assert s.lease_b is not None
    with pytest.raises(mc_queue.NamespaceLost, match="claim sequence went backwards"):
        s.w2.leases.renew_lease(s.lease_b.attempt_id, s.lease_b.fence, worker_id="w2", lease_ms=LONG)
    r = own_redis.client()
    assert meta(r, prefix)["state"] == "lost"
    assert attempt_fields(r, prefix, s.tb, 1)["state"] == "pending"  # nothing was written to B
    r.close()
    _recover_and_check_no_reuse(s)


def test_older_snapshot_sweeper_first_never_reissues_a_fence(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client], tmp_path: Path
) -> None:
    """After the restore the first to act is the sweeper, then reconcile, retry and a fresh worker's
    claim: the (task, fence) pairs issued before the restore must not be issued again (or the
    namespace must refuse until recovered). Fence 3 of A was held by w2 before the restore.
    """
    s = _older_snapshot(own_redis, prefix, clients, tmp_path)
    sweeper = _connect(own_redis, prefix, clients)
    fresh_worker = _connect(own_redis, prefix, clients)
    issued_again: list[tuple[str, int]] = []
    try:
        expired = sweeper.maintenance.expire_leases()
        assert [(e.attempt_id, e.old_fence) for e in expired] == [(s.lease_a1.attempt_id if s.lease_a1 else "", 1)]
        # The restart raised the floor: the bump lies above every fence issued before the restore.
        assert expired[0].new_fence > s.max_issued()
        assert s.lease_a1 is not None
        reconcile_attempt(sweeper, s.lease_a1.attempt_id)
        sweeper.operator.retry_task(s.ta, "worker w1 lost its lease; run it again")
        lease = fresh_worker.leases.claim_attempt(s.ta, "w3", lease_ms=LONG)
        if lease.fence in s.issued[s.ta]:
            issued_again.append((s.ta, lease.fence))
    except mc_queue.NamespaceLost:
        pass  # refusing is fine: the loss was noticed before a fence was reused
    assert issued_again == [], f"fences issued twice after restoring an older copy: {issued_again}"


# --------------------------------------------------------------------------- (c) SIGKILL, AOF always


def test_sigkill_with_aof_always_loses_nothing(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client]
) -> None:
    q = _connect(own_redis, prefix, clients)
    r = own_redis.client()
    assert r.config_get("appendonly")["appendonly"] == "yes"
    assert r.config_get("appendfsync")["appendfsync"] == "always"
    tids = [q.producer.enqueue("kill", "noop", {"i": i}).id for i in range(12)]
    leases = [q.leases.claim_attempt(t, "w1", lease_ms=LONG) for t in tids[:8]]
    for lease in leases[:3]:
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"i": lease.task_id}, worker_id="w1")
    before = dump_namespace(r, prefix)
    seq = int(meta(r, prefix)["seq"])
    r.close()

    own_redis.restart(keep_data=True, sig=9)  # SIGKILL: no shutdown, no final fsync
    r = own_redis.client()
    assert dump_namespace(r, prefix) == before
    assert q.reads.namespace().state == "ok"
    # The clients carry on: renew and complete the held leases, claim again; the sequence continues.
    for lease in leases[3:5]:
        q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1")
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"after": "kill"}, worker_id="w1")
    nxt = q.leases.claim_attempt(tids[8], "w1", lease_ms=LONG)
    # The first fence a restarted redis-server issues lies above the restart time.
    assert nxt.fence > 10**15 and int(meta(r, prefix)["seq"]) == seq + 1
    assert _nslog_types(r, prefix) == ["namespace_created"]
    r.close()


def test_sigkill_mid_stream_keeps_every_acknowledged_claim(
    own_redis: RedisServer, prefix: str, clients: list[mc_queue.Client]
) -> None:
    """A producer/worker loop runs while redis-server is SIGKILLed: whatever was acknowledged survives."""
    q = _connect(own_redis, prefix, clients)
    acked: list[tuple[str, int, int]] = []
    stopped: list[BaseException] = []
    go = threading.Event()

    def loop() -> None:
        i = 0
        try:
            while True:
                tid = q.producer.enqueue("kill", "noop", {"i": i}).id
                lease = q.leases.claim_attempt(tid, "w1", lease_ms=LONG)
                acked.append((tid, lease.fence, lease.expires_at_ms))
                i += 1
                if i == 20:
                    go.set()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            stopped.append(exc)
        finally:
            go.set()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    assert go.wait(30)
    own_redis.kill()
    th.join(30)
    assert not th.is_alive() and stopped, "the loop should end with a connection error"
    own_redis.start()
    r = own_redis.client()
    assert len(acked) >= 20
    pipe = r.pipeline(transaction=False)
    for tid, _, _ in acked:
        tk = Keys(prefix).task(tid)
        pipe.hget(tk.task, "state")
        pipe.hget(tk.task, "fence")
        pipe.hmget(tk.attempts, "1.state", "1.fence", "1.lease_exp", "1.worker")
    replies = pipe.execute()
    for i, (_, fence, exp) in enumerate(acked):
        assert replies[3 * i: 3 * i + 2] == ["running", str(fence)]
        assert replies[3 * i + 2] == ["running", str(fence), str(exp), "w1"]
    assert int(meta(r, prefix)["seq"]) >= len(acked)
    assert q.reads.namespace().state == "ok"
    r.close()


# --------------------------------------------------------------------------- (d) embedded witness


def test_embedded_witness_remembers_the_epoch(tmp_path: Path, prefix: str) -> None:
    home = tmp_path / "home"
    made: list[mc_queue.Client] = []
    try:
        q = mc_queue.connect(home=str(home), prefix=prefix)
        made.append(q)
        assert q.embedded is not None and q.embedded.started
        tid = q.producer.enqueue("emb", "noop", {"i": 1}).id
        lease = q.leases.claim_attempt(tid, "w1", lease_ms=LONG)
        epoch = q.reads.namespace().epoch
        assert q.embedded.witness.exists() and prefix in q.embedded.witness.read_text()

        # A clean stop with the data kept is not a loss.
        assert stop_server(home)
        q2 = mc_queue.connect(home=str(home), prefix=prefix)
        made.append(q2)
        assert q2.reads.namespace().state == "ok" and q2.reads.namespace().epoch == epoch

        # Stop, delete the data folder, start again: the witness remembers the epoch.
        assert stop_server(home)
        shutil.rmtree(home / "redis")
        q3 = mc_queue.connect(home=str(home), prefix=prefix)
        made.append(q3)
        assert q3.embedded is not None and q3.embedded.started
        info = q3.reads.namespace()
        assert info.state == "lost"
        with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
            q3.producer.enqueue("emb", "noop", {"i": 2})
        with pytest.raises(mc_queue.NamespaceLost, match="mcq recover"):
            q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1", lease_ms=LONG)

        out = recover(q3, reason="test: embedded data folder deleted")
        assert q3.reads.namespace().state == "ok"
        assert q3.reads.namespace().epoch == out["epoch"] != epoch
        assert out["epoch"] in q3.embedded.witness.read_text()
        t2 = q3.producer.enqueue("emb", "noop", {"i": 2}).id
        new = q3.leases.claim_attempt(t2, "w2", lease_ms=LONG)
        assert new.fence > lease.fence and new.fence >= out["fence_floor"]
        # The client from before the loss presents the retired epoch: it refreshes and goes on.
        t3 = q.producer.enqueue("emb", "noop", {"i": 3}).id
        assert q.leases.claim_attempt(t3, "w1", lease_ms=LONG).fence > out["fence_floor"]
        assert q3.reads.namespace().state == "ok"
    finally:
        for c in made:
            c.close()
        stop_server(home)


def test_a_sweeper_that_only_read_before_a_recovery_presents_no_claim_sequence_of_the_old_epoch(
        redis_server: RedisServer, prefix: str, tmp_path: Path) -> None:
    """Issue 15 (found by bench/failover.py): a sweeper that had written nothing yet judged the lineage with
    the namespace's epoch, kept the claim sequence it read from the other processes' watermarks, and after
    a failover and `mcq recover` presented that old epoch's sequence against the new epoch: "claim
    sequence went backwards", the namespace lost a second time."""
    state = tmp_path / "state"
    worker = mc_queue.connect(redis_server.url, prefix=prefix, state_dir=state, track_replication="on")
    sweeper = mc_queue.connect(redis_server.url, prefix=prefix, state_dir=state, track_replication="on")
    try:
        for i in range(3):
            t = worker.producer.enqueue("jobs", "h", {"i": i})
            worker.leases.claim_attempt(t.id, "w1", 60_000)  # claim sequence 1, 2, 3 under the first epoch
        assert sweeper.backend.ns.epoch is None
        mc_queue.Sweeper(sweeper).run_once()  # judges the lineage with what the worker's watermark says
        assert sweeper.reads.namespace().state == "ok"
        # Redis goes back to an older copy (the claim sequence with it): the worker's next write says so.
        worker.redis.hset(Keys(prefix).meta, "seq", 1)
        t = worker.producer.enqueue("jobs", "h", {"i": 9})
        with pytest.raises(mc_queue.NamespaceLost):
            worker.leases.claim_attempt(t.id, "w1", 60_000)
        recover(worker, reason="the test recovers")
        assert worker.reads.namespace().state == "ok"
        for _ in range(2):
            mc_queue.Sweeper(sweeper).run_once()
        info = sweeper.reads.namespace()
        assert info.state == "ok", info.reason
    finally:
        worker.close()
        sweeper.close()

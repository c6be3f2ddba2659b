"""The cases an adversary broke main with (issue 8), as regression tests against a real redis-server.

Each test names the finding it pins. The fuzz test (test_fuzz.py) covers the same ground by machine;
these say it in the user's words, through the Client a user calls.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis

import mc_queue
from mc_queue import Decision, FailureClass, make_failure, recover
from mc_queue.contracts.errors import OutcomeUnknown
from mc_queue.contracts.keys import new_ulid
from mc_queue.ops.sweeper import Sweeper
from mc_queue.store.scripts import ScriptRunner

FAILURE = make_failure(FailureClass.PROVIDER, "Timeout", "the provider timed out")
REASON = "a reason that is long enough"
LONG = 60_000


def every_key(q: mc_queue.Client) -> dict[str, Any]:
    """Every key of the namespace with its value (events and counters included)."""
    out: dict[str, Any] = {}
    for key in sorted(q.redis.scan_iter(match=q.keys.tag + "*")):
        kind = q.redis.type(key)
        out[key] = {"hash": q.redis.hgetall, "zset": lambda k: q.redis.zrange(k, 0, -1, withscores=True),
                    "set": lambda k: sorted(q.redis.smembers(k)), "string": q.redis.get,
                    "stream": q.redis.xrange, "list": lambda k: q.redis.lrange(k, 0, -1)}[kind](key)
    return out


def running(q: mc_queue.Client) -> tuple[mc_queue.Task, mc_queue.Lease]:
    task = q.producer.enqueue("jobs", "h", {"n": new_ulid()})
    return task, q.leases.claim_attempt(task.id, "w1", LONG)


def quarantined(q: mc_queue.Client, key: str | None = None) -> mc_queue.Task:
    task = q.producer.enqueue("jobs", "h", {"n": new_ulid()}, key)
    lease = q.leases.claim_attempt(task.id, "w1", LONG)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w1",
                   decision=Decision("quarantine", "poison", attention={"task_id": task.id}))
    return task


# --------------------------------------------------------------------------- 1. half-applied transitions


@pytest.mark.parametrize("cost", [math.inf, -math.inf, math.nan, -0.5, 2e9])
@pytest.mark.parametrize("op", ["complete", "fail", "renew"])
def test_1_a_bad_cost_is_refused_before_anything_is_written(q: mc_queue.Client, op: str, cost: float) -> None:
    task, lease = running(q)
    before = every_key(q)
    with pytest.raises(mc_queue.InvalidArgument, match="cost"):
        if op == "complete":
            q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1", cost=cost)
        elif op == "fail":
            q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w1", cost=cost)
        else:
            q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="w1", cost=cost)
    assert every_key(q) == before
    # the same call as the script receives it, bypassing the Client's check: refused the same way
    tk = q.keys.task(task.id)
    raw = q.runner.call("renew", {**q.backend.ns_keys(), "leases": q.keys.leases, "task": tk.task,
                                  "attempts": tk.attempts,
                                  "events": tk.events, "stats": q.keys.stats, "fence": tk.fence, "lease": tk.lease},
                        {"n": 1, "fence": lease.fence, "worker": "w1", "lease_ms": "", "cost": repr(cost),
                         "tokens": 0, "request_id": "", "epoch": q.backend.ns.epoch, "min_seq": 0, "proof": ""})
    assert raw[0] == "E_BADARG" and every_key(q) == before
    # the Attempt is untouched: it completes normally afterwards
    assert q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1},
                                     worker_id="w1").state.value == "succeeded"
    assert q.reads.get_task(task.id).state.value == "succeeded"


@pytest.mark.parametrize("tokens", [-1, 2**63, 1.5])
def test_1_bad_tokens_are_refused(q: mc_queue.Client, tokens: Any) -> None:
    _, lease = running(q)
    with pytest.raises(mc_queue.InvalidArgument, match="tokens"):
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1", tokens=tokens)


# --------------------------------------------------------------------------- 2. a lease that never expires


@pytest.mark.parametrize("lease_ms", [math.inf, 1e30, 2**63, 3_600_001, 0, -5, 1.5])
def test_2_a_lease_outside_the_namespace_ceiling_is_refused(q: mc_queue.Client, lease_ms: Any) -> None:
    task = q.producer.enqueue("jobs", "h", {"n": 1})
    before = every_key(q)
    with pytest.raises(mc_queue.InvalidArgument, match="lease_ms"):
        q.leases.claim_attempt(task.id, "w1", lease_ms)
    assert every_key(q) == before


def test_2_a_claim_takes_the_lease_frozen_in_the_task_and_the_key_expires_with_it(q: mc_queue.Client) -> None:
    task = q.producer.enqueue("jobs", "h", {"n": 1}, lease_ms=5_000)
    lease = q.leases.claim_attempt(task.id, "w1", None)
    started_ms = q.reads.get_task(task.id).attempts[0].started_at.timestamp() * 1000
    assert lease.lease_ms == 5_000 and lease.expires_at_ms - started_ms == pytest.approx(5_000, abs=2)
    pttl = q.redis.pttl(q.keys.task(task.id).lease)
    assert 4_000 < pttl <= 5_000, "the lease is a key with a PX TTL"
    assert q.redis.hget(q.keys.task(task.id).task, "fence") == str(lease.fence), "the fence counts in the task hash"
    assert not q.redis.exists(q.keys.task(task.id).fence), "no key of its own"


def test_2_the_fence_is_incr_and_the_lease_is_pexpired_on_the_wire(q: mc_queue.Client,
                                                                    redis_server: Any) -> None:
    """MONITOR shows the commands the claim and the renewal run inside Redis."""
    task = q.producer.enqueue("jobs", "h", {"n": 1})
    tk = q.keys.task(task.id)
    seen: list[str] = []
    mon_conn = redis.Redis.from_url(q.url, decode_responses=True)
    with mon_conn.monitor() as m:
        lease = q.leases.claim_attempt(task.id, "w1", 30_000)
        renewed = q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1", lease_ms=20_000)
        q.redis.ping()
        for cmd in m.listen():
            seen.append(cmd["command"])
            if cmd["command"] == "PING":
                break
    mon_conn.close()
    assert f"HINCRBY {tk.task} fence 1" in seen, seen  # the counter lives in the task hash
    # The key's expiry is the absolute one the lease index holds (one clock reading, never a second one).
    assert f"SET {tk.lease} 1:{lease.fence} PXAT {lease.expires_at_ms}" in seen, seen
    assert f"PEXPIREAT {tk.lease} {renewed}" in seen, seen


# --------------------------------------------------------------------------- 3. ids that wedge the sweeper


@pytest.mark.parametrize("bad", ["\n", "\r\n", " ", "\t"])
def test_3_an_id_with_a_trailing_character_is_refused(q: mc_queue.Client, bad: str) -> None:
    with pytest.raises(mc_queue.InvalidArgument):
        q.producer.enqueue("jobs", "h", {"n": 1}, task_id=f"jobs:{new_ulid()}{bad}")
    with pytest.raises(mc_queue.InvalidArgument):
        q.leases.claim_attempt(f"jobs:{new_ulid()}{bad}", "w1")
    with pytest.raises(mc_queue.InvalidArgument):
        q.producer.enqueue(f"jobs{bad}", "h", {"n": 1})
    with pytest.raises(mc_queue.InvalidArgument):
        mc_queue.Client(q.url, prefix=f"p{bad}")


def test_3_a_sweeper_pass_never_stops_on_a_bad_index_entry(q: mc_queue.Client) -> None:
    """Unreadable members and members whose task is gone, planted in every index: the pass goes on,
    drops them, logs each, and still does its real work."""
    _, dead = running(q)
    q.operator.void_leases([dead.attempt_id], reason="the worker vanished")  # real work: a suspect to reconcile
    ghost = f"jobs:{new_ulid()}/1"
    for index in ("leases", "suspect", "outbox", "cancels"):
        q.redis.zadd(getattr(q.keys, index), {f"jobs:{new_ulid()}/1\n": 0, "garbage": 0, ghost: 0})
        q.writer.execute_command("ZADD", getattr(q.keys, index), 0, b"\xff\xfe not utf-8")
    report = Sweeper(q).run_once()
    assert list(report.reconciled) == [dead.attempt_id]
    assert report.errors == []
    for index in ("leases", "suspect", "outbox", "cancels"):
        left = q.redis.zrange(getattr(q.keys, index), 0, -1)
        assert left == [], (index, left)
    # The real work: the retry waits in the pending index, where the dispatch walk finds it when it is due.
    assert q.redis.zscore(q.keys.pending("jobs"), dead.task_id) is not None
    orphans = [e for e in q.reads.namespace_events() if e["type"] == "orphan_index_entry"]
    assert len(orphans) == 16 and {e["member"] for e in orphans} >= {"garbage", ghost}


# --------------------------------------------------------------------------- 4. recovery that never finishes


def test_4_recovery_ends_when_a_task_hash_is_gone_while_its_lease_is_indexed(q: mc_queue.Client) -> None:
    task, lease = running(q)
    other, live = running(q)
    q.redis.delete(q.keys.task(task.id).task)  # the hash is gone, its lease index entry stays
    out = recover(q, reason="test: a task hash vanished")
    assert out["voided_leases"] == [live.attempt_id] and out["dropped_entries"] == 1
    assert q.reads.namespace().state == "ok" and q.redis.zcard(q.keys.leases) == 0
    orphans = [e for e in q.reads.namespace_events() if e["type"] == "orphan_index_entry"]
    assert [e["member"] for e in orphans] == [lease.attempt_id]
    assert q.reads.get_task(other.id).attempts[0].state.value == "suspect"


def test_4_recovery_that_can_make_no_progress_ends_and_says_what_it_could_not_void(q: mc_queue.Client) -> None:
    task, lease = running(q)
    q.redis.delete(q.keys.task(task.id).task)
    q.redis.set(q.keys.task(task.id).task, "not a hash")  # every script on this task now fails in Redis
    with pytest.raises(mc_queue.RecoveryIncomplete, match=lease.attempt_id) as info:
        recover(q, reason="test: a corrupt task")
    assert info.value.left == [lease.attempt_id]
    assert q.reads.namespace().state == "recovering", "a lease from before the loss may still be honoured: not ok yet"
    with pytest.raises(mc_queue.NamespaceLost):
        q.producer.enqueue("jobs", "h", {"n": 1})
    q.redis.delete(q.keys.task(task.id).task)  # the operator looked and removed the corrupt key
    out = recover(q, reason="test: after the corrupt key was removed")
    assert out["dropped_entries"] == 1 and q.reads.namespace().state == "ok"


def test_4_a_suspect_entry_whose_task_is_gone_is_dropped_by_the_sweeper(q: mc_queue.Client) -> None:
    task, lease = running(q)
    q.operator.void_leases([lease.attempt_id], reason="gone")
    q.redis.delete(q.keys.task(task.id).task)
    report = Sweeper(q).run_once()
    assert report.dropped == [lease.attempt_id] and report.errors == []
    assert q.redis.zcard(q.keys.suspect) == 0


# --------------------------------------------------------------------------- 5. decisions on a lost namespace


def _lose(q: mc_queue.Client) -> tuple[mc_queue.Task, mc_queue.Lease]:
    task, lease = running(q)
    q.redis.hset(q.keys.task(task.id).task, "fence", 0)  # Redis went back to before the claim this client saw
    with pytest.raises(mc_queue.NamespaceLost):
        q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1")
    assert q.reads.namespace().state == "lost"
    return task, lease


def test_5_every_state_changing_script_refuses_on_a_lost_namespace(q: mc_queue.Client) -> None:
    q_task = quarantined(q)
    pending = q.producer.enqueue("jobs", "h", {"n": "pending"})
    _, suspect = running(q)
    q.operator.void_leases([suspect.attempt_id], reason="t")
    task, lease = _lose(q)
    before = every_key(q)
    calls = [
        lambda: q.maintenance.expire([lease.attempt_id], actor="t", force=False, reason="x"),
        lambda: q.operator.void_leases([lease.attempt_id], reason="x"),
        lambda: q.operator.begin_reconcile(suspect.attempt_id),
        lambda: q.operator.settle_attempt(suspect.attempt_id, "t", "failed", failure=FAILURE, evidence={}),
        lambda: q.schedule.mark_dispatched(f"{pending.id}/1", recheck_ms=1000),
        lambda: q.operator.dlq_purge(q_task.id, reason=REASON),
        lambda: q.operator.dlq_replay(q_task.id, REASON),
        lambda: q.maintenance.drop_index_entry("suspect", suspect.attempt_id, reason="x"),
        lambda: q.producer.enqueue("jobs", "h", {"n": 2}),
        lambda: q.leases.claim_attempt(pending.id, "w2"),
        lambda: q.operator.retry_task(task.id, REASON),
        lambda: q.operator.cancel_task(pending.id, REASON),
        lambda: q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1"),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(mc_queue.NamespaceLost):
            call()
            pytest.fail(f"call {i} was not refused")
    report = Sweeper(q).run_once()
    assert report.namespace == "lost" and not (report.expired or report.reconciled or report.dispatched)
    assert every_key(q) == before, "a refusal on a lost namespace changed something"


def test_5_a_read_never_creates_a_namespace(q: mc_queue.Client) -> None:
    assert q.reads.namespace().state == "missing"
    q.reads.status()
    q.reads.overview()
    assert q.redis.exists(q.keys.meta) == 0
    q.producer.enqueue("jobs", "h", {"n": 1})
    q.redis.delete(q.keys.meta)  # wiped, but the namespace left traces
    info = q.reads.namespace()
    assert info.state == "lost" and "still holds tasks" in info.reason
    assert q.redis.exists(q.keys.meta) == 0, "reading must not re-create the namespace as ok"


# --------------------------------------------------------------------------- 6. stale writes that escape the fence


def test_6_effect_done_with_a_stale_fence_is_refused_even_for_a_receipt_already_on_file(q: mc_queue.Client) -> None:
    task, lease = running(q)
    key = mc_queue.mint_key(task.id, "open-pr", "sha1")
    q.leases.effect_begin(lease.attempt_id, lease.fence, key, {"operation": "open-pr", "identity": "sha1"},
                          worker_id="w1")
    q.leases.effect_done(lease.attempt_id, lease.fence, key, "done", {"pr": 1}, actor="w1")
    q.operator.void_leases([lease.attempt_id], reason="the worker froze")  # the fence moves on
    stale = int(q.redis.hget(q.keys.stats, "stale_write_refused") or 0)
    for receipt in ({"pr": 1}, {"pr": 2}):  # the identical receipt, and another one
        with pytest.raises(mc_queue.StaleFence):
            q.leases.effect_done(lease.attempt_id, lease.fence, key, "done", receipt, actor="w1")
    assert int(q.redis.hget(q.keys.stats, "stale_write_refused")) == stale + 2
    types = [e.type for e in q.reads.get_task(task.id).events]
    assert types.count("stale_write_refused") == 2 and types.count("late_receipt") == 2
    assert q.reads.effects(task.id)[key].receipt == {"pr": 1}


@pytest.mark.parametrize("op", ["replay", "purge"])
def test_6_dlq_refusals_are_audited(q: mc_queue.Client, op: str) -> None:
    task = q.producer.enqueue("jobs", "h", {"n": 1})
    with pytest.raises(mc_queue.TransitionRefused, match="not quarantined"):
        q.operator.dlq_replay(task.id, REASON) if op == "replay" else q.operator.dlq_purge(task.id, reason=REASON)
    assert [e.type for e in q.reads.get_task(task.id).events][-1] == f"{op}_refused"


# --------------------------------------------------------------------------- 7. resends of scripts


def test_7_a_resent_dlq_replay_returns_the_attempt_it_created(q: mc_queue.Client) -> None:
    task = quarantined(q)
    first = q.operator.dlq_replay(task.id, REASON, request_id="req-1")
    again = q.operator.dlq_replay(task.id, REASON, request_id="req-1")
    assert first.number == again.number == 2
    assert [e.type for e in q.reads.get_task(task.id).events].count("dlq_replayed") == 1
    with pytest.raises(mc_queue.TransitionRefused):  # another request is a second replay: refused
        q.operator.dlq_replay(task.id, REASON, request_id="req-2")


def test_7_a_resent_purge_and_cancel_ack_report_what_they_did(q: mc_queue.Client) -> None:
    task = quarantined(q)
    assert q.operator.dlq_purge(task.id, reason=REASON, request_id="p-1") == 1
    assert q.operator.dlq_purge(task.id, reason=REASON, request_id="p-1") == 1
    with pytest.raises(mc_queue.TaskNotFound):
        q.operator.dlq_purge(task.id, reason=REASON, request_id="p-2")
    t2, lease = running(q)
    q.operator.cancel_task(t2.id, REASON)
    fence = q.leases.acknowledge_cancel(lease.attempt_id, lease.fence, worker_id="w1", request_id="a-1")
    assert q.leases.acknowledge_cancel(lease.attempt_id, lease.fence, worker_id="w1", request_id="a-1") == fence
    assert [e.type for e in q.reads.get_task(t2.id).events].count("cancel_acknowledged") == 1


def test_7_the_runner_resends_only_what_the_header_declares_idempotent(q: mc_queue.Client,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ScriptRunner(q.writer, sleep=lambda s: None)
    sent: list[str] = []

    def broken(name: str, keys: Any, argv: Any, client: Any = None, items: Any = ()) -> Any:
        sent.append(name)
        raise redis.ConnectionError("reply lost")

    monkeypatch.setattr(runner, "call", broken)
    with pytest.raises(redis.ConnectionError):
        runner.run("due", {"index": q.keys.leases}, {"limit": 1})
    assert sent == ["due"] * 4  # idempotent: sent, then resent three times
    sent.clear()
    spec = runner.spec("due")
    monkeypatch.setitem(runner._scripts, "due", (spec.__class__(**{**spec.__dict__, "idempotent": False}),
                                                runner._scripts["due"][1]))
    with pytest.raises(OutcomeUnknown):
        runner.run("due", {"index": q.keys.leases}, {"limit": 1})
    assert sent == ["due"], "a script whose header says 'Idempotent: no' is never resent"


# --------------------------------------------------------------------------- 8. purge forgets the producer key


def test_8_a_purged_task_s_key_and_id_are_refused_until_the_tombstone_expires(q: mc_queue.Client) -> None:
    task = quarantined(q, key="issue-42")
    q.operator.dlq_purge(task.id, reason=REASON)
    with pytest.raises(mc_queue.TaskPurged, match=task.id):
        q.producer.enqueue("jobs", "h", {"n": task.payload["n"]}, "issue-42")
    with pytest.raises(mc_queue.TaskPurged):
        q.producer.enqueue("jobs", "h", {"n": 1}, task_id=task.id)
    tomb = q.reads.tombstone(task.id)
    assert tomb is not None and tomb["reason"] == REASON and tomb["idem_key"] == "issue-42"
    assert any(e["type"] == "enqueue_refused" for e in q.reads.namespace_events())
    # an operator who frees the key at once gets a new task for it
    freed = quarantined(q, key="issue-43")
    q.operator.dlq_purge(freed.id, reason=REASON, keep_key_s=0)
    again = q.producer.enqueue("jobs", "h", {"n": freed.payload["n"]}, "issue-43")
    assert again.id != freed.id


# --------------------------------------------------------------------------- 9. a too-high fence


def test_9_a_caller_s_wrong_fence_does_not_stop_the_namespace(q: mc_queue.Client) -> None:
    task, lease = running(q)
    with pytest.raises(mc_queue.StaleFence):
        q.leases.complete_attempt(lease.attempt_id, lease.fence + 1000, {"ok": 1}, worker_id="w1")
    assert q.reads.namespace().state == "ok"
    q.producer.enqueue("jobs", "h", {"n": "still open"})  # producers go on
    assert q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1},
                                     worker_id="w1").state.value == "succeeded"
    refusal = next(e for e in q.reads.get_task(task.id).events if e.type == "stale_write_refused")
    assert refusal.fields["refusal"] == "fence_ahead"


# --------------------------------------------------------------------------- issue 10: the namespace log is capped


def test_the_namespace_log_is_capped_and_keeps_its_newest_entries(q: mc_queue.Client) -> None:
    """A long-lived namespace's log (refusals without a task, orphans, losses) never grows without
    bound: every script appends to it with XADD MAXLEN ~ 100,000."""
    q.producer.enqueue("jobs", "h", {"n": 1}, "the-key")
    pipe = q.redis.pipeline(transaction=False)
    for i in range(100_500):
        pipe.xadd(q.keys.nslog, {"type": "filler", "i": str(i)})
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()
    assert q.redis.xlen(q.keys.nslog) > 100_500
    with pytest.raises(mc_queue.IdempotencyConflict):
        q.producer.enqueue("jobs", "h", {"n": 2}, "the-key")  # refused: enqueue_refused goes to the namespace log
    length = q.redis.xlen(q.keys.nslog)
    assert 100_000 <= length <= 100_200, length  # trimmed to the cap (whole stream nodes of 100 entries)
    newest = q.reads.namespace_events(count=None)[-1]
    assert newest["type"] == "enqueue_refused" and newest["idem_key"] == "the-key"


def test_a_fence_counter_kept_as_a_key_of_its_own_is_honoured_and_moved_into_the_task_hash(q: mc_queue.Client) -> None:
    """A task written before the fence counter moved into the task hash has a key ':fence': its fence is
    checked from there (current passes, stale is refused), and the next fence issued moves it into the
    hash and goes on from it, never back to 1."""
    task, lease = running(q)
    tk = q.keys.task(task.id)
    q.redis.hdel(tk.task, "fence")
    q.redis.set(tk.fence, lease.fence)  # as an earlier version left it
    assert q.reads.get_task(task.id).fence == lease.fence
    with pytest.raises(mc_queue.StaleFence):
        q.leases.renew_lease(lease.attempt_id, lease.fence - 1 if lease.fence > 1 else 0, worker_id="w1")
    q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1")  # current: accepted
    voided = q.operator.void_leases([lease.attempt_id], actor="test", reason="the next fence moves the counter")
    assert [v.new_fence for v in voided] == [lease.fence + 1]
    assert not q.redis.exists(tk.fence) and q.redis.hget(tk.task, "fence") == str(lease.fence + 1)
    assert q.reads.get_task(task.id).fence == lease.fence + 1

"""Spend ceilings, denial of wallet (issue 19): what the Attempts of the tasks naming a key may spend per
window, checked and reserved inside the claim on Redis's clock. A claimed Attempt reserves what its task's
budget has left; when it stops running (complete, fail, an expired or voided lease, an acknowledged cancel)
the reservation is replaced, once, by what it was charged. Over the ceiling the Attempt holds nothing and
is due again (wait), or its task is canceled with the reason (reject). Both sides of each boundary,
against the session's real redis-server."""

from __future__ import annotations

import time
from typing import Any

import pytest

import mc_queue
from mc_queue import Budget, OverLimit, TaskState
from mc_queue.contracts.errors import InvalidArgument, SlotRejected
from mc_queue.contracts.failures import make_failure
from mc_queue.contracts.keys import limit_names
from mc_queue.contracts.models import FailureClass
from tests.apps import controls_app
from tests.harness import Harness, redis_ms, wait_for
from tests.integration.test_slots import APP, wait_settled

KEY = "tenant:acme"


def claim(q: mc_queue.Client, task: mc_queue.Task, worker: str = "w1", lease_ms: int = 60_000) -> mc_queue.Lease:
    names = limit_names(str(q.redis.hget(q.keys.task(task.id).task, "limits") or ""))
    return q.leases.claim_attempt(task.id, worker, lease_ms, limits=names)


def enqueue(q: mc_queue.Client, n: int, *, key: str = KEY, max_cost: float | None = None,
            max_tokens: int | None = None) -> list[mc_queue.Task]:
    budget = Budget(max_cost=max_cost, max_tokens=max_tokens)
    return [q.producer.enqueue("jobs", "h", {"n": i, "key": key}, limits={key: 0}, budget=budget) for i in range(n)]


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def test_the_ceiling_admits_reservations_up_to_it_exactly_and_the_next_waits_holding_nothing(
        q: mc_queue.Client) -> None:
    assert q.spend.set(KEY, cost=0.8, per_s=2.5, reason="a tenant's ceiling")
    a, b, c = enqueue(q, 3, max_cost=0.4)
    la, lb = claim(q, a), claim(q, b)  # 0.4 + 0.4 = the ceiling exactly: admitted
    assert q.reads.get_task(a.id).attempts[0].spend == {KEY: (0.4, 0)}
    s = q.spend.status(KEY)
    assert (s.cost, s.reserved_cost, s.running, s.spent_cost) == (0.8, 0.8, 2, 0.0)
    with pytest.raises(OverLimit, match=r"spend ceiling tenant:acme: cost \(thousandths\) 0 spent in the last "
                                        r"2500 ms and 800 reserved by running Attempts, of 800; this Attempt may "
                                        r"spend 400") as over:
        claim(q, c)
    t = q.reads.get_task(c.id)
    att = t.attempts[0]
    assert t.state is TaskState.PENDING and att.fence is None and att.limited == 1
    assert not q.redis.exists(q.keys.task(c.id).lease)
    assert over.value.due_ms >= redis_ms(q.redis) + 2000  # a recheck: reservations block, not spending
    assert q.spend.status(KEY).deferred == 1
    # the first Attempt ends having spent 0.1 of its 0.4: its reservation is replaced by that
    q.leases.heartbeat(la.attempt_id, la.fence, worker_id="w1", cost=0.1)
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": True}, worker_id="w1")
    s = q.spend.status(KEY)
    assert (s.spent_cost, s.reserved_cost, s.running) == (0.1, 0.4, 1)
    # 0.1 spent + 0.4 reserved + c's 0.4 = 0.9: still over; b ends having spent 0.25: 0.35 + 0.4 fits
    q.leases.complete_attempt(lb.attempt_id, lb.fence, {"ok": True}, worker_id="w1", cost=0.25)
    assert (q.spend.status(KEY).spent_cost, q.spend.status(KEY).reserved_cost) == (0.35, 0.0)
    wait_for(lambda: redis_ms(q.redis) >= over.value.due_ms, 4, "c's recheck")
    lc = claim(q, c)
    assert q.spend.status(KEY).reserved_cost == 0.4
    q.leases.fail_attempt(lc.attempt_id, lc.fence, make_failure(FailureClass.PROVIDER, "X", "down"), worker_id="w1",
                          cost=0.05, tokens=7)
    s = q.spend.status(KEY)
    assert (s.reserved_cost, s.running, s.spent_tokens) == (0.0, 0, 7)


def test_a_refused_claim_changes_only_the_attempts_due_time_and_its_record(q: mc_queue.Client) -> None:
    q.spend.set(KEY, cost=0.5, per_s=3600, reason="ceiling")
    a, b = enqueue(q, 2, max_cost=0.3)
    claim(q, a)
    before = snapshot(q)
    with pytest.raises(OverLimit):
        claim(q, b)
    after = snapshot(q)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    tk = q.keys.task(b.id)
    # the Attempt's due time and limited count, its history, the queue's pending score, the counters and
    # the key's next recheck: no reservation, no lease, no fence
    assert changed <= {tk.attempts_v1, tk.task, tk.events, q.keys.pending("jobs"), q.keys.stats, q.keys.limits}
    assert q.keys.spent not in changed and tk.lease not in changed and tk.fence not in changed


def test_what_was_spent_counts_until_its_bucket_leaves_the_window(q: mc_queue.Client) -> None:
    q.spend.set(KEY, cost=1.0, per_s=1.2, reason="a short window")
    a, b = enqueue(q, 2, max_cost=0.6)
    la = claim(q, a)
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": True}, worker_id="w1", cost=0.6)
    assert q.spend.status(KEY).spent_cost == 0.6
    with pytest.raises(OverLimit, match=r"cost \(thousandths\) 600 spent") as over:  # 0.6 spent + 0.6 > 1.0
        claim(q, b)
    now = redis_ms(q.redis)
    assert now < over.value.due_ms <= now + 1200 + 20 + 50  # when the bucket (a sixtieth: 20 ms) leaves
    wait_for(lambda: redis_ms(q.redis) >= over.value.due_ms, 3, "the bucket to leave the window")
    assert q.spend.status(KEY).spent_cost == 0.0
    lb = claim(q, b)
    assert lb.fence > 0
    assert len([m for m in q.redis.zrange(q.keys.spent, 0, -1) if "\n~\n" not in m]) == 0  # the old bucket dropped


def test_reject_cancels_the_task_with_the_reason(q: mc_queue.Client) -> None:
    q.spend.set(KEY, cost=0.5, per_s=3600, on_over="reject", reason="refuse what does not fit")
    a, b = enqueue(q, 2, max_cost=0.3)
    claim(q, a)
    with pytest.raises(SlotRejected, match=r"spend ceiling tenant:acme: .* \(rejects when over\)"):
        claim(q, b)
    t = q.reads.get_task(b.id)
    assert t.state is TaskState.CANCELED and "spend ceiling" in (t.cancel_requested or "")
    assert q.spend.status(KEY).rejected == 1 and q.spend.status(KEY).reserved_cost == 0.3


def test_a_family_ceiling_gives_each_key_its_own(q: mc_queue.Client) -> None:
    q.spend.set("tenant:*", cost=0.5, per_s=3600, reason="each tenant")
    a1, a2 = enqueue(q, 2, key="tenant:a", max_cost=0.3)
    (b1,) = enqueue(q, 1, key="tenant:b", max_cost=0.3)
    claim(q, a1)
    with pytest.raises(OverLimit, match="tenant:a"):
        claim(q, a2)
    claim(q, b1)  # tenant:b's own ceiling is untouched by tenant:a's
    s = q.spend.status("tenant:b")
    assert s.family and s.cost == 0.5 and s.reserved_cost == 0.3


def test_without_a_budget_a_task_is_admitted_while_anything_is_left(q: mc_queue.Client) -> None:
    q.spend.set(KEY, tokens=100, per_s=3600, reason="tokens only")
    a, b, c = enqueue(q, 3)
    la = claim(q, a)
    assert q.spend.status(KEY).reserved_tokens == 0  # no budget: nothing to reserve
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": True}, worker_id="w1", tokens=99)
    lb = claim(q, b)  # 99 of 100: something is left
    q.leases.complete_attempt(lb.attempt_id, lb.fence, {"ok": True}, worker_id="w1", tokens=1)
    with pytest.raises(OverLimit, match="tokens 100 spent"):  # 100 of 100: nothing is
        claim(q, c)


def test_a_retry_reserves_what_the_budget_has_left(q: mc_queue.Client) -> None:
    q.spend.set(KEY, cost=10, per_s=3600, reason="ceiling")
    (a,) = enqueue(q, 1, max_cost=1.0)
    la = claim(q, a)
    retry = mc_queue.Decision("retry", "transient", 0.0, next_reason="a transient failure", next_hypothesis="h")
    q.leases.fail_attempt(la.attempt_id, la.fence, make_failure(FailureClass.PROVIDER, "X", "down"),
                          worker_id="w1", cost=0.7, decision=retry)
    wait_for(lambda: q.reads.get_task(a.id).state is not TaskState.RUNNING, 2, "the retry")
    time.sleep(0.01)
    lb = claim(q, q.reads.get_task(a.id))
    assert lb.attempt_id.endswith("/2")
    s = q.spend.status(KEY)
    assert (s.spent_cost, s.reserved_cost) == (0.7, 0.3)


def test_a_budget_stored_in_chunks_is_read_whole(q: mc_queue.Client) -> None:
    """A task's budget longer than 64 bytes is stored in chunks (common.lua ``put``): the estimate is still
    its max_cost (found by bench_spend.py, whose budgets reserved nothing)."""
    q.spend.set(KEY, cost=1.0, per_s=3600, reason="ceiling")
    budget = Budget(max_cost=0.6, max_attempts=1000, max_same_fingerprint=1000, max_tokens=123_456_789)
    a, b = (q.producer.enqueue("jobs", "h", {"n": i}, limits={KEY: 0}, budget=budget) for i in range(2))
    assert q.redis.hexists(q.keys.task(a.id).task, "budget#0")  # (in chunks)
    claim(q, a)
    assert q.spend.status(KEY).reserved_cost == 0.6 and q.reads.get_task(a.id).attempts[0].spend == {
        KEY: (0.6, 123_456_789)}
    with pytest.raises(OverLimit):  # 0.6 + 0.6 > 1.0
        claim(q, b)


def test_an_estimate_above_the_ceiling_is_never_admitted_and_says_so(q: mc_queue.Client) -> None:
    q.spend.set(KEY, cost=0.5, per_s=60, reason="small")
    (a,) = enqueue(q, 1, max_cost=2.0)
    with pytest.raises(OverLimit, match="above the ceiling of 500 per 60000 ms: never admitted until the ceiling "
                                        "is raised or its budget lowered"):
        claim(q, a)


@pytest.mark.parametrize("how", ["void", "cancel"])
def test_a_voided_lease_and_an_acknowledged_cancel_replace_the_reservation_with_what_was_charged(
        q: mc_queue.Client, how: str) -> None:
    q.spend.set(KEY, cost=1.0, per_s=3600, reason="ceiling")
    (a,) = enqueue(q, 1, max_cost=0.8)
    la = claim(q, a)
    q.leases.heartbeat(la.attempt_id, la.fence, worker_id="w1", cost=0.2, tokens=5)
    if how == "void":
        q.operator.void_leases([la.attempt_id], reason="the worker is gone")
    else:
        q.operator.cancel_task(a.id, "no longer needed by anyone", ack_timeout_ms=60_000)
        q.leases.acknowledge_cancel(la.attempt_id, la.fence, worker_id="w1")
    s = q.spend.status(KEY)
    assert (s.reserved_cost, s.running, s.spent_cost, s.spent_tokens) == (0.0, 0, 0.2, 5)
    q.operator.void_leases([la.attempt_id], reason="again")  # a second end settles nothing twice
    assert q.spend.status(KEY).spent_cost == 0.2


def test_a_completion_sent_twice_is_counted_once(q: mc_queue.Client) -> None:
    q.spend.set(KEY, cost=1.0, per_s=3600, reason="ceiling")
    (a,) = enqueue(q, 1, max_cost=0.5)
    la = claim(q, a)
    for _ in range(2):
        q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": 1}, worker_id="w1", cost=0.3)
    assert q.spend.status(KEY).spent_cost == 0.3


def test_settings_refuse_what_they_cannot_mean(q: mc_queue.Client) -> None:
    for kwargs, match in (({"per_s": 60}, "cost=, tokens= or both"),
                          ({"cost": 0, "per_s": 60}, "cost must be"),
                          ({"cost": float("nan"), "per_s": 60}, "cost must be"),
                          ({"cost": 1, "per_s": 0}, "per_s"),
                          ({"tokens": -1, "per_s": 60}, "tokens"),
                          ({"cost": 1, "per_s": 60, "on_over": "supersede"}, "on_over")):
        with pytest.raises(InvalidArgument, match=match):
            q.spend.set(KEY, reason="bad", **kwargs)
    with pytest.raises(InvalidArgument, match="invalid concurrency key"):
        q.spend.set("bad key", cost=1, per_s=60)
    assert q.spend.all() == []
    # an App's setting does not replace an operator's; delete removes it
    assert q.spend.set(KEY, cost=1, per_s=60, reason="operator")
    assert not q.spend.set(KEY, cost=2, per_s=60, source="app", reason="app")
    assert q.spend.status(KEY).cost == 1.0
    assert q.spend.delete(KEY, reason="done") and q.spend.status(KEY).cost is None


def test_through_real_workers_no_window_spends_more_than_the_ceiling_and_every_task_runs(controls: Harness) -> None:
    """Two worker processes (fork and simple) and a sweeper drain twelve tasks of one tenant whose Attempts
    are each charged 0.25 against a ceiling of 1.0 in any 3 s (``tests/apps/controls_app.py``): at most
    four Attempts' spend in any window, by the time each stopped (what the records say), every task runs,
    and the ceiling deferred the rest."""
    h = controls
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)
    ids = [ac.enqueue("spend", {"n": i}, limits={"tenant:x": 0}).id for i in range(12)]
    h.spawn(h.mcq_cmd("sweeper", "--app", APP, "--interval", "0.2"))
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    h.spawn(h.worker_cmd("fork", APP, burst=False))
    settled = wait_settled(h, ids, timeout=90)
    assert all(t.state is TaskState.SUCCEEDED for t in settled), [t.state for t in settled]
    ends = sorted((a.ended_at.timestamp(), a.cost) for t in settled for a in t.attempts if a.ended_at)
    assert len(ends) == 12 and all(c == 0.25 for _, c in ends)
    for at, _ in ends:  # every window of 3 s that ends at an Attempt's end
        inside = sum(c for e, c in ends if at - 3.0 < e <= at)
        assert inside <= 1.0 + 1e-9, f"{inside} spent in the 3 s ending at {at}"
    s = h.client.spend.status("tenant:x")
    assert s.family and s.deferred > 0 and s.reserved_cost == 0 and s.running == 0
    assert ends[-1][0] - ends[0][0] >= 6.0  # twelve at four a window: at least two windows after the first


def hostile_refusals(q: mc_queue.Client, keys: dict[str, str], good: dict[str, Any], args: tuple[str, ...],
                     undo: Any) -> int:
    """limit_admin.lua sent ``good`` with each of ``args`` replaced by each hostile value of the fuzz test: a
    refusal (E_BADARG) changes no key; a value that happens to be valid is taken and ``undo(arg, value)``
    checks it may be and undoes it.
    Returns how many were refused."""
    from tests.scripts.test_fuzz import HOSTILE

    refused = 0
    for arg in args:
        for value in HOSTILE:
            before = snapshot(q)
            reply = q.runner.call("limit_admin", keys, {**good, arg: value})
            if reply[0] == "E_BADARG":
                refused += 1
                assert snapshot(q) == before, (arg, repr(value)[:40])
            else:
                assert reply[0] in ("OK", "NOOP"), (arg, repr(value)[:40], reply)
                undo(arg, value)
    return refused


def test_hostile_arguments_to_the_ceilings_setting_are_refused_and_change_nothing(q: mc_queue.Client) -> None:
    """limit_admin.lua's 'spend' op with one argument replaced by each hostile value of the fuzz test: each
    call is refused (E_BADARG) or, where the value happens to be valid, succeeds; a refusal changes no key."""
    from tests.scripts.test_fuzz import HOSTILE, capture

    call = capture(q, "limit_admin", lambda: q.spend.set(KEY, cost=1, tokens=5, per_s=60, reason="good"))
    keys, good, _ = call
    assert (good["op"], good["limit"], good["tokens"], good["window_ms"], good["on_full"]) == \
        ("spend", 1000, 5, 60000, "wait")
    refused = hostile_refusals(q, keys, good, ("limit", "tokens", "window_ms", "on_full", "key"),
                               lambda arg, value: q.spend.delete(KEY, reason="undo a valid value"))
    assert refused >= 5 * len(HOSTILE) - 6  # ('01', '1e3' ... are refused; only values that mean a number pass)


def test_the_sweeper_drops_buckets_no_window_counts_and_keeps_the_rest(q: mc_queue.Client) -> None:
    """A key whose tasks stopped coming would keep its last buckets for ever (the claim drops a key's stale
    buckets only when it admits one of its Attempts): the sweeper's trim drops a bucket once it ended more
    than sixty widths ago, never one a window may still count, never a reservation."""
    q.spend.set("tenant:*", cost=10, per_s=0.6, reason="a window of 600 ms: buckets of 10 ms")
    a, b, c = (q.producer.enqueue("jobs", "h", {"n": i}, limits={f"tenant:{k}": 0}, budget=Budget(max_cost=0.5))
               for i, k in enumerate("xyz"))
    la, lb = claim(q, a), claim(q, b)
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": 1}, worker_id="w1", cost=0.25)
    q.leases.complete_attempt(lb.attempt_id, lb.fence, {"ok": 1}, worker_id="w1", cost=0.5)
    claim(q, c)  # running: its reservation stays whatever the time

    def buckets() -> list[str]:
        return sorted(m.split("\n")[0] for m in q.redis.zrange(q.keys.spent, 0, -1) if "\n~\n" not in m)

    assert buckets() == ["tenant:x", "tenant:y"]
    assert q.maintenance.trim_spend() == 0  # still in a window: kept
    wait_for(lambda: q.maintenance.trim_spend(limit=1) == 2 or not buckets(), 5, "the buckets to go stale")
    assert buckets() == []
    assert [m.split("\n")[0] for m in q.redis.zrange(q.keys.spent, 0, -1)] == ["tenant:z"]  # the reservation
    mc_queue.Sweeper(q).run_once()  # (the sweeper's pass runs the trim: nothing left to drop)
    assert q.spend.status("tenant:z").reserved_cost == 0.5

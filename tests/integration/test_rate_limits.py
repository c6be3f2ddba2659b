"""Rate limits (issue 19): checked and taken inside the claim, on Redis's clock, all or none, with a cost
per task; an Attempt over a limit holds nothing (no lease, no fence, still pending), is due again when
its units return, and is sent again by the sweeper then; a pause (a provider's 429) holds a key
fleet-wide. Both sides of each boundary, against the session's real redis-server."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

import mc_queue
from mc_queue import OverLimit, Sweeper, TaskState
from mc_queue.contracts.errors import InvalidArgument
from mc_queue.contracts.keys import limit_names
from mc_queue.testing import ForgeServer
from tests.apps import controls_app
from tests.harness import Harness, redis_ms

APP = "tests.apps.controls_app:app"

LIMIT = "github"


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def claim(q: mc_queue.Client, task: mc_queue.Task, worker: str = "w1") -> mc_queue.Lease:
    return q.leases.claim_attempt(task.id, worker, 60_000, limits=tuple(sorted(task_limits(q, task))))


def task_limits(q: mc_queue.Client, task: mc_queue.Task) -> tuple[str, ...]:
    return limit_names(str(q.redis.hget(q.keys.task(task.id).task, "limits") or ""))


def first_came_due(q: mc_queue.Client, since_ms: int) -> list[str]:
    """What the sweeper's look between passes finds due in queue jobs from ``since_ms``, once something is."""
    cursors: dict[str, tuple[int, int]] = {"jobs": (since_ms, 0)}
    sent: list[str] = []
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        sent, cursors = q.schedule.came_due(cursors)
        time.sleep(0.01)
    return sent


def test_within_the_limit_claims_take_units_and_the_next_one_over_it_holds_nothing(q: mc_queue.Client) -> None:
    assert q.limits.set(LIMIT, 2, per_s=60, reason="github allows 2 a minute here")
    tasks = [q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1}) for i in range(3)]
    first = claim(q, tasks[0])
    claim(q, tasks[1])
    status = q.limits.status(LIMIT)
    assert (status.limit, status.window_ms, status.used, status.left) == (2, 60_000, 2, 0)
    lease_key = q.keys.task(tasks[2].id).lease
    with pytest.raises(OverLimit, match="rate limit github: 2 of 2 units used") as over:
        claim(q, tasks[2])
    # offered again when the oldest unit leaves the window: the first claim's time plus the window
    assert over.value.due_ms == first.claimed_now_ms + 60_000
    t = q.reads.get_task(tasks[2].id)
    a = t.attempts[0]
    assert t.state is TaskState.PENDING and a.state.value == "pending" and a.fence is None
    assert not q.redis.exists(lease_key)
    assert a.limited == 1 and a.limited_by and "rate limit github" in a.limited_by
    assert a.due_at is not None and round(a.due_at.timestamp() * 1000) == over.value.due_ms
    assert q.redis.zscore(q.keys.pending("jobs"), tasks[2].id) == over.value.due_ms
    assert [e.fields["reason"] for e in t.events if e.type == "claim_limited"] == [a.limited_by]
    assert q.limits.status(LIMIT).deferred == 1


def test_units_return_when_they_leave_the_window_and_the_deferred_attempt_is_claimed(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 1, per_s=0.3, reason="one per 300 ms")
    a, b = (q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1}) for i in range(2))
    claim(q, a)
    with pytest.raises(OverLimit) as over:
        claim(q, b)
    while redis_ms(q.redis) < over.value.due_ms - 5:
        with pytest.raises(mc_queue.ClaimRejected, match="not due"):  # before its due time: not yet
            q.leases.claim_attempt(b.id, "w1", 60_000, limits=(LIMIT,))
        time.sleep(0.02)
    while redis_ms(q.redis) < over.value.due_ms:
        time.sleep(0.002)
    assert claim(q, b).fence >= 1  # at the due time: the unit is back
    assert q.limits.status(LIMIT).used == 1  # the first left the window, the second is in it


def test_all_or_none_a_full_limit_takes_nothing_from_the_other(q: mc_queue.Client) -> None:
    q.limits.set("github", 10, per_s=60, reason="room")
    q.limits.set("model:openai", 3, per_s=60, reason="little room")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={"github": 2, "model:openai": 5})
    before = q.redis.zcard(q.keys.limit_log("github"))
    with pytest.raises(OverLimit, match=r"model:openai: 0 of 3 units used in the last 60000 ms, 5 wanted|above"):
        claim(q, t)
    assert q.redis.zcard(q.keys.limit_log("github")) == before == 0
    assert q.limits.status("github").used == 0


def test_a_cost_counts_in_units_on_both_sides_of_the_limit(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 5, per_s=60, reason="5 points a minute")
    big = [q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 3}) for i in range(2)]
    small = q.producer.enqueue("jobs", "h", {"n": 9}, limits={LIMIT: 2})
    claim(q, big[0])  # 3 of 5
    with pytest.raises(OverLimit, match=r"3 of 5 units used.*3 wanted"):
        claim(q, big[1])  # 6 > 5
    claim(q, small)  # 5 of 5: exactly at the limit is within it
    assert q.limits.status(LIMIT).used == 5


def test_a_cost_above_the_limit_says_it_can_never_be_admitted(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 2, per_s=60, reason="tiny")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={LIMIT: 3})
    with pytest.raises(OverLimit, match="never admitted until the limit is raised"):
        claim(q, t)


def test_a_cost_of_zero_names_the_key_and_takes_no_units(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 1, per_s=60, reason="one a minute")
    claim(q, q.producer.enqueue("jobs", "h", {"n": 0}, limits={LIMIT: 1}))
    for i in range(3):  # the limit is used up, and these need none of it
        claim(q, q.producer.enqueue("jobs", "h", {"n": i + 1}, limits={LIMIT: 0}))
    assert q.limits.status(LIMIT).used == 1 and q.redis.zcard(q.keys.limit_log(LIMIT)) == 1


def test_a_key_with_no_limit_set_is_not_limited_and_keeps_no_log(q: mc_queue.Client) -> None:
    tasks = [q.producer.enqueue("jobs", "h", {"n": i}, limits={"unset": 1000}) for i in range(3)]
    for t in tasks:
        claim(q, t)
    assert not q.redis.exists(q.keys.limit_log("unset"))


def test_a_pause_holds_every_claim_of_the_key_until_it_ends_or_is_resumed(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 100, per_s=60, reason="plenty")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={LIMIT: 1})
    other = q.producer.enqueue("jobs", "h", {"n": 2}, limits={"model:x": 1})
    until = q.limits.pause(LIMIT, 30, reason="429 from github, Retry-After 30")
    assert q.limits.pause(LIMIT, 5, reason="a shorter one changes nothing") == until
    with pytest.raises(OverLimit, match=r"paused until .*429 from github") as over:
        claim(q, t)
    assert over.value.due_ms == until
    claim(q, other)  # another key is not held
    assert q.limits.resume(LIMIT, reason="github is back")
    assert not q.limits.resume(LIMIT, reason="not paused any more")
    claim(q, q.producer.enqueue("jobs", "h", {"n": 3}, limits={LIMIT: 1}))  # a new one is claimed at once
    with pytest.raises(mc_queue.ClaimRejected, match="not due"):  # the deferred one keeps the due time it got
        claim(q, t)
    log = [(e["type"], e["key"]) for e in q.reads.namespace_events() if e["type"].startswith("limit_")]
    assert log == [("limit_set", LIMIT), ("limit_paused", LIMIT), ("limit_resumed", LIMIT)]


def test_deferred_attempts_are_offered_again_one_slot_apart(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 4, per_s=2, reason="4 per 2 s: a slot is 500 ms")
    tasks = [q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1}) for i in range(7)]
    first = claim(q, tasks[0]).claimed_now_ms
    for t in tasks[1:4]:
        claim(q, t)
    dues = []
    for t in tasks[4:]:
        with pytest.raises(OverLimit) as over:
            claim(q, t)
        dues.append(over.value.due_ms)
    # the first when the oldest unit returns, the others a slot apart (not all at once for one unit)
    assert dues[0] == first + 2000
    assert [b - a for a, b in itertools.pairwise(dues)] == [500, 500]
    assert q.limits.status(LIMIT).deferred == 3


def test_claiming_without_the_task_limits_costs_one_resend_and_the_wrong_ones_change_nothing(
        q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 5, per_s=60, reason="room")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={LIMIT: 1})
    tk = q.keys.task(t.id)
    before = snapshot(q)
    keys = {**q.backend.ns_keys(), "stats": q.keys.stats, "counts": q.keys.counts, "leases": q.keys.leases,
            "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events, "pending": tk.pending,
            "fence": tk.fence, "lease": tk.lease, "paused": q.keys.paused, "limits": q.keys.limits, "done": tk.done,
            "held": tk.held, "released": q.keys.released, "slotheld": q.keys.slotheld, "slotwait": q.keys.slotwait,
            "spent": q.keys.spent}
    argv = {"worker": "w1", "lease_ms": "", "epoch": q.backend.epoch(), "min_seq": 0, "request_id": "r1",
            "expect_n": "", "with_task": "", "budget_ms": ""}
    for items in ([], [({"log": q.keys.limit_log("other")}, {"limit_key": "other"})]):
        assert q.runner.call("claim", keys, argv, items=items)[0] == "E_LIMITKEYS"
    bad = [({"log": q.keys.limit_log("other")}, {"limit_key": LIMIT})]  # a log that is not the key's
    assert q.runner.call("claim", keys, argv, items=bad)[0] == "E_BADARG"
    assert snapshot(q) == before
    assert q.leases.claim_attempt(t.id, "w1", 60_000).fence >= 1  # no limits given: found, sent again
    assert q.limits.status(LIMIT).used == 1


@pytest.mark.parametrize("limits", [{"bad key": 1}, {"": 1}, {LIMIT: -1}, {LIMIT: 1.5}, {LIMIT: True},
                                    {LIMIT: 10**9}, {f"k{i}": 1 for i in range(9)}, ["github"], "github=1"])
def test_bad_limits_are_refused_at_enqueue_with_nothing_written(q: mc_queue.Client, limits: Any) -> None:
    q.producer.enqueue("jobs", "h", {"n": 0})
    before = snapshot(q)
    with pytest.raises(InvalidArgument):
        q.producer.enqueue("jobs", "h", {"n": 1}, limits=limits)
    assert snapshot(q) == before


@pytest.mark.parametrize("call", [
    lambda q: q.limits.set(LIMIT, 0, per_s=1), lambda q: q.limits.set(LIMIT, 1, per_s=0),
    lambda q: q.limits.set(LIMIT, 1, per_s=float("nan")), lambda q: q.limits.set(LIMIT, 1, per_s=float("inf")),
    lambda q: q.limits.set("a b", 1, per_s=1), lambda q: q.limits.set(LIMIT, 1, per_s=1, reason="a\nb"),
    lambda q: q.limits.pause(LIMIT, -1, reason="r"), lambda q: q.limits.pause(LIMIT, 31 * 86_400, reason="r"),
    lambda q: q.limits.set(LIMIT, 1, per_s=1, source="someone"),
])
def test_a_refused_limit_change_changes_nothing(q: mc_queue.Client, call: Any) -> None:
    q.limits.set(LIMIT, 3, per_s=10, reason="before")
    before = snapshot(q)
    with pytest.raises(InvalidArgument):
        call(q)
    assert snapshot(q) == before


def test_an_app_limit_does_not_replace_an_operator_limit(q: mc_queue.Client) -> None:
    assert q.limits.set(LIMIT, 3, per_s=10, reason="the operator's", source="operator")
    assert not q.limits.set(LIMIT, 50, per_s=10, reason="declared by an app", source="app")
    assert q.limits.status(LIMIT).limit == 3
    assert q.limits.delete(LIMIT, reason="gone")
    assert q.limits.set(LIMIT, 50, per_s=10, reason="declared by an app", source="app")
    assert q.limits.status(LIMIT).source == "app"


def test_the_sweeper_sends_a_deferred_attempt_again_when_its_units_return(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 1, per_s=0.4, reason="one per 400 ms")
    a, b = (q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1}) for i in range(2))
    claim(q, a)
    q.schedule.mark_dispatched(f"{b.id}/1", recheck_ms=60_000)  # it was sent once and its claim deferred
    with pytest.raises(OverLimit) as over:
        claim(q, b)
    assert q.reads.get_task(b.id).attempts[0].dispatches == 1
    sweeper = Sweeper(q)
    assert first_came_due(q, redis_ms(q.redis)) == [f"{b.id}/1"] and redis_ms(q.redis) >= over.value.due_ms
    assert not sweeper.run_once().errors


# ------------------------------------------------------------------ through real workers and a sweeper


def _settle(h: Harness, ids: list[str], timeout: float = 30) -> list[mc_queue.Task]:
    deadline = time.monotonic() + timeout
    while True:
        tasks = [h.client.reads.get_task(i) for i in ids]
        if all(t.state is TaskState.SUCCEEDED for t in tasks):
            return tasks
        assert time.monotonic() < deadline, [(t.id, t.state.value, t.latest.limited if t.latest else 0) for t in tasks]
        time.sleep(0.1)


def test_real_workers_never_claim_more_than_the_limit_in_any_window_and_all_tasks_run(
        controls: Harness, forge: ForgeServer) -> None:
    h = controls
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)  # what `mcq worker` does at start: 3 'api' units a second
    ids = [ac.enqueue("limited", {"id": i}).id for i in range(9)]
    h.spawn(h.mcq_cmd("sweeper", "--app", APP, "--interval", "0.2"))
    for _ in range(2):
        h.spawn(h.worker_cmd("fork", APP, burst=False))
    tasks = _settle(h, ids)
    starts = sorted(round(t.attempts[0].started_at.timestamp() * 1000) for t in tasks if t.attempts[0].started_at)
    assert len(starts) == 9 and all(len(t.attempts) == 1 for t in tasks)  # a deferral makes no Attempt
    worst = max(sum(1 for s in starts if first <= s < first + 1000) for first in starts)
    assert worst <= 3, starts  # no window of 1 s ever held more than 3 claims
    assert sum(t.attempts[0].limited for t in tasks) >= 1  # some were deferred, none lost
    assert sum(forge.count_by_key().values()) == 9 and not forge.duplicates()


def test_a_429_pauses_the_key_fleet_wide_and_the_attempt_is_retried_after_it(controls: Harness) -> None:
    h = controls
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)
    task = ac.enqueue("throttled", {"retry_after": 1.0})
    h.spawn(h.mcq_cmd("sweeper", "--app", APP, "--interval", "0.2"))
    h.spawn(h.worker_cmd("fork", APP, burst=False))
    done = _settle(h, [task.id])[0]
    first, second = done.attempts
    assert first.failure is not None and first.failure.failure_class.value == "capacity"
    assert first.failure.type == "RateLimited"
    paused = [e for e in h.client.reads.namespace_events() if e["type"] == "limit_paused"]
    assert len(paused) == 1 and paused[0]["key"] == "api" and paused[0]["source"] == "worker"
    until = int(paused[0]["until"])
    assert second.started_at is not None and second.started_at.timestamp() * 1000 >= until  # not before the pause ended


def test_a_send_recorded_after_the_claim_deferred_it_does_not_hide_it_from_the_sweeper(q: mc_queue.Client) -> None:
    """The sweeper records a send after RQ has the message: a worker may claim (and be deferred) first."""
    q.limits.set(LIMIT, 1, per_s=0.3, reason="one per 300 ms")
    a, b = (q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1}) for i in range(2))
    claim(q, a)
    since = redis_ms(q.redis)
    with pytest.raises(OverLimit) as over:
        claim(q, b)
    assert q.schedule.mark_dispatched(f"{b.id}/1", recheck_ms=60_000) is False  # not due: no dispatch on file
    assert first_came_due(q, since) == [f"{b.id}/1"] and redis_ms(q.redis) >= over.value.due_ms


# ------------------------------------------------------------------ the tool gateway (limit_stamp)


def test_a_stamp_within_the_window_counts_the_units_from_the_call(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 1, per_s=0.5, reason="one per 500 ms")
    a, b = (q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1}) for i in range(2))
    lease = claim(q, a)
    time.sleep(0.2)
    at = q.leases.stamp_limit(lease.attempt_id, lease.fence, LIMIT, worker_id="w1")
    assert at is not None and at >= lease.claimed_now_ms + 200
    assert q.redis.zscore(q.keys.limit_log(LIMIT), f"{lease.attempt_id} 1") == at
    with pytest.raises(OverLimit) as over:  # the unit returns a window after the call, not the claim
        claim(q, b)
    assert over.value.due_ms == at + 500


def test_a_stamp_after_the_window_takes_the_units_again_or_is_refused_with_nothing_written(
        q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 1, per_s=0.2, reason="one per 200 ms")
    a, b = (q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1}) for i in range(2))
    la = claim(q, a)
    time.sleep(0.25)  # its unit left the window
    lb = claim(q, b)  # and another took it
    before = snapshot(q)
    with pytest.raises(OverLimit) as over:
        q.leases.stamp_limit(la.attempt_id, la.fence, LIMIT, worker_id="w1")
    assert over.value.due_ms == lb.claimed_now_ms + 200
    assert snapshot(q) == before
    while redis_ms(q.redis) <= over.value.due_ms:
        time.sleep(0.01)
    at = q.leases.stamp_limit(la.attempt_id, la.fence, LIMIT, worker_id="w1")  # back: taken again
    assert at is not None and q.limits.status(LIMIT).used == 1


def test_a_stale_holder_cannot_stamp_and_a_key_the_task_does_not_name_is_refused(q: mc_queue.Client) -> None:
    q.limits.set(LIMIT, 5, per_s=10, reason="room")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={LIMIT: 1})
    lease = claim(q, t)
    with pytest.raises(InvalidArgument, match="names no rate limit other"):
        q.leases.stamp_limit(lease.attempt_id, lease.fence, "other", worker_id="w1")
    q.operator.void_leases([lease.attempt_id], reason="the worker vanished")
    before = q.redis.zscore(q.keys.limit_log(LIMIT), f"{lease.attempt_id} 1")
    with pytest.raises(mc_queue.WriteRefused):
        q.leases.stamp_limit(lease.attempt_id, lease.fence, LIMIT, worker_id="w1")
    assert q.redis.zscore(q.keys.limit_log(LIMIT), f"{lease.attempt_id} 1") == before
    unset = q.producer.enqueue("jobs", "h", {"n": 2}, limits={"unset": 1})
    lu = claim(q, unset)
    assert q.leases.stamp_limit(lu.attempt_id, lu.fence, "unset", worker_id="w1") is None


def test_the_metrics_show_each_limit_its_units_its_pause_and_its_deferrals(q: mc_queue.Client) -> None:
    from mc_queue.ops.metrics import NamespaceCollector
    from tests.integration.test_metrics_alerts import scrape, v

    q.limits.set(LIMIT, 2, per_s=60, reason="two a minute")
    tasks = [q.producer.enqueue("jobs", "h", {"n": i}, limits={LIMIT: 1, "model:x": 1}) for i in range(3)]
    claim(q, tasks[0])
    claim(q, tasks[1])
    with pytest.raises(OverLimit):
        claim(q, tasks[2])
    q.limits.pause("model:x", 60, reason="429 from the model provider")
    m, _ = scrape(NamespaceCollector(q))
    assert v(m, "mcq_rate_limit_units", key=LIMIT) == 2 and v(m, "mcq_rate_limit_window_seconds", key=LIMIT) == 60
    assert v(m, "mcq_rate_limit_used", key=LIMIT) == 2
    assert v(m, "mcq_rate_limit_deferred_total", key=LIMIT) == 1
    assert v(m, "mcq_rate_limit_paused", key=LIMIT) == 0 and v(m, "mcq_rate_limit_paused", key="model:x") == 1

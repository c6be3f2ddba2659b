"""Circuit breakers (issue 19): per dependency key, tripped by classified failures (failure rate, slow-call
rate, one fingerprint repeated) over a window, checked at claim (an open breaker's tasks are not claimed:
nothing held, no budget spent) and before every call (ctx.call / ctx.calling); half-open admits exactly N
probe Attempts fleet-wide; transitions are events and metrics. Both sides of each boundary, on the
session's real redis-server, and through real workers against a provider that fails on command."""

from __future__ import annotations

import time
from typing import Any

import pytest

import mc_queue
from mc_queue import OverLimit, TaskState
from mc_queue.client.limits import BreakerSetting
from mc_queue.contracts.errors import BreakerOpen, InvalidArgument
from mc_queue.testing import ForgeServer
from tests.apps import controls_app
from tests.harness import Harness, redis_ms

KEY = "forge"
FP = "0123456789abcdef"


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def setting(**kw: Any) -> BreakerSetting:
    return BreakerSetting(**{"failure_rate": 0.5, "min_calls": 4, "window_s": 10.0, "open_s": 0.4, "probes": 2, **kw})


def record(q: mc_queue.Client, *outcomes: bool, fp: str = FP, elapsed_ms: int = 5) -> list[str]:
    return [q.limits.record(KEY, ok, elapsed_ms, fingerprint="" if ok else fp, attempt_id="jobs:x/1", actor="w1")
            for ok in outcomes]


def claim(q: mc_queue.Client, task: mc_queue.Task) -> mc_queue.Lease:
    return q.leases.claim_attempt(task.id, "w1", 60_000, limits=(KEY,))


def needs(q: mc_queue.Client, n: int = 0) -> mc_queue.Task:
    return q.producer.enqueue("jobs", "h", {"n": n}, limits={KEY: 0})


def open_until(q: mc_queue.Client) -> int:
    s = q.limits.status(KEY)
    assert s.breaker_state == "open" and s.breaker_until_ms
    return s.breaker_until_ms


def test_the_failure_rate_opens_it_at_min_calls_and_at_the_rate_not_before(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(), reason="the forge's breaker")
    assert record(q, False, True, True) == ["closed"] * 3  # 1 of 3: fewer than 4 calls
    assert record(q, True) == ["closed"]  # 1 of 4: 25%
    assert record(q, False) == ["closed"]  # 2 of 5: 40%
    assert record(q, False) == ["open"]  # 3 of 6: 50%, the rate: open
    events = [e for e in q.reads.namespace_events() if e["type"] == "breaker_opened"]
    assert len(events) == 1 and "3 of 6 calls failed" in events[0]["reason"]
    assert record(q, False) == [""]  # open: a late outcome is not counted


def test_a_rate_below_the_threshold_stays_closed(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(), reason="the forge's breaker")
    assert record(q, True, True, True, False, True, True) == ["closed"] * 6  # 1 of 6


def test_while_open_no_task_naming_the_key_is_claimed_and_others_are(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(open_s=30), reason="the forge's breaker")
    record(q, False, False, False, False)
    until = open_until(q)
    dependent, other = needs(q), q.producer.enqueue("jobs", "h", {"n": 2})
    with pytest.raises(OverLimit, match="circuit breaker forge: open until") as over:
        claim(q, dependent)
    assert over.value.due_ms == until
    t = q.reads.get_task(dependent.id)
    assert t.state is TaskState.PENDING and t.attempts[0].fence is None and not q.redis.exists(
        q.keys.task(dependent.id).lease)  # nothing held, no budget spent
    assert q.leases.claim_attempt(other.id, "w1", 60_000).fence >= 1
    assert q.limits.status(KEY).breaker_deferred == 1


def test_half_open_admits_exactly_its_probes_and_their_success_closes_it(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(), reason="the forge's breaker")
    record(q, False, False, False, False)
    until = open_until(q)
    tasks = [needs(q, i) for i in range(3)]
    while redis_ms(q.redis) <= until:
        time.sleep(0.02)
    probes = [claim(q, t) for t in tasks[:2]]  # exactly two, fleet-wide
    with pytest.raises(OverLimit, match="half-open, its 2 probe"):
        claim(q, tasks[2])
    assert [q.redis.hget(q.keys.task(t.id).task, "1.probe") for t in tasks] == [KEY, KEY, None]
    assert q.limits.status(KEY).breaker_state == "half"
    for lease in probes:  # each probe calls through the gateway: allowed
        q.leases.stamp_limit(lease.attempt_id, lease.fence, KEY, worker_id="w1")
    assert record(q, True) == ["half"] and record(q, True) == ["closed"]
    assert q.limits.status(KEY).breaker_state == "closed"
    kinds = [e["type"] for e in q.reads.namespace_events() if e["type"].startswith("breaker_")]
    assert kinds == ["breaker_set", "breaker_opened", "breaker_half_open", "breaker_closed"]


def test_a_failed_probe_opens_it_again(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(), reason="the forge's breaker")
    record(q, False, False, False, False)
    until = open_until(q)
    while redis_ms(q.redis) <= until:
        time.sleep(0.02)
    claim(q, needs(q))
    assert record(q, False) == ["open"]
    assert open_until(q) > until


def test_the_gateway_refuses_a_call_while_open_and_a_non_probe_while_half_open(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(), reason="the forge's breaker")
    running = claim(q, needs(q, 1))  # claimed while closed
    record(q, False, False, False, False)
    until = open_until(q)
    before = snapshot(q)
    with pytest.raises(BreakerOpen, match="is open until") as refused:
        q.leases.stamp_limit(running.attempt_id, running.fence, KEY, worker_id="w1")
    assert refused.value.until_ms == until and snapshot(q) == before
    while redis_ms(q.redis) <= until:
        time.sleep(0.02)
    claim(q, needs(q, 2))  # the half-open breaker's first probe
    with pytest.raises(BreakerOpen, match="only its probe Attempts"):  # the one claimed before: no probe
        q.leases.stamp_limit(running.attempt_id, running.fence, KEY, worker_id="w1")


def test_one_failure_repeated_opens_it_and_slow_calls_do_too(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(min_calls=100, same_failure=3), reason="the same failure thrice")
    assert record(q, False, False, fp="aaaaaaaaaaaaaaaa") == ["closed"] * 2
    assert record(q, False, fp="bbbbbbbbbbbbbbbb") == ["closed"]  # another failure: its own count
    assert record(q, False, fp="aaaaaaaaaaaaaaaa") == ["open"]
    q.limits.reset(KEY, reason="the provider was fixed")
    q.limits.set_breaker(KEY, setting(min_calls=4, slow_s=0.1, slow_rate=0.5), reason="slow calls count")
    assert record(q, True, True, elapsed_ms=50) == ["closed"] * 2
    assert record(q, True, elapsed_ms=150) == ["closed"]  # 1 slow of 3 (fewer than 4 calls)
    assert record(q, True, elapsed_ms=150) == ["open"]  # 2 slow of 4: 50%


def test_operators_open_and_close_it_by_hand_and_an_app_does_not_replace_their_setting(q: mc_queue.Client) -> None:
    assert q.limits.set_breaker(KEY, setting(), reason="the operator's")
    assert not q.limits.set_breaker(KEY, setting(min_calls=50), reason="an app's", source="app")
    assert q.limits.status(KEY).breaker == setting()
    until = q.limits.trip(KEY, 60, reason="the forge is down for maintenance")
    with pytest.raises(OverLimit, match="opened by hand: the forge is down"):
        claim(q, needs(q))
    assert q.limits.status(KEY).breaker_until_ms == until
    assert q.limits.reset(KEY, reason="maintenance is over")
    assert not q.limits.reset(KEY, reason="it is closed already")
    claim(q, needs(q, 1))


@pytest.mark.parametrize("bad", [dict(failure_rate=0), dict(failure_rate=1.5), dict(min_calls=0), dict(probes=0),
                                 dict(window_s=float("nan")), dict(open_s=-1), dict(slow_s=0), dict(same_failure=-1),
                                 dict(failure_rate=True)])
def test_a_bad_setting_is_refused_with_nothing_written(q: mc_queue.Client, bad: dict[str, Any]) -> None:
    q.limits.set_breaker(KEY, setting(), reason="before")
    before = snapshot(q)
    with pytest.raises(InvalidArgument):
        q.limits.set_breaker(KEY, setting(**bad), reason="after")
    assert snapshot(q) == before


def test_the_script_refuses_hostile_settings_before_any_write(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(), reason="before")
    before = snapshot(q)
    for text in ("0 4 10000 400 2 0 50 0", "101 4 10000 400 2 0 50 0", "50 4 10000 400 2", "50 4 1e9 400 2 0 50 0",
                 "50 4 10000 400 2 0 50 0\n", "-5 4 10000 400 2 0 50 0", "50 4 99999999999999 400 2 0 50 0"):
        with pytest.raises(InvalidArgument):
            q.limits._admin("breaker", KEY, "hostile", "operator", None, breaker=text)
    assert snapshot(q) == before


# ------------------------------------------------------------------ through real workers and a failing provider


def test_an_outage_opens_it_dependents_wait_others_run_and_probes_close_it(
        controls: Harness, forge: ForgeServer) -> None:
    h = controls
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)  # the forge's breaker: opens at 50% of 3 calls, 1 s, 1 probe
    forge.fail_next(6, status=503)  # the provider is down for its next six calls
    dependents = [ac.enqueue("needs-forge", {"id": i}).id for i in range(4)]
    others = [ac.enqueue("independent", {"n": i}).id for i in range(20)]
    h.spawn(h.mcq_cmd("sweeper", "--app", APP, "--interval", "0.2"))
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    deadline = time.monotonic() + 60
    while True:
        tasks = [h.client.reads.get_task(t) for t in dependents + others]
        if all(t.state is TaskState.SUCCEEDED for t in tasks):
            break
        assert time.monotonic() < deadline, [(t.id, t.state.value) for t in tasks]
        time.sleep(0.1)
    events = [e for e in h.client.reads.namespace_events() if e["type"].startswith("breaker_")]
    kinds = [e["type"] for e in events]
    assert "breaker_opened" in kinds and kinds[-1] == "breaker_closed"
    # no dependent Attempt was claimed while the breaker was open (from each opening to its half-open)
    spans = []
    for e in events:
        at = int(str(e["id"]).split("-")[0])
        if e["type"] == "breaker_opened":
            spans.append([at, int(e["until"])])
    for tid in dependents:
        for a in h.client.reads.get_task(tid).attempts:
            if a.started_at is not None:
                started = round(a.started_at.timestamp() * 1000)
                assert not any(lo < started < hi for lo, hi in spans), (tid, a.number, started, spans)
    assert sum(forge.count_by_key().values()) == 4 and not forge.duplicates()  # one PR each, none twice


APP = "tests.apps.controls_app:app"


def test_probes_that_never_report_are_replaced_after_twice_the_open_time(q: mc_queue.Client) -> None:
    q.limits.set_breaker(KEY, setting(open_s=0.2, probes=1), reason="the forge's breaker")
    record(q, False, False, False, False)
    until = open_until(q)
    tasks = [needs(q, i) for i in range(3)]
    while redis_ms(q.redis) <= until:
        time.sleep(0.02)
    probe = claim(q, tasks[0])  # the probe's worker then dies: no outcome ever comes
    with pytest.raises(OverLimit, match="half-open, its 1 probe"):  # within twice the open time: wait
        claim(q, tasks[1])
    admitted = probe.claimed_now_ms
    while redis_ms(q.redis) <= admitted + 400:
        time.sleep(0.02)
    claim(q, tasks[2])  # past it: a new probe, the breaker does not wait for ever
    assert q.redis.hget(q.keys.task(tasks[2].id).task, "1.probe") == KEY
    assert record(q, True) == ["closed"]

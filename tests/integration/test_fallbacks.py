"""Declared fallbacks (issue 19, degradation): while a dependency's circuit breaker is open, a task that
names one of its declared fallbacks is still claimed (the claim records which), and its handler's call goes
to the first fallback that is up, the switch recorded on the Attempt and in its history, once; with the
primary up again, or no fallback up, nothing of the kind happens. Both sides of each boundary, against the
session's real redis-server, and through a real worker process."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import mc_queue
from mc_queue import OverLimit, TaskState
from mc_queue.contracts.errors import BreakerOpen, InvalidArgument, StaleFence
from mc_queue.contracts.keys import limit_names
from mc_queue.testing import RedisServer
from tests.apps import controls_app
from tests.harness import Harness
from tests.integration.test_caps_ops import ok
from tests.integration.test_slots import APP, wait_settled
from tests.integration.test_spend import hostile_refusals

BIG, SMALL, OTHER = "model:big", "model:small", "model:other"


def claim(q: mc_queue.Client, task: mc_queue.Task) -> mc_queue.Lease:
    names = limit_names(str(q.redis.hget(q.keys.task(task.id).task, "limits") or ""))
    return q.leases.claim_attempt(task.id, "w1", 60_000, limits=names)


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def test_an_open_breaker_holds_only_the_tasks_without_a_fallback_that_is_up(q: mc_queue.Client) -> None:
    q.limits.set_fallbacks(BIG, [SMALL], reason="the small model stands in")
    q.limits.trip(BIG, 60, reason="the big model is down")
    alone = q.producer.enqueue("jobs", "h", {"n": 1}, limits={BIG: 0})
    with_fb = q.producer.enqueue("jobs", "h", {"n": 2}, limits={BIG: 0, SMALL: 0})
    with_other = q.producer.enqueue("jobs", "h", {"n": 3}, limits={BIG: 0, OTHER: 0})  # not a declared fallback
    for t in (alone, with_other):
        with pytest.raises(OverLimit, match="circuit breaker model:big"):
            claim(q, t)
    lease = claim(q, with_fb)
    assert q.reads.get_task(with_fb.id).attempts[0].admitted_via == {BIG: SMALL}
    # the fallback down too: held like the others
    q.limits.trip(SMALL, 60, reason="the small model is down as well")
    again = q.producer.enqueue("jobs", "h", {"n": 4}, limits={BIG: 0, SMALL: 0})
    with pytest.raises(OverLimit, match=r"circuit breaker model:(big|small)"):
        claim(q, again)
    assert lease.fence > 0


def test_the_call_goes_to_the_fallback_and_the_switch_is_recorded_once(q: mc_queue.Client) -> None:
    q.limits.set_fallbacks(BIG, [SMALL], reason="the small model stands in")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={BIG: 0, SMALL: 0})
    lease = claim(q, t)
    before = snapshot(q)
    # the primary is up: a stand-in call is refused and writes nothing
    assert not q.leases.stamp_fallback(lease.attempt_id, lease.fence, SMALL, BIG, worker_id="w1")
    assert snapshot(q) == before
    q.limits.trip(BIG, 60, reason="the big model is down")
    for _ in range(2):
        assert q.leases.stamp_fallback(lease.attempt_id, lease.fence, SMALL, BIG, worker_id="w1")
    task = q.reads.get_task(t.id)
    assert task.attempts[0].fallbacks == {BIG: SMALL}
    used = [e.fields for e in task.events if e.type == "fallback_used"]
    assert len(used) == 1 and (used[0]["from"], used[0]["to"]) == (BIG, SMALL)
    assert "the big model is down" in used[0]["why"]


def test_a_breaker_whose_open_time_ran_out_is_down_for_every_call_but_a_probe(q: mc_queue.Client) -> None:
    """An open breaker whose time has run out, before a claim turned it half-open, admits only probes:
    a direct call of the primary is refused (E_OPEN), so a stand-in call goes ahead (it used to be told
    "the primary is up, call it", then the primary refused: the two checks disagreed); a skip likewise."""
    q.limits.set_fallbacks(BIG, [SMALL], reason="the small model stands in")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={BIG: 0, SMALL: 0})
    lease = claim(q, t)
    q.limits.trip(BIG, 60, reason="the big model is down")
    field = f"{BIG}|bstate"
    kind, _, rest = str(q.redis.hget(q.keys.limits, field)).partition(" ")
    until, _, tail = rest.partition(" ")
    assert kind == "open" and int(until) > 0
    past = q.backend.redis_time_ms() - 1_000
    q.redis.hset(q.keys.limits, field, " ".join(x for x in ("open", str(past), tail) if x))  # its time ran out
    with pytest.raises(BreakerOpen, match="half-open"):
        q.leases.stamp_limit(lease.attempt_id, lease.fence, BIG, worker_id="w1")
    assert q.leases.stamp_fallback(lease.attempt_id, lease.fence, SMALL, BIG, worker_id="w1")
    assert q.reads.get_task(t.id).attempts[0].fallbacks == {BIG: SMALL}


def test_a_stand_in_that_is_not_declared_or_not_named_or_stale_is_refused_and_writes_nothing(
        q: mc_queue.Client) -> None:
    q.limits.set_fallbacks(BIG, [SMALL], reason="the small model stands in")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={BIG: 0, SMALL: 0, OTHER: 0})
    lease = claim(q, t)
    q.limits.trip(BIG, 60, reason="the big model is down")
    before = snapshot(q)
    with pytest.raises(InvalidArgument, match="model:other is not a declared fallback of model:big"):
        q.leases.stamp_fallback(lease.attempt_id, lease.fence, OTHER, BIG, worker_id="w1")
    with pytest.raises(InvalidArgument, match="the task names no key model:nope"):
        q.leases.stamp_fallback(lease.attempt_id, lease.fence, SMALL, "model:nope", worker_id="w1")
    assert snapshot(q) == before
    q.operator.void_leases([lease.attempt_id], reason="the worker is gone")
    with pytest.raises(StaleFence):
        q.leases.stamp_fallback(lease.attempt_id, lease.fence, SMALL, BIG, worker_id="w1")
    assert "fallbacks" not in str(q.redis.hgetall(q.keys.task(t.id).task))


def test_settings_refuse_what_they_cannot_mean_and_delete_removes_them(q: mc_queue.Client) -> None:
    for fbs in ([], [BIG], [SMALL, SMALL], ["bad key"], [f"m:{i}" for i in range(9)]):
        with pytest.raises(InvalidArgument):
            q.limits.set_fallbacks(BIG, fbs, reason="bad")
    assert q.limits.set_fallbacks(BIG, [SMALL, OTHER], reason="two in order")
    assert q.limits.status(BIG).fallbacks == (SMALL, OTHER)
    assert not q.limits.set_fallbacks(BIG, [OTHER], source="app", reason="an App does not replace it")
    assert q.limits.delete_fallbacks(BIG, reason="no more stand-ins")
    assert q.limits.status(BIG).fallbacks == ()
    app = mc_queue.App(name="fb")
    with pytest.raises(InvalidArgument):
        app.fallback(BIG, BIG, quality="itself")

    @app.handler("before", needs=[BIG])
    def before(ctx: mc_queue.Context, payload: Any) -> None: ...

    app.fallback(BIG, SMALL, quality="smaller")

    @app.handler("after", needs=[BIG])
    def after(ctx: mc_queue.Context, payload: Any) -> None: ...

    assert app.spec("before").limits == app.spec("after").limits == {BIG: 0, SMALL: 0}


def down_then_up(h: Harness, key: str, handler: str) -> tuple[mc_queue.Task, str, mc_queue.Task]:
    """Through a real worker of the controls app: a task of ``handler`` run while ``key``'s breaker is open
    (and what ``mcq show`` says of it), then one run after it closed again."""
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)
    h.client.limits.trip(key, 60, reason=f"{key} is down (an outage)")
    down = ac.enqueue(handler, {"n": 1}).id
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    (t,) = wait_settled(h, [down], timeout=60)
    shown = h.mcq("show", down).stdout  # what an operator reads
    h.client.limits.reset(key, reason=f"{key} is back")
    up = ac.enqueue(handler, {"n": 2}).id
    (t2,) = wait_settled(h, [up], timeout=60)
    return t, shown, t2


def test_through_a_real_worker_the_answer_comes_from_the_fallback_while_the_primary_is_down(
        controls: Harness) -> None:
    t, shown, t2 = down_then_up(controls, BIG, "ask-model")
    assert t.state is TaskState.SUCCEEDED
    a = t.attempts[-1]
    assert t.result == {"model": "small-2026-11", "autonomy": "draft pull requests only"}
    assert (a.admitted_via, a.fallbacks) == ({BIG: SMALL}, {BIG: SMALL})
    assert "fallbacks used: model:big -> model:small" in shown and "claimed while down: model:big" in shown, shown
    # the primary back: the next task's answer is the big model's, and nothing says fallback
    assert t2.result == {"model": "big-2026-10"} and not t2.attempts[-1].fallbacks
    assert not t2.attempts[-1].admitted_via


def test_mcq_breakers_lists_each_breakers_fallbacks(redis_server: RedisServer, prefix: str) -> None:
    q = mc_queue.Client(redis_server.url, prefix=prefix)
    q.backend.open_namespace()
    q.limits.set_breaker(BIG, reason="the big model's breaker")
    q.limits.set_fallbacks(BIG, [SMALL, OTHER], reason="two stand-ins, in order")
    q.limits.trip(BIG, 60, reason="the big model is down")
    rows = json.loads(ok(redis_server, prefix, "breakers", "--json"))["breakers"]
    assert [(r["key"], r["state"], r["fallbacks"]) for r in rows] == [(BIG, "open", [SMALL, OTHER])]
    line = ok(redis_server, prefix, "breakers")
    assert line.startswith(f"{BIG}: OPEN for "), line
    assert f"; fallbacks {SMALL}, {OTHER}; opened 0 time(s)" in line, line  # (opened by hand: not counted)
    q.close()


def test_hostile_arguments_to_the_fallbacks_setting_are_refused_and_change_nothing(q: mc_queue.Client) -> None:
    """limit_admin.lua's 'fallbacks' op with one argument replaced by each hostile value of the fuzz test:
    refused (E_BADARG) with no key changed, or (a value that happens to be valid) accepted."""
    from tests.scripts.test_fuzz import HOSTILE, capture

    keys, good, _ = capture(q, "limit_admin", lambda: q.limits.set_fallbacks(BIG, [SMALL], reason="good"))
    assert (good["op"], good["fallbacks"]) == ("fallbacks", SMALL)

    def undo(arg: str, value: object) -> None:  # only a valid key name ('inf', '1e3', '01' ...) may pass
        assert isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][\w.:-]*", value), (arg, value)
        q.limits.delete_fallbacks(BIG, reason="undo a valid value")

    refused = hostile_refusals(q, keys, good, ("fallbacks", "key", "source"), undo)
    assert refused >= 2 * len(HOSTILE)

"""Declared degradation by skipping an optional step (issue 19): a dependency may declare, after its fallbacks,
that the step calling it can be skipped (``App.optional``; the setting's last fallback is ``SKIP_STEP``).
While its circuit breaker is down and no declared fallback is up, its tasks are still claimed (the claim
records it) and the handler's ``ctx.call(key, fn, fallback=use)`` calls ``use(fb)`` with ``fb.skips`` True,
the skip recorded on the Attempt and in its history once, fenced. With the dependency up, or no skip
declared, nothing of the kind happens. Both sides of each boundary, against the session's real redis-server,
and through a real worker process."""

from __future__ import annotations

import json
from typing import Any

import pytest

import mc_queue
from mc_queue import OverLimit, TaskState
from mc_queue.contracts.errors import InvalidArgument, StaleFence
from mc_queue.contracts.keys import SKIP_STEP
from mc_queue.testing import RedisServer
from tests.harness import Harness
from tests.integration.test_caps_ops import ok
from tests.integration.test_fallbacks import claim, down_then_up, snapshot
from tests.scripts.test_fuzz import capture

REVIEW, SMALL = "model:review", "model:small"


def test_a_declared_skip_lets_a_task_be_claimed_while_its_dependency_is_down(q: mc_queue.Client) -> None:
    q.limits.trip(REVIEW, 60, reason="the review model is down")
    held = q.producer.enqueue("jobs", "h", {"n": 1}, limits={REVIEW: 0})
    with pytest.raises(OverLimit, match="circuit breaker model:review"):  # no skip declared: held
        claim(q, held)
    q.limits.set_fallbacks(REVIEW, [SKIP_STEP], reason="the review is optional")
    skippable = q.producer.enqueue("jobs", "h", {"n": 4}, limits={REVIEW: 0})
    lease = claim(q, skippable)
    assert q.reads.get_task(skippable.id).attempts[0].admitted_via == {REVIEW: SKIP_STEP}
    # a real fallback up is preferred to the skip
    q.limits.set_fallbacks(REVIEW, [SMALL, SKIP_STEP], reason="a smaller reviewer, else no review")
    both = q.producer.enqueue("jobs", "h", {"n": 2}, limits={REVIEW: 0, SMALL: 0})
    claim(q, both)
    assert q.reads.get_task(both.id).attempts[0].admitted_via == {REVIEW: SMALL}
    q.limits.trip(SMALL, 60, reason="the small reviewer is down too")
    last = q.producer.enqueue("jobs", "h", {"n": 3}, limits={REVIEW: 0, SMALL: 0})
    claim(q, last)
    assert q.reads.get_task(last.id).attempts[0].admitted_via == {REVIEW: SKIP_STEP}
    assert lease.fence > 0


def test_the_skip_is_recorded_once_while_down_and_refused_with_nothing_written_while_up(q: mc_queue.Client) -> None:
    q.limits.set_fallbacks(REVIEW, [SKIP_STEP], reason="the review is optional")
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={REVIEW: 0})
    lease = claim(q, t)
    before = snapshot(q)
    assert not q.leases.stamp_skip(lease.attempt_id, lease.fence, REVIEW, worker_id="w1")  # up: call it
    assert snapshot(q) == before
    q.limits.trip(REVIEW, 60, reason="the review model is down")
    for _ in range(2):
        assert q.leases.stamp_skip(lease.attempt_id, lease.fence, REVIEW, worker_id="w1")
    task = q.reads.get_task(t.id)
    assert task.attempts[0].fallbacks == {REVIEW: SKIP_STEP}
    skipped = [e.fields for e in task.events if e.type == "step_skipped"]
    assert len(skipped) == 1 and skipped[0]["key"] == REVIEW and "the review model is down" in skipped[0]["why"]


def test_a_skip_not_declared_not_named_or_stale_is_refused_and_writes_nothing(q: mc_queue.Client) -> None:
    t = q.producer.enqueue("jobs", "h", {"n": 1}, limits={REVIEW: 0, SMALL: 0})
    lease = claim(q, t)
    q.limits.trip(REVIEW, 60, reason="the review model is down")
    q.limits.set_fallbacks(SMALL, [SKIP_STEP], reason="another key's skip says nothing of this one")
    before = snapshot(q)
    with pytest.raises(InvalidArgument, match="model:review declares no skip"):
        q.leases.stamp_skip(lease.attempt_id, lease.fence, REVIEW, worker_id="w1")
    with pytest.raises(InvalidArgument, match="the task names no rate limit model:other"):
        q.leases.stamp_skip(lease.attempt_id, lease.fence, "model:other", worker_id="w1")
    assert snapshot(q) == before
    q.limits.set_fallbacks(REVIEW, [SKIP_STEP], reason="the review is optional")
    q.operator.void_leases([lease.attempt_id], reason="the worker is gone")
    with pytest.raises(StaleFence):
        q.leases.stamp_skip(lease.attempt_id, lease.fence, REVIEW, worker_id="w1")
    assert not q.reads.get_task(t.id).attempts[0].fallbacks


def test_the_skip_setting_is_the_last_fallback_and_an_app_declares_it_once(q: mc_queue.Client) -> None:
    for fbs in ([SKIP_STEP, SMALL], [SKIP_STEP, SKIP_STEP], [REVIEW, SKIP_STEP]):
        with pytest.raises(InvalidArgument):
            q.limits.set_fallbacks(REVIEW, fbs, reason="bad")
    keys, good, _ = capture(q, "limit_admin", lambda: q.limits.set_fallbacks(REVIEW, [SMALL], reason="good"))
    for raw in (f"{SKIP_STEP},{SMALL}", f"{SMALL},{SKIP_STEP},{SKIP_STEP}", "--", f"{REVIEW},{SKIP_STEP}"):
        before = snapshot(q)  # the script refuses them too
        reply = q.runner.run("limit_admin", keys, {**good, "fallbacks": raw})
        assert reply[0] == "E_BADARG" and "fallbacks" in reply[1], (raw, reply)
        assert snapshot(q) == before
    assert q.limits.set_fallbacks(REVIEW, [SMALL, SKIP_STEP], reason="fine")
    assert q.limits.status(REVIEW).fallbacks == (SMALL, SKIP_STEP)
    app = mc_queue.App(name="opt")

    @app.handler("before", needs=[REVIEW])
    def before(ctx: mc_queue.Context, payload: Any) -> None: ...

    skip = app.optional(REVIEW, quality="no review comments")
    assert skip.skips and skip.key == SKIP_STEP and skip.primary == REVIEW
    app.fallback(REVIEW, SMALL, quality="a smaller reviewer")  # declared after: still tried before the skip
    assert [fb.key for fb in app.fallbacks[REVIEW]] == [SMALL, SKIP_STEP]
    with pytest.raises(InvalidArgument, match="once"):
        app.optional(REVIEW, quality="twice")
    with pytest.raises(InvalidArgument):
        app.fallback(REVIEW, SKIP_STEP, quality="not through fallback")
    assert app.spec("before").limits == {REVIEW: 0, SMALL: 0}  # the skip is no key a task names


def test_through_a_real_worker_the_step_is_skipped_while_its_dependency_is_down(controls: Harness) -> None:
    t, shown, t2 = down_then_up(controls, REVIEW, "open-pr-reviewed")
    assert t.state is TaskState.SUCCEEDED
    a = t.attempts[-1]
    assert t.result == {"n": 1, "review": None, "skipped": "the pull request is opened without an AI review"}
    assert (a.admitted_via, a.fallbacks) == ({REVIEW: SKIP_STEP}, {REVIEW: SKIP_STEP})
    assert "fallbacks used: model:review -> (step skipped)" in shown, shown
    assert "claimed while down: model:review (its step can be skipped)" in shown, shown
    assert t2.result == {"n": 2, "review": "looks good"} and not t2.attempts[-1].fallbacks


def test_mcq_breakers_shows_the_skip(redis_server: RedisServer, prefix: str) -> None:
    q = mc_queue.Client(redis_server.url, prefix=prefix)
    q.backend.open_namespace()
    q.limits.set_fallbacks(REVIEW, [SMALL, SKIP_STEP], reason="a smaller reviewer, else no review")
    q.limits.trip(REVIEW, 60, reason="down")
    rows = json.loads(ok(redis_server, prefix, "breakers", "--json"))["breakers"]
    assert [(r["key"], r["fallbacks"]) for r in rows] == [(REVIEW, [SMALL, SKIP_STEP])]
    assert f"; fallbacks {SMALL}, (skip the step); opened" in ok(redis_server, prefix, "breakers")
    q.close()

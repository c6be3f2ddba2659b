"""The timeout budget (issue 19): set at claim on Redis's clock from the task's timeout_s, never past its
finish_by, recorded in the Attempt, visible to the handler as ``ctx.remaining_s``; a call that needs more
than is left is refused before it starts (no intent, nothing at the provider) and classified executor.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import mc_queue
from mc_queue import TaskState
from mc_queue.contracts.models import FailureClass
from mc_queue.testing import ForgeServer
from tests.apps import controls_app
from tests.harness import Harness, redis_ms

APP = "tests.apps.controls_app:app"


def test_the_claim_sets_the_deadline_on_redis_clock_and_a_resend_gets_the_same(q: mc_queue.Client) -> None:
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    before = redis_ms(q.redis)
    lease = q.leases.claim_attempt(t.id, "w1", 60_000, budget_s=2.5, request_id="r1")
    after = redis_ms(q.redis)
    assert before + 2500 <= lease.deadline_ms <= after + 2500
    assert lease.deadline_ms == lease.claimed_now_ms + 2500
    again = q.leases.claim_attempt(t.id, "w1", 60_000, budget_s=2.5, request_id="r1")  # a resend: DUP
    assert again.deadline_ms == lease.deadline_ms and again.fence == lease.fence
    attempt = q.reads.get_task(t.id).attempts[0]
    assert attempt.deadline_at is not None and round(attempt.deadline_at.timestamp() * 1000) == lease.deadline_ms


def test_renewals_stop_one_lease_length_after_the_budget_ends(q: mc_queue.Client) -> None:
    """A handler hung where its worker cannot stop it, its heartbeat thread still beating: the lease is cut
    to the budget's end plus one lease length, and a renewal after that is refused, nothing renewed."""
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1", 1000, budget_s=0.3)
    last = lease.deadline_ms + 1000
    hb = q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="w1")  # well before: a whole lease
    assert lease.claimed_now_ms + 1000 <= hb.expires_at_ms <= last
    while redis_ms(q.redis) < lease.deadline_ms + 200:
        time.sleep(0.02)
    hb = q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="w1")  # past the deadline: cut to last
    assert hb.expires_at_ms == last
    assert int(q.redis.pttl(q.keys.task(t.id).lease)) <= last - redis_ms(q.redis) + 5
    while redis_ms(q.redis) < last - 150:
        time.sleep(0.02)
    q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="w1")  # the last one that is allowed
    while redis_ms(q.redis) < last:
        time.sleep(0.01)
    with pytest.raises(mc_queue.LeaseExpired):  # (its lease ran out at `last` anyway: refused either way)
        q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="w1")
    att = q.reads.get_task(t.id).attempts[0]
    assert att.lease_expires_at is not None and round(att.lease_expires_at.timestamp() * 1000) <= last


def test_a_live_lease_is_not_renewed_after_the_budget_and_a_lease_length(q: mc_queue.Client) -> None:
    """The other side: a lease still live (claimed with a long lease) after the budget's end plus a lease
    length of the claim's own is refused renewal with 'budget_spent', nothing written but the audit."""
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1", 1000, budget_s=0.2)
    q.redis.pexpire(q.keys.task(t.id).lease, 60_000)  # (as if an older renewal had given it longer)
    while redis_ms(q.redis) < lease.deadline_ms + 1000:
        time.sleep(0.02)
    before = q.redis.pttl(q.keys.task(t.id).lease)
    with pytest.raises(mc_queue.LeaseExpired):
        q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="w1")
    assert q.redis.pttl(q.keys.task(t.id).lease) <= before
    refused = [e for e in q.reads.get_task(t.id).events if e.type == "stale_write_refused"]
    assert refused and refused[-1].fields["refusal"] == "budget_spent"


def test_no_budget_and_no_finish_by_means_no_deadline_and_no_field(q: mc_queue.Client) -> None:
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    lease = q.leases.claim_attempt(t.id, "w1", 60_000)
    assert lease.deadline_ms == 0
    assert "1.deadline" not in q.redis.hgetall(q.keys.task(t.id).task)
    assert q.reads.get_task(t.id).attempts[0].deadline_at is None


@pytest.mark.parametrize("budget_s, clipped", [(60.0, True), (1.0, False), (None, True)])
def test_the_finish_by_clips_the_budget_on_either_side(q: mc_queue.Client, budget_s: float | None,
                                                       clipped: bool) -> None:
    t = q.producer.enqueue("jobs", "h", {"n": 1}, finish_by=timedelta(seconds=20))
    assert t.finish_by is not None
    finish_ms = round(t.finish_by.timestamp() * 1000)
    lease = q.leases.claim_attempt(t.id, "w1", 60_000, budget_s=budget_s)
    if clipped:
        assert lease.deadline_ms == finish_ms
    else:
        assert lease.deadline_ms == lease.claimed_now_ms + 1000 < finish_ms


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "3", True, 31 * 86_400])
def test_a_bad_budget_is_refused_before_anything_is_sent(q: mc_queue.Client, bad: object) -> None:
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    before = q.redis.hgetall(q.keys.task(t.id).task)
    with pytest.raises(mc_queue.InvalidArgument, match="budget_s"):
        q.leases.claim_attempt(t.id, "w1", 60_000, budget_s=bad)  # type: ignore[arg-type]
    assert q.redis.hgetall(q.keys.task(t.id).task) == before


def test_a_call_that_fits_the_budget_runs_and_the_handler_sees_what_is_left(controls: Harness,
                                                                            forge: ForgeServer) -> None:
    h = controls
    ac = h.app_client(controls_app.app)
    task = ac.enqueue("budgeted", {"id": 1, "needs_s": 1.0, "sleep_s": 0.2})
    done = h.drive(task.id, app=APP)
    assert done.state is TaskState.SUCCEEDED, done.attempts[-1].failure
    a = done.attempts[0]
    assert a.deadline_at is not None and a.started_at is not None
    assert (a.deadline_at - a.started_at).total_seconds() == pytest.approx(3.0)  # the handler's timeout_s
    assert 2.0 < a.result["left_s"] <= 2.8  # 3 s less the 0.2 s of work and the run up to it
    assert sum(forge.count_by_key().values()) == 1


def test_a_call_that_would_exceed_the_budget_is_refused_before_it_starts(controls: Harness, forge: ForgeServer) -> None:
    h = controls
    ac = h.app_client(controls_app.app)
    task = ac.enqueue("budgeted", {"id": 2, "needs_s": 1.0, "sleep_s": 2.2})
    done = h.drive(task.id, app=APP)
    assert done.state is TaskState.BLOCKED  # max_attempts=1: no second Attempt
    f = done.attempts[0].failure
    assert f is not None and f.failure_class is FailureClass.EXECUTOR and f.type == "TimeoutBudgetExceeded"
    assert "open-pr" in f.message and "needs up to 1s" in f.message and "not started" in f.message
    assert forge.count_by_key() == {}  # nothing reached the provider
    assert h.client.reads.effects(task.id) == {}  # and no intent was written
    shown = h.mcq("show", task.id)
    assert shown.returncode == 0 and "timeout budget" in shown.stdout

"""Dependencies (issue 18): a task that waits for others (``after=[...]``), on a real redis-server.

Both sides of each boundary: parent ended / not yet, succeeded / not (mode succeeded and mode ended),
one parent of two left / none, a parent that ended before the enqueue, a parent ended by
reconciliation, a chain canceled link by link, a dependent canceled or past its start_by while it
waits, a parent not retired or purged before its dependents are released. A refused enqueue writes
nothing; a release run twice changes nothing the second time.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, Sweeper, TaskState, make_failure
from mc_queue.client.producer import NewTask
from mc_queue.producer.dispatch import AppClient
from mc_queue.producer.transport import rq_connection, rq_queue
from mc_queue.testing import RedisServer
from tests.integration.test_delayed import _App, _mcq

QUEUE = "jobs"
FAILURE = make_failure(FailureClass.PROVIDER, "Timeout", "the provider timed out")
QUARANTINE = Decision("quarantine", "quarantine it", attention={"task_id": "x", "why_unsafe": "test"})


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def new(q: mc_queue.Client, **kw: Any) -> mc_queue.Task:
    return q.producer.enqueue(QUEUE, "h", {"n": time.monotonic_ns()}, **kw)


def succeed(q: mc_queue.Client, tid: str) -> None:
    lease = q.leases.claim_attempt(tid, "w", 60_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w")


def fail(q: mc_queue.Client, tid: str, decision: Decision | None = None) -> None:
    lease = q.leases.claim_attempt(tid, "w", 60_000)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w", decision=decision)


def state(q: mc_queue.Client, tid: str) -> TaskState:
    return q.reads.get_task(tid).state


def test_a_dependent_waits_until_its_parent_succeeds_then_is_claimable(q: mc_queue.Client) -> None:
    parent = new(q)
    child = new(q, after=[parent.id])
    assert child.state is TaskState.WAITING and child.after == [parent.id] and child.after_left == [parent.id]
    assert child.after_mode == "succeeded"
    assert q.reads.get_task(parent.id).dependents == [child.id]
    with pytest.raises(mc_queue.ClaimRejected, match="task is waiting"):
        q.leases.claim_attempt(child.id, "w", 60_000)
    assert q.dependencies.release_due().released == []  # the parent has not ended: nothing owed
    succeed(q, parent.id)
    assert q.redis.zrange(q.keys.released, 0, -1) == [parent.id]  # recorded by the parent's end itself
    r = q.dependencies.release_due()
    assert r.released == [child.id] and r.canceled == [] and r.errors == []
    assert q.redis.zcard(q.keys.released) == 0
    t = q.reads.get_task(child.id)
    assert t.state is TaskState.PENDING and t.after_left == [] and t.after == [parent.id]
    met = [e for e in t.events if e.type == "dependency_met"]
    assert len(met) == 1 and met[0].fields["parent"] == parent.id and met[0].fields["parent_state"] == "succeeded"
    assert q.leases.claim_attempt(child.id, "w", 60_000).number == 1
    # run again: the entry is gone, nothing changes
    before = snapshot(q)
    assert q.dependencies.release_due() == type(r)()
    assert snapshot(q) == before


@pytest.mark.parametrize("end", ["failed", "blocked", "quarantined", "canceled"])
@pytest.mark.parametrize("mode", ["succeeded", "ended"])
def test_a_parent_that_does_not_succeed_cancels_or_releases_as_declared(q: mc_queue.Client, end: str,
                                                                        mode: str) -> None:
    parent = new(q)
    child = new(q, after=[parent.id], after_mode=mode)
    if end == "canceled":
        q.operator.cancel_task(parent.id, "the operator no longer needs it")
    else:
        stop = Decision("stop", "stop for a person", attention={"task_id": "x", "why_unsafe": "test"})
        fail(q, parent.id, {"failed": None, "blocked": stop, "quarantined": QUARANTINE}[end])
    assert state(q, parent.id).value == end
    r = q.dependencies.release_due()
    t = q.reads.get_task(child.id)
    if mode == "succeeded":
        assert r.canceled == [child.id] and t.state is TaskState.CANCELED
        assert t.attempts[0].state.value == "canceled"
        reason = next(e for e in t.events if e.type == "task_canceled").fields["reason"]
        assert parent.id in reason and end in reason
        assert q.redis.zscore(q.keys.done(QUEUE), child.id) is not None  # retention sees it
    else:
        assert r.released == [child.id] and t.state is TaskState.PENDING


def test_two_parents_release_only_when_both_ended(q: mc_queue.Client) -> None:
    a, b = new(q), new(q)
    child = new(q, after=[a.id, b.id])
    succeed(q, a.id)
    r = q.dependencies.release_due()
    assert r.waiting == [child.id] and r.released == []
    t = q.reads.get_task(child.id)
    assert t.state is TaskState.WAITING and t.after_left == [b.id]
    succeed(q, b.id)
    assert q.dependencies.release_due().released == [child.id]
    assert state(q, child.id) is TaskState.PENDING


def test_a_parent_that_ended_before_the_enqueue_counts_at_once_or_refuses(q: mc_queue.Client) -> None:
    done = new(q)
    succeed(q, done.id)
    t = new(q, after=[done.id])
    assert t.state is TaskState.PENDING and t.after == [done.id] and t.after_left == []
    assert q.reads.get_task(done.id).dependents == []  # nothing owed by an end that already happened
    failed = new(q)
    fail(q, failed.id)
    before = snapshot(q)
    with pytest.raises(mc_queue.TransitionRefused, match=rf"{failed.id} .*ended failed.*after_mode ended"):
        new(q, after=[failed.id])
    assert snapshot(q) == before
    assert new(q, after=[failed.id], after_mode="ended").state is TaskState.PENDING


def test_a_delayed_dependent_keeps_its_own_due_time(q: mc_queue.Client) -> None:
    parent = new(q)
    child = new(q, after=[parent.id], delay_s=3600)
    assert child.state is TaskState.WAITING
    succeed(q, parent.id)
    r = q.dependencies.release_due()
    assert r.scheduled == [child.id] and r.released == []
    t = q.reads.get_task(child.id)
    assert t.state is TaskState.SCHEDULED
    with pytest.raises(mc_queue.ClaimRejected, match="not due"):
        q.leases.claim_attempt(child.id, "w", 60_000)


def test_a_chain_is_canceled_link_by_link(q: mc_queue.Client) -> None:
    a = new(q)
    b = new(q, after=[a.id])
    c = new(q, after=[b.id])
    d = new(q, after=[c.id], after_mode="ended")
    fail(q, a.id)
    assert q.dependencies.release_due().canceled == [b.id]
    assert q.redis.zrange(q.keys.released, 0, -1) == [b.id]  # b's own end owes c
    assert q.dependencies.release_due().canceled == [c.id]
    assert q.dependencies.release_due().released == [d.id]  # 'ended': a canceled parent counts
    assert [state(q, x.id) for x in (b, c, d)] == [TaskState.CANCELED, TaskState.CANCELED, TaskState.PENDING]


def test_a_waiting_task_canceled_or_past_its_start_by_is_left_alone_by_the_release(q: mc_queue.Client) -> None:
    from datetime import timedelta
    parent = new(q)
    canceled = new(q, after=[parent.id])
    late = new(q, after=[parent.id], start_by=timedelta(milliseconds=150))
    assert q.operator.cancel_task(canceled.id, "the operator no longer needs it") == "canceled"
    time.sleep(0.3)
    report = Sweeper(q).run_once()
    assert report.deadlines == [f"{late.id} start_by"]
    assert state(q, late.id) is TaskState.CANCELED
    succeed(q, parent.id)
    before = {x: q.reads.get_task(x).events for x in (canceled.id, late.id)}
    r = q.dependencies.release_due()
    assert r.released == r.canceled == r.waiting == []
    assert {x: q.reads.get_task(x).events for x in (canceled.id, late.id)} == before


def test_a_parent_ended_by_reconciliation_releases_its_dependents(q: mc_queue.Client) -> None:
    parent = new(q)
    child = new(q, after=[parent.id])
    lease = q.leases.claim_attempt(parent.id, "w", 60_000)
    q.operator.void_leases([lease.attempt_id], reason="the worker's host is gone")
    q.operator.begin_reconcile(lease.attempt_id)
    q.operator.settle_attempt(lease.attempt_id, "test", "succeeded", result={"proven": True}, evidence={"pr": 1})
    assert q.dependencies.release_due().released == [child.id]


def test_a_parent_is_not_retired_or_purged_before_its_dependents_are_released(q: mc_queue.Client) -> None:
    parent = new(q)
    child = new(q, after=[parent.id])
    fail(q, parent.id, QUARANTINE)
    with pytest.raises(mc_queue.TransitionRefused, match="not released them yet"):
        q.operator.dlq_purge(parent.id, reason="purge it right away please")
    assert q.operator.retire_task(parent.id, states=["quarantined"], reason="retire it right away") is None
    assert q.dependencies.release_due().canceled == [child.id]
    q.operator.dlq_purge(parent.id, reason="purge it now that it is released")
    with pytest.raises(mc_queue.TaskNotFound):
        q.reads.get_task(parent.id)


def test_packing_keeps_what_release_and_retire_read(q: mc_queue.Client) -> None:
    parent = new(q)
    child = new(q, after=[parent.id], after_mode="ended")
    succeed(q, parent.id)
    assert q.maintenance.pack_tasks([parent.id]) >= 0
    assert q.dependencies.release_due().released == [child.id]
    assert q.reads.get_task(parent.id).dependents == [child.id]
    assert q.operator.retire_task(parent.id, states=["succeeded"], reason="retire it now it is done") == "succeeded"


@pytest.mark.parametrize("after, why", [
    (["nope"], "task id"), (["jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV"] * 2, "named twice"), ("jobs:x", "a list"),
    ([f"jobs:{'0' * 25}{i % 10}" for i in range(101)], "at most 100"), ([7], "not a task id"),
])
def test_a_bad_after_is_refused_with_nothing_written(q: mc_queue.Client, after: Any, why: str) -> None:
    parent = new(q)
    before = snapshot(q)
    with pytest.raises(mc_queue.InvalidArgument, match=why):
        new(q, after=after)
    with pytest.raises(mc_queue.InvalidArgument, match="after_mode"):
        new(q, after=[parent.id], after_mode="sometimes")
    assert snapshot(q) == before


def test_an_unknown_parent_itself_and_bulk_are_refused_with_nothing_written(q: mc_queue.Client) -> None:
    new(q)
    before = snapshot(q)
    with pytest.raises(mc_queue.TaskNotFound, match="no task jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV to wait for"):
        new(q, after=["jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV"])
    with pytest.raises(mc_queue.InvalidArgument, match="itself"):
        new(q, after=["jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV"], task_id="jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV")
    with pytest.raises(mc_queue.InvalidArgument, match="item 1: enqueue_many does not take after"):
        q.producer.enqueue_many([NewTask(QUEUE, "h", {"n": 1}, after=["jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV"])])
    assert snapshot(q) == before


def test_a_resend_returns_the_same_waiting_task(q: mc_queue.Client) -> None:
    parent = new(q)
    a = q.producer.enqueue(QUEUE, "h", {"n": 1}, "merge-key", after=[parent.id])
    b = q.producer.enqueue(QUEUE, "h", {"n": 1}, "merge-key", after=[parent.id])
    assert a.id == b.id and q.reads.get_task(parent.id).dependents == [a.id]


def test_a_plain_task_stores_nothing_of_this(q: mc_queue.Client) -> None:
    t = new(q)
    fields = q.redis.hgetall(q.keys.task(t.id).task)
    assert not {"after", "after_mode", "after_left", "dependents"} & set(fields)
    succeed(q, t.id)
    assert q.redis.zcard(q.keys.released) == 0


def test_waiting_tasks_are_listed_by_state(q: mc_queue.Client) -> None:
    parent = new(q)
    child = new(q, after=[parent.id])
    rows, _ = q.reads.list_tasks(states=["waiting"])
    assert [r["task_id"] for r in rows] == [child.id]
    rows, _ = q.reads.list_tasks(states=["pending"])
    assert [r["task_id"] for r in rows] == [parent.id]
    assert q.reads.status()[QUEUE]["counts"] == {"pending": 1, "waiting": 1}


def test_the_sweeper_sends_a_released_task_to_rq_promptly(q: mc_queue.Client) -> None:
    ac = AppClient(_App(), q)
    rq = rq_connection(q)
    try:
        rqq = rq_queue(rq, q.keys.prefix, QUEUE)
        parent = ac.enqueue("h", {"n": 1})
        child = ac.enqueue("h", {"n": 2}, after=[parent.id])
        assert rqq.count == 1  # the parent's message only
        sweeper = Sweeper(q)
        assert sweeper.promote() == [] and rqq.count == 1
        succeed(q, parent.id)
        ended = q.backend.redis_time_ms()
        assert sweeper.promote() == [f"{child.id}/1"] and rqq.count == 2
        assert q.backend.redis_time_ms() - ended < 1000
        assert sweeper.promote() == [] and sweeper.run_once().dispatched == []  # sent once
    finally:
        rq.close()
        ac.close()


def test_through_the_cli_a_worker_and_the_sweeper(redis_server: RedisServer, prefix: str) -> None:
    """The way a user runs it: `mcq enqueue --after`, real `mcq worker --burst` and `mcq sweeper --once`
    processes; the dependent runs only after its parent succeeded, and `mcq show` explains both."""
    app = ("--app", "tests.apps.cli_app:app")
    parent = _mcq(redis_server, prefix, "enqueue", "fix-issue", *app, "--payload", '{"issue": 1}')
    assert parent.returncode == 0, parent.stderr
    pid = parent.stdout.strip()
    child = _mcq(redis_server, prefix, "enqueue", "fix-issue", *app, "--payload", '{"issue": 2}', "--after", pid)
    assert child.returncode == 0, child.stderr
    cid = child.stdout.strip()
    show = " ".join(_mcq(redis_server, prefix, "show", cid).stdout.split())  # (wrapped at 80 columns)
    assert f"state: waiting (for 1 of 1 task(s) to succeed: {pid})" in show, show
    assert cid in _mcq(redis_server, prefix, "tasks", "--state", "waiting").stdout
    refused = _mcq(redis_server, prefix, "enqueue", "fix-issue", *app, "--payload", '{"issue": 3}',
                   "--after", "fixes:01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert refused.returncode != 0 and "no task fixes:01ARZ3NDEKTSV4RRFFQ69G5FAV to wait for" in refused.stderr
    work = _mcq(redis_server, prefix, "worker", *app, "--burst", "--kind", "simple")
    assert work.returncode == 0, work.stderr
    assert "succeeded" in _mcq(redis_server, prefix, "show", pid).stdout
    assert "waiting" in _mcq(redis_server, prefix, "show", cid).stdout  # the worker never got it
    sweep = _mcq(redis_server, prefix, "sweeper", "--once", "--json")
    assert sweep.returncode == 0 and cid in json.loads(sweep.stdout)["released"], sweep.stdout + sweep.stderr
    work = _mcq(redis_server, prefix, "worker", *app, "--burst", "--kind", "simple")
    assert work.returncode == 0, work.stderr
    show = " ".join(_mcq(redis_server, prefix, "show", cid).stdout.split())
    assert "state: succeeded" in show and f"after: {pid} (each must succeed)" in show, show
    assert f"task {pid} it waits for ended succeeded: released, pending" in show, show
    assert f"dependents: {cid}" in " ".join(_mcq(redis_server, prefix, "show", pid).stdout.split())

"""Concurrency keys, bulkheads (issue 19): at most N running Attempts per key, fleet-wide, checked and taken
inside the claim; a slot lives and dies with its Attempt (complete, fail, expired lease, acknowledged
cancel each return it, once); a full key parks the new Attempt (nothing held), rejects it (the task is
canceled, with why) or supersedes the oldest holder; a returned slot wakes the first waiter, which keeps its
place; one slot is a writer lease whose fence reaches the provider. Both sides of each boundary, against
the session's real redis-server."""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Any

import httpx
import pytest

import mc_queue
from mc_queue import OverLimit, Sweeper, TaskState
from mc_queue.contracts.errors import ClaimRejected, InvalidArgument, SlotRejected
from mc_queue.contracts.failures import make_failure
from mc_queue.contracts.keys import limit_names
from mc_queue.contracts.models import FailureClass
from mc_queue.providers.http import HttpPullRequests
from mc_queue.testing import ForgeServer
from tests.apps import controls_app
from tests.harness import Harness, redis_ms, wait_for

KEY = "repo:acme.web"


def claim(q: mc_queue.Client, task: mc_queue.Task, worker: str = "w1", lease_ms: int = 60_000) -> mc_queue.Lease:
    names = limit_names(str(q.redis.hget(q.keys.task(task.id).task, "limits") or ""))
    return q.leases.claim_attempt(task.id, worker, lease_ms, limits=names, with_task=True)


def enqueue(q: mc_queue.Client, n: int, key: str = KEY) -> list[mc_queue.Task]:
    return [q.producer.enqueue("jobs", "h", {"n": i, "key": key}, limits={key: 1}) for i in range(n)]


def holders(q: mc_queue.Client, key: str = KEY) -> list[str]:
    return [aid for aid, _ in q.slots.status(key).holders]


def holder_and_two_waiters(q: mc_queue.Client, lease_ms: int = 60_000) -> tuple[mc_queue.Lease, mc_queue.Task,
                                                                                 mc_queue.Task]:
    """A writer lease (one slot) held by a first task's Attempt, and two more tasks parked in line for it."""
    q.slots.set(KEY, 1, reason="a writer lease")
    a, b, c = enqueue(q, 3)
    la = claim(q, a, lease_ms=lease_ms)
    for t in (b, c):
        with pytest.raises(OverLimit):
            claim(q, t)
    return la, b, c


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def test_a_key_admits_its_slots_and_the_next_claim_waits_in_line_holding_nothing(q: mc_queue.Client) -> None:
    assert q.slots.set(KEY, 2, reason="two agents per repository")
    a, b, c = enqueue(q, 3)
    la, lb = claim(q, a), claim(q, b)
    assert la.task and lb.task
    assert (la.task.attempts[0].slots, lb.task.attempts[0].slots) == ({KEY: 1}, {KEY: 2})  # writer fences
    with pytest.raises(OverLimit, match=f"waits for a slot: concurrency key {KEY}: 2 of 2 slots held") as over:
        claim(q, c)
    assert over.value.supersede == ""
    t = q.reads.get_task(c.id)
    att = t.attempts[0]
    assert t.state is TaskState.PENDING and att.state.value == "pending" and att.fence is None
    assert not q.redis.exists(q.keys.task(c.id).lease)
    assert att.waiting_for == KEY and att.limited == 1
    # parked: not due (so never sent) until a slot returns
    assert q.redis.zscore(q.keys.pending("jobs"), c.id) == over.value.due_ms > redis_ms(q.redis) + 60_000
    with pytest.raises(ClaimRejected, match="not due"):
        claim(q, c)
    s = q.slots.status(KEY)
    assert (s.slots, s.on_full, s.running, s.waiting, s.writer_fence, s.waited) == (2, "wait", 2, 1, 2, 1)
    assert sorted(holders(q)) == sorted([la.attempt_id, lb.attempt_id])
    assert [e.fields["key"] for e in t.events if e.type == "claim_limited"] == [KEY]


def end_complete(q: mc_queue.Client, lease: mc_queue.Lease) -> None:
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id=lease.worker_id)


def end_fail(q: mc_queue.Client, lease: mc_queue.Lease) -> None:
    q.leases.fail_attempt(lease.attempt_id, lease.fence,
                          make_failure(FailureClass.PROVIDER, "BadGateway", "the forge answered 502"),
                          worker_id=lease.worker_id)


def end_void(q: mc_queue.Client, lease: mc_queue.Lease) -> None:
    report = q.maintenance.expire([lease.attempt_id], actor="w1", force=True, reason="its work horse died")
    assert [e.attempt_id for e in report.expired] == [lease.attempt_id]


def end_expire(q: mc_queue.Client, lease: mc_queue.Lease) -> None:
    deadline = time.monotonic() + 5
    while not (expired := q.maintenance.expire_leases()):  # until its PX runs out on Redis's clock
        assert holders(q) == [lease.attempt_id]  # live: the slot stays held
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert [e.attempt_id for e in expired] == [lease.attempt_id]


def end_cancel_ack(q: mc_queue.Client, lease: mc_queue.Lease) -> None:
    q.operator.cancel_task(lease.task_id, "the operator stops this one")
    q.leases.acknowledge_cancel(lease.attempt_id, lease.fence, worker_id=lease.worker_id)


@pytest.mark.parametrize("end", [end_complete, end_fail, end_expire, end_void, end_cancel_ack])
def test_a_slot_returns_once_when_its_attempt_stops_running_and_wakes_the_first_waiter(q: mc_queue.Client,
                                                                                       end: Any) -> None:
    la, b, c = holder_and_two_waiters(q, lease_ms=400)
    # held: the renewal keeps it, nothing is woken
    q.leases.heartbeat(la.attempt_id, la.fence, worker_id="w1")
    assert q.slots.wake_due() == [] and holders(q) == [la.attempt_id]
    end(q, la)
    assert holders(q) == [] and q.slots.status(KEY).waiting == 1
    assert q.slots.wake_due() == [f"{b.id}/1"]  # the first in line, made due now
    assert q.redis.zscore(q.keys.pending("jobs"), b.id) <= redis_ms(q.redis)
    assert [e.type for e in q.reads.get_task(b.id).events].count("slot_free") == 1
    lb = claim(q, b)
    assert lb.task and lb.task.attempts[0].slots == {KEY: 2}
    with pytest.raises(ClaimRejected):  # c still waits: one slot
        claim(q, c)
    # a second end of the same Attempt returns nothing more (ZREM says it was gone)
    assert holders(q) == [lb.attempt_id]


def test_a_waiter_woken_that_left_the_line_passes_its_wake_to_the_next(q: mc_queue.Client) -> None:
    la, b, c = holder_and_two_waiters(q)
    end_complete(q, la)  # b is put in the wake set ...
    q.operator.cancel_task(b.id, "no longer wanted, canceled while woken")  # ... and leaves before it is woken
    assert q.slots.wake_due() == [f"{c.id}/1"]
    claim(q, c)


def test_a_woken_waiter_that_finds_the_key_full_again_keeps_its_place(q: mc_queue.Client) -> None:
    la, b, c = holder_and_two_waiters(q)
    end_complete(q, la)
    assert q.slots.wake_due() == [f"{b.id}/1"]
    late = enqueue(q, 1)[0]  # a new task's claim takes the slot before b's does
    ll = claim(q, late)
    with pytest.raises(OverLimit):
        claim(q, b)
    end_complete(q, ll)
    assert q.slots.wake_due() == [f"{b.id}/1"]  # b, not c: its place was kept
    assert q.reads.get_task(c.id).attempts[0].waiting_for == KEY


def test_a_family_gives_each_key_its_own_slots_and_a_key_of_its_own_wins(q: mc_queue.Client) -> None:
    assert q.slots.set("repo:*", 1, reason="one writer per repository")
    a1, a2 = enqueue(q, 2, "repo:a")
    b1 = enqueue(q, 1, "repo:b")[0]
    claim(q, a1)
    claim(q, b1)  # another key of the family: its own slot
    with pytest.raises(OverLimit, match="concurrency key repo:a: 1 of 1"):
        claim(q, a2)
    s = q.slots.status("repo:a")
    assert (s.slots, s.family, s.running) == (1, True, 1)
    q.slots.set("repo:a", 2, reason="repo a may have two")
    assert q.slots.audit() == 1  # the raised key's free slot wakes its waiter
    assert q.slots.wake_due() == [f"{a2.id}/1"]
    claim(q, a2)
    assert q.slots.status("repo:a").family is False


def test_a_full_key_that_rejects_cancels_the_new_task_with_its_reason(q: mc_queue.Client) -> None:
    q.slots.set(KEY, 1, on_full="reject", reason="newest loses")
    a, b = enqueue(q, 2)
    la = claim(q, a)
    with pytest.raises(SlotRejected, match=f"concurrency key {KEY}: 1 of 1 slots held"):
        claim(q, b)
    t = q.reads.get_task(b.id)
    assert t.state is TaskState.CANCELED and t.attempts[0].state.value == "canceled"
    assert next(e.fields["reason"] for e in t.events if e.type == "task_canceled").endswith("(rejects when full)")
    assert holders(q) == [la.attempt_id] and q.slots.status(KEY).rejected == 1
    assert q.redis.zscore(q.keys.pending("jobs"), b.id) is None
    end_complete(q, la)  # below the limit: admitted
    claim(q, enqueue(q, 1)[0])


def test_a_full_key_that_supersedes_names_its_oldest_holder(q: mc_queue.Client) -> None:
    q.slots.set(KEY, 2, on_full="supersede", reason="the newest push wins")
    a, b, c = enqueue(q, 3)
    la = claim(q, a)
    time.sleep(0.002)
    claim(q, b)
    with pytest.raises(OverLimit, match=f"superseding {la.attempt_id}") as over:
        claim(q, c)
    assert over.value.supersede == la.attempt_id
    # the caller cancels it; its acknowledgement returns the slot and wakes c
    end_cancel_ack(q, la)
    assert q.slots.wake_due() == [f"{c.id}/1"]
    claim(q, c)


def test_cost_zero_names_the_key_without_taking_a_slot(q: mc_queue.Client) -> None:
    q.slots.set(KEY, 1, reason="a writer lease")
    a = enqueue(q, 1)[0]
    claim(q, a)
    reader = q.producer.enqueue("jobs", "h", {"read": True}, limits={KEY: 0})
    lr = claim(q, reader)
    assert lr.task and lr.task.attempts[0].slots == {}


def test_the_writer_fence_reaches_the_provider_and_refuses_the_writer_a_newer_one_replaced(
        q: mc_queue.Client) -> None:
    q.slots.set(KEY, 1, reason="one writer per branch")
    a, b = enqueue(q, 2)
    la = claim(q, a, lease_ms=300)
    with pytest.raises(OverLimit):
        claim(q, b)
    end_expire(q, la)  # a's worker froze: its lease ran out, the sweeper expired it, b got the writer lease
    assert q.slots.wake_due() == [f"{b.id}/1"]
    lb = claim(q, b)
    assert la.task and lb.task
    wa, wb = la.task.attempts[0].slots[KEY], lb.task.attempts[0].slots[KEY]
    assert wb > wa
    with ForgeServer(enforce_fence=True) as forge:
        prs = HttpPullRequests(forge.url)
        try:
            prs.open_pr("k-b", repo="acme/web", head="fix", base="main", title="b", writer=(KEY, wb))
            with pytest.raises(httpx.HTTPStatusError) as refused:  # the zombie wakes up and pushes
                prs.open_pr("k-a", repo="acme/web", head="fix-a", base="main", title="a", writer=(KEY, wa))
            assert refused.value.response.status_code == 409
        finally:
            prs.close()
        assert len(forge.pulls) == 1 and forge.fenced_out == 1


def test_the_sweeper_sends_the_woken_waiter_and_its_audit_finds_a_slot_left_free(q: mc_queue.Client) -> None:
    la, b, c = holder_and_two_waiters(q)
    end_complete(q, la)
    sweeper = Sweeper(q, actor="sweeper-1")
    assert sweeper.promote() == [f"{b.id}/1"]  # woken and sent between passes
    # b goes away after its wake, before its claim: the slot is free and c waits, with no wake on its way
    q.operator.cancel_task(b.id, "canceled after it was woken")
    assert q.slots.wake_due() == []
    report = sweeper.run_once()  # the pass's audit finds the free slot
    assert report.woken == [f"{c.id}/1"] and f"{c.id}/1" in report.dispatched
    claim(q, c)


@pytest.mark.parametrize("args,why", [
    ({"slots": 0}, "slots must be"),
    ({"slots": 1_000_001}, "slots must be"),
    ({"slots": 1, "on_full": "drop"}, "on_full must be"),
])
def test_a_bad_setting_is_refused_and_changes_nothing(q: mc_queue.Client, args: dict[str, Any], why: str) -> None:
    before = snapshot(q)
    with pytest.raises(InvalidArgument, match=why):
        q.slots.set(KEY, **args)
    for key in ("repo/acme", "*", ":*", "repo:**", "x" * 129):
        with pytest.raises(InvalidArgument, match="invalid concurrency key"):
            q.slots.set(key, 1)
    assert snapshot(q) == before


# ------------------------------------------------------------------ through real workers, a sweeper and a provider

APP = "tests.apps.controls_app:app"


def held_spans(h: Harness, task_ids: list[str]) -> list[tuple[int, int, str]]:
    """Every Attempt of these tasks that held a slot: (claimed, stopped running, attempt id), ms."""
    spans = []
    for tid in task_ids:
        for a in h.client.reads.get_task(tid).attempts:
            if a.slots and a.started_at is not None:
                end = a.suspect_at or a.ended_at
                spans.append((round(a.started_at.timestamp() * 1000),
                              round(end.timestamp() * 1000) if end else 2**62, a.id))
    return sorted(spans)


def wait_settled(h: Harness, task_ids: list[str], timeout: float = 60) -> list[mc_queue.Task]:
    deadline = time.monotonic() + timeout
    while True:
        tasks = [h.client.reads.get_task(t) for t in task_ids]
        if all(t.state in (TaskState.SUCCEEDED, TaskState.CANCELED) for t in tasks):
            return tasks
        assert time.monotonic() < deadline, [(t.id, t.state.value, [a.state.value for a in t.attempts])
                                             for t in tasks]
        time.sleep(0.05)


def test_a_sigkilled_holder_returns_its_slot_within_lease_and_a_sweep_and_never_two_write_at_once(
        controls: Harness, forge: ForgeServer) -> None:
    h = controls
    forge.enforce_fence = True
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)  # repo:* one slot each (a writer lease), lease 1.5 s
    tasks = [ac.enqueue("write-branch", {"id": i, "key": "repo:a", "hold_s": 2}, limits={"repo:a": 1}).id
             for i in range(4)]
    other = ac.enqueue("write-branch", {"id": 9, "key": "repo:b", "hold_s": 0}, limits={"repo:b": 1}).id
    h.spawn(h.mcq_cmd("sweeper", "--app", APP, "--interval", "0.2"))
    victim = h.spawn(h.worker_cmd("simple", APP, burst=False))  # (runs its Attempts in its own process)
    h.spawn(h.worker_cmd("fork", APP, burst=False))
    # the victim's process group dies (work horse and all) while an Attempt of repo:a holds the slot
    def on_victim() -> str | None:
        for aid, _ in h.client.slots.status("repo:a").holders:
            worker = h.client.reads.get_task(aid.rpartition("/")[0]).attempts[-1].worker_id or ""
            if worker.rpartition(".")[2] == str(victim.pid):
                return aid
        return None

    holder = wait_for(on_victim, 30, "an Attempt of repo:a on the victim worker")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    settled = wait_settled(h, [*tasks, other])
    assert all(t.state is TaskState.SUCCEEDED for t in settled)
    spans = held_spans(h, tasks)
    assert any(aid == holder for _, _, aid in spans)
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        assert start >= end, f"{b} claimed the writer lease at {start} while {a} held it until {end}"
    # the killed holder's slot came back within its lease and a sweep of its last renewal
    killed = next(a for t in settled for a in t.attempts if a.id == holder)
    assert killed.suspect_at is not None and killed.lease_expires_at is not None
    late = (killed.suspect_at - killed.lease_expires_at).total_seconds()
    assert late < 1.5, f"slot returned {late:.2f} s after the lease ran out"
    # at the provider: one pull request per task, writer fences rising in the order they were made
    assert sorted(forge.count_by_key().values()) == [1] * 5 and not forge.duplicates()
    writers = [p for p in forge.pulls if p["head"] != "w-9"]
    assert len(writers) == 4
    assert not h.client.slots.status("repo:a").holders and h.client.slots.status("repo:a").waiting == 0


def test_a_superseding_key_cancels_the_running_push_and_runs_the_newest(controls: Harness,
                                                                         forge: ForgeServer) -> None:
    h = controls
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)  # push:* one slot, supersede
    first = ac.enqueue("write-branch", {"id": 1, "key": "push:main", "hold_s": 30}, limits={"push:main": 1}).id
    h.spawn(h.mcq_cmd("sweeper", "--app", APP, "--interval", "0.2"))
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    wait_for(lambda: h.client.slots.status("push:main").holders, 30, "the first push to hold the slot")
    newest = ac.enqueue("write-branch", {"id": 2, "key": "push:main", "hold_s": 0}, limits={"push:main": 1}).id
    a, b = wait_settled(h, [first, newest], timeout=60)
    assert (a.state, b.state) == (TaskState.CANCELED, TaskState.SUCCEEDED)
    assert any(e.type == "cancel_requested" and f"superseded by {newest}/1" in e.fields.get("reason", "")
               for e in a.events)
    stopped = a.attempts[0].suspect_at
    assert stopped is not None and b.attempts[-1].started_at is not None
    assert b.attempts[-1].started_at >= stopped  # the newest ran only once the first stopped
    assert [p["head"] for p in forge.pulls] == ["w-2"]  # the superseded push never reached the forge


def test_a_holder_whose_adapter_cannot_be_canceled_is_waited_for_not_superseded(controls: Harness,
                                                                               forge: ForgeServer) -> None:
    """push:* supersedes its running holder, but this holder's handler declares ``can_cancel=False``: canceling
    it would void its lease while it keeps running (two writers). The newest waits in line instead, and runs
    once the holder ended; both reach the forge, in order."""
    h = controls
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)  # push:* one slot, supersede
    first = ac.enqueue("write-branch-uncancelable", {"id": 1, "key": "push:dev", "hold_s": 2},
                       limits={"push:dev": 1}).id
    h.spawn(h.mcq_cmd("sweeper", "--app", APP, "--interval", "0.2"))
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    wait_for(lambda: h.client.slots.status("push:dev").holders, 30, "the first push to hold the slot")
    newest = ac.enqueue("write-branch", {"id": 2, "key": "push:dev", "hold_s": 0}, limits={"push:dev": 1}).id
    a, b = wait_settled(h, [first, newest], timeout=60)
    assert (a.state, b.state) == (TaskState.SUCCEEDED, TaskState.SUCCEEDED)
    assert not any(e.type == "cancel_requested" for e in a.events)
    assert b.attempts[-1].started_at is not None and a.attempts[0].ended_at is not None
    assert b.attempts[-1].started_at >= a.attempts[0].ended_at
    assert [p["head"] for p in forge.pulls] == ["w-1", "w-2"]


def test_adapter_capabilities_are_checked_where_declared() -> None:
    app = mc_queue.App(name="caps")

    def fn(ctx: mc_queue.Context, payload: Any) -> None: ...

    with pytest.raises(InvalidArgument, match="can_resume=False reuses no phase"):
        app.handler("a", can_resume=False, reusable_phases=frozenset({"source_capture_done"}))(fn)
    with pytest.raises(InvalidArgument, match="can_cancel must be True or False"):
        app.handler("b", can_cancel="no")(fn)  # type: ignore[arg-type]
    app.handler("c", can_resume=False, can_cancel=False)(fn)
    spec = app.spec("c")
    assert (spec.can_cancel, spec.can_resume, spec.reusable_phases) == (False, False, frozenset())
    app.handler("d")(fn)
    assert app.spec("d").can_cancel and app.spec("d").reusable_phases == frozenset({"source_capture_done"})


def test_the_worker_that_returns_a_slot_sends_the_waiter_itself_with_no_sweeper_running(
        controls: Harness, forge: ForgeServer) -> None:
    h = controls
    ac = h.app_client(controls_app.app)
    controls_app.app.publish_retention(h.client)  # repo:* one slot
    first = ac.enqueue("write-branch", {"id": 1, "key": "repo:c", "hold_s": 1}, limits={"repo:c": 1}).id
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    wait_for(lambda: h.client.slots.status("repo:c").holders, 30, "the first to hold the slot")
    second = ac.enqueue("write-branch", {"id": 2, "key": "repo:c", "hold_s": 0}, limits={"repo:c": 1}).id
    wait_for(lambda: h.client.reads.get_task(second).attempts[0].waiting_for == "repo:c", 30, "the second to park")
    a, b = wait_settled(h, [first, second], timeout=30)  # no sweeper: the first's worker woke and sent it
    assert (a.state, b.state) == (TaskState.SUCCEEDED, TaskState.SUCCEEDED)
    assert b.attempts[0].started_at is not None and a.attempts[0].ended_at is not None
    assert b.attempts[0].started_at >= a.attempts[0].ended_at
    assert (b.attempts[0].started_at - a.attempts[0].ended_at).total_seconds() < 2

"""The cancellation protocol under real workers and real races: prevent, signal, acknowledge or time
out, reconcile, terminate. Late writes stay in the history and never reopen a canceled task.

Workers are `mcq worker` subprocesses running tests/apps/effects_app.py; the sweeper runs here.
Assertions read the task's records (Attempts, events), never logs.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

import mc_queue
from mc_queue import CancelRequested, TaskState, TransitionRefused, WriteRefused, reconcile_attempt
from mc_queue.contracts.models import AttemptState
from mc_queue.testing import RedisServer
from tests.faults.test_effects import Harness, explain, forge, h
from tests.harness import events, proc_state, wait_for

__all__ = ["forge", "h"]  # fixtures used by name

REASON = "operator canceled: the issue was closed upstream"


def order(task: mc_queue.Task, *types: str) -> list[int]:
    """Positions of the first event of each type, in the order given (asserts each exists)."""
    names = [e.type for e in task.events]
    out = []
    for typ in types:
        assert typ in names, f"{typ} missing{explain(task)}"
        out.append(names.index(typ))
    return out


# --------------------------------------------------------------------------- 1. pending: canceled at once


def test_cancel_of_a_pending_task_is_immediate_and_its_message_ends_quietly(h: Harness) -> None:
    task = h.app.enqueue("heartbeats", {"steps": 1})
    assert h.queued() == 1  # its RQ message is already on the way

    assert h.client.operator.cancel_task(task.id, REASON) == "canceled"
    t = h.task(task.id)
    why = explain(t)
    assert t.state is TaskState.CANCELED and t.attempts[0].state is AttemptState.CANCELED, why
    assert events(t, "task_canceled", attempt=1)[0].fields["reason"] == REASON, why
    assert h.client.operator.cancel_task(task.id, REASON) == "canceled"  # a second request reports the first
    assert not h.sweeper.run_once().dispatched  # the outbox no longer holds it

    # The message is delivered anyway: the claim refuses it, the worker ends quietly.
    out = h.run_worker("simple")
    assert out.returncode == 0, out.stderr[-2000:]
    assert h.queued() == 0
    t = h.task(task.id)
    why = explain(t)
    assert t.state is TaskState.CANCELED and [a.state for a in t.attempts] == [AttemptState.CANCELED], why
    refused = events(t, "claim_refused", attempt=1)
    assert len(refused) == 1 and "canceled" in refused[0].fields["reason"], why
    assert not events(t, "attempt_claimed") and t.result is None, why


# --------------------------------------------------------------------------- 2. running: acknowledged


def test_cancel_of_a_running_task_is_heard_acknowledged_and_reconciled(h: Harness, tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    task = h.app.enqueue("heartbeats", {"steps": 600, "step_s": 0.05, "pidfile": str(tmp_path / "pid"),
                                        "seen": str(seen)})
    name = f"cw-{uuid.uuid4().hex[:6]}"
    w = h.start_worker("simple", "--name", name)
    wait_for(lambda: events(h.task(task.id), "attempt_claimed"), 20, "the worker to claim")

    assert h.client.operator.cancel_task(task.id, REASON, ack_timeout_ms=30_000) == "signaled"
    acked = wait_for(lambda: (t := h.task(task.id)) and events(t, "cancel_acknowledged") and t, 10,
                     "the worker to acknowledge the cancel")
    assert w.wait(20) == 0, h.worker_log(w)
    # The handler itself heard it at its next ctx call.
    assert seen.read_text().startswith("CancelRequested"), seen.read_text()
    a = acked.attempts[0]
    assert a.state is AttemptState.SUSPECT, explain(acked)  # lease given up, waiting for reconciliation
    ack = events(acked, "cancel_acknowledged")[0]
    assert ack.fields["worker"] == name and int(ack.fields["new_fence"]) > int(ack.fields["fence"]), explain(acked)

    final = h.sweep_until(lambda t: t.state is TaskState.CANCELED, task.id, 10, "reconciliation to cancel")
    why = explain(final)
    a = final.attempts[0]
    assert a.state is AttemptState.CANCELED and a.settled_by == "reconcile", why
    assert len(final.attempts) == 1 and final.result is None, why
    positions = order(final, "attempt_claimed", "cancel_requested", "cancel_acknowledged", "reconciling_started",
                      "attempt_reconciled", "task_canceled")
    assert positions == sorted(positions), why
    assert events(final, "attempt_reconciled")[0].fields["outcome"] == "canceled", why
    assert not events(final, "lease_expired") and not events(final, "attempt_succeeded"), why
    assert not events(final, "attempt_created", attempt=2), why


# --------------------------------------------------------------------------- 3. no acknowledgement: timeout


def test_an_executor_that_never_acknowledges_has_its_lease_voided_after_the_timeout(h: Harness,
                                                                                    tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    task = h.app.enqueue("heartbeats", {"steps": 600, "step_s": 0.05, "pidfile": str(pidfile),
                                        "seen": str(tmp_path / "seen")})
    name = f"cw-{uuid.uuid4().hex[:6]}"
    w = h.start_worker("simple", "--name", name)
    pid = int(wait_for(lambda: Path(f"{pidfile}.1").exists() and Path(f"{pidfile}.1").read_text(), 20,
                       "the handler's pid"))
    assert pid == w.pid
    h.sigstop(pid)  # it will never hear the signal, let alone acknowledge

    assert h.client.operator.cancel_task(task.id, REASON, ack_timeout_ms=300) == "signaled"
    final = h.sweep_until(lambda t: t.state is TaskState.CANCELED, task.id, 10,
                          "the sweeper to void the lease and cancel")
    why = explain(final)
    assert proc_state(pid) in ("T", "t"), "the executor must still be frozen"
    voided = events(final, "lease_expired", attempt=1)
    assert len(voided) == 1 and voided[0].fields["reason"] == "cancel not acknowledged in time", why
    # Voided before the lease itself would have run out (lease 4 s, ack timeout 0.3 s).
    assert int(voided[0].fields["left_ms"]) > 0 and voided[0].fields["overdue_ms"] == "0", why
    assert not events(final, "cancel_acknowledged"), why
    a = final.attempts[0]
    assert a.state is AttemptState.CANCELED and a.settled_by == "reconcile", why
    positions = order(final, "cancel_requested", "lease_expired", "reconciling_started", "attempt_reconciled",
                      "task_canceled")
    assert positions == sorted(positions), why

    # Woken up, the executor is refused at its next write, and the task stays canceled.
    h.sigcont(pid)
    assert w.wait(20) == 0, h.worker_log(w)
    after = h.task(task.id)
    why = explain(after)
    stale = events(after, "stale_write_refused", attempt=1)
    assert stale and all(e.fields["worker"] == name and e.fields["refusal"] == "stale_fence" for e in stale), why
    assert (tmp_path / "seen").read_text().startswith("LeaseLost"), why
    assert after.state is TaskState.CANCELED and after.attempts[0].state is AttemptState.CANCELED, why
    assert len(after.attempts) == 1 and after.result is None, why


# --------------------------------------------------------------------------- 4. late completion


def test_a_completion_after_cancel_is_refused_kept_and_cannot_reopen_the_task(h: Harness) -> None:
    q = h.client
    task = q.producer.enqueue("effects", "heartbeats", {"steps": 1})
    lease = q.leases.claim_attempt(task.id, "late-worker", lease_ms=10_000)
    assert q.operator.cancel_task(task.id, REASON, ack_timeout_ms=200) == "signaled"

    # While the cancel is pending: the completion is refused (the executor must acknowledge instead).
    with pytest.raises(CancelRequested):
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"done": True}, worker_id="late-worker")
    t = q.reads.get_task(task.id)
    why = explain(t)
    refused = events(t, "stale_write_refused", attempt=1, op="complete")
    assert len(refused) == 1 and refused[0].fields["refusal"] == "cancel_requested", why
    assert t.state is TaskState.RUNNING and t.cancel_requested == REASON, why

    # Nobody acknowledges: after the timeout the sweeper voids the lease and the task ends canceled.
    final = h.sweep_until(lambda t: t.state is TaskState.CANCELED, task.id, 10, "the cancel to complete")

    # Late writes with the old fence: every one refused, every one kept, the task stays canceled.
    with pytest.raises(WriteRefused):
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"done": True}, worker_id="late-worker")
    with pytest.raises(WriteRefused):
        q.leases.fail_attempt(lease.attempt_id, lease.fence, mc_queue.make_failure("provider", "Timeout", "late"),
                       worker_id="late-worker")
    with pytest.raises(WriteRefused):
        q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="late-worker")
    with pytest.raises(TransitionRefused):
        q.operator.retry_task(task.id, "try it once more after the cancel")
    after = q.reads.get_task(task.id)
    why = explain(after)
    late = [e for e in events(after, "stale_write_refused", attempt=1) if e.fields.get("refusal") == "stale_fence"]
    assert [e.fields["op"] for e in late] == ["complete", "fail", "renew"], why
    assert all(int(e.fields["presented_fence"]) == lease.fence for e in late), why
    assert after.state is TaskState.CANCELED and after.result is None, why
    assert [a.state for a in after.attempts] == [AttemptState.CANCELED], why
    assert not events(after, "attempt_succeeded") and len(after.events) > len(final.events), why
    assert q.operator.cancel_task(task.id, REASON) == "canceled"


# --------------------------------------------------------------------------- 5. cancel racing complete


def race(worker: mc_queue.Client, person: mc_queue.Client, task_id: str, lease: mc_queue.Lease,
         result: dict[str, int]) -> dict[str, str]:
    """The executor completes and the operator cancels at the same moment (two connections, a barrier).
    An executor told to stop acknowledges, as run_attempt does."""
    barrier = threading.Barrier(2)
    seen: dict[str, str] = {}

    def complete() -> None:
        barrier.wait()
        try:
            worker.leases.complete_attempt(lease.attempt_id, lease.fence, result, worker_id="racer")
            seen["complete"] = "ok"
        except CancelRequested:
            seen["complete"] = "cancel_requested"
            worker.leases.acknowledge_cancel(lease.attempt_id, lease.fence, worker_id="racer")

    def cancel() -> None:
        barrier.wait()
        try:
            seen["cancel"] = person.operator.cancel_task(task_id, REASON, ack_timeout_ms=30_000)
        except TransitionRefused:
            seen["cancel"] = "refused"

    threads = [threading.Thread(target=complete), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return seen


def test_cancel_racing_complete_ends_in_exactly_one_final_state(redis_server: RedisServer, prefix: str) -> None:
    rounds = 30
    setup = mc_queue.connect(redis_server.url, prefix=prefix)
    worker = mc_queue.connect(redis_server.url, prefix=prefix)
    operator = mc_queue.connect(redis_server.url, prefix=prefix)
    tally = {"succeeded": 0, "canceled": 0}
    try:
        for i in range(rounds):
            task = setup.producer.enqueue("effects", "heartbeats", {"round": i})
            lease = worker.leases.claim_attempt(task.id, "racer", lease_ms=30_000)
            seen = race(worker, operator, task.id, lease, {"round": i})
            assert set(seen) == {"complete", "cancel"}, seen
            if seen["cancel"] == "signaled":
                reconcile_attempt(setup, lease.attempt_id, actor="reconciler")
            final = setup.reads.get_task(task.id)
            why = f"round {i}: {seen}{explain(final)}"
            succeeded = final.state is TaskState.SUCCEEDED
            canceled = final.state is TaskState.CANCELED
            assert succeeded != canceled, why
            if succeeded:
                assert seen == {"complete": "ok", "cancel": "refused"}, why
                assert len(events(final, "attempt_succeeded")) == 1 and len(events(final, "cancel_refused")) == 1, why
                assert final.attempts[0].state is AttemptState.SUCCEEDED and final.result == {"round": i}, why
                assert not events(final, "task_canceled") and not events(final, "stale_write_refused"), why
                assert not events(final, "cancel_requested"), why
            else:
                assert seen == {"complete": "cancel_requested", "cancel": "signaled"}, why
                refused = events(final, "stale_write_refused", op="complete")
                assert len(refused) == 1 and refused[0].fields["refusal"] == "cancel_requested", why
                assert len(events(final, "task_canceled")) == 1 and not events(final, "attempt_succeeded"), why
                assert final.attempts[0].state is AttemptState.CANCELED and final.result is None, why
                assert not events(final, "cancel_refused"), why
            tally[final.state.value] += 1
        assert sum(tally.values()) == rounds, tally
        print(f"cancel vs complete over {rounds} rounds: {tally}")
    finally:
        for c in (setup, worker, operator):
            c.close()

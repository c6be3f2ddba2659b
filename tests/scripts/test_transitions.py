"""Every edge of the state table happens, and nothing else does (a real redis-server).

A tour drives each listed transition through the Client while a TransitionRecorder watches every
script call: the changes seen must be exactly the table's edges (none missing, none extra). The
stateful property test checks the same "nothing but listed edges" on random histories.
"""

from __future__ import annotations

import time

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, make_failure
from mc_queue.client.producer import NewTask
from mc_queue.contracts.errors import SlotRejected
from mc_queue.contracts.states import TRANSITIONS
from mc_queue.testing import TransitionRecorder

FAILURE = make_failure(FailureClass.PROVIDER, "Timeout", "the provider timed out")
REASON = "the reason for this move is recorded"
LONG = 60_000


def _retry(delay_s: float) -> Decision:
    return Decision("retry", "transient", delay_s, next_reason="transient failure, try again", next_hypothesis="")


STOP = Decision("stop", "stop for a person", attention={"task_id": "x", "why_unsafe": "tour"})
QUARANTINE = Decision("quarantine", "quarantine", attention={"task_id": "x", "why_unsafe": "tour"})


def _tour(q: mc_queue.Client) -> None:
    def new() -> str:
        return q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}).id

    def running(tid: str | None = None) -> tuple[str, mc_queue.Lease]:
        tid = tid or new()
        return tid, q.leases.claim_attempt(tid, "w", LONG)

    def reconciling(tid: str | None = None, *, cancel: bool = False) -> tuple[str, str]:
        tid, lease = running(tid)
        if cancel:
            q.operator.cancel_task(tid, REASON)
        q.operator.void_leases([lease.attempt_id], reason="tour voids")
        q.operator.begin_reconcile(lease.attempt_id)
        return tid, lease.attempt_id

    def failed() -> str:
        tid, lease = running()
        q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w")
        return tid

    def blocked() -> str:
        tid, lease = running()
        q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w", decision=STOP)
        return tid

    def quarantined() -> str:
        tid, lease = running()
        q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w", decision=QUARANTINE)
        return tid

    def backoff() -> str:
        tid = failed()
        q.operator.retry_task(tid, REASON, delay_ms=40)
        return tid

    # claim from pending and from backoff; complete
    tid, lease = running()
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w")
    tid = backoff()
    time.sleep(0.06)
    q.leases.claim_attempt(tid, "w", LONG)
    # a scheduled task: claimed once due, canceled before
    tid = q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, delay_s=0.04).id
    time.sleep(0.06)
    q.leases.claim_attempt(tid, "w", LONG)
    q.operator.cancel_task(q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, delay_s=3600).id, REASON)
    # a full concurrency key that rejects the newest: the claim cancels the task, from pending, backoff, scheduled
    q.slots.set("tour:one", 1, on_full="reject", reason="the tour's writer lease")
    keyed = {"tour:one": 1}
    bk = q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, limits=keyed).id
    lease = q.leases.claim_attempt(bk, "w", LONG, limits=("tour:one",))
    q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w", decision=_retry(0.04))
    holder = q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, limits=keyed).id
    q.leases.claim_attempt(holder, "w", LONG, limits=("tour:one",))
    sched = q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, delay_s=0.04, limits=keyed).id
    pend = q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, limits=keyed).id
    time.sleep(0.06)
    for tid in (pend, bk, sched):
        with pytest.raises(SlotRejected):
            q.leases.claim_attempt(tid, "w", LONG, limits=("tour:one",))
    # a batch: a task due now and one scheduled, each with its Attempt 1
    q.producer.enqueue_many([NewTask("tour", "h", {"n": time.monotonic_ns()}),
                             NewTask("tour", "h", {"n": time.monotonic_ns()}, delay_s=3600)])
    # tasks that wait for others: enqueued waiting, or pending / scheduled when their parent already ended;
    # released to pending or scheduled, canceled by a parent that did not succeed, canceled while waiting
    ended, lease = running()
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w")
    q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, after=[ended])
    q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, after=[ended], delay_s=3600)
    parent, doomed = new(), new()
    for kw in ({}, {"delay_s": 3600}):
        q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, after=[parent], **kw)
    q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, after=[doomed])
    q.operator.cancel_task(q.producer.enqueue("tour", "h", {"n": time.monotonic_ns()}, after=[parent]).id, REASON)
    _, lease = running(parent)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w")
    q.operator.cancel_task(doomed, REASON)
    q.dependencies.release_due()
    # fail and each decision
    for decision in (None, _retry(0), _retry(30), STOP, QUARANTINE):
        tid, lease = running()
        q.leases.fail_attempt(lease.attempt_id, lease.fence, FAILURE, worker_id="w", decision=decision)
    # expire, cancel_ack, reconcile_begin, and every settlement
    tid, aid = reconciling()
    q.operator.settle_attempt(aid, "tour", "succeeded", result={"proven": True}, evidence={"tour": 1})
    tid, aid = reconciling(cancel=True)
    q.operator.settle_attempt(aid, "tour", "canceled", evidence={"tour": 1})
    for decision in (None, _retry(0), _retry(30), STOP, QUARANTINE):
        tid, aid = reconciling()
        q.operator.settle_attempt(aid, "tour", "failed", failure=FAILURE, evidence={"tour": 1}, decision=decision)
    tid, lease = running()
    q.operator.cancel_task(tid, REASON)
    q.leases.acknowledge_cancel(lease.attempt_id, lease.fence, worker_id="w")
    # retry from failed and blocked, now or after a backoff
    for make in (failed, blocked):
        for delay in (0, 30_000):
            q.operator.retry_task(make(), REASON, delay_ms=delay)
    # cancel whatever is not running
    for make in (new, backoff, failed, blocked):
        q.operator.cancel_task(make(), REASON)
    # the DLQ
    q.operator.dlq_replay(quarantined(), REASON, "fixed")
    q.operator.dlq_purge(quarantined(), reason=REASON)
    # retention and `mcq tasks purge`: every ended state, packed or not
    done = running()
    q.leases.complete_attempt(done[1].attempt_id, done[1].fence, {"ok": 1}, worker_id="w")
    q.maintenance.pack_tasks([done[0]])
    canceled = new()
    q.operator.cancel_task(canceled, REASON)
    for tid, state in ((done[0], "succeeded"), (canceled, "canceled"), (failed(), "failed"), (blocked(), "blocked"),
                       (quarantined(), "quarantined")):
        assert q.operator.retire_task(tid, states=[state], reason=REASON) == state


def test_every_listed_edge_happens_and_nothing_else(q: mc_queue.Client) -> None:
    rec = TransitionRecorder(q)
    try:
        _tour(q)
    finally:
        rec.close()
    assert rec.violations == [], f"changes the state table does not list: {sorted(set(rec.violations))}"
    listed = {(e.entity, e.src, e.dst, e.script) for e in TRANSITIONS}
    missing = listed - set(rec.seen)
    assert not missing, f"listed edges the tour never made happen: {sorted(missing)}"

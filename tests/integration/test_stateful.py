"""Stateful property test: the real Client on a real redis-server against a pure-Python model.

The model (``Model*`` below) is written from the Lua headers and the state table in
``mc_queue/models.py``: for every call it predicts success or the exact exception class, and the
resulting task state, attempt states and fences. After every step the real records are read back
(``Client.get_task``, ``Client.status``) and compared with the model, and these invariants hold:

* at most one non-terminal Attempt per task, and it is the latest;
* a terminal Attempt never changes again (snapshots are kept);
* the task fence never decreases; claim never hands out the same (task, fence) twice;
* Attempts are numbered 1..N, Attempt N > 1 names N - 1 as previous and has a reason >= 10 chars;
* every refused fenced write (StaleFence, LeaseExpired, AttemptNotRunning) adds exactly one
  ``stale_write_refused`` event, and nothing else adds one;
* ``status()`` counts equal the model's counts per (queue, state);
* ``attempt_claimed`` events equal the claims that handed out a new lease (a resent claim with the
  same request id returns the same lease and is not a new claim).

Time: a lease is either long (60 s, never runs out during a run) or 1 ms followed by a short
sleep so that Redis's clock has certainly passed it; nothing else depends on wall-clock time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import mc_queue
from mc_queue import reconcile_attempt
from mc_queue.errors import (
    AttemptNotRunning,
    ClaimRejected,
    IdempotencyConflict,
    InvalidArgument,
    LeaseExpired,
    McqError,
    ResultConflict,
    RetryRefused,
    StaleFence,
    TaskNotFound,
    TransitionRefused,
    WriteRefused,
)
from mc_queue.failures import make_failure
from mc_queue.keys import new_task_id
from mc_queue.models import Task
from mc_queue.testing import RedisServer, unique_prefix

QUEUES = ("qa", "qb")
HANDLERS = ("h1", "h2")
WORKERS = ("w1", "w2", "w3")
LONG_MS = 60_000  # never runs out within one run
SHORT_MS = 1  # has run out once _let_clock_pass() returns
FAILURES = (
    make_failure("provider", "Timeout", "the provider timed out"),
    make_failure("validation", "TestsFailed", "3 tests failed"),
)
# Reasons count characters after trimming: the third invalid one is >= 10 characters untrimmed, the
# last >= 10 bytes of UTF-8 but 9 characters; "réessayer!" is 10 characters.
VALID_REASONS = ("provider timed out, retry", "0123456789", "  padded-but-long-enough  ", "réessayer!")
INVALID_REASONS = ("", "too short", "   short    \t", "ééééé ééé")
LUA_SPACE = " \t\n\r\f\v"  # Lua's %s in the C locale (retry.lua trims the reason with it)
TERMINAL = frozenset({"succeeded", "failed", "canceled"})
GHOST = new_task_id(QUEUES[0])  # a task id no run has enqueued (until enqueue_with_task_id names it)


def _let_clock_pass() -> None:
    """Let Redis's millisecond clock pass a 1 ms lease (or a 1 ms retry delay)."""
    time.sleep(0.004)


# --------------------------------------------------------------------------------------------- model


@dataclass
class ModelAttempt:
    n: int
    reason: str
    state: str = "pending"
    fence: int | None = None
    worker: str | None = None
    claim_req: str | None = None  # request id of the claim that took it (None: the client's uuid)
    create_req: str | None = None  # request id of the retry that created it
    lease_ms: int | None = None  # length granted at claim (what renew without lease_ms uses)
    expired: bool = False  # the lease has passed on Redis's clock
    due: bool = True  # due_at has passed
    result: int | None = None  # variant recorded by complete
    failure: int | None = None  # variant recorded by fail (None when settled by reconciliation)
    settled_by: str | None = None


@dataclass
class ModelTask:
    id: str
    queue: str
    handler: str
    payload: int
    idem_key: str | None
    state: str = "pending"
    fence: int = 0
    attempts: list[ModelAttempt] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)
    leases: list[tuple[int, int]] = field(default_factory=list)  # (n, fence) handed out by claim

    @property
    def latest(self) -> ModelAttempt:
        return self.attempts[-1]

    def fenced_candidates(self) -> list[tuple[int, int]]:
        """(attempt, fence) pairs a worker could present: the current fence with the latest attempt
        (three times, so it is drawn most often), every lease claim handed out, and old fences with
        the latest attempt. Never a fence above the current one: that proves Redis lost state."""
        latest = len(self.attempts)
        pairs = set(self.leases)
        pairs.update((latest, f) for _, f in self.leases)
        return [(latest, self.fence)] * 3 + sorted(pairs)


def _running(t: ModelTask) -> bool:
    return t.latest.state == "running"


def _claimable(t: ModelTask) -> bool:
    return t.latest.state == "pending" and t.latest.due


def _payload(variant: int) -> dict[str, Any]:
    return {"v": variant, "text": f"payload {variant}"}


def _result(variant: int) -> dict[str, Any]:
    return {"ok": variant}


# --------------------------------------------------------------------------------------------- machine


class QueueMachine(RuleBasedStateMachine):
    """Drives one fresh namespace per run. ``url`` is set by the test before the machine runs."""

    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.q = mc_queue.Client(self.url, prefix=unique_prefix("stateful"), actor="stateful-test")
        self.model: dict[str, ModelTask] = {}
        self.idem: dict[str, str] = {}  # idempotency key -> task id
        self.handed_out: set[tuple[str, int]] = set()  # (task, fence) handed out by claim
        self.claims_ok: Counter[str] = Counter()  # per task: claims that handed out a new lease
        self.terminal_snapshots: dict[tuple[str, int], dict[str, Any]] = {}
        self.last_fence: dict[str, int] = {}

    def teardown(self) -> None:
        self.q.close()

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[Any, McqError | None]:
        try:
            return fn(*args, **kw), None
        except McqError as exc:
            return None, exc

    @staticmethod
    def _expect(what: str, expected: type[McqError] | None, exc: McqError | None) -> None:
        if expected is None:
            assert exc is None, f"{what}: model expects success, got {type(exc).__name__}: {exc}"
            return
        assert exc is not None, f"{what}: model expects {expected.__name__}, the call succeeded"
        ok = isinstance(exc, expected) if expected is InvalidArgument else type(exc) is expected
        assert ok, f"{what}: model expects {expected.__name__}, got {type(exc).__name__}: {exc}"

    def _pick_task(self, data: st.DataObject, prefer: Callable[[ModelTask], bool]) -> str:
        """Mostly a task the rule can act on (so runs make progress), sometimes any task, and
        sometimes a task id nobody enqueued."""
        roll = data.draw(st.integers(0, 9), label="task choice")
        good = sorted(tid for tid, t in self.model.items() if prefer(t))
        if roll == 9 or not self.model:
            return GHOST
        pool = good if roll < 7 and good else sorted(self.model)
        return data.draw(st.sampled_from(pool), label="task")

    def _pick_fenced(self, data: st.DataObject, task: str) -> tuple[int, int]:
        t = self.model.get(task)
        candidates = t.fenced_candidates() if t is not None else [(1, 0), (1, 1)]
        return data.draw(st.sampled_from(candidates), label="attempt, fence")

    # ------------------------------------------------------------------ operations: predict, call, compare, apply

    def _op_enqueue(self, queue: str, handler: str, payload: int, idem: str | None, task_id: str | None) -> None:
        # enqueue.lua: the idempotency key first, then the task id, else a new task.
        expected: type[McqError] | None = None
        existing: str | None = None
        if task_id is not None and not task_id.startswith(queue + ":"):
            expected = InvalidArgument  # the client: the id does not belong to the queue
        elif idem is not None and idem in self.idem:
            e = self.model[self.idem[idem]]
            if (e.payload, e.handler, e.queue) == (payload, handler, queue):
                existing = e.id
            else:
                expected = IdempotencyConflict
        elif task_id is not None and task_id in self.model:
            e = self.model[task_id]
            if (e.payload, e.handler) == (payload, handler):
                existing = e.id
            else:
                expected = IdempotencyConflict
                e.events["enqueue_refused"] += 1  # recorded in that task's history
        task, exc = self._call(self.q.enqueue, queue, handler, _payload(payload), idem, task_id=task_id)
        self._expect(f"enqueue({queue}, {handler}, payload={payload}, key={idem}, id={task_id})", expected, exc)
        if exc is not None:
            return
        if existing is not None:
            assert task.id == existing, "a replay must return the task it first created"
            return
        assert task.id not in self.model, "a new enqueue must create a new task"
        assert task_id is None or task.id == task_id
        t = ModelTask(task.id, queue, handler, payload, idem)
        t.attempts.append(ModelAttempt(1, "first dispatch"))
        t.events.update(["task_created", "attempt_created"])
        self.model[task.id] = t
        if idem is not None:
            self.idem[idem] = task.id

    def _op_claim(self, task: str, worker: str, lease_ms: int, request_id: str | None) -> bool:
        """claim.lua. Returns whether a new lease was handed out."""
        t = self.model.get(task)
        expected: type[McqError] | None = None
        dup = False
        if t is None:
            expected = TaskNotFound
        else:
            a = t.latest
            if request_id is not None and a.claim_req == request_id and a.state == "running":
                dup = True
            elif t.state not in ("pending", "backoff") or a.state != "pending" or not a.due:
                expected = ClaimRejected
        lease, exc = self._call(self.q.claim_attempt, task, worker, lease_ms, request_id=request_id)
        self._expect(f"claim({task}, {worker}, lease_ms={lease_ms}, request_id={request_id})", expected, exc)
        if t is None:
            return False
        if exc is not None:
            t.events["claim_refused"] += 1
            return False
        a = t.latest
        assert (lease.number, lease.attempt_id) == (a.n, f"{task}/{a.n}")
        if dup:
            assert lease.fence == a.fence, f"a resent claim returned fence {lease.fence}, the lease has {a.fence}"
            return False
        # common.lua next_fence: above the current fence and the namespace floor (and not below
        # Redis TIME in microseconds), so the model checks "above", then adopts the value.
        assert lease.fence > t.fence, f"claim handed out fence {lease.fence}, not above the current {t.fence}"
        t.fence = lease.fence
        assert (task, lease.fence) not in self.handed_out, f"fence {lease.fence} of {task} handed out twice"
        self.handed_out.add((task, lease.fence))
        self.claims_ok[task] += 1
        t.leases.append((a.n, lease.fence))
        t.state = "running"
        a.state, a.fence, a.worker, a.claim_req, a.lease_ms = "running", lease.fence, worker, request_id, lease_ms
        a.expired = False
        t.events["attempt_claimed"] += 1
        if lease_ms == SHORT_MS:
            _let_clock_pass()
            a.expired = True
        return True

    @staticmethod
    def _fence_check(t: ModelTask, n: int, fence: int) -> type[WriteRefused] | None:
        """common.lua fence_check: a stale fence or not the latest attempt, then not running, then expired."""
        a = t.attempts[n - 1]
        if fence != t.fence or n != len(t.attempts):
            return StaleFence
        if a.state != "running":
            return AttemptNotRunning
        if a.expired:
            return LeaseExpired
        return None

    def _op_renew(self, task: str, n: int, fence: int, lease_ms: int | None, worker: str) -> None:
        t = self.model.get(task)
        expected: type[McqError] | None
        # renew.lua: the namespace and fence checks come first; without lease_ms the length granted
        # at claim is used, which a running attempt always has.
        if t is None:
            expected = TaskNotFound
        else:
            expected = self._fence_check(t, n, fence)
        _, exc = self._call(self.q.renew_lease, f"{task}/{n}", fence, worker_id=worker, lease_ms=lease_ms)
        self._expect(f"renew({task}/{n}, fence={fence}, lease_ms={lease_ms})", expected, exc)
        if t is None:
            return
        if isinstance(exc, WriteRefused):
            t.events["stale_write_refused"] += 1
        if exc is None:
            a = t.attempts[n - 1]
            a.expired = False
            if (lease_ms or a.lease_ms) == SHORT_MS:
                _let_clock_pass()
                a.expired = True

    def _op_complete(self, task: str, n: int, fence: int, variant: int, worker: str) -> None:
        t = self.model.get(task)
        expected: type[McqError] | None = None
        replay = False
        if t is None:
            expected = TaskNotFound
        else:
            a = t.attempts[n - 1]
            if a.state == "succeeded" and a.fence == fence and a.result is not None:
                replay = a.result == variant  # same fence, same result: a no-op success
                expected = None if replay else ResultConflict
            else:
                expected = self._fence_check(t, n, fence)
        att, exc = self._call(self.q.complete_attempt, f"{task}/{n}", fence, _result(variant), worker_id=worker)
        self._expect(f"complete({task}/{n}, fence={fence}, result={variant})", expected, exc)
        if t is None:
            return
        if isinstance(exc, WriteRefused):
            t.events["stale_write_refused"] += 1
        if isinstance(exc, ResultConflict):
            t.events["completion_conflict"] += 1
        if exc is not None:
            return
        assert att.state == "succeeded" and att.result == _result(variant)
        if not replay:
            a = t.attempts[n - 1]
            a.state, a.result = "succeeded", variant
            t.state = "succeeded"
            t.events["attempt_succeeded"] += 1

    def _op_fail(self, task: str, n: int, fence: int, variant: int, worker: str) -> None:
        t = self.model.get(task)
        expected: type[McqError] | None = None
        replay = False
        if t is None:
            expected = TaskNotFound
        else:
            a = t.attempts[n - 1]
            # Idempotent on (fence, failure digest): only a failure that fail recorded with this fence
            # counts. An Attempt settled by reconciliation was not failed by the holder of its old fence
            # (expire revoked that fence), so that holder's late write is an ordinary stale one.
            if a.state == "failed" and a.fence == fence and a.failure is not None:
                replay = a.failure == variant
                expected = None if replay else ResultConflict
            else:
                expected = self._fence_check(t, n, fence)
        att, exc = self._call(self.q.fail_attempt, f"{task}/{n}", fence, FAILURES[variant], worker_id=worker)
        self._expect(f"fail({task}/{n}, fence={fence}, failure={variant})", expected, exc)
        if t is None:
            return
        if isinstance(exc, WriteRefused):
            t.events["stale_write_refused"] += 1
        if isinstance(exc, ResultConflict):
            t.events["failure_conflict"] += 1
        if exc is not None:
            return
        assert att.state == "failed" and att.failure == FAILURES[variant]
        if not replay:
            a = t.attempts[n - 1]
            a.state, a.failure = "failed", variant
            t.state = "failed"
            t.events["attempt_failed"] += 1

    def _op_expire_leases(self) -> None:
        expected = set()
        for t in self.model.values():
            a = t.latest
            if a.state == "running" and a.expired:
                expected.add((f"{t.id}/{a.n}", a.fence))
        got, exc = self._call(self.q.expire_leases)
        self._expect("expire_leases()", None, exc)
        assert len(got) == len({e.attempt_id for e in got}), "an attempt was expired twice in one sweep"
        assert {(e.attempt_id, e.old_fence) for e in got} == expected, (
            f"expire_leases() returned {got}, model expects {sorted(expected)}")
        for e in got:
            t = self.model[e.attempt_id.rpartition("/")[0]]
            assert e.new_fence > t.fence, f"{e.attempt_id}: expire bumped the fence {t.fence} to {e.new_fence}"
            t.latest.state = "suspect"  # the task stays running until reconciliation settles it
            t.fence = e.new_fence
            t.events["lease_expired"] += 1

    def _op_reconcile(self, task: str, n: int) -> None:
        t = self.model.get(task)
        expected: type[McqError] | None = None
        if t is None:
            expected = TaskNotFound
        elif n > len(t.attempts) or t.attempts[n - 1].state != "suspect":
            expected = TransitionRefused
        att, exc = self._call(reconcile_attempt, self.q, f"{task}/{n}")
        self._expect(f"reconcile_attempt({task}/{n})", expected, exc)
        if t is not None and exc is not None:
            t.events["reconcile_refused"] += 1  # reconcile_begin records its refusal
        if exc is not None or t is None:
            return
        assert att.state == "failed" and att.settled_by == "reconcile"
        a = t.attempts[n - 1]
        a.state, a.settled_by = "failed", "reconcile"
        t.state = "failed"
        t.events.update(["reconciling_started", "attempt_reconciled"])

    def _op_retry(self, task: str, reason: str, delay_ms: int, req: str | None) -> None:
        t = self.model.get(task)
        expected: type[McqError] | None = None
        dup = False
        if any(ord(c) < 32 for c in reason):  # bad input: refused before anything is read or written
            expected = InvalidArgument
        elif t is None:
            expected = TaskNotFound
        elif req is not None and t.latest.create_req == req:
            dup = True  # a resend returns the attempt it created
        elif t.latest.state != "failed":  # succeeded (final), or an attempt still active
            expected = RetryRefused
        elif len(reason.strip(LUA_SPACE)) < 10:
            expected = RetryRefused
        att, exc = self._call(self.q.retry_task, task, reason, "try again", delay_ms=delay_ms, request_id=req)
        self._expect(f"retry_task({task}, {reason!r}, delay_ms={delay_ms}, request_id={req})", expected, exc)
        if t is None:
            return
        if isinstance(exc, RetryRefused):
            t.events["retry_refused"] += 1
        if exc is not None:
            return
        if dup:
            assert att.number == t.latest.n, "a resent retry must return the attempt it created"
            return
        m = ModelAttempt(len(t.attempts) + 1, reason.strip(LUA_SPACE), create_req=req, due=delay_ms != LONG_MS)
        assert att.number == m.n and att.state == "pending"
        t.attempts.append(m)
        t.state = "pending" if delay_ms == 0 else "backoff"
        t.events["attempt_created"] += 1
        if delay_ms == SHORT_MS:
            _let_clock_pass()

    # ------------------------------------------------------------------ rules

    @initialize(queue=st.sampled_from(QUEUES), payload=st.integers(0, 2))
    def first_task(self, queue: str, payload: int) -> None:
        """Every run starts with a task (swarm testing may switch the enqueue rules off)."""
        self._op_enqueue(queue, HANDLERS[0], payload, None, None)

    @rule(queue=st.sampled_from(QUEUES), handler=st.sampled_from(HANDLERS),
          payload=st.integers(0, 2), idem=st.none() | st.sampled_from(["k1", "k2", "k3"]))
    def enqueue(self, queue: str, handler: str, payload: int, idem: str | None) -> None:
        self._op_enqueue(queue, handler, payload, idem, None)

    @rule(data=st.data(), other_queue=st.booleans(), handler=st.sampled_from(HANDLERS),
          payload=st.integers(0, 2), idem=st.none() | st.sampled_from(["k1", "k2"]))
    def enqueue_with_task_id(self, data: st.DataObject, other_queue: bool, handler: str, payload: int,
                             idem: str | None) -> None:
        """The producer names the task id: an existing one (a replay or a conflict) or GHOST."""
        task = self._pick_task(data, lambda t: True)
        queue = task.partition(":")[0]
        if other_queue:
            queue = QUEUES[1 - QUEUES.index(queue)]
        self._op_enqueue(queue, handler, payload, idem, task)

    @rule(data=st.data(), change=st.sampled_from(["nothing", "payload", "handler", "queue"]))
    def enqueue_resend(self, data: st.DataObject, change: str) -> None:
        """A producer sends a task again under its idempotency key: unchanged (the same task comes
        back), or with another payload, handler or queue (a conflict)."""
        if not self.idem:
            self._op_enqueue(QUEUES[0], HANDLERS[0], 0, "k1", None)
            return
        key = data.draw(st.sampled_from(sorted(self.idem)), label="idempotency key")
        t = self.model[self.idem[key]]
        queue, handler, payload = t.queue, t.handler, t.payload
        if change == "payload":
            payload = (payload + 1) % 3
        elif change == "handler":
            handler = HANDLERS[1 - HANDLERS.index(handler)]
        elif change == "queue":
            queue = QUEUES[1 - QUEUES.index(queue)]
        self._op_enqueue(queue, handler, payload, key, None)

    @rule(data=st.data(), worker=st.sampled_from(WORKERS), lease_ms=st.sampled_from([LONG_MS, LONG_MS, SHORT_MS]),
          req=st.none() | st.integers(0, 1))
    def claim(self, data: st.DataObject, worker: str, lease_ms: int, req: int | None) -> None:
        task = self._pick_task(data, lambda t: t.latest.state in ("pending", "running"))
        self._op_claim(task, worker, lease_ms, None if req is None else f"{worker}-claim-{req}")

    @rule(data=st.data(), lease_ms=st.sampled_from([None, LONG_MS, SHORT_MS]), worker=st.sampled_from(WORKERS))
    def renew(self, data: st.DataObject, lease_ms: int | None, worker: str) -> None:
        task = self._pick_task(data, _running)
        self._op_renew(task, *self._pick_fenced(data, task), lease_ms, worker)

    @rule(data=st.data(), variant=st.integers(1, 2), worker=st.sampled_from(WORKERS))
    def complete(self, data: st.DataObject, variant: int, worker: str) -> None:
        task = self._pick_task(data, _running)
        self._op_complete(task, *self._pick_fenced(data, task), variant, worker)

    @rule(data=st.data(), variant=st.integers(0, 1), worker=st.sampled_from(WORKERS))
    def fail(self, data: st.DataObject, variant: int, worker: str) -> None:
        task = self._pick_task(data, _running)
        self._op_fail(task, *self._pick_fenced(data, task), variant, worker)

    @rule(data=st.data(), op=st.sampled_from(["renew", "complete", "fail"]), variant=st.integers(0, 1))
    def zombie_write(self, data: st.DataObject, op: str, variant: int) -> None:
        """A worker that lost its lease writes late with the fence it was given."""
        task = self._pick_task(data, lambda t: len(t.leases) > 0)
        t = self.model.get(task)
        if t is not None and t.leases:
            n, fence = data.draw(st.sampled_from(t.leases), label="old lease")
        else:  # never a fence above the current one (that proves Redis lost state)
            n, fence = 1, t.fence if t is not None else 1
        if op == "renew":
            self._op_renew(task, n, fence, LONG_MS, "zombie")
        elif op == "complete":
            self._op_complete(task, n, fence, variant + 1, "zombie")
        else:
            self._op_fail(task, n, fence, variant, "zombie")

    @rule(data=st.data(), op=st.sampled_from(["renew", "complete", "fail"]), variant=st.integers(0, 1))
    def fenced_sweep(self, data: st.DataObject, op: str, variant: int) -> None:
        """Every (attempt, fence) pair a worker of this task could hold writes once, oldest first."""
        task = self._pick_task(data, lambda t: len(t.leases) > 0)
        t = self.model.get(task)
        for n, fence in sorted(set(t.fenced_candidates())) if t is not None else [(1, 1)]:
            if op == "renew":
                self._op_renew(task, n, fence, LONG_MS, "sweep")
            elif op == "complete":
                self._op_complete(task, n, fence, variant + 1, "sweep")
            else:
                self._op_fail(task, n, fence, variant, "sweep")

    @rule()
    def expire_leases(self) -> None:
        self._op_expire_leases()

    @rule(data=st.data())
    def reconcile_attempt(self, data: st.DataObject) -> None:
        task = self._pick_task(data, lambda t: t.latest.state == "suspect")
        t = self.model.get(task)
        n = data.draw(st.integers(1, len(t.attempts) + 1), label="attempt") if t else 1
        if t and t.latest.state == "suspect" and data.draw(st.booleans(), label="the suspect one"):
            n = t.latest.n
        self._op_reconcile(task, n)

    @rule(data=st.data(), reason=st.sampled_from(VALID_REASONS + INVALID_REASONS),
          delay_ms=st.sampled_from([0, SHORT_MS, LONG_MS]), req=st.none() | st.sampled_from(["x1", "x2"]))
    def retry_task(self, data: st.DataObject, reason: str, delay_ms: int, req: str | None) -> None:
        task = self._pick_task(data, lambda t: t.latest.state == "failed")
        self._op_retry(task, reason, delay_ms, req)

    @rule(data=st.data(), worker=st.sampled_from(WORKERS), variant=st.integers(0, 1),
          outcome=st.sampled_from(["complete", "fail", "renew_complete", "fail_retry", "resend_claim", "late_write",
                                   "abandon", "short_heartbeat"]),
          reason=st.sampled_from(VALID_REASONS + INVALID_REASONS), delay_ms=st.sampled_from([0, SHORT_MS, LONG_MS]))
    def worker_cycle(self, data: st.DataObject, worker: str, variant: int, outcome: str, reason: str,
                     delay_ms: int) -> None:
        """A worker claims a claimable task and takes it through to an outcome in one step, so that
        short runs still go through whole lifecycles: complete or fail it (the operator then decides
        on a retry), resend its claim first, write after its 1 ms lease ran out, abandon it, or
        shorten its lease to 1 ms with a last heartbeat and vanish (the sweeper runs next).
        When nothing is claimable a producer enqueues a task first."""
        if not any(_claimable(t) for t in self.model.values()):  # a producer adds work first
            self._op_enqueue(QUEUES[variant], HANDLERS[0], variant, None, None)
        task = self._pick_task(data, _claimable)
        lease_ms = SHORT_MS if outcome in ("late_write", "abandon") else LONG_MS
        request_id = f"{worker}-claim-{variant}" if outcome == "resend_claim" else None
        if not self._op_claim(task, worker, lease_ms, request_id):
            return
        n, fence = self.model[task].leases[-1]
        if outcome == "resend_claim":  # the reply was lost: the same request id gets the same lease
            self._op_claim(task, worker, lease_ms, request_id)
        if outcome == "renew_complete":
            self._op_renew(task, n, fence, None, worker)
        if outcome == "short_heartbeat":
            self._op_renew(task, n, fence, SHORT_MS, worker)
            self._op_expire_leases()
        if outcome in ("complete", "renew_complete", "resend_claim", "late_write"):
            self._op_complete(task, n, fence, variant + 1, worker)
        elif outcome in ("fail", "fail_retry"):
            self._op_fail(task, n, fence, variant, worker)
        if outcome == "resend_claim":  # a late resend of the claim once the attempt has ended
            self._op_claim(task, worker, lease_ms, request_id)
        if outcome == "fail_retry":
            self._op_retry(task, reason, delay_ms, None)
            # The worker resends its failure (a replay, even after the retry), then writes once more
            # with its fence, which is still the task's fence but no longer names the latest attempt.
            self._op_fail(task, n, fence, variant, worker)
            self._op_complete(task, n, fence, variant + 1, worker)

    @rule(data=st.data(), zombie=st.booleans(), reason=st.sampled_from(VALID_REASONS),
          delay_ms=st.sampled_from([0, SHORT_MS, LONG_MS]))
    def operator_cycle(self, data: st.DataObject, zombie: bool, reason: str, delay_ms: int) -> None:
        """A worker vanishes (when no lease has run out yet, one claims with a 1 ms lease and is
        never heard of again), the sweeper runs, the reconciler settles one suspect attempt, the
        worker that lost the lease may still write late with its old fence (renew, complete, fail),
        and the operator retries the task."""
        if not any(t.latest.state == "suspect" or (_running(t) and t.latest.expired) for t in self.model.values()):
            claimable = sorted(tid for tid, t in self.model.items() if _claimable(t))
            if claimable:
                self._op_claim(data.draw(st.sampled_from(claimable), label="vanishing worker's task"), "w-gone",
                               SHORT_MS, None)
        self._op_expire_leases()
        task = self._pick_task(data, lambda t: t.latest.state == "suspect")
        t = self.model.get(task)
        if t is None or t.latest.state != "suspect":
            return
        a = t.latest
        self._op_reconcile(task, a.n)
        assert a.fence is not None and a.worker is not None
        if zombie:
            self._op_renew(task, a.n, a.fence, LONG_MS, a.worker)
            self._op_complete(task, a.n, a.fence, 1, a.worker)
            self._op_fail(task, a.n, a.fence, 0, a.worker)
        self._op_retry(task, reason, delay_ms, None)

    @rule(data=st.data(), kind=st.sampled_from(["claim_lease", "claim_worker", "renew_lease", "retry_delay",
                                                "enqueue_payload"]))
    def invalid_argument(self, data: st.DataObject, kind: str) -> None:
        """Bad input is refused before anything is written (no event, no state change)."""
        task = self._pick_task(data, lambda t: True)
        calls: dict[str, Callable[[], Any]] = {
            "claim_lease": lambda: self.q.claim_attempt(task, "w1", 0),
            "claim_worker": lambda: self.q.claim_attempt(task, "", LONG_MS),
            "renew_lease": lambda: self.q.renew_lease(f"{task}/1", 0, lease_ms=0),
            "retry_delay": lambda: self.q.retry_task(task, VALID_REASONS[0], delay_ms=-1),
            "enqueue_payload": lambda: self.q.enqueue(QUEUES[0], HANDLERS[0], ["not", "a", "dict"]),
        }
        _, exc = self._call(calls[kind])
        self._expect(f"invalid_argument({kind})", InvalidArgument, exc)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def matches_model(self) -> None:
        assert self.q.namespace().state == "ok", "the namespace must never be marked lost"
        counts: dict[str, Counter[str]] = {}
        for tid, t in self.model.items():
            counts.setdefault(t.queue, Counter())[t.state] += 1
            self._check_task(t, self.q.get_task(tid))
        status = self.q.status()
        for queue in set(status) | set(counts):
            got = status.get(queue, {}).get("counts", {})
            want = dict(+counts.get(queue, Counter()))
            assert got == want, f"status() counts of {queue}: {got}, model {want}"

    def _check_task(self, t: ModelTask, real: Task) -> None:
        tid = t.id
        # Attempts are numbered 1..N; N > 1 names N - 1 as previous and records a reason.
        numbers = [a.number for a in real.attempts]
        assert numbers == list(range(1, len(numbers) + 1)), f"{tid}: attempt numbers {numbers}"
        assert real.attempt_count == len(numbers), f"{tid}: attempt_count {real.attempt_count}, {len(numbers)} kept"
        for a in real.attempts[1:]:
            assert a.previous == f"{tid}/{a.number - 1}", f"{a.id}: previous is {a.previous}"
            assert a.reason is not None and len(a.reason) >= 10, f"{a.id}: reason {a.reason!r}"
        # At most one non-terminal attempt, and it is the latest.
        live = [a.number for a in real.attempts if not a.terminal]
        assert live in ([], [len(numbers)]), f"{tid}: non-terminal attempts {live} of {len(numbers)}"
        # A terminal attempt never changes.
        for a in real.attempts:
            if a.terminal:
                snap = self.terminal_snapshots.setdefault((tid, a.number), a.model_dump())
                assert a.model_dump() == snap, f"{a.id} changed after it was terminal"
        # The fence never goes down.
        assert real.fence >= self.last_fence.get(tid, 0), f"{tid}: fence went down to {real.fence}"
        self.last_fence[tid] = real.fence
        # Task and attempts as the model says.
        got_task = (real.state.value, real.fence, real.queue, real.handler, len(real.attempts))
        want_task = (t.state, t.fence, t.queue, t.handler, len(t.attempts))
        assert got_task == want_task, f"{tid}: (state, fence, queue, handler, attempts) {got_task}, model {want_task}"
        active = t.latest.n if t.latest.state not in TERMINAL else None
        assert real.active_attempt == active, f"{tid}: active attempt {real.active_attempt}, model {active}"
        for ra, ma in zip(real.attempts, t.attempts, strict=True):
            got = (ra.state.value, ra.fence, ra.worker_id, ra.settled_by, ra.reason)
            want = (ma.state, ma.fence, ma.worker, ma.settled_by, ma.reason)
            assert got == want, f"{ra.id}: (state, fence, worker, settled_by, reason) {got}, model {want}"
            if ma.result is not None:
                assert ra.result == _result(ma.result), f"{ra.id}: result {ra.result}"
            if ma.failure is not None:
                assert ra.failure == FAILURES[ma.failure], f"{ra.id}: failure {ra.failure}"
        # Events: one stale_write_refused per refused fenced write; one attempt_claimed per claim that
        # handed out a lease, with increasing fences; every other type as the model counts it.
        seen = Counter(e.type for e in real.events)
        assert seen["stale_write_refused"] == t.events["stale_write_refused"], (
            f"{tid}: {seen['stale_write_refused']} stale_write_refused events for "
            f"{t.events['stale_write_refused']} refused fenced writes")
        assert seen["attempt_claimed"] == self.claims_ok[tid], (
            f"{tid}: {seen['attempt_claimed']} attempt_claimed events for {self.claims_ok[tid]} claims")
        claimed = [int(e.fields["fence"]) for e in real.events if e.type == "attempt_claimed"]
        assert claimed == sorted(set(claimed)), f"{tid}: attempt_claimed fences {claimed}"
        assert +seen == +t.events, f"{tid}: events {dict(+seen)}, model {dict(+t.events)}"


# --------------------------------------------------------------------------------------------- test


@pytest.fixture(scope="module")
def stateful_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of this module (no AOF: durability is not under test here, speed is)."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis-stateful")), appendonly=False)
    with server:
        yield server


def test_queue_matches_model(stateful_redis: RedisServer) -> None:
    machine = type("QueueMachineRun", (QueueMachine,), {"url": stateful_redis.url})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )

"""Stateful property test: the real Client on a real redis-server against a pure-Python model.

The model (``Model*`` below) is written from the Lua headers, ``lua/includes/common.lua`` and the
state table in ``mc_queue/contracts/states.py``: for every call it predicts success or the exact exception
class, the resulting task state, attempt states, fences (exactly: the next fence is
``max(current + 1, namespace floor + 1)``), effects, indexes and events. It covers enqueue (with
idempotency keys, named task ids and the tombstones of purged tasks), claim, renew/heartbeat,
checkpoint, effect_begin/effect_done, complete, fail with and without a policy decision (retry now,
retry after a delay, stop with an attention item, quarantine, malformed decisions), expire_leases,
forced voids (``void_leases``) and the sweeper's voiding of unacknowledged cancels
(``due_cancels``), reconciliation (``reconcile_attempt``: canceled, succeeded from a
``result_pending`` checkpoint, blocked on an unknown effect, failed and waiting, or the task's
frozen RetryPolicy/Budget deciding with ``apply_policy=True``; a late direct settlement),
retry_task, cancel_task, acknowledge_cancel, dlq_replay, dlq_purge, dependencies (``enqueue(after=...)``
in both modes, with parents in any state, gone or named twice, and the sweeper's ``release_due``: the
released index holds exactly the parents whose end is not released yet), and recovery: ``recover()`` on a
healthy namespace, the same by its steps (claims refused while recovering, recover_finish refused
while a lease is left), and ``recover()`` after a loss signal (the namespace meta vanishes: the next
write marks the namespace lost and claims are refused until the recovery).

After every step the real records are read back and compared with the model, and these hold:

* at most one non-terminal Attempt per task, and it is the latest;
* a terminal Attempt never changes again (snapshots are kept);
* the task fence never decreases; claim never hands out the same (task, fence) twice;
* the task's lease key exists exactly while its latest attempt runs on a live lease;
* Attempts are numbered 1..N, Attempt N > 1 names N - 1 as previous and has a reason >= 10 chars;
* every refused fenced write adds exactly one ``stale_write_refused`` event, with the refusal the
  model predicts (stale_fence, attempt_<state>, lease_expired, cancel_requested), and nothing else
  adds one; every other event type (task streams and the namespace log) is counted as the model says;
* ``status()`` counts, the lease / suspect / cancels / outbox / pending / released indexes, the DLQ and
  the attention items equal the model's; each task's after, after_left and dependents too;
* every state change a script makes is an edge of ``mc_queue.contracts.states.TRANSITIONS``
  (``TransitionRecorder`` on both clients);
* a purged task is gone (``TaskNotFound``) and leaves a tombstone.

Two clients share the namespace: ``q`` (producer, workers, operator, reconciler) and ``sw`` (the
sweeper: expire_leases, due_cancels, void_leases).

Time: a lease is either long (60 s, never runs out during a run) or 1 ms followed by a short
sleep so that Redis's clock has certainly passed it; the same holds for retry delays and tombstone
windows. The retry policies frozen into tasks use a backoff below 1 ms, so a policy's retry is due
at once; nothing else depends on wall-clock time.

Not covered: cost and token charges, the sweeper's re-dispatch (dispatch_walk, mark_dispatched), index_drop, and
the state-loss signals other than a vanished meta (a fence ahead with its claim record, a claim
sequence gone backwards, an epoch Redis never issued, a restart of redis-server).

Code bugs this test found (fixed since; the model checks the documented contract, so each would
fail it again, see p72, m70 and m71 below):

* BUG-1: ``dlq_purge`` deleted the task's fence counter, so a task id enqueued again after its
  purge (``keep_key_s=0``, or once the tombstone window passed) handed out fence 1, 2, ... again: a
  zombie of the purged incarnation could complete the new one. (Fixed first by keeping the counter;
  since issue 15 the purge raises the namespace fence floor to the task's last fence instead, as
  retention does, and deletes the counter: no key is left behind without a TTL.)
* BUG-2: ``Maintenance.expire()`` (expire_leases, void_leases) presented its cached epoch without the
  reload-and-resend ``_with_epoch`` gives the other calls, so a client (a running sweeper) connected
  before a recovery elsewhere silently expired and voided nothing afterwards (E_EPOCH landed in
  ``ExpireReport.errors``).
* BUG-3 (minor): canceling a blocked task left its attention item open for good (only retry,
  replay and purge resolved one, all refused for a canceled task).

Faults this test was shown to catch
-----------------------------------
Each mutant is one change in a copy of ``lua/`` (p72: of ``mc_queue/client/core.py``), run by the driver
``/tmp/mutants/run.py``: it loads the copy (``mc_queue.store.scripts._SPECS = load_specs(copy)``) before
any client exists, then runs this machine with the settings below (shrinking off) on 3 seeds;
"caught k/3" means k of the 3 runs failed. 69 of 72 were caught in every run, 1 in 2 of 3,
and the 2 missed ones are equivalent mutants (no call through the Client can tell them apart).
The copies were made from one moment of ``lua/`` and ``mc_queue/`` (both kept changing meanwhile);
the driver is a scratch script, not part of the repository. Mutants on rare paths vary between
runs: earlier rounds on slightly different versions of this test saw 2/3 for m10, m14, m28, m41,
m48, m53 and m68. A second rerun of the same mutants ported to the ``lua/`` of commit 709f3de
(includes split into common/fenced/decisions, the three fixes in; this test as of that commit's
time) caught 63 in 3/3 runs, 6 in 2/3 (m31, m48, m53, m68, m70, m71), and missed the same two.

* m01 complete: no fence check: caught 3/3
* m02 expire: the fence is not bumped: caught 3/3
* m03 retry: accepts a quarantined task: caught 3/3
* m04 dlq_purge: leaves no tombstone: caught 3/3
* m05 cancel_ack: acknowledges without a cancel request: caught 3/3
* m06 reconcile_settle: forgets ZREM of the suspect index: caught 3/3
* m07 fence_check: ignores a cancel request (complete/fail/checkpoint/effect go on): caught 3/3
* m08 cancel: no cancels index entry (the sweeper never voids): caught 3/3 (2/3 before the index check inside
  cancel_cycle)
* m09 cancel: the pending attempt is not canceled: caught 3/3
* m10 claim: claims an attempt that is not due: caught 3/3
* m11 apply_decision: quarantine without a DLQ entry: caught 3/3
* m12 dlq_replay: replays a task in any state but running: caught 3/3
* m13 dlq_replay: keeps the DLQ entry: caught 3/3
* m14 dlq_purge: frees the producer key at once whatever the window: caught 3/3
* m15 enqueue: ignores the task id's tombstone: caught 3/3
* m16 renew: never reports a cancel request: caught 3/3
* m17 cancel_ack: the fence is not bumped: caught 3/3
* m18 expire: force=1 does not void a live lease: caught 3/3
* m19 recover_begin: the fence floor is not raised: caught 3/3
* m20 checkpoint: the same phase index again is accepted (< for <=): caught 3/3
* m21 effect_begin: ignores a cancel request: caught 3/3
* m22 effect_done: a refused receipt leaves no late_receipt: caught 3/3
* m23 cancel: cancels a succeeded task: caught 3/3
* m24 reconcile_settle: canceled without moving the status count: caught 3/3
* m25 next_fence: ignores the namespace floor: caught 3/3
* m26 fail: no decision check (retry without reason, stop without attention applied): caught 3/3
* m27 cancel: a second request signals again: caught 3/3
* m28 retry: keeps the attention item: caught 3/3
* m29 claim: keeps the outbox entry: caught 3/3
* m30 apply_decision: a retry due now leaves the task in backoff: caught 3/3
* m31 enqueue: a purged producer key is never free again: caught 2/3
* m32 cancel_ack: a request id replays whatever fence is presented: caught 3/3
* m33 reconcile_begin: takes a running attempt: caught 3/3
* m34 fence_check: no lease check: caught 3/3
* m35 fence_check: a cancel refusal recorded as cancel_refused: caught 3/3
* m36 expire: keeps the cancels index entry: caught 3/3
* m37 fail: a resend with another failure is a replay: caught 3/3
* m38 dlq_purge: purges any task but a running one: caught 3/3
* m39 apply_decision: stop raises no attention item: caught 3/3
* m40 reconcile_settle: succeeded leaves the active attempt set: caught 3/3
* m41 claim: a resent request id returns the lease whatever the attempt's state: caught 3/3
* m42 dlq_purge: any request id replays a purge: caught 3/3
* m43 expire: force=0 voids a live lease too: missed 0/3 (equivalent through the Client: due_leases hands expire only
  entries whose lease ran out)
* m44 dlq_replay: no request-id replay (a resend creates another attempt): caught 3/3
* m45 cancel: keeps the pending index entry: caught 3/3
* m46 recover_finish: finishes with leases left: caught 3/3
* m47 reconcile_begin: its refusal goes to the namespace log: caught 3/3
* m48 retry: the new attempt is due at once whatever the delay: caught 3/3
* m49 dlq_purge: keeps the effects: caught 3/3
* m50 cancel_ack: keeps the lease key: caught 3/3
* m51 renew: no PEXPIREAT: caught 3/3
* m52 cancel: a suspect attempt enters the cancels index: caught 3/3
* m53 dlq_purge: keep_key_s=0 leaves the producer key: caught 3/3
* m54 claim: ignores the lease length asked for: caught 3/3
* m55 apply_decision: a retry without outbox entry: caught 3/3
* m56 cancel_ack: does not record the fence it moved to: caught 3/3
* m57 checkpoint: a replay whatever the fence: caught 3/3
* m58 effect_begin: the own-intent check ignores the fence: missed 0/3 (equivalent: a running attempt's fence is its
  claim fence, so once fence_check passed the intent's fence is the presented one)
* m59 complete: the replay check also takes a reconciled success: caught 3/3
* m60 complete: keeps the lease key: caught 3/3
* m61 effect_done: the worker's receipt skips the fence check: caught 3/3
* m62 reconcile_settle: canceled leaves the task failed: caught 3/3
* m63 mark_lost: no state_loss_detected event: caught 3/3
* m64 recover_begin: does not hold the namespace (state ok): caught 3/3
* m65 ns_check: a lost namespace is usable: caught 3/3
* m66 expire: a forced void keeps the lease index entry: caught 3/3
* m67 DECISIONS: stop leaves the task failed: caught 3/3
* m68 cancel: refuses to cancel a failed task: caught 3/3
* m69 enqueue: a task-id conflict recorded in the namespace log: caught 3/3
* m70 dlq_purge: deletes the fence counter again (BUG-1): caught 3/3 (before issue 15; the purge now
  deletes it and raises the namespace floor instead, which the model expects)
* m71 cancel: leaves the attention item again (BUG-3): caught 3/3
* p72 Client.expire (Python): no epoch reload after a recovery elsewhere (BUG-2): caught 3/3
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import mc_queue
from mc_queue import Backoff, Budget, Decision, FailureClass, RetryPolicy, reconcile_attempt, recover
from mc_queue.client.producer import NewTask
from mc_queue.contracts.errors import (
    AttemptNotRunning,
    CancelRequested,
    ClaimRejected,
    EffectNotBegun,
    IdempotencyConflict,
    InvalidArgument,
    LeaseExpired,
    McqError,
    NamespaceLost,
    OverLimit,
    PhaseOutOfOrder,
    ResultConflict,
    RetryRefused,
    StaleFence,
    TaskNotFound,
    TaskPurged,
    TransitionRefused,
)
from mc_queue.contracts.failures import make_failure
from mc_queue.contracts.keys import new_task_id
from mc_queue.contracts.models import Task
from mc_queue.testing import RedisServer, TransitionRecorder, unique_prefix

QUEUES = ("qa", "qb")
HANDLERS = ("h1", "h2")
WORKERS = ("w1", "w2", "w3")
LONG_MS = 60_000  # never runs out within one run
SHORT_MS = 1  # has run out once _let_clock_pass() returns
LIMIT_KEY, LIMIT_UNITS = "api", 1  # the rate limit some tasks name: 1 unit an hour
SLOT_KEY = "tenant:a"  # the concurrency key the first queue's tasks name (its family has room for all)
REACHED: Counter[str] = Counter()  # outcomes the runs reached (the test checks the rare ones were)
FAILURES = (
    make_failure("provider", "Timeout", "the provider timed out"),
    make_failure("validation", "TestsFailed", "3 tests failed"),
)
# Reasons count characters after trimming: the third invalid one is >= 10 characters untrimmed, the
# last >= 10 bytes of UTF-8 but 9 characters; "réessayer!" is 10 characters.
VALID_REASONS = ("provider timed out, retry", "0123456789", "  padded-but-long-enough  ", "réessayer!")
INVALID_REASONS = ("", "too short", "   short    \t", "ééééé ééé")
LUA_SPACE = " \t\n\r\f\v"  # Lua's %s in the C locale (the scripts trim reasons with it)
TERMINAL = frozenset({"succeeded", "failed", "canceled"})
ENDED = frozenset({"succeeded", "failed", "blocked", "quarantined", "canceled"})  # a task's (common.lua HELD, DONE)
OPEN_STATES = frozenset({"scheduled", "waiting", "pending", "running", "backoff"})  # common.lua OPEN
GHOST = new_task_id(QUEUES[0])  # a task id no run has enqueued (until enqueue_with_task_id names it)

# The retry policy and budget frozen into a task follow from its (handler, payload); the backoff is
# below a millisecond, so a policy's retry decision is always "a new Attempt due now".
FAST = Backoff(base_s=0.0001, max_s=0.0001)
CONFIGS: dict[str, tuple[RetryPolicy, Budget]] = {
    "retry": (RetryPolicy(backoff=FAST), Budget()),
    "poison2": (RetryPolicy(backoff=FAST), Budget(max_same_fingerprint=2)),
    "attempts2": (RetryPolicy(backoff=FAST), Budget(max_attempts=2)),
    "stop": (RetryPolicy(backoff=FAST, actions={FailureClass.EXECUTOR: "stop"}), Budget()),
    "quarantine": (RetryPolicy(backoff=FAST, actions={FailureClass.EXECUTOR: "quarantine"}), Budget()),
}
CONFIG_OF = {("h1", 0): "retry", ("h1", 1): "poison2", ("h1", 2): "quarantine",
             ("h2", 0): "attempts2", ("h2", 1): "stop", ("h2", 2): "retry"}

# Decisions a worker's fail() may carry. The two bad ones are refused as bad input (nothing written).
NEXT_REASON = "  policy: the provider timed out, try again  "
DECISIONS: dict[str, Decision | None] = {
    "none": None,
    "retry_now": Decision("retry", "transient failure", 0.0, next_reason=NEXT_REASON, next_hypothesis="same"),
    "retry_1ms": Decision("retry", "transient failure", 0.001, next_reason=NEXT_REASON),
    "retry_later": Decision("retry", "transient failure", 60.0, next_reason=NEXT_REASON),
    "stop": Decision("stop", "a person must look", attention={"kind": "stop", "why": "test"}),
    "quarantine": Decision("quarantine", "poison", attention={"kind": "quarantine", "why": "test"}),
    "bad_retry": Decision("retry", "no reason given", 0.0, next_reason="too short"),
    "bad_stop": Decision("stop", "no attention item"),
}
BAD_DECISIONS = frozenset({"bad_retry", "bad_stop"})
PHASES = (("prepared", 1), ("result_pending", 2))  # checkpoint phases in their declared order
EFFECT_KEYS = ("a", "b")
RECONCILED_EFFECT = {"found": "done", "absent": "absent", "unknown": "unknown"}  # provider answer -> record
PURGE_KEEP_S = (0, 0.001, 3600.0)  # frees the id and key at once | a 1 ms window (then passed) | refused


def _let_clock_pass() -> None:
    """Let Redis's millisecond clock pass a 1 ms lease (or a 1 ms delay or tombstone window)."""
    time.sleep(0.004)


# --------------------------------------------------------------------------------------------- model


@dataclass
class ModelAttempt:
    n: int
    reason: str | None  # None: written by the retry policy (only its length is checked)
    state: str = "pending"
    fence: int | None = None
    worker: str | None = None
    claim_req: str | None = None  # request id of the claim that took it (None: the client's uuid)
    create_req: str | None = None  # request id of the retry or replay that created it
    lease_ms: int | None = None  # length granted at claim (what renew without lease_ms uses)
    expired: bool = False  # the lease has passed on Redis's clock
    due: bool = True  # due_at has passed
    result: int | None = None  # result variant (complete, or reconciliation from result_pending)
    completed: bool = False  # complete recorded it (with a result digest): a resend is a replay
    failure: int | None = None  # variant recorded by fail (None when settled by reconciliation)
    lost: bool = False  # reconciliation recorded an executor LeaseLost failure
    fp: str | None = None  # label of the failure's fingerprint (what the budget counts repeats of)
    settled_by: str | None = None
    phase: str | None = None
    phase_index: int = -1
    ckpts: dict[str, int] = field(default_factory=dict)  # phase -> record variant
    ack_req: str | None = None  # request id of the cancel acknowledgement
    ack_fence: int | None = None  # the fence that acknowledgement moved to


@dataclass
class ModelEffect:
    state: str  # intent | done | absent | unknown
    attempt: int
    fence: int
    receipt: int | None = None
    receipt_attempt: int | None = None

    @property
    def by_attempt(self) -> int:
        return self.receipt_attempt or self.attempt


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
    refusals: Counter[str] = field(default_factory=Counter)  # stale_write_refused by refusal
    leases: list[tuple[int, int]] = field(default_factory=list)  # (n, fence) handed out by claim
    cancel: str | None = None  # the recorded cancel reason
    cancel_due: bool = False  # the running attempt's acknowledgement deadline has passed
    attention: bool = False
    effects: dict[str, ModelEffect] = field(default_factory=dict)
    after: list[str] = field(default_factory=list)  # enqueue_after's parents ...
    mode: str | None = None  # ... 'succeeded' | 'ended'
    after_left: list[str] = field(default_factory=list)  # the parents not counted yet
    dependents: list[str] = field(default_factory=list)  # the tasks that waited or wait for it
    owed: bool = False  # in the released index: it ended with dependents, release.lua has not run since
    released: bool = False  # release.lua ran since its last dependent was added ('released_at')
    limited: bool = False  # it names the rate limit LIMIT_KEY (cost 1): each claim takes a unit

    def __setattr__(self, name: str, value: Any) -> None:
        # Every move into an ended state of a task with dependents puts it in the released index
        # (common.lua index_end), however many moves one step makes.
        if name == "state" and value in ENDED and value != getattr(self, "state", None) \
                and getattr(self, "dependents", None):
            object.__setattr__(self, "owed", True)
        object.__setattr__(self, name, value)

    @property
    def latest(self) -> ModelAttempt:
        return self.attempts[-1]

    @property
    def config(self) -> str:
        return CONFIG_OF[(self.handler, self.payload)]

    def fenced_candidates(self) -> list[tuple[int, int]]:
        """(attempt, fence) pairs a worker could present: the current fence with the latest attempt
        (three times, so it is drawn most often), every lease claim handed out, and old fences with
        the latest attempt. Never a fence above the current one: that proves Redis lost state."""
        latest = len(self.attempts)
        pairs = set(self.leases)
        pairs.update((latest, f) for _, f in self.leases)
        return [(latest, self.fence)] * 3 + sorted(pairs)


@dataclass
class IdemEntry:
    """A producer key as enqueue.lua keeps it: the task and signature, or purged."""

    task: str
    queue: str
    handler: str
    payload: int
    purged: str | None = None  # None | "refused" (window open) | "passed" (window over: the key is free)


@dataclass
class Purged:
    """A purged task's tombstone."""

    request_id: str | None
    attempts: int
    refused: bool  # enqueue refuses the id until the window passes
    fence: int  # the fence counter the task had


def _limits(queue: str) -> dict[str, int]:
    """The second queue's tasks name the rate limit, the first one's a concurrency key (a property of the
    queue, not a draw: which task a rule picks among those of a queue then does not decide what its claim
    does)."""
    return {LIMIT_KEY: 1} if queue == QUEUES[1] else {SLOT_KEY: 1}


def _fair(queue: str) -> str | None:
    """The first queue's tasks name the concurrency key as their fairness key too (its counter of tasks not
    ended must follow every transition: matches_model)."""
    return SLOT_KEY if queue == QUEUES[0] else None


def _running(t: ModelTask) -> bool:
    return t.latest.state == "running"


def _claimable(t: ModelTask) -> bool:
    return t.state in ("pending", "backoff", "scheduled") and t.latest.state == "pending" and t.latest.due


def _payload(variant: int) -> dict[str, Any]:
    return {"v": variant, "text": f"payload {variant}"}


def _result(variant: int) -> dict[str, Any]:
    return {"ok": variant}


def _receipt(variant: int) -> dict[str, Any]:
    return {"pr": variant}


def _ckpt(phase: str, variant: int) -> dict[str, Any]:
    data = {"result": _result(variant)} if phase == "result_pending" else {"step": variant}
    return {"phase": phase, "data": data}


def _effect_key(task: str, x: str) -> str:
    return f"push:{task}:{x}"


# --------------------------------------------------------------------------------------------- machine


class QueueMachine(RuleBasedStateMachine):
    """Drives one fresh namespace per run. ``url`` is set by the test before the machine runs."""

    url = ""

    def __init__(self) -> None:
        super().__init__()
        prefix = unique_prefix("stateful")
        self.q = mc_queue.Client(self.url, prefix=prefix, actor="stateful-test")
        self.sw = mc_queue.Client(self.url, prefix=prefix, actor="sweeper")
        self.recorders = [TransitionRecorder(self.q), TransitionRecorder(self.sw)]
        self.model: dict[str, ModelTask] = {}
        self.idem: dict[str, IdemEntry] = {}
        self.purged: dict[str, Purged] = {}  # task id -> its last purge's tombstone
        self.nslog: Counter[str] = Counter({"namespace_created": 1})  # the first step creates it
        self.floor = 0  # the namespace's fence floor (raised by recover)
        self.counter = 0
        self.provider: str = "absent"  # what the provider answers the reconciler (found|absent|unknown)
        self.handed_out: set[tuple[str, int]] = set()  # (task, fence) handed out by claim
        self.claims_ok: Counter[str] = Counter()  # per task: claims that handed out a new lease
        self.terminal_snapshots: dict[tuple[str, int], dict[str, Any]] = {}
        self.last_fence: dict[str, int] = {}
        self.owed_gone: set[str] = set()  # purged tasks the released index still names
        # A rate limit of LIMIT_UNITS an hour: within a run, units taken never return, so a claim of a
        # limited task is admitted while units are left and deferred (no lease, not due) after.
        self.q.limits.set(LIMIT_KEY, LIMIT_UNITS, per_s=3600, reason="the stateful test's limit")
        self.nslog["limit_set"] += 1
        self.units_used = 0
        # Slots for every running Attempt a run can have: none is ever parked, and each slot must follow its
        # Attempt through every way it stops running (matches_model compares the holders with the model).
        self.q.slots.set("tenant:*", 1000, reason="the stateful test's concurrency keys")
        self.nslog["slots_set"] += 1
        # A spend ceiling no run reaches: each running Attempt of the key holds a reservation, replaced as it
        # stops running by whatever way it stops (matches_model compares the reservations with the model).
        self.q.spend.set("tenant:*", cost=999_999, tokens=10**12, per_s=3600, reason="the stateful test's ceiling")
        self.nslog["spend_set"] += 1

    def teardown(self) -> None:
        for r in self.recorders:
            r.close()
        self.q.close()
        self.sw.close()

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
        sometimes a task id nobody enqueued or a purged one."""
        roll = data.draw(st.integers(0, 9), label="task choice")
        # (in the order the run made them, not by id: ids made in one millisecond sort either way, and a
        # draw must pick the same task when a run is replayed)
        good = [tid for tid, t in self.model.items() if prefer(t)]
        if roll == 9 or not self.model:
            gone = [GHOST, *(tid for tid in self.purged if tid not in self.model)]
            return data.draw(st.sampled_from(gone), label="absent task")
        pool = good if roll < 7 and good else list(self.model)
        return data.draw(st.sampled_from(pool), label="task")

    def _pick_fenced(self, data: st.DataObject, task: str) -> tuple[int, int]:
        t = self.model.get(task)
        candidates = t.fenced_candidates() if t is not None else [(1, 0), (1, 1)]
        return data.draw(st.sampled_from(candidates), label="attempt, fence")

    def _next_fence(self, t: ModelTask) -> int:
        """common.lua next_fence: INCR of the task's counter, raised above the namespace floor."""
        return max(t.fence + 1, self.floor + 1)

    def _refusal(self, t: ModelTask, n: int, fence: int, check_cancel: bool) -> tuple[type[McqError], str] | None:
        """fenced.lua fence_check: a fence above the current one (at or below the namespace floor: an
        earlier incarnation's; above it: a caller's mistake, no claim record), a stale fence or not the
        latest attempt, then not running, then expired, then (writes that may not go on after a cancel
        request) a cancel request."""
        a = t.attempts[n - 1]
        if fence > t.fence:
            return StaleFence, "fence_retired" if fence <= self.floor else "fence_ahead"
        if fence != t.fence or n != len(t.attempts):
            return StaleFence, "stale_fence"
        if a.state != "running":
            return AttemptNotRunning, f"attempt_{a.state}"
        if a.expired:
            return LeaseExpired, "lease_expired"
        if check_cancel and t.cancel is not None:
            return CancelRequested, "cancel_requested"
        return None

    @staticmethod
    def _refused(t: ModelTask, refusal: tuple[type[McqError], str] | None) -> type[McqError] | None:
        """Record the stale_write_refused event a refusal leaves; the exception class to expect."""
        if refusal is None:
            return None
        t.events["stale_write_refused"] += 1
        t.refusals[refusal[1]] += 1
        return refusal[0]

    def _new_attempt(self, t: ModelTask, reason: str | None, *, due: bool = True,
                     create_req: str | None = None) -> ModelAttempt:
        m = ModelAttempt(len(t.attempts) + 1, reason, create_req=create_req, due=due)
        t.attempts.append(m)
        t.events["attempt_created"] += 1
        return m

    def _apply_decision(self, t: ModelTask, action: str, *, delay_ms: int = 0, reason: str | None = None) -> None:
        """common.lua apply_decision, after the attempt failed: wait | retry | stop | quarantine."""
        if action == "retry":
            self._new_attempt(t, reason, due=delay_ms != LONG_MS)
            t.state = "pending" if delay_ms == 0 else "backoff"
            if delay_ms == SHORT_MS:
                _let_clock_pass()
        elif action == "wait":
            t.state = "failed"
        else:
            t.state = "blocked" if action == "stop" else "quarantined"
            t.attention = True
            t.events["attention_raised"] += 1
            if action == "quarantine":
                t.events["task_quarantined"] += 1

    def _policy(self, t: ModelTask, a: ModelAttempt, label: str) -> str:
        """What the task's frozen RetryPolicy and Budget decide for an executor failure of ``a``
        (mc_queue.policy.classify.decide): the class's action, then the attempts budget, then repeats."""
        policy, budget = CONFIGS[t.config]
        action = policy.actions[FailureClass.EXECUTOR]
        if action in ("stop", "quarantine"):
            return action
        if a.n >= budget.max_attempts:
            return "stop"
        same = 1 + sum(1 for x in t.attempts[: a.n - 1] if x.fp == label)
        return "quarantine" if same >= budget.max_same_fingerprint else "retry"

    # ------------------------------------------------------------------ operations: predict, call, compare, apply

    def _predict_enqueue(self, queue: str, handler: str, payload: int, idem: str | None,
                         task_id: str | None) -> tuple[type[McqError] | None, str | None, Callable[[], None]]:
        """What enqueue.lua (admit.lua's enqueue_check) decides for one task: the error expected (None),
        the task a replay returns (None), and the audit a refusal records (applied by the caller)."""
        # the idempotency key first, then the task id, then the id's tombstone, else a new task.
        expected: type[McqError] | None = None
        existing: str | None = None
        audit: Callable[[], None] = lambda: None  # noqa: E731
        entry = self.idem.get(idem) if idem is not None else None
        if task_id is not None and not task_id.startswith(queue + ":"):
            expected = InvalidArgument  # the client: the id does not belong to the queue
        elif entry is not None and entry.purged == "refused":
            expected = TaskPurged
            audit = lambda: self.nslog.update(["enqueue_refused"])  # noqa: E731
        elif entry is not None and entry.purged is None:
            if (entry.payload, entry.handler, entry.queue) == (payload, handler, queue):
                existing = entry.task
            else:
                expected = IdempotencyConflict
                audit = lambda: self.nslog.update(["enqueue_refused"])  # noqa: E731
        if expected is None and existing is None and task_id is not None:
            if task_id in self.model:
                e = self.model[task_id]
                if (e.payload, e.handler) == (payload, handler):
                    existing = e.id
                else:
                    expected = IdempotencyConflict
                    audit = lambda: e.events.update(["enqueue_refused"])  # noqa: E731 (that task's history)
            elif task_id in self.purged and self.purged[task_id].refused:
                expected = TaskPurged
                audit = lambda: self.nslog.update(["enqueue_refused"])  # noqa: E731
        return expected, existing, audit

    def _op_enqueue(self, queue: str, handler: str, payload: int, idem: str | None,
                    task_id: str | None, delay_ms: int = 0) -> str | None:
        """Returns the id of the task enqueue returned (None when it refused)."""
        expected, existing, audit = self._predict_enqueue(queue, handler, payload, idem, task_id)
        if expected is not None:
            audit()
        policy, budget = CONFIGS[CONFIG_OF[(handler, payload)]]
        task, exc = self._call(self.q.producer.enqueue, queue, handler, _payload(payload), idem, task_id=task_id,
                               retry_policy=policy, budget=budget, delay_s=delay_ms / 1000 if delay_ms else None,
                               limits=_limits(queue), fair_key=_fair(queue))
        self._expect(f"enqueue({queue}, {handler}, payload={payload}, key={idem}, id={task_id})", expected, exc)
        if exc is not None:
            return None
        out = self._enqueued(task, existing, queue, handler, payload, idem, task_id, delay_ms)
        if existing is None and delay_ms == SHORT_MS:
            _let_clock_pass()
        return out

    def _enqueued(self, task: Any, existing: str | None, queue: str, handler: str, payload: int, idem: str | None,
                  task_id: str | None, delay_ms: int) -> str:
        """The model after an enqueue (or one item of a batch) that was not refused."""
        if existing is not None:
            assert task.id == existing, "a replay must return the task it first created"
            return existing
        assert task.id not in self.model, "a new enqueue must create a new task"
        assert task_id is None or task.id == task_id
        t = ModelTask(task.id, queue, handler, payload, idem, limited=LIMIT_KEY in _limits(queue))
        if task.id in self.purged:  # the id of a purged task, enqueued again after its window
            for key in [k for k in self.terminal_snapshots if k[0] == task.id]:
                del self.terminal_snapshots[key]
            self.claims_ok.pop(task.id, None)  # the purge deleted the old history
            self.last_fence.pop(task.id, None)  # a new incarnation: no fence issued yet (then above the floor)
            # BUG-1: the purge raised the namespace floor to the old incarnation's last fence, so the
            # new one's fences lie above every fence the old one issued (its counter starts again at 0).
            assert self.floor >= self.purged[task.id].fence
        t.attempts.append(ModelAttempt(1, "first dispatch", due=delay_ms != LONG_MS))
        t.state = "scheduled" if delay_ms else "pending"
        t.events.update(["task_created", "attempt_created"])
        self.model[task.id] = t
        if idem is not None:
            self.idem[idem] = IdemEntry(task.id, queue, handler, payload)
        return str(task.id)

    def _op_enqueue_many(self, items: list[tuple[str, str, int, str | None, str | None, int]]) -> None:
        """enqueue_many.lua: the client's checks of every item, then the script's (the same key or id twice),
        then each item's enqueue_check in order: the first refusal refuses the batch, its audit alone
        recorded, nothing written; else every item as enqueue would make it, all at once."""
        preds = [self._predict_enqueue(q, h, p, k, tid) for q, h, p, k, tid, _ in items]
        keys = [k for _, _, _, k, _, _ in items if k is not None]
        ids = [tid for _, _, _, _, tid, _ in items if tid is not None]
        expected: type[McqError] | None = None
        if any(e is InvalidArgument for e, _, _ in preds) or len(set(keys)) < len(keys) or len(set(ids)) < len(ids):
            expected = InvalidArgument  # (a bad id: the client's check; the same key or id twice: the script's)
        else:
            for e, _, audit in preds:
                if e is not None:
                    expected = e
                    audit()
                    break
        batch = []
        for q, h, p, k, tid, delay_ms in items:
            policy, budget = CONFIGS[CONFIG_OF[(h, p)]]
            batch.append(NewTask(q, h, _payload(p), k, task_id=tid, retry_policy=policy, budget=budget,
                                 delay_s=delay_ms / 1000 if delay_ms else None, limits=_limits(q),
                                 fair_key=_fair(q)))
        tasks, exc = self._call(self.q.producer.enqueue_many, batch)
        self._expect(f"enqueue_many({items})", expected, exc)
        if exc is not None:
            return
        for task, (q, h, p, k, tid, delay_ms), (_, existing, _) in zip(tasks, items, preds, strict=True):
            self._enqueued(task, existing, q, h, p, k, tid, delay_ms)
        if any(d == SHORT_MS for *_, d in items):
            _let_clock_pass()

    def _op_enqueue_after(self, queue: str, payload: int, parents: list[str], mode: str) -> None:
        """enqueue_after.lua for a new task (no key, no id): the client's checks (a parent named twice), then
        each parent in order: not in Redis (TaskNotFound); ended otherwise than succeeded in mode succeeded
        (TransitionRefused); nothing recorded for either. Else the task waits for the parents not ended."""
        expected: type[McqError] | None = None
        if len(set(parents)) < len(parents):
            expected = InvalidArgument
        else:
            for p in parents:
                pt = self.model.get(p)
                if pt is None:
                    expected = TaskNotFound
                    break
                if mode == "succeeded" and pt.state in ENDED and pt.state != "succeeded":
                    expected = TransitionRefused
                    break
        policy, budget = CONFIGS[CONFIG_OF[(HANDLERS[0], payload)]]
        task, exc = self._call(self.q.producer.enqueue, queue, HANDLERS[0], _payload(payload), retry_policy=policy,
                               budget=budget, after=parents, after_mode=mode, limits=_limits(queue),
                               fair_key=_fair(queue))
        self._expect(f"enqueue(after={parents}, after_mode={mode})", expected, exc)
        if exc is not None:
            return
        self._enqueued(task, None, queue, HANDLERS[0], payload, None, None, 0)
        t = self.model[task.id]
        t.after, t.mode = list(parents), mode
        t.after_left = [p for p in parents if self.model[p].state not in ENDED]
        for p in t.after_left:
            self.model[p].dependents.append(t.id)
            self.model[p].released = False
        if t.after_left:
            t.state = "waiting"

    def _op_release(self) -> None:
        """Dependencies.release_due (release.lua for each parent the released index holds, in its order: read
        from Redis, the set itself is the invariant's to check). A parent no longer ended owes nothing yet;
        for an ended one each waiting dependent that still counts it is canceled (mode succeeded, a parent
        that did not succeed), counts it (dependency_met), or, with none left, becomes pending."""
        order = [str(p) for p in self.sw.redis.zrange(self.sw.keys.released, 0, -1)]
        got, exc = self._call(self.sw.dependencies.release_due, limit=10_000)
        self._expect("release_due()", None, exc)
        assert got.errors == [], f"release_due errors: {got.errors}"
        released: list[str] = []
        canceled: list[str] = []
        for pid in order:
            self.owed_gone.discard(pid)
            p = self.model.get(pid)
            if p is None:  # purged after its release, then ended again: nothing left to release
                continue
            p.owed = False
            if p.state not in ENDED:
                continue
            p.released = True
            for did in p.dependents:
                d = self.model.get(did)
                if d is None or d.state != "waiting" or pid not in d.after_left:
                    continue
                d.after_left.remove(pid)
                if d.mode == "succeeded" and p.state != "succeeded":
                    d.state = "canceled"
                    d.latest.state, d.latest.settled_by = "canceled", "cancel"
                    d.events["task_canceled"] += 1
                    canceled.append(did)
                    continue
                d.events["dependency_met"] += 1
                if not d.after_left:
                    d.state = "pending"
                    released.append(did)
        assert (got.released, got.canceled) == (released, canceled), (
            f"release_due released {got.released}, canceled {got.canceled}; model {released}, {canceled}")

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
            elif not _claimable(t):
                expected = ClaimRejected
            elif t.limited and self.units_used >= LIMIT_UNITS:
                expected = OverLimit  # every unit of the hour is taken: deferred, nothing held
        lease, exc = self._call(self.q.leases.claim_attempt, task, worker, lease_ms, request_id=request_id)
        self._expect(f"claim({task}, {worker}, lease_ms={lease_ms}, request_id={request_id})", expected, exc)
        if t is None:
            return False
        if isinstance(exc, OverLimit):
            REACHED["over_limit"] += 1
            t.events["claim_limited"] += 1
            t.latest.due = False  # due when a unit returns: an hour from the first claim
            return False
        if exc is not None:
            t.events["claim_refused"] += 1
            return False
        if t.limited and not dup:
            self.units_used += 1
        a = t.latest
        assert (lease.number, lease.attempt_id) == (a.n, f"{task}/{a.n}")
        if dup:
            assert lease.fence == a.fence, f"a resent claim returned fence {lease.fence}, the lease has {a.fence}"
            return False
        want = self._next_fence(t)
        assert lease.fence == want, f"claim handed out fence {lease.fence}, model {want} (current {t.fence})"
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

    def _op_renew(self, task: str, n: int, fence: int, lease_ms: int | None, worker: str) -> None:
        # renew.lua: the namespace and fence checks come first (a cancel request does not stop a
        # renewal: it is how the executor hears of it); without lease_ms the length granted at claim.
        t = self.model.get(task)
        expected = TaskNotFound if t is None else self._refused(t, self._refusal(t, n, fence, False))
        hb, exc = self._call(self.q.leases.heartbeat, f"{task}/{n}", fence, worker_id=worker, lease_ms=lease_ms)
        self._expect(f"renew({task}/{n}, fence={fence}, lease_ms={lease_ms})", expected, exc)
        if t is None or exc is not None:
            return
        assert hb.cancel_requested == (t.cancel is not None), f"renew reports cancel_requested={hb.cancel_requested}"
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
            # A replay only of a success the worker recorded with this fence (a reconciled one has no digest).
            if a.state == "succeeded" and a.fence == fence and a.completed:
                replay = a.result == variant  # same fence, same result: a no-op success
                expected = None if replay else ResultConflict
            else:
                expected = self._refused(t, self._refusal(t, n, fence, True))
        att, exc = self._call(self.q.leases.complete_attempt, f"{task}/{n}", fence, _result(variant), worker_id=worker)
        self._expect(f"complete({task}/{n}, fence={fence}, result={variant})", expected, exc)
        if t is None:
            return
        if isinstance(exc, ResultConflict):
            t.events["completion_conflict"] += 1
        if exc is not None:
            return
        assert att.state == "succeeded" and att.result == _result(variant)
        if not replay:
            a = t.attempts[n - 1]
            a.state, a.result, a.completed = "succeeded", variant, True
            t.state = "succeeded"
            t.events["attempt_succeeded"] += 1

    def _op_fail(self, task: str, n: int, fence: int, variant: int, worker: str, decision: str = "none") -> None:
        t = self.model.get(task)
        expected: type[McqError] | None = None
        replay = False
        if decision in BAD_DECISIONS:
            expected = InvalidArgument  # fail.lua checks the decision before it reads anything
        elif t is None:
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
                expected = self._refused(t, self._refusal(t, n, fence, True))
        att, exc = self._call(self.q.leases.fail_attempt, f"{task}/{n}", fence, FAILURES[variant], worker_id=worker,
                              decision=DECISIONS[decision])
        self._expect(f"fail({task}/{n}, fence={fence}, failure={variant}, decision={decision})", expected, exc)
        if t is None or decision in BAD_DECISIONS:
            return
        if isinstance(exc, ResultConflict):
            t.events["failure_conflict"] += 1
        if exc is not None:
            return
        assert att.state == "failed" and att.failure == FAILURES[variant]
        if replay:
            return
        a = t.attempts[n - 1]
        a.state, a.failure, a.fp = "failed", variant, f"fail:{variant}"
        t.events["attempt_failed"] += 1
        d = DECISIONS[decision]
        if d is None:
            self._apply_decision(t, "wait")
        else:
            self._apply_decision(t, d.action, delay_ms=int(d.delay_s * 1000),
                                 reason=d.next_reason.strip(LUA_SPACE))

    def _op_checkpoint(self, task: str, n: int, fence: int, phase: str, variant: int, worker: str) -> None:
        # checkpoint.lua: the same phase and record with the same fence is a replay (checked first),
        # then the fenced checks (a cancel request included), then phases are monotonic.
        t = self.model.get(task)
        index = dict(PHASES)[phase]
        expected: type[McqError] | None = None
        replay = False
        if t is None:
            expected = TaskNotFound
        else:
            a = t.attempts[n - 1]
            if a.ckpts.get(phase) == variant and a.fence == fence:
                replay = True
            else:
                expected = self._refused(t, self._refusal(t, n, fence, True))
                if expected is None and index <= a.phase_index:
                    expected = PhaseOutOfOrder
                    t.events["checkpoint_refused"] += 1
        got, exc = self._call(self.q.leases.checkpoint, f"{task}/{n}", fence, phase, index, _ckpt(phase, variant),
                              worker_id=worker)
        self._expect(f"checkpoint({task}/{n}, fence={fence}, {phase}, variant={variant})", expected, exc)
        if t is None or exc is not None:
            return
        assert got == (not replay), f"checkpoint returned {got}, model expects a replay: {replay}"
        if not replay:
            a = t.attempts[n - 1]
            a.ckpts[phase], a.phase, a.phase_index = variant, phase, index
            t.events["checkpoint_recorded"] += 1

    def _op_effect_begin(self, task: str, n: int, fence: int, x: str, worker: str) -> None:
        # effect_begin.lua: the fenced checks (a cancel request included), then the key's record: a
        # receipt is replayed, this attempt's own intent goes ahead again, any other record but
        # 'absent' must be reconciled first, else a new intent.
        t = self.model.get(task)
        key = _effect_key(task, x)
        expected = TaskNotFound if t is None else self._refused(t, self._refusal(t, n, fence, True))
        got, exc = self._call(self.q.leases.effect_begin, f"{task}/{n}", fence, key, {"operation": "push",
                                                                                      "identity": x},
                              worker_id=worker)
        self._expect(f"effect_begin({task}/{n}, fence={fence}, {x})", expected, exc)
        if t is None or exc is not None:
            return
        e = t.effects.get(key)
        if e is not None and e.state == "done":
            want = "DONE"
            t.events["effect_replayed"] += 1
        elif e is not None and e.state == "intent" and (e.attempt, e.fence) == (n, fence):
            want = "OK"
        elif e is not None and e.state != "absent":
            want = "PENDING"
        else:
            want = "OK"
            t.effects[key] = ModelEffect("intent", n, fence)
            t.events["effect_intent"] += 1
        assert got[0] == want, f"effect_begin({task}/{n}, {x}) returned {got[0]}, model {want}"

    def _op_effect_done(self, task: str, n: int, fence: int, x: str, variant: int, worker: str) -> None:
        # effect_done.lua as the worker: fenced (no cancel check: a receipt of an effect already made is
        # evidence), a refused receipt is kept as late_receipt; then the key must have a record.
        t = self.model.get(task)
        key = _effect_key(task, x)
        expected: type[McqError] | None
        if t is None:
            expected = TaskNotFound
        else:
            expected = self._refused(t, self._refusal(t, n, fence, False))
            if expected is not None:
                t.events["late_receipt"] += 1
            elif key not in t.effects:
                expected = EffectNotBegun  # E_NOEFFECT: no intent on file (refused, and recorded)
                t.events["effect_refused"] += 1
            elif t.effects[key].state == "done" and t.effects[key].receipt != variant:
                expected = ResultConflict
                t.events["effect_conflict"] += 1
        _, exc = self._call(self.q.leases.effect_done, f"{task}/{n}", fence, key, "done", _receipt(variant),
                            actor=worker)
        self._expect(f"effect_done({task}/{n}, fence={fence}, {x}, receipt={variant})", expected, exc)
        if t is None or exc is not None:
            return
        e = t.effects[key]
        if e.state != "done":
            e.state, e.receipt, e.receipt_attempt = "done", variant, n
            t.events["effect_receipt"] += 1

    def _op_expire_leases(self) -> None:
        """The sweeper's expire_leases: every running attempt whose lease ran out turns suspect."""
        expected = set()
        for t in self.model.values():
            a = t.latest
            if a.state == "running" and a.expired:
                expected.add((f"{t.id}/{a.n}", a.fence))
        got, exc = self._call(self.sw.maintenance.expire_leases)
        self._expect("expire_leases()", None, exc)
        assert len(got) == len({e.attempt_id for e in got}), "an attempt was expired twice in one sweep"
        assert {(e.attempt_id, e.old_fence) for e in got} == expected, (
            f"expire_leases() returned {got}, model expects {sorted(expected)}")
        for e in got:
            self._voided(self.model[e.attempt_id.rpartition("/")[0]], e.new_fence)

    def _voided(self, t: ModelTask, new_fence: int) -> None:
        """expire.lua on a running attempt: suspect, the fence bumped (the task stays running until
        reconciliation settles it), out of the lease and cancels indexes, into the suspect index."""
        want = self._next_fence(t)
        assert new_fence == want, f"{t.id}: expire moved the fence {t.fence} to {new_fence}, model {want}"
        t.latest.state = "suspect"
        t.fence = new_fence
        t.events["lease_expired"] += 1

    def _op_void(self, members: list[str]) -> None:
        """void_leases (expire.lua with force): a running latest attempt is voided even with a live
        lease; any other member is a no-op (its index entries, if any, are dropped)."""
        expected = []
        for m in members:
            tid, _, n = m.rpartition("/")
            t = self.model.get(tid)
            if t is not None and int(n) == len(t.attempts) and t.latest.state == "running" and m not in expected:
                expected.append(m)
        got, exc = self._call(self.sw.operator.void_leases, members, reason="cancel not acknowledged in time")
        self._expect(f"void_leases({members})", None, exc)
        assert [e.attempt_id for e in got] == expected, f"void_leases voided {got}, model {expected}"
        for e in got:
            t = self.model[e.attempt_id.rpartition("/")[0]]
            assert e.old_fence == t.fence
            self._voided(t, e.new_fence)

    def _op_sweep_cancels(self) -> None:
        """The sweeper's cancel pass: running attempts whose cancel was not acknowledged by its
        deadline (due_cancels) have their leases voided."""
        expected = sorted(f"{t.id}/{t.latest.n}" for t in self.model.values()
                          if _running(t) and t.cancel is not None and t.cancel_due)
        due, exc = self._call(self.sw.maintenance.due_cancels)
        self._expect("due_cancels()", None, exc)
        assert sorted(due) == expected, f"due_cancels() returned {due}, model {expected}"
        if due:
            self._op_void(due)

    def _op_reconcile(self, task: str, n: int, *, apply_policy: bool = False, provider: str = "absent") -> None:
        """reconcile_attempt: reconcile_begin (only a suspect attempt), ask the provider about every
        intent without a receipt, then settle: canceled (a cancel was requested), blocked (an effect
        is unknown), succeeded (a result_pending checkpoint and no effect of this attempt absent),
        else failed as an executor LeaseLost: the task waits, or its frozen policy decides."""
        t = self.model.get(task)
        expected: type[McqError] | None = None
        if t is None:
            expected = TaskNotFound
        elif n > len(t.attempts) or t.attempts[n - 1].state != "suspect":
            expected = TransitionRefused
        self.provider = provider
        att, exc = self._call(reconcile_attempt, self.q, f"{task}/{n}", apply_policy=apply_policy,
                              operations={"push": self._provider_lookup})
        self._expect(f"reconcile_attempt({task}/{n}, apply_policy={apply_policy}, provider={provider})", expected, exc)
        if t is not None and exc is not None:
            t.events["reconcile_refused"] += 1  # reconcile_begin records its refusal
        if exc is not None or t is None:
            return
        a = t.attempts[n - 1]
        t.events.update(["reconciling_started", "attempt_reconciled"])
        for e in t.effects.values():
            if e.state == "intent":  # the provider's answer is recorded as the receipt, absent or unknown
                e.state, e.receipt_attempt = RECONCILED_EFFECT[provider], n
                e.receipt = 0 if provider == "found" else None
                t.events[f"effect_{'receipt' if provider == 'found' else provider}"] += 1
        a.settled_by = "reconcile"
        label = f"lost:{a.phase or 'start'}"
        if t.cancel is not None:
            a.state = t.state = "canceled"
            t.events["task_canceled"] += 1
        elif any(e.state == "unknown" for e in t.effects.values()):
            a.state, a.lost, a.fp = "failed", True, label
            self._apply_decision(t, "stop")
        elif "result_pending" in a.ckpts and not any(
                e.state == "absent" and e.by_attempt == n for e in t.effects.values()):
            a.state = t.state = "succeeded"
            a.result = a.ckpts["result_pending"]
        else:
            action = self._policy(t, a, label) if apply_policy else "wait"
            a.state, a.lost, a.fp = "failed", True, label
            self._apply_decision(t, action)
        assert (att.state.value, att.settled_by) == (a.state, "reconcile"), f"reconcile settled {att.state}"

    def _op_settle(self, task: str, n: int, outcome: str) -> None:
        """reconcile_settle.lua called directly: only a reconciling attempt is settled (none stays
        reconciling here), but an attempt reconciliation settled with this outcome is reported again."""
        t = self.model.get(task)
        expected: type[McqError] | None = None
        if t is None:
            expected = TaskNotFound
        elif n > len(t.attempts) or (t.attempts[n - 1].state, t.attempts[n - 1].settled_by) != (outcome, "reconcile"):
            expected = TransitionRefused
            t.events["settle_refused"] += 1
        failure = make_failure("executor", "LeaseLost", "settled by hand") if outcome == "failed" else None
        att, exc = self._call(self.q.operator.settle_attempt, f"{task}/{n}", "operator", outcome, result=_result(1),
                              failure=failure, evidence={"by": "hand"})
        self._expect(f"settle_attempt({task}/{n}, {outcome})", expected, exc)
        if exc is None:
            assert (att.state.value, att.settled_by) == (outcome, "reconcile"), f"settle reported {att.state}"

    def _op_reconciler_effect(self, task: str, n: int, x: str) -> None:
        """effect_done.lua as the reconciler (no fence): only while the attempt is reconciling."""
        t = self.model.get(task)
        expected: type[McqError] = TaskNotFound
        if t is not None:
            expected = TransitionRefused
            t.events["effect_refused"] += 1
        _, exc = self._call(self.q.leases.effect_done, f"{task}/{n}", None, _effect_key(task, x), "absent",
                            "nothing there",
                            source="reconcile", actor="late-reconciler")
        self._expect(f"effect_done({task}/{n}, reconciler, {x})", expected, exc)

    def _provider_lookup(self, key: str) -> Any:
        """The provider the reconciler asks about an intent without a receipt."""
        if self.provider == "unknown":
            raise RuntimeError("the provider cannot tell")
        return _receipt(0) if self.provider == "found" else None

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
        elif t.state in ("succeeded", "canceled", "quarantined") or t.latest.state != "failed":
            expected = RetryRefused  # never runs again, or an attempt still active or not failed
        elif len(reason.strip(LUA_SPACE)) < 10:
            expected = RetryRefused
        att, exc = self._call(self.q.operator.retry_task, task, reason, "try again", delay_ms=delay_ms, request_id=req)
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
        m = self._new_attempt(t, reason.strip(LUA_SPACE), due=delay_ms != LONG_MS, create_req=req)
        assert att.number == m.n and att.state == "pending"
        t.state = "pending" if delay_ms == 0 else "backoff"
        t.attention = False  # the operator's decision resolves the attention item
        if delay_ms == SHORT_MS:
            _let_clock_pass()

    def _op_cancel(self, task: str, reason: str, timeout_ms: int) -> None:
        # cancel.lua: canceled already is a replay, succeeded and quarantined are refused, a second
        # request reports the first; a running (or suspect, reconciling) attempt is signalled, else the
        # task (and its pending attempt) is canceled at once.
        t = self.model.get(task)
        expected: type[McqError] | None = None
        want: str | None = None
        if any(ord(c) < 32 for c in reason) or len(reason.strip()) < 10:
            expected = InvalidArgument
        elif t is None:
            expected = TaskNotFound
        elif t.state == "canceled":
            want = "canceled"
        elif t.state in ("succeeded", "quarantined"):
            expected = TransitionRefused
            t.events["cancel_refused"] += 1
        elif t.cancel is not None:
            want = "signaled"
        got, exc = self._call(self.q.operator.cancel_task, task, reason, ack_timeout_ms=timeout_ms)
        self._expect(f"cancel_task({task}, {reason!r}, timeout={timeout_ms})", expected, exc)
        if t is None or exc is not None:
            return
        if want is None:
            a = t.latest
            t.cancel = reason.strip(LUA_SPACE)
            t.events["cancel_requested"] += 1
            if a.state in ("running", "suspect", "reconciling"):
                want = "signaled"
                t.cancel_due = timeout_ms == 0
            else:
                want = "canceled"
                if a.state == "pending":
                    a.state, a.settled_by = "canceled", "cancel"
                t.state = "canceled"
                t.attention = False  # BUG-3: the cancellation resolves a blocked task's attention item
                t.events["task_canceled"] += 1
        assert got == want, f"cancel_task({task}) returned {got}, model {want}"

    def _op_ack(self, task: str, n: int, fence: int, req: str | None, worker: str) -> None:
        # cancel_ack.lua: a resend with the same request id (and fence) reports the first
        # acknowledgement; then the fence checks; then a cancel must have been requested.
        t = self.model.get(task)
        expected: type[McqError] | None = None
        dup: int | None = None
        if t is None:
            expected = TaskNotFound
        else:
            a = t.attempts[n - 1]
            if req is not None and a.ack_req == req and a.fence == fence:
                dup = a.ack_fence
            else:
                expected = self._refused(t, self._refusal(t, n, fence, False))
                if expected is None and t.cancel is None:
                    expected = TransitionRefused
                    t.events["cancel_ack_refused"] += 1
        got, exc = self._call(self.q.leases.acknowledge_cancel, f"{task}/{n}", fence, worker_id=worker, request_id=req)
        self._expect(f"acknowledge_cancel({task}/{n}, fence={fence}, request_id={req})", expected, exc)
        if t is None or exc is not None:
            return
        if dup is not None:
            assert got == dup, f"a resent acknowledgement returned fence {got}, the first one {dup}"
            return
        a = t.attempts[n - 1]
        want = self._next_fence(t)
        assert got == want, f"acknowledge_cancel moved the fence to {got}, model {want}"
        a.state, a.ack_req, a.ack_fence = "suspect", req, got
        t.fence = got
        t.events["cancel_acknowledged"] += 1

    def _op_replay(self, task: str, reason: str, req: str | None) -> None:
        # dlq_replay.lua: bad reasons are bad input; a resend with the request id of the latest
        # attempt returns it; only a quarantined task is replayed.
        t = self.model.get(task)
        expected: type[McqError] | None = None
        dup = False
        if any(ord(c) < 32 for c in reason) or len(reason.strip()) < 10:
            expected = InvalidArgument
        elif t is None:
            expected = TaskNotFound
        elif req is not None and t.latest.create_req == req:
            dup = True
        elif t.state != "quarantined":
            expected = TransitionRefused
            t.events["replay_refused"] += 1
        att, exc = self._call(self.q.operator.dlq_replay, task, reason, "a person looked", request_id=req)
        self._expect(f"dlq_replay({task}, {reason!r}, request_id={req})", expected, exc)
        if t is None or exc is not None:
            return
        if dup:
            assert att.number == t.latest.n, "a resent replay must return the attempt it created"
            return
        m = self._new_attempt(t, reason.strip(LUA_SPACE), create_req=req)
        assert att.number == m.n and att.state == "pending"
        t.state = "pending"
        t.attention = False
        t.events["dlq_replayed"] += 1

    def _op_purge(self, task: str, reason: str, keep_s: float, req: str | None) -> None:
        # dlq_purge.lua: bad reasons are bad input; a purged task is reported again to a resend with
        # its request id; only a quarantined task is purged.
        t = self.model.get(task)
        expected: type[McqError] | None = None
        dup: int | None = None
        if any(ord(c) < 32 for c in reason) or len(reason.strip()) < 10:
            expected = InvalidArgument
        elif t is None:
            p = self.purged.get(task)
            if p is not None and req is not None and p.request_id == req:
                dup = p.attempts
            else:
                expected = TaskNotFound
        elif t.state != "quarantined":
            expected = TransitionRefused
            t.events["purge_refused"] += 1
        elif t.dependents and not t.released:
            expected = TransitionRefused  # it owes its dependents a release first (E_CHANGED, nothing recorded)
        got, exc = self._call(self.q.operator.dlq_purge, task, reason=reason, keep_key_s=keep_s, request_id=req)
        self._expect(f"dlq_purge({task}, {reason!r}, keep={keep_s}, request_id={req})", expected, exc)
        if exc is not None:
            return
        if dup is not None:
            assert got == dup, f"a resent purge reported {got} attempts, the first one {dup}"
            return
        assert t is not None
        assert got == len(t.attempts), f"purge reported {got} attempts, model {len(t.attempts)}"
        del self.model[task]
        if t.owed:
            self.owed_gone.add(task)
        self.nslog["task_purged"] += 1
        self.purged[task] = Purged(req, len(t.attempts), keep_s > 1, t.fence)
        self.floor = max(self.floor, t.fence)  # dlq_purge raises the floor to the task's last fence
        if t.idem_key is not None:
            if keep_s == 0:
                del self.idem[t.idem_key]  # the key is free at once
            else:
                self.idem[t.idem_key].purged = "refused" if keep_s > 1 else "passed"
        if 0 < keep_s <= 1:
            _let_clock_pass()

    def _op_recover(self) -> None:
        """recover() on a healthy namespace: a new epoch, the fence floor raised, every live lease
        voided (running attempts turn suspect with a fence above the floor), the namespace ok again."""
        before = self.q.reads.namespace().epoch
        expected = sorted(f"{t.id}/{t.latest.n}" for t in self.model.values() if _running(t))
        report, exc = self._call(recover, self.q, reason="stateful test recovers")
        self._expect("recover()", None, exc)
        voided = sorted(report["voided_leases"])
        assert voided == expected, f"recover voided {voided}, model {expected}"
        assert report["dropped_entries"] == 0, f"recover dropped {report['dropped_entries']} index entries"
        assert report["fence_floor"] > self.floor, f"recover lowered the fence floor to {report['fence_floor']}"
        self.floor = report["fence_floor"]
        for aid in expected:
            t = self.model[aid.rpartition("/")[0]]
            t.latest.state = "suspect"
            t.fence = self._next_fence(t)
            t.events["lease_expired"] += 1
        self.nslog.update(["recovery_started", "recovery_finished"])
        info = self.q.reads.namespace()
        assert info.state == "ok" and info.epoch != before, f"after recover: {info}"
        assert info.floor == self.floor

    def _op_recover_by_steps(self, data: st.DataObject) -> None:
        """recover() by hand: recover_begin holds the namespace (a claim is refused meanwhile, nothing
        written), recover_finish is refused while a lease from before is indexed (recovery_refused),
        the leases are voided with the recovering epoch, then the namespace is ok again."""
        claimable = [tid for tid, t in self.model.items() if _claimable(t)]
        if claimable and not any(_running(t) for t in self.model.values()):  # a lease to void
            self._op_claim(data.draw(st.sampled_from(claimable), label="a running task"), "w-before", LONG_MS, None)
        epoch, floor = self.q.operator.begin_recovery(reason="stateful test recovers by hand")
        assert floor > self.floor, f"recover_begin lowered the fence floor to {floor}"
        self.floor = floor
        self.nslog["recovery_started"] += 1
        assert self.q.reads.namespace().state == "recovering"
        task = self._pick_task(data, _claimable)
        _, exc = self._call(self.q.leases.claim_attempt, task, "w-during", LONG_MS)
        self._expect(f"claim({task}) while recovering", NamespaceLost, exc)
        running = sorted(f"{t.id}/{t.latest.n}" for t in self.model.values() if _running(t))
        if running:
            _, exc = self._call(self.q.operator.finish_recovery, epoch, voided=0)
            self._expect("finish_recovery() with leases left", TransitionRefused, exc)
            self.nslog["recovery_refused"] += 1
            got, exc = self._call(self.q.operator.void_leases, running, reason="recovery by hand",
                                  recovering_epoch=epoch)
            self._expect(f"void_leases({running}) while recovering", None, exc)
            assert sorted(e.attempt_id for e in got) == running, f"voided {got}, model {running}"
            for e in got:
                self._voided(self.model[e.attempt_id.rpartition("/")[0]], e.new_fence)
        _, exc = self._call(self.q.operator.finish_recovery, epoch, voided=len(running))
        self._expect("finish_recovery()", None, exc)
        self.nslog["recovery_finished"] += 1
        info = self.q.reads.namespace()
        assert (info.state, info.epoch, info.floor) == ("ok", epoch, floor), f"after the recovery: {info}"

    # ------------------------------------------------------------------ rules

    @initialize(queue=st.sampled_from(QUEUES), payload=st.integers(0, 2))
    def first_task(self, queue: str, payload: int) -> None:
        """Every run starts with a task (swarm testing may switch the enqueue rules off)."""
        self._op_enqueue(queue, HANDLERS[0], payload, None, None)

    @rule(queue=st.sampled_from(QUEUES), handler=st.sampled_from(HANDLERS),
          payload=st.integers(0, 2), idem=st.none() | st.sampled_from(["k1", "k2", "k3"]),
          delay_ms=st.sampled_from([0, 0, 0, SHORT_MS, LONG_MS]))
    def enqueue(self, queue: str, handler: str, payload: int, idem: str | None, delay_ms: int) -> None:
        """A new task, due now, after a delay that runs out at once, or one that does not in this run."""
        self._op_enqueue(queue, handler, payload, idem, None, delay_ms)

    @rule(data=st.data(), other_queue=st.booleans(), handler=st.sampled_from(HANDLERS),
          payload=st.integers(0, 2), idem=st.none() | st.sampled_from(["k1", "k2"]))
    def enqueue_with_task_id(self, data: st.DataObject, other_queue: bool, handler: str, payload: int,
                             idem: str | None) -> None:
        """The producer names the task id: an existing one (a replay or a conflict), a purged one, or GHOST."""
        task = self._pick_task(data, lambda t: True)
        queue = task.partition(":")[0]
        if other_queue:
            queue = QUEUES[1 - QUEUES.index(queue)]
        self._op_enqueue(queue, handler, payload, idem, task)

    @rule(data=st.data(), n=st.integers(1, 3))
    def enqueue_many(self, data: st.DataObject, n: int) -> None:
        """A batch of 1-3 tasks, all or nothing: new ones, replays of keys or ids, conflicts, purged ones."""
        items = []
        for i in range(n):
            queue = data.draw(st.sampled_from(QUEUES), label=f"item {i} queue")
            handler = data.draw(st.sampled_from(HANDLERS), label=f"item {i} handler")
            payload = data.draw(st.integers(0, 2), label=f"item {i} payload")
            idem = data.draw(st.none() | st.sampled_from(["k1", "k2", "k3"]), label=f"item {i} key")
            task_id = None
            if self.model and data.draw(st.booleans(), label=f"item {i} names a task id"):
                task_id = self._pick_task(data, lambda t: True)
            delay_ms = data.draw(st.sampled_from([0, 0, SHORT_MS, LONG_MS]), label=f"item {i} delay")
            items.append((queue, handler, payload, idem, task_id, delay_ms))
        self._op_enqueue_many(items)

    @rule(data=st.data(), queue=st.sampled_from(QUEUES), payload=st.integers(0, 2), n=st.integers(1, 2),
          mode=st.sampled_from(["succeeded", "ended"]))
    def enqueue_after(self, data: st.DataObject, queue: str, payload: int, n: int, mode: str) -> None:
        """A new task that waits for one or two others (any task: running, ended, waiting, purged, GHOST,
        sometimes the same one twice)."""
        parents = [self._pick_task(data, lambda t: t.state not in ENDED) for _ in range(n)]
        self._op_enqueue_after(queue, payload, parents, mode)

    @rule(data=st.data(), mode=st.sampled_from(["succeeded", "ended"]),
          end=st.sampled_from(["complete", "fail", "quarantine", "cancel", "nothing"]))
    def dependency_cycle(self, data: st.DataObject, mode: str, end: str) -> None:
        """A task waits for a claimable one, which then ends (or not), and the sweeper releases: the paths
        a random walk reaches too rarely (a parent's end, a chain when the parent itself waits)."""
        parent = self._pick_task(data, lambda t: _claimable(t) or t.state == "waiting")
        self._op_enqueue_after(QUEUES[0], 0, [parent], mode)
        t = self.model.get(parent)
        if end == "cancel":
            self._op_cancel(parent, "the operator no longer needs it", 0)
        elif end != "nothing" and t is not None and _claimable(t) and self._op_claim(parent, "w1", LONG_MS, None):
            if end == "complete":
                self._op_complete(parent, t.latest.n, t.fence, 0, "w1")
            else:
                self._op_fail(parent, t.latest.n, t.fence, 0, "w1", "quarantine" if end == "quarantine" else "none")
        self._op_release()

    @rule()
    def release(self) -> None:
        """The sweeper's release step: what the ended parents owe their dependents."""
        self._op_release()

    @rule(data=st.data(), change=st.sampled_from(["nothing", "payload", "handler", "queue"]))
    def enqueue_resend(self, data: st.DataObject, change: str) -> None:
        """A producer sends a task again under its idempotency key: unchanged (the same task comes
        back, or TaskPurged), or with another payload, handler or queue (a conflict)."""
        if not self.idem:
            self._op_enqueue(QUEUES[0], HANDLERS[0], 0, "k1", None)
            return
        key = data.draw(st.sampled_from(sorted(self.idem)), label="idempotency key")
        e = self.idem[key]
        queue, handler, payload = e.queue, e.handler, e.payload
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

    @rule(data=st.data(), variant=st.integers(0, 1), worker=st.sampled_from(WORKERS),
          decision=st.sampled_from(sorted(DECISIONS)))
    def fail(self, data: st.DataObject, variant: int, worker: str, decision: str) -> None:
        task = self._pick_task(data, _running)
        self._op_fail(task, *self._pick_fenced(data, task), variant, worker, decision)

    @rule(data=st.data(), phase=st.sampled_from([p for p, _ in PHASES]), variant=st.integers(1, 2),
          worker=st.sampled_from(WORKERS))
    def checkpoint(self, data: st.DataObject, phase: str, variant: int, worker: str) -> None:
        task = self._pick_task(data, _running)
        self._op_checkpoint(task, *self._pick_fenced(data, task), phase, variant, worker)

    @rule(data=st.data(), x=st.sampled_from(EFFECT_KEYS), variant=st.integers(1, 2), done=st.booleans(),
          worker=st.sampled_from(WORKERS))
    def effect(self, data: st.DataObject, x: str, variant: int, done: bool, worker: str) -> None:
        """A worker records an effect's intent, or its receipt (late, or for a key with no intent)."""
        task = self._pick_task(data, _running)
        n, fence = self._pick_fenced(data, task)
        if done:
            self._op_effect_done(task, n, fence, x, variant, worker)
        else:
            self._op_effect_begin(task, n, fence, x, worker)

    @rule(data=st.data(), op=st.sampled_from(["renew", "complete", "fail", "checkpoint", "effect_begin",
                                              "effect_done", "ack"]), variant=st.integers(0, 1))
    def zombie_write(self, data: st.DataObject, op: str, variant: int) -> None:
        """A worker that lost its lease writes late with the fence it was given."""
        task = self._pick_task(data, lambda t: len(t.leases) > 0)
        t = self.model.get(task)
        if t is not None and t.leases:
            n, fence = data.draw(st.sampled_from(t.leases), label="old lease")
        else:  # never a fence above the current one (that proves Redis lost state)
            n, fence = 1, t.fence if t is not None else 1
        self._fenced_op(op, task, n, fence, variant, "zombie")

    def _fenced_op(self, op: str, task: str, n: int, fence: int, variant: int, worker: str) -> None:
        if op == "renew":
            self._op_renew(task, n, fence, LONG_MS, worker)
        elif op == "complete":
            self._op_complete(task, n, fence, variant + 1, worker)
        elif op == "fail":
            self._op_fail(task, n, fence, variant, worker)
        elif op == "checkpoint":
            self._op_checkpoint(task, n, fence, PHASES[variant][0], 1, worker)
        elif op == "effect_begin":
            self._op_effect_begin(task, n, fence, EFFECT_KEYS[variant], worker)
        elif op == "effect_done":
            self._op_effect_done(task, n, fence, EFFECT_KEYS[variant], 1, worker)
        else:
            self._op_ack(task, n, fence, f"ack-{variant}", worker)

    @rule(data=st.data(), op=st.sampled_from(["renew", "complete", "fail", "checkpoint", "effect_begin", "ack"]),
          variant=st.integers(0, 1))
    def fenced_sweep(self, data: st.DataObject, op: str, variant: int) -> None:
        """Every (attempt, fence) pair a worker of this task could hold writes once, oldest first."""
        task = self._pick_task(data, lambda t: len(t.leases) > 0)
        t = self.model.get(task)
        for n, fence in sorted(set(t.fenced_candidates())) if t is not None else [(1, 1)]:
            self._fenced_op(op, task, n, fence, variant, "sweep")

    @rule()
    def expire_leases(self) -> None:
        self._op_expire_leases()

    @rule(data=st.data(), apply_policy=st.booleans(), provider=st.sampled_from(["found", "absent", "unknown"]))
    def reconcile_attempt(self, data: st.DataObject, apply_policy: bool, provider: str) -> None:
        task = self._pick_task(data, lambda t: t.latest.state == "suspect")
        t = self.model.get(task)
        n = data.draw(st.integers(1, len(t.attempts) + 1), label="attempt") if t else 1
        if t and t.latest.state == "suspect" and data.draw(st.booleans(), label="the suspect one"):
            n = t.latest.n
        self._op_reconcile(task, n, apply_policy=apply_policy, provider=provider)

    @rule(data=st.data(), outcome=st.sampled_from(["same", "succeeded", "failed", "canceled", "effect"]))
    def settle_directly(self, data: st.DataObject, outcome: str) -> None:
        """A second reconciler arrives late: it settles an attempt that is not reconciling (refused,
        or reported again when reconciliation settled it with that outcome) or records an effect."""
        task = self._pick_task(data, lambda t: any(a.settled_by == "reconcile" for a in t.attempts))
        t = self.model.get(task)
        n = data.draw(st.integers(1, len(t.attempts) + 1), label="attempt") if t else 1
        if t is not None and data.draw(st.booleans(), label="a reconciled one"):
            n = max([a.n for a in t.attempts if a.settled_by == "reconcile"] or [n])
        if outcome == "same":  # the outcome reconciliation recorded (a resend of its settlement)
            outcome = t.attempts[n - 1].state if t is not None and n <= len(t.attempts) else "canceled"
            outcome = outcome if outcome in TERMINAL else "canceled"
        if outcome == "effect":
            self._op_reconciler_effect(task, n, EFFECT_KEYS[0])
        else:
            self._op_settle(task, n, outcome)

    @rule(data=st.data(), reason=st.sampled_from(VALID_REASONS + INVALID_REASONS),
          delay_ms=st.sampled_from([0, SHORT_MS, LONG_MS]), req=st.none() | st.sampled_from(["x1", "x2"]))
    def retry_task(self, data: st.DataObject, reason: str, delay_ms: int, req: str | None) -> None:
        task = self._pick_task(data, lambda t: t.latest.state == "failed")
        self._op_retry(task, reason, delay_ms, req)

    @rule(data=st.data(), reason=st.sampled_from(VALID_REASONS + INVALID_REASONS),
          timeout_ms=st.sampled_from([0, LONG_MS]))
    def cancel_task(self, data: st.DataObject, reason: str, timeout_ms: int) -> None:
        task = self._pick_task(data, lambda t: t.state != "canceled")
        self._op_cancel(task, reason, timeout_ms)

    @rule(data=st.data(), req=st.none() | st.sampled_from(["ack-0", "ack-1"]), worker=st.sampled_from(WORKERS))
    def acknowledge_cancel(self, data: st.DataObject, req: str | None, worker: str) -> None:
        task = self._pick_task(data, lambda t: _running(t) and t.cancel is not None)
        self._op_ack(task, *self._pick_fenced(data, task), req, worker)

    @rule()
    def sweep_cancels(self) -> None:
        self._op_sweep_cancels()

    @rule(data=st.data())
    def void_leases(self, data: st.DataObject) -> None:
        """Forced voids of a few index members: running ones, settled ones, old attempts, absent tasks."""
        members = []
        for _ in range(data.draw(st.integers(1, 3), label="how many")):
            task = self._pick_task(data, _running)
            t = self.model.get(task)
            n = data.draw(st.integers(1, len(t.attempts)), label="attempt") if t else 1
            members.append(f"{task}/{n}")
        self._op_void(members)

    @rule(data=st.data(), reason=st.sampled_from(VALID_REASONS + INVALID_REASONS),
          req=st.none() | st.sampled_from(["r1", "r2"]))
    def dlq_replay(self, data: st.DataObject, reason: str, req: str | None) -> None:
        task = self._pick_task(data, lambda t: t.state == "quarantined")
        self._op_replay(task, reason, req)

    @rule(data=st.data(), reason=st.sampled_from(VALID_REASONS + INVALID_REASONS),
          keep_s=st.sampled_from(PURGE_KEEP_S), req=st.none() | st.sampled_from(["p1", "p2"]))
    def dlq_purge(self, data: st.DataObject, reason: str, keep_s: float, req: str | None) -> None:
        task = self._pick_task(data, lambda t: t.state == "quarantined")
        self._op_purge(task, reason, keep_s, req)

    @rule()
    def recover_namespace(self) -> None:
        self._op_recover()

    @rule(data=st.data())
    def recover_by_steps(self, data: st.DataObject) -> None:
        self._op_recover_by_steps(data)

    @rule(data=st.data())
    def lose_and_recover(self, data: st.DataObject) -> None:
        """Redis loses the namespace meta (a restart without its data would): the next transition
        detects it (state_loss_detected), the namespace is lost and refuses claims until recover()."""
        self.q.redis.delete(self.q.keys.meta)
        _, exc = self._call(self.q.producer.enqueue, QUEUES[0], HANDLERS[0], _payload(0))
        self._expect("enqueue after the namespace meta vanished", NamespaceLost, exc)
        self.nslog["state_loss_detected"] += 1
        assert self.q.reads.namespace().state == "lost"
        task = self._pick_task(data, _claimable)
        _, exc = self._call(self.q.leases.claim_attempt, task, "w-lost", LONG_MS)
        self._expect(f"claim({task}) while the namespace is lost", NamespaceLost, exc)
        self._op_recover()

    @rule(data=st.data(), worker=st.sampled_from(WORKERS), variant=st.integers(0, 1),
          outcome=st.sampled_from(["complete", "fail", "renew_complete", "fail_retry", "resend_claim", "late_write",
                                   "abandon", "short_heartbeat", "fail_decided", "checkpoint_vanish", "checkpoints",
                                   "ack_uncanceled"]),
          reason=st.sampled_from(VALID_REASONS + INVALID_REASONS), delay_ms=st.sampled_from([0, SHORT_MS, LONG_MS]),
          decision=st.sampled_from(sorted(DECISIONS)))
    def worker_cycle(self, data: st.DataObject, worker: str, variant: int, outcome: str, reason: str,
                     delay_ms: int, decision: str) -> None:
        """A worker claims a claimable task and takes it through to an outcome in one step, so that
        short runs still go through whole lifecycles: complete or fail it (the operator then retries
        or cancels it, or the decision comes with the failure), resend its claim first, write after
        its 1 ms lease ran out, abandon it, shorten its lease to 1 ms with a last heartbeat and vanish
        (the sweeper runs next), checkpoint its result and vanish (reconciliation proves it; its late
        completion is refused), record its phases (a resend is a replay, an earlier phase is
        refused), or acknowledge a cancel nobody requested. When nothing is claimable a producer
        enqueues a task first."""
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
        if outcome == "checkpoints":
            self._op_checkpoint(task, n, fence, "prepared", variant + 1, worker)
            self._op_checkpoint(task, n, fence, "prepared", variant + 1, worker)  # a resend is a replay
            self._op_checkpoint(task, n, fence, "prepared", 2 - variant, worker)  # another record: refused
            self._op_checkpoint(task, n, fence, "result_pending", 1, worker)
            self._op_checkpoint(task, n, fence, "prepared", 2 - variant, worker)  # phases are monotonic
        if outcome == "ack_uncanceled":
            self._op_ack(task, n, fence, None, worker)
        if outcome == "checkpoint_vanish":
            self._op_checkpoint(task, n, fence, "result_pending", variant + 1, worker)
            self._op_void([f"{task}/{n}"])
            self._op_reconcile(task, n, apply_policy=True)
            self._op_complete(task, n, fence, variant + 1, worker)  # it wakes up: stale, though proven
        if outcome in ("complete", "renew_complete", "resend_claim", "late_write", "checkpoints", "ack_uncanceled"):
            self._op_complete(task, n, fence, variant + 1, worker)
        elif outcome in ("fail", "fail_retry"):
            self._op_fail(task, n, fence, variant, worker)
            if outcome == "fail" and variant == 1:  # the operator gives up on the failed task
                self._op_cancel(task, VALID_REASONS[0], 0)
        elif outcome == "fail_decided":
            self._op_fail(task, n, fence, variant, worker, decision)
            self._op_fail(task, n, fence, variant, worker, decision)  # a resend is a replay
        if outcome == "resend_claim":  # a late resend of the claim once the attempt has ended
            self._op_claim(task, worker, lease_ms, request_id)
        if outcome == "renew_complete":  # a cancel after the fact is refused (the task succeeded)
            self._op_cancel(task, VALID_REASONS[variant], 0)
        if outcome == "fail_retry":
            self._op_retry(task, reason, delay_ms, None)
            # The worker resends its failure (a replay, even after the retry), then writes once more
            # with its fence, which is still the task's fence but no longer names the latest attempt.
            self._op_fail(task, n, fence, variant, worker)
            self._op_complete(task, n, fence, variant + 1, worker)

    @rule(data=st.data(), worker=st.sampled_from(WORKERS), variant=st.integers(0, 1),
          decision=st.sampled_from(sorted(DECISIONS)), effect=st.sampled_from(["none", "intent", "receipt"]),
          then=st.sampled_from(["nothing", "next_attempt", "operator_retry"]), other=st.booleans())
    def worker_fail_cycle(self, data: st.DataObject, worker: str, variant: int, decision: str, effect: str,
                          then: str, other: bool) -> None:
        """A worker fails its attempt with the policy's decision (retry now or later, stop,
        quarantine, or a malformed one), maybe after recording an effect's intent (and receipt), and
        resends the failure (a replay; another failure with the same fence is a conflict). Then the
        next attempt runs (its worker finds the effect: a receipt to replay, or an intent of another
        attempt to reconcile first) or the operator retries."""
        if not any(_claimable(t) for t in self.model.values()):
            self._op_enqueue(QUEUES[variant], HANDLERS[variant], variant, None, None)
        task = self._pick_task(data, _claimable)
        if not self._op_claim(task, worker, LONG_MS, None):
            return
        n, fence = self.model[task].leases[-1]
        if effect != "none":
            self._op_effect_begin(task, n, fence, EFFECT_KEYS[0], worker)
        if effect == "receipt":
            self._op_effect_done(task, n, fence, EFFECT_KEYS[0], variant + 1, worker)
        self._op_fail(task, n, fence, variant, worker, decision)
        self._op_fail(task, n, fence, 1 - variant if other else variant, worker, decision)
        if then == "operator_retry":
            self._op_retry(task, VALID_REASONS[variant], 0, None)
        elif then == "next_attempt" and self._op_claim(task, "w-next", LONG_MS, None):
            m, fence2 = self.model[task].leases[-1]
            self._op_effect_begin(task, m, fence2, EFFECT_KEYS[0], "w-next")
            self._op_complete(task, m, fence2, 1, "w-next")

    @rule(data=st.data(), zombie=st.booleans(), reason=st.sampled_from(VALID_REASONS),
          delay_ms=st.sampled_from([0, SHORT_MS, LONG_MS]), apply_policy=st.booleans(),
          cancel=st.sampled_from([False, False, True]))
    def operator_cycle(self, data: st.DataObject, zombie: bool, reason: str, delay_ms: int,
                       apply_policy: bool, cancel: bool) -> None:
        """A worker vanishes (when no lease has run out yet, one claims with a 1 ms lease and is
        never heard of again), the sweeper runs, maybe the operator cancels the task of one suspect
        attempt (signalled: nothing runs), the reconciler settles that attempt, the worker that lost
        the lease may still write late with its old fence (renew, complete, fail), and the operator
        retries the task, which a worker claims at once (refused until it is due)."""
        if not any(t.latest.state == "suspect" or (_running(t) and t.latest.expired) for t in self.model.values()):
            claimable = [tid for tid, t in self.model.items() if _claimable(t)]
            if claimable:
                self._op_claim(data.draw(st.sampled_from(claimable), label="vanishing worker's task"), "w-gone",
                               SHORT_MS, None)
        self._op_expire_leases()
        task = self._pick_task(data, lambda t: t.latest.state == "suspect")
        t = self.model.get(task)
        if t is None or t.latest.state != "suspect":
            return
        a = t.latest
        if cancel:
            self._op_cancel(task, reason, 0)
        self._op_reconcile(task, a.n, apply_policy=apply_policy)
        assert a.fence is not None and a.worker is not None
        if zombie:
            self._op_renew(task, a.n, a.fence, LONG_MS, a.worker)
            self._op_complete(task, a.n, a.fence, 1, a.worker)
            self._op_fail(task, a.n, a.fence, 0, a.worker)
        self._op_retry(task, reason, delay_ms, None)
        self._op_claim(task, "w-eager", LONG_MS, None)  # refused while the new attempt is not due

    @rule(data=st.data(), worker=st.sampled_from(WORKERS), timeout_ms=st.sampled_from([0, LONG_MS]),
          ending=st.sampled_from(["ack", "ack_resend", "void", "expire", "recover"]),
          probe=st.sampled_from(["complete", "fail", "checkpoint", "effect_begin", "effect_done"]),
          effect_first=st.booleans(), provider=st.sampled_from(["found", "absent", "unknown"]),
          reason=st.sampled_from(VALID_REASONS), twice=st.booleans())
    def cancel_cycle(self, data: st.DataObject, worker: str, timeout_ms: int, ending: str, probe: str,
                     effect_first: bool, provider: str, reason: str, twice: bool) -> None:
        """The cancellation protocol end to end: a worker runs a task (maybe with an effect's intent
        on file), the operator cancels it (maybe twice: the second request reports the first), the
        worker's next write is refused (CancelRequested) while its heartbeat reports the cancel;
        then it acknowledges (maybe twice: the same request id reports the same fence), or the
        sweeper voids its lease (due only with a 0 ms deadline), or its 1 ms lease runs out, or a
        recovery voids it; reconciliation settles the attempt canceled, and the worker's late
        writes are refused."""
        if not any(_claimable(t) for t in self.model.values()):
            self._op_enqueue(QUEUES[0], HANDLERS[1], 0, None, None)
        task = self._pick_task(data, _claimable)
        if not self._op_claim(task, worker, SHORT_MS if ending == "expire" else LONG_MS, None):
            return
        n, fence = self.model[task].leases[-1]
        if effect_first and ending != "expire":
            self._op_effect_begin(task, n, fence, EFFECT_KEYS[0], worker)
        self._op_cancel(task, reason, timeout_ms)
        self._check_indexes()  # the signalled attempt is in the cancels index (no step ends with it there)
        if twice:
            self._op_cancel(task, VALID_REASONS[0], 0)
        self._fenced_op(probe, task, n, fence, 0, worker)
        self._op_effect_begin(task, n, fence, EFFECT_KEYS[1], worker)
        if ending != "expire":
            self._op_renew(task, n, fence, None, worker)
        if ending in ("ack", "ack_resend"):
            self._op_ack(task, n, fence, f"ack-{worker}", worker)
            if ending == "ack_resend":
                self._op_ack(task, n, fence, f"ack-{worker}", worker)
        elif ending == "void":
            self._op_sweep_cancels()
        elif ending == "expire":
            self._op_expire_leases()
        else:
            self._op_recover()
        self._op_reconcile(task, n, provider=provider)
        self._op_complete(task, n, fence, 1, worker)
        self._op_ack(task, n, fence, f"ack-{worker}", worker)
        # The same request id with the fence the acknowledgement moved to is no resend: refused.
        self._op_ack(task, n, self.model[task].fence, f"ack-{worker}", worker)

    @rule(data=st.data(), route=st.sampled_from(["fail", "reconcile"]), key=st.sampled_from([True, True, False]),
          then=st.sampled_from(["replay", "replay_resend", "purge", "purge_resend", "refused"]),
          keep_s=st.sampled_from(PURGE_KEEP_S), again=st.sampled_from(["key_then_id", "id_then_key", "both"]),
          reason=st.sampled_from((*VALID_REASONS, INVALID_REASONS[1])))
    def dlq_cycle(self, data: st.DataObject, route: str, key: bool, then: str, keep_s: float, again: str,
                  reason: str) -> None:
        """A task reaches the DLQ (its worker fails it with a quarantine decision, or it vanishes and
        the frozen policy quarantines it), then a person replays it (maybe resending with the same
        request id) or purges it (maybe resending the purge, and purging once more with another
        request id), or a retry and a cancel are refused first; after a purge the producer sends it
        again by its key alone, by its id alone (in either order), or by both: TaskPurged while the
        window is open. When the id runs again, the purged incarnation's worker writes late: stale."""
        self.counter += 1
        idem = f"dlq-{self.counter}" if key else None
        task = self._op_enqueue(QUEUES[self.counter % 2], "h1", 2, idem, None)  # h1/2: executor failures quarantine
        if task is None or not self._op_claim(task, "w-dlq", LONG_MS, None):
            return
        n, fence = self.model[task].leases[-1]
        self._op_effect_begin(task, n, fence, EFFECT_KEYS[0], "w-dlq")  # a purge deletes its effects too
        if route == "fail":
            self._op_fail(task, n, fence, 0, "w-dlq", "quarantine")
        else:
            self._op_void([f"{task}/{n}"])
            self._op_reconcile(task, n, apply_policy=True)
        if then == "refused":
            self._op_retry(task, VALID_REASONS[0], 0, None)
            self._op_cancel(task, VALID_REASONS[0], 0)
            self._op_claim(task, "w-dlq", LONG_MS, None)
        if then.startswith("replay"):
            self._op_replay(task, reason, "r-dlq")
            if then == "replay_resend":
                self._op_replay(task, reason, "r-dlq")
            return
        self._op_purge(task, reason, keep_s, "p-dlq")
        if then == "purge_resend":
            self._op_purge(task, reason, keep_s, "p-dlq")  # the same request: reported again
            self._op_purge(task, reason, keep_s, None)  # another request: no such task
        queue = task.partition(":")[0]
        if again == "both":
            self._op_enqueue(queue, "h1", 2, idem, task)
        for by_key in (again == "key_then_id", again == "id_then_key"):
            if by_key and idem is not None:
                self._op_enqueue(queue, "h1", 2, idem, None)
            elif not by_key and again != "both":
                self._op_enqueue(queue, "h1", 2, None, task)
        t = self.model.get(task)
        if t is not None and _claimable(t):  # the id's new incarnation runs; the purged one's worker is stale
            self._op_claim(task, "w-new", LONG_MS, None)
            self._op_complete(task, n, fence, 1, "w-dlq")

    @rule(data=st.data(), config=st.sampled_from(sorted(CONFIG_OF)), rounds=st.integers(1, 3),
          phase=st.sampled_from([None, "prepared", "result_pending"]), effect=st.booleans(),
          provider=st.sampled_from(["found", "absent", "unknown"]), give_up=st.booleans())
    def policy_cycle(self, data: st.DataObject, config: tuple[str, int], rounds: int, phase: str | None,
                     effect: bool, provider: str, give_up: bool) -> None:
        """The sweeper's way with a vanished worker, a few times over: claim, maybe a checkpoint and an
        effect's intent, the lease voided, reconciliation with the task's frozen policy deciding
        (retry now, stop when the attempts run out, quarantine on a repeated fingerprint, or the
        class's own stop / quarantine), unless the result was on file (succeeded) or the provider
        cannot tell about the effect (blocked). The vanished worker's checkpoint resend arrives after
        the void; at the end the operator retries the task (refused unless it was stopped), or
        cancels it."""
        handler, payload = config
        task = self._op_enqueue(QUEUES[payload % 2], handler, payload, None, None)
        assert task is not None
        for _ in range(rounds):
            if not self._op_claim(task, "w-policy", LONG_MS, None):
                return
            n, fence = self.model[task].leases[-1]
            if phase is not None:
                self._op_checkpoint(task, n, fence, phase, 1, "w-policy")
            if effect:
                self._op_effect_begin(task, n, fence, EFFECT_KEYS[1], "w-policy")
            self._op_void([f"{task}/{n}"])
            if phase is not None:  # the vanished worker's resend: a replay with its fence, else refused
                self._op_checkpoint(task, n, fence, phase, 1, "w-policy")
                self._op_checkpoint(task, n, self.model[task].fence, phase, 1, "w-policy")
            self._op_reconcile(task, n, apply_policy=True, provider=provider)
        if give_up:  # the operator cancels a stopped task (its attention item is resolved)
            self._op_cancel(task, VALID_REASONS[0], 0)
        else:  # the operator takes up a stopped task
            self._op_retry(task, VALID_REASONS[0], 0, None)

    @rule(data=st.data(), kind=st.sampled_from(["claim_lease", "claim_worker", "renew_lease", "retry_delay",
                                                "enqueue_payload", "cancel_reason", "cancel_control",
                                                "replay_reason", "purge_reason", "purge_keep", "ack_worker",
                                                "checkpoint_phase"]))
    def invalid_argument(self, data: st.DataObject, kind: str) -> None:
        """Bad input is refused before anything is written (no event, no state change)."""
        task = self._pick_task(data, lambda t: True)
        calls: dict[str, Callable[[], Any]] = {
            "claim_lease": lambda: self.q.leases.claim_attempt(task, "w1", 0),
            "claim_worker": lambda: self.q.leases.claim_attempt(task, "", LONG_MS),
            "renew_lease": lambda: self.q.leases.renew_lease(f"{task}/1", 0, lease_ms=0),
            "retry_delay": lambda: self.q.operator.retry_task(task, VALID_REASONS[0], delay_ms=-1),
            "enqueue_payload": lambda: self.q.producer.enqueue(QUEUES[0], HANDLERS[0], ["not", "a", "dict"]),
            "cancel_reason": lambda: self.q.operator.cancel_task(task, "too short"),
            "cancel_control": lambda: self.q.operator.cancel_task(task, "a reason with a\nnewline in it"),
            "replay_reason": lambda: self.q.operator.dlq_replay(task, " short   "),
            "purge_reason": lambda: self.q.operator.dlq_purge(task, reason="short"),
            "purge_keep": lambda: self.q.operator.dlq_purge(task, reason=VALID_REASONS[0], keep_key_s=-1),
            "ack_worker": lambda: self.q.leases.acknowledge_cancel(f"{task}/1", 1, worker_id="w\tx"),
            "checkpoint_phase": lambda: self.q.leases.checkpoint(f"{task}/1", 1, "two words", 1, {}),
        }
        _, exc = self._call(calls[kind])
        self._expect(f"invalid_argument({kind})", InvalidArgument, exc)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def matches_model(self) -> None:
        for r in self.recorders:
            assert not r.violations, f"state changes outside mc_queue.contracts.states.TRANSITIONS: {r.violations}"
        assert self.q.reads.namespace().state == "ok", "the namespace must never be marked lost"
        released = {str(x) for x in self.q.redis.zrange(self.q.keys.released, 0, -1)}
        want_released = {t.id for t in self.model.values() if t.owed} | self.owed_gone
        assert released == want_released, f"released index {sorted(released)}, model {sorted(want_released)}"
        counts: dict[str, Counter[str]] = {}
        for tid, t in self.model.items():
            counts.setdefault(t.queue, Counter())[t.state] += 1
            self._check_task(t, self.q.reads.get_task(tid))
        status = self.q.reads.status()
        for queue in set(status) | set(counts):
            got = status.get(queue, {}).get("counts", {})
            want = dict(+counts.get(queue, Counter()))
            assert got == want, f"status() counts of {queue}: {got}, model {want}"
        for tid in self.purged:
            if tid not in self.model:
                _, exc = self._call(self.q.reads.get_task, tid)
                self._expect(f"get_task({tid}) after its purge", TaskNotFound, exc)
                assert self.q.reads.tombstone(tid) is not None, f"{tid}: purged without a tombstone"
                k = self.q.keys.task(tid)
                left = self.q.redis.exists(k.task, k.attempts, k.events, k.effects)
                assert left == 0, f"{tid}: {left} of its task, attempts, events, effects keys survived the purge"
        self._check_indexes()
        held = sorted(str(m).rpartition("\n")[2] for m in self.q.redis.zrange(self.q.keys.slotheld, 0, -1))
        running = sorted(f"{t.id}/{t.latest.n}" for t in self.model.values()
                         if t.queue == QUEUES[0] and t.latest.state == "running")
        assert held == running, f"concurrency slots held by {held}, running Attempts of {SLOT_KEY} {running}"
        reserved = sorted(str(m).split("\n")[2] for m in self.q.redis.zrange(self.q.keys.spent, 0, -1)
                          if str(m).split("\n")[1] == "~")
        assert reserved == running, f"spend reserved by {reserved}, running Attempts of {SLOT_KEY} {running}"
        # The fairness key's counter of tasks not ended (its cap's measure) follows every transition.
        open_ = sum(1 for t in self.model.values() if t.queue == QUEUES[0] and t.state in OPEN_STATES)
        got_open = int(self.q.redis.hget(self.q.keys.counts, f"@{SLOT_KEY}|open") or 0)
        assert got_open == open_, f"tasks of {SLOT_KEY} not ended: counted {got_open}, model {open_}"
        # ... and so do the bytes of the payloads of tasks not ended, per queue and for the key.
        pipe = self.q.redis.pipeline(transaction=False)
        opened = [t for t in self.model.values() if t.state in OPEN_STATES]
        for t in opened:
            pipe.hstrlen(self.q.keys.task(t.id).task, "payload")
        sizes = dict(zip([t.id for t in opened], pipe.execute(), strict=True))
        for queue in QUEUES:
            want_bytes = sum(sizes[t.id] for t in opened if t.queue == queue)
            got_bytes = int(self.q.redis.hget(self.q.keys.counts, f"{queue}|bytes") or 0)
            assert got_bytes == want_bytes, f"payload bytes of {queue}'s tasks not ended: {got_bytes}, {want_bytes}"
        key_bytes = int(self.q.redis.hget(self.q.keys.counts, f"@{SLOT_KEY}|bytes") or 0)
        assert key_bytes == sum(sizes[t.id] for t in opened if t.queue == QUEUES[0]), "the key's payload bytes"
        seen = Counter(e["type"] for e in self.q.reads.namespace_events())
        assert +seen == +self.nslog, f"namespace log {dict(+seen)}, model {dict(+self.nslog)}"

    def _check_indexes(self) -> None:
        """The time indexes, the pending queues, the DLQ and the attention items hold exactly the
        attempts and tasks whose state they are for."""
        # (the outbox of versions before 2026-12 stays empty: a pending Attempt is in its queue's index only)
        want: dict[str, set[str]] = {"leases": set(), "suspect": set(), "cancels": set(), "outbox": set()}
        pending: dict[str, set[str]] = {q: set() for q in QUEUES}
        for t in self.model.values():
            aid, state = f"{t.id}/{t.latest.n}", t.latest.state
            if state == "running":
                want["leases"].add(aid)
                if t.cancel is not None:
                    want["cancels"].add(aid)
            elif state in ("suspect", "reconciling"):
                want["suspect"].add(aid)
            elif state == "pending":
                pending[t.queue].add(t.id)
        for index, members in want.items():
            got = set(self.q.reads.task_ids_of(index, limit=10_000))
            assert got == members, f"{index} index {sorted(got)}, model {sorted(members)}"
        for queue, members in pending.items():
            got = set(cast(list[str], self.q.redis.zrange(self.q.keys.pending(queue), 0, -1)))
            assert got == members, f"pending index of {queue} {sorted(got)}, model {sorted(members)}"
        dlq = {tid for tid, _ in self.q.reads.dlq()}
        assert dlq == {t.id for t in self.model.values() if t.state == "quarantined"}, f"dlq {sorted(dlq)}"
        attention = set(self.q.redis.hkeys(self.q.keys.attention))
        want_attention = {t.id for t in self.model.values() if t.attention}
        assert attention == want_attention, f"attention items {sorted(attention)}, model {sorted(want_attention)}"

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
        got_task = (real.state.value, real.fence, real.queue, real.handler, len(real.attempts), real.cancel_requested)
        want_task = (t.state, t.fence, t.queue, t.handler, len(t.attempts), t.cancel)
        assert got_task == want_task, (
            f"{tid}: (state, fence, queue, handler, attempts, cancel) {got_task}, model {want_task}")
        got_deps = (real.after, real.after_mode, real.after_left, real.dependents)
        want_deps = (t.after, t.mode, t.after_left, t.dependents)
        assert got_deps == want_deps, f"{tid}: (after, mode, left, dependents) {got_deps}, model {want_deps}"
        active = t.latest.n if t.latest.state not in TERMINAL else None
        assert real.active_attempt == active, f"{tid}: active attempt {real.active_attempt}, model {active}"
        # The lease key exists exactly while the latest attempt runs on a live lease.
        lease_live = _running(t) and not t.latest.expired
        assert (real.lease_pttl_ms is not None) == lease_live, (
            f"{tid}: lease key PTTL {real.lease_pttl_ms}, model says live: {lease_live}")
        for ra, ma in zip(real.attempts, t.attempts, strict=True):
            got = (ra.state.value, ra.fence, ra.worker_id, ra.settled_by, ra.phase, sorted(ra.checkpoints))
            want = (ma.state, ma.fence, ma.worker, ma.settled_by, ma.phase, sorted(ma.ckpts))
            assert got == want, f"{ra.id}: (state, fence, worker, settled_by, phase, checkpoints) {got}, model {want}"
            if ma.reason is not None:
                assert ra.reason == ma.reason, f"{ra.id}: reason {ra.reason!r}, model {ma.reason!r}"
            if ma.result is not None:
                assert ra.result == _result(ma.result), f"{ra.id}: result {ra.result}"
            if ma.failure is not None:
                assert ra.failure == FAILURES[ma.failure], f"{ra.id}: failure {ra.failure}"
            if ma.lost:
                assert ra.failure is not None and (ra.failure.failure_class, ra.failure.type) == (
                    FailureClass.EXECUTOR, "LeaseLost"), f"{ra.id}: failure {ra.failure}"
        effects = {k: (e.state, e.attempt, e.receipt, e.receipt_attempt) for k, e in self.q.reads.effects(tid).items()}
        want_effects = {k: (e.state, e.attempt, None if e.receipt is None else _receipt(e.receipt), e.receipt_attempt)
                        for k, e in t.effects.items()}
        assert effects == want_effects, f"{tid}: effects {effects}, model {want_effects}"
        # Events: one stale_write_refused per refused fenced write, with the refusal the model
        # predicts; one attempt_claimed per claim that handed out a lease, with increasing fences;
        # every other type as the model counts it.
        seen = Counter(e.type for e in real.events)
        assert seen["stale_write_refused"] == t.events["stale_write_refused"], (
            f"{tid}: {seen['stale_write_refused']} stale_write_refused events for "
            f"{t.events['stale_write_refused']} refused fenced writes")
        refusals = Counter(e.fields.get("refusal", "?") for e in real.events if e.type == "stale_write_refused")
        assert +refusals == +t.refusals, f"{tid}: refusals {dict(+refusals)}, model {dict(+t.refusals)}"
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


SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_queue_matches_model(stateful_redis: RedisServer) -> None:
    machine = type("QueueMachineRun", (QueueMachine,), {"url": stateful_redis.url})
    REACHED.clear()
    run_state_machine_as_test(machine, settings=SETTINGS)
    assert REACHED["over_limit"] > 0, "no run used up the rate limit: its deferral was never checked"

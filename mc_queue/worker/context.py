"""The consumer side of an Attempt: the Context a handler runs with, and the heartbeats that keep
its lease.

The handler gets an explicit :class:`Context`: its task, Attempt, fence, payload and manifest, and
the calls that keep the platform informed (heartbeat, checkpoint, charge, effect). Every call first
checks the lease: after a refusal the handler learns :class:`LeaseLost` at its next call and may not
start another side effect. One daemon thread per process (:data:`HEARTBEATS`) renews the lease of
every running Attempt every third of its lease, whether or not the handler ever yields.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import redis

from ..client import Client
from ..contracts import failpoints
from ..contracts.codec import canonical_json, check_seconds, digest
from ..contracts.errors import (
    CancelRequested,
    InvalidArgument,
    McqError,
    PhaseOutOfOrder,
    WriteRefused,
)
from ..contracts.models import Attempt, Heartbeat, Manifest, Task
from ..policy.classify import (
    BudgetExceeded,
    ConfigurationFailure,
    TimeoutBudgetExceeded,
)
from ..policy.effects import EffectUnknown, Perform, Reconcile, mint_key, work_id
from ..producer.app import Fallback, HandlerSpec
from .gateway import Gateway

log = logging.getLogger("mc_queue.worker")
T = TypeVar("T")


class LeaseLost(McqError):
    """This Attempt's lease is gone (expired, or ownership moved on): start no further side effect."""


class Context:
    """What a handler gets: its task, Attempt, fence, payload and manifest, and the calls that
    keep the platform informed. Every call first checks the lease: after a refusal the handler
    learns :class:`LeaseLost` at its next call and may not start another side effect."""

    def __init__(self, client: Client, spec: HandlerSpec, task: Task, attempt: Attempt, fence: int,
                 worker_id: str, workspace: Path | Callable[[], Path],
                 operations: Mapping[str, Reconcile] | None = None, *, recovered_at_ms: int = 0,
                 deadline_ms: int = 0, now_ms: int = 0,
                 fallbacks: Mapping[str, tuple[Fallback, ...]] | None = None) -> None:
        self.client = client
        self.spec = spec
        self.task = task
        self.attempt = attempt
        self.attempt_id = attempt.id
        self.fence = fence
        self.worker_id = worker_id
        self._workspace: Path | None = workspace if isinstance(workspace, Path) else None
        self._make_workspace = workspace if callable(workspace) else None
        self.payload: dict[str, Any] = task.payload
        assert task.manifest is not None
        self.manifest: Manifest = attempt.manifest or task.manifest
        self.execution_digest = digest(self.manifest.model_dump_json())
        self.operations: Mapping[str, Reconcile] = operations or {}
        # Before an effect's first call, ask the provider whether it already happened when "no intent on
        # record" may not mean "never done": the task was re-sent with its producer key after Redis lost
        # the first one, or it was created before the namespace's last recovery (a failover or restart
        # may have taken its effect records, never its effect key, which is built from the task id).
        created_ms = int(task.created_at.timestamp() * 1000) if task.created_at else 0
        self.ask_first = bool(task.idempotency_key) or (recovered_at_ms > 0 and created_ms <= recovered_at_ms)
        self.effects_used = False
        # The timeout budget: its end on Redis's clock (set by the claim), and Redis's clock at the claim
        # paired with this process's monotonic clock then (one clock: the host's wall clock plays no part).
        self.deadline_ms = deadline_ms
        self._clock = (now_ms, time.monotonic())
        self._lost: str | None = None
        self._cancelled = False
        self._charged = (attempt.cost, attempt.tokens)
        self._lock = threading.Lock()
        self._beat_lock = threading.Lock()  # serialises background heartbeats with their stop
        self._beating = False
        self._reached: list[str] = []  # phases this Attempt recorded, in order (their index is their place)
        self._gateway = Gateway(client, self.attempt_id, fence, worker_id, check=self.check, fenced=self._fenced,
                                now_ms=self.now_ms, time_for=self.time_for, fallbacks=fallbacks or {})

    @property
    def workspace(self) -> Path:
        """This Attempt's fresh directory, created on first use under the worker's workspace root."""
        if self._workspace is None:
            assert self._make_workspace is not None
            self._workspace = self._make_workspace()
        return self._workspace

    @property
    def workspace_created(self) -> bool:
        return self._workspace is not None

    # -- lease state, shared with the heartbeat thread

    def _mark_lost(self, why: str) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = why

    def check(self) -> None:
        """Raise LeaseLost once the lease is gone, CancelRequested once a cancel was requested."""
        if self._lost is not None:
            raise LeaseLost(f"attempt {self.attempt_id} lost its lease: {self._lost}; no further side effects",
                            attempt_id=self.attempt_id, task_id=self.task.id)
        if self._cancelled:
            raise CancelRequested(f"attempt {self.attempt_id}: cancellation was requested; stop here",
                                  attempt_id=self.attempt_id, task_id=self.task.id)

    @property
    def lease_lost(self) -> bool:
        return self._lost is not None

    @property
    def cancelled(self) -> bool:
        """True once cancellation was requested (seen at the last heartbeat)."""
        return self._cancelled

    def start_heartbeats(self, interval_s: float) -> None:
        """Renew this Attempt's lease from the process's heartbeat thread every ``interval_s``."""
        with self._beat_lock:
            self._beating = True
        HEARTBEATS.register(self, interval_s)

    def stop_heartbeats(self) -> None:
        """After this returns no heartbeat of this Attempt is in flight or will start (so none can land
        after the completion and be refused as stale)."""
        HEARTBEATS.unregister(self)
        with self._beat_lock:
            self._beating = False

    def background_beat(self) -> bool:
        """One renewal from the heartbeat thread; False when this Attempt's lease is gone for good."""
        with self._beat_lock:
            if not self._beating:
                return False
            try:
                self._beat()
            except LeaseLost:
                return False
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.warning("heartbeat of %s failed (%s); retrying", self.attempt_id, exc)
            except McqError as exc:  # namespace lost or similar: stop claiming authority
                self._mark_lost(f"{type(exc).__name__}: {exc}")
                return False
            return True

    def _beat(self, *, cost: float = 0.0, tokens: int = 0, request_id: str | None = None) -> None:
        try:
            hb = self.client.leases.heartbeat(self.attempt_id, self.fence, worker_id=self.worker_id,
                                       cost=cost, tokens=tokens, request_id=request_id)
        except WriteRefused as exc:
            self._mark_lost(f"{type(exc).__name__}: {exc.message}")
            raise LeaseLost(str(exc), attempt_id=self.attempt_id, task_id=self.task.id) from exc
        self._renewed(hb)

    def _renewed(self, hb: Heartbeat) -> None:
        if hb.cancel_requested:
            self._cancelled = True
        self._charged = (hb.cost, hb.tokens)

    @property
    def heartbeat_lock(self) -> threading.Lock:
        """Held while a background renewal of this Attempt is in flight (stop_heartbeats waits for it)."""
        return self._beat_lock

    @property
    def heartbeating(self) -> bool:
        """True from start_heartbeats until stop_heartbeats."""
        return self._beating

    def take_renewal(self, outcome: Heartbeat | BaseException) -> bool:
        """A background renewal's outcome, made elsewhere (:func:`renew_together`); False when this
        Attempt's lease is gone for good. Judged as :meth:`background_beat` judges its own."""
        if isinstance(outcome, Heartbeat):
            self._renewed(outcome)
            return True
        if isinstance(outcome, WriteRefused):
            self._mark_lost(f"{type(outcome).__name__}: {outcome.message}")
            return False
        if isinstance(outcome, McqError):  # namespace lost or similar: stop claiming authority
            self._mark_lost(f"{type(outcome).__name__}: {outcome}")
            return False
        log.warning("heartbeat of %s failed (%s); retrying", self.attempt_id, outcome)
        return True

    # -- the timeout budget

    def now_ms(self) -> int:
        """Redis's clock now, as far as this process can tell: the claim's reading plus the time since."""
        at, mono = self._clock
        return at + round((time.monotonic() - mono) * 1000) if at else round(time.time() * 1000)

    @property
    def remaining_s(self) -> float | None:
        """Seconds left of this Attempt's timeout budget (set at claim from the task's timeout_s and its
        finish_by, on Redis's clock), at least 0; None when the Attempt has no budget."""
        if not self.deadline_ms:
            return None
        return max(0.0, (self.deadline_ms - self.now_ms()) / 1000)

    def time_for(self, what: str, needs_s: float) -> float:
        """The timeout to give a call that may take up to ``needs_s``: ``needs_s`` itself, or what is left
        of the budget when that is less and still enough to be worth starting. A call that needs more than
        is left is refused before it starts: :class:`TimeoutBudgetExceeded` (an executor failure) says what
        it needed and what was left. Pass the result on as the call's own timeout (httpx, subprocess)."""
        self.check()
        check_seconds(needs_s, what="needs_s", high=30 * 86_400)
        left = self.remaining_s
        if left is None:
            return needs_s
        if left < needs_s:
            raise TimeoutBudgetExceeded(
                f"{what} needs up to {needs_s:g}s and {left:.3f}s are left of attempt {self.attempt_id}'s timeout "
                f"budget (it ends at {self.deadline_ms} ms, Redis clock): not started")
        return needs_s

    def calling(self, key: str) -> None:
        """The tool gateway of dependency ``key`` (one the task names in ``limits``): say so right before
        the call to its provider (one round trip). Its circuit breaker is checked: open, or half-open and
        this Attempt is no probe, the call is refused before it starts (:class:`DependencyDown`, a capacity
        failure retried when the breaker half-opens). The units the claim took from its rate limit count
        from now, not from the claim: a provider that counts calls then sees no more than the limit in any
        window, however long the Attempt took to get to its call. A call more than a window after the claim
        takes the units again, or raises :class:`CapacityError` (retried when they are back) when others
        took them. :meth:`call` does this and records the call's outcome for the breaker."""
        self._gateway.calling(key)

    def call(self, key: str, fn: Callable[[], T], *, needs_s: float | None = None,
             fallback: Callable[[Fallback], T] | None = None) -> T:
        """Call dependency ``key`` through its gateway (:meth:`calling`: its breaker checked, its rate limit's
        units counted from now; ``needs_s``: refused first when the timeout budget has less left,
        :meth:`time_for`), then record the outcome for its circuit breaker: a failure classified provider,
        capacity or executor (a 5xx, a 503, a timeout) counts against the dependency, with its fingerprint;
        anything else (a 4xx, a validation failure) is the request's, not the dependency's, and counts as a
        call that worked. The exception, if any, is raised again as it was. ``fallback``: while the breaker
        is open, ``fallback(chosen)`` is called instead through the first of the App's declared fallbacks
        of ``key`` that is up (``App.fallback``; ``chosen.params`` says what to call it with), the switch
        recorded on the Attempt; with none up and the step declared optional (``App.optional``),
        ``fallback(chosen)`` with ``chosen.skips`` True (no dependency is called; the skip recorded); else the
        call is refused as without one."""
        return self._gateway.call(key, fn, needs_s, fallback)

    # -- the handler's calls

    def heartbeat(self) -> None:
        """Renew the lease now (the worker also does it in the background, every third of a lease).
        Raises LeaseLost when ownership moved on, CancelRequested once a cancel was requested."""
        self.check()
        self._beat()
        self.check()

    def charge(self, cost: float = 0.0, tokens: int = 0) -> None:
        """Charge cost and tokens to this Attempt; raises BudgetExceeded past the task's budget."""
        self.check()
        self._beat(cost=cost, tokens=tokens, request_id=uuid.uuid4().hex)
        budget = self.spec.budget
        spent_before = [(a.cost, a.tokens) for a in self.task.attempts if a.number != self.attempt.number]
        cost_total = self._charged[0] + sum(c for c, _ in spent_before)
        tokens_total = self._charged[1] + sum(t for _, t in spent_before)
        if budget.max_cost is not None and cost_total > budget.max_cost:
            raise BudgetExceeded(f"cost {cost_total:g} is over the task's budget of {budget.max_cost:g}")
        if budget.max_tokens is not None and tokens_total > budget.max_tokens:
            raise BudgetExceeded(f"{tokens_total} tokens are over the task's budget of {budget.max_tokens}")

    def scope_digest(self, scope: Mapping[str, Any]) -> str:
        """The binding a checkpoint is valid for: execution digest plus repository, base, branch, generation."""
        return digest(canonical_json({"execution_digest": self.execution_digest, "task": self.task.id,
                                      **{k: scope.get(k) for k in ("repository", "base", "branch", "generation")}}))

    def _phase_index(self, phase: str) -> int:
        """Where ``phase`` lies in this Attempt's order: its declared position, or (no phases declared)
        its position among the phases this Attempt reached, a new one after them all."""
        declared = self.spec.phases
        if declared is None:
            return self._reached.index(phase) if phase in self._reached else len(self._reached)
        if phase not in declared:
            raise ConfigurationFailure(
                f"handler {self.spec.name!r} declares the phases {list(declared)}, and {phase!r} is not one of "
                f"them: add it to @app.handler({self.spec.name!r}, phases=...) in the order it is reached, or "
                "declare no phases at all (any name goes then, in the order first reached)")
        return declared.index(phase)

    def checkpoint(self, phase: str, data: Any = None, *, scope: Mapping[str, Any] | None = None) -> None:
        """Record that this Attempt reached ``phase`` (fenced; phases only move forward)."""
        self.check()
        if not isinstance(phase, str):
            raise InvalidArgument(f"a phase is a name, got {type(phase).__name__}")
        index = self._phase_index(phase)
        scope = dict(scope or {})
        record = {"phase": phase, "data": data, "scope": scope, "scope_digest": self.scope_digest(scope),
                  "task": self.task.id, "attempt": self.attempt.number}
        try:
            self.client.leases.checkpoint(self.attempt_id, self.fence, phase, index, record, worker_id=self.worker_id)
            if phase not in self._reached:
                self._reached.append(phase)
        except PhaseOutOfOrder:
            raise
        except WriteRefused as exc:
            self._mark_lost(f"{type(exc).__name__}: {exc.message}")
            raise LeaseLost(str(exc), attempt_id=self.attempt_id, task_id=self.task.id) from exc

    def reusable_checkpoint(self, phase: str, *, scope: Mapping[str, Any] | None = None) -> Any:
        """Data of ``phase`` recorded by an earlier Attempt of this task, when that phase is declared
        reusable (read-only) and its scope binding is identical to this one; else None."""
        self.check()
        if phase not in self.spec.reusable_phases:
            return None
        want = self.scope_digest(dict(scope or {}))
        for earlier in reversed(self.task.attempts):
            if earlier.number >= self.attempt.number:
                continue
            rec = earlier.checkpoints.get(phase)
            if rec and rec.get("scope_digest") == want:
                return rec.get("data")
        return None

    # -- side effects

    @property
    def work_id(self) -> str:
        """The identity of the work across resends: derived from the producer's idempotency key when
        the task has one (so a task re-sent after Redis lost it names the same provider objects),
        else the task's ULID. Effect keys and names at providers (a branch) should be built from it."""
        return work_id(self.task.id, self.task.idempotency_key, self.client.keys.prefix)

    def effect_key(self, operation: str, identity: str, *, per_attempt: bool = False) -> str:
        return mint_key(self.task.id, operation, identity, self.attempt.number if per_attempt else None,
                        producer_key=self.task.idempotency_key, namespace=self.client.keys.prefix)

    def effect(self, operation: str, identity: str, perform: Perform, reconcile: Reconcile | None = None, *,
               per_attempt: bool = False, assume: Mapping[str, Any] | None = None,
               needs_s: float | None = None) -> Any:
        """Do a side effect at most once per logical operation, and return the provider's receipt.

        The intent is persisted (fenced) before ``perform(key)`` is called and the receipt after. A
        replay returns the recorded receipt without calling the provider. An intent left without a
        receipt by an earlier Attempt is reconciled with the provider first: found -> its receipt;
        certainly absent -> performed now; unknown -> :class:`EffectUnknown` (nothing is repeated).
        A task with a producer idempotency key asks the provider before its first call too: its key
        comes from the producer's (:attr:`work_id`), so a task re-sent after Redis lost the first one
        finds the first one's effects instead of repeating them. So does every task created before
        the namespace's last recovery (``mcq recover``): a loss may have taken its effect records, but
        not its effect keys. A failed lookup fails the Attempt with the lookup's own error, classified
        as usual; the intent is reconciled later.

        ``assume``: what the call may take for granted, read *before* this call and recorded in the
        intent under the fence (a git remote's head for ``--force-with-lease``): the provider fences
        a late call from a worker that lost its lease with it (see the README's provider contract).

        ``needs_s``: how long the call may take; when less than that is left of the Attempt's timeout
        budget the effect is refused before its intent is written (:meth:`time_for`).
        """
        self.check()
        if needs_s is not None:
            self.time_for(f"effect {operation!r}", needs_s)
        ask = reconcile or self.operations.get(operation)
        if ask is None:
            raise InvalidArgument(f"operation {operation!r} has no reconcile: pass one, or register it with "
                                  f"app.operation({operation!r}, reconcile) so the sweeper can ask the provider")
        key = self.effect_key(operation, identity, per_attempt=per_attempt)
        record: dict[str, Any] = {"operation": operation, "identity": identity, "per_attempt": per_attempt}
        if assume:
            record["assume"] = dict(assume)
        self.effects_used = True
        status, existing = self._fenced(lambda: self.client.leases.effect_begin(
            self.attempt_id, self.fence, key, record, worker_id=self.worker_id))
        if status == "DONE":
            assert existing is not None
            return existing.receipt
        if status == "OK" and self.ask_first:
            found = ask(key)  # after a loss the provider may hold an effect whose record Redis lost
            if found is not None:
                self._fenced(lambda: self.client.leases.effect_done(self.attempt_id, self.fence, key, "done", found,
                                                             source="reconcile", actor=self.worker_id))
                return found
        elif status == "PENDING":
            try:
                found = ask(key)
            except Exception as exc:
                raise EffectUnknown(f"cannot tell whether {key} happened: {type(exc).__name__}: {exc}",
                                    attempt_id=self.attempt_id, task_id=self.task.id) from exc
            if found is not None:
                self._fenced(lambda: self.client.leases.effect_done(self.attempt_id, self.fence, key, "done", found,
                                                             source="reconcile", actor=self.worker_id))
                return found
            self._fenced(lambda: self.client.leases.effect_done(self.attempt_id, self.fence, key, "absent",
                                                         "provider has no trace of it", source="reconcile",
                                                         actor=self.worker_id))
            status, _ = self._fenced(lambda: self.client.leases.effect_begin(
                self.attempt_id, self.fence, key, record, worker_id=self.worker_id))
            if status != "OK":
                raise EffectUnknown(f"effect {key} changed while it was reconciled ({status})",
                                    attempt_id=self.attempt_id, task_id=self.task.id)
        self.check()
        failpoints.hit("effect.before_call", operation=operation, attempt=self.attempt_id, worker=self.worker_id)
        receipt = perform(key)
        failpoints.hit("effect.after_call", operation=operation, attempt=self.attempt_id, worker=self.worker_id)
        self._fenced(lambda: self.client.leases.effect_done(self.attempt_id, self.fence, key, "done", receipt,
                                                     source="perform", actor=self.worker_id))
        return receipt

    def _fenced(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except WriteRefused as exc:
            self._mark_lost(f"{type(exc).__name__}: {exc.message}")
            raise LeaseLost(str(exc), attempt_id=self.attempt_id, task_id=self.task.id) from exc


def renew_together(ctxs: list[Context]) -> list[Context]:
    """One background renewal of each of these Attempts' leases (one client, one worker) in one round trip;
    returns those whose lease is gone for good. A single Attempt makes the single call."""
    if len(ctxs) == 1:
        return [] if ctxs[0].background_beat() else ctxs
    with contextlib.ExitStack() as held:
        for ctx in ctxs:
            held.enter_context(ctx.heartbeat_lock)
        beating = [c for c in ctxs if c.heartbeating]
        gone = [c for c in ctxs if not c.heartbeating]
        if not beating:
            return gone
        try:
            batch = beating[0].client.leases.batch(beating[0].worker_id,
                                                   renew=[(c.attempt_id, c.fence) for c in beating])
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.warning("heartbeats of %d attempts failed (%s); retrying", len(beating), exc)
            return gone
        except McqError as exc:  # namespace lost or similar: none of them claims authority any more
            for c in beating:
                c.take_renewal(exc)
            return ctxs
        return gone + [c for c, outcome in zip(beating, batch.renewed, strict=True) if not c.take_renewal(outcome)]


class HeartbeatService:
    """One daemon thread per process renews the lease of every registered Attempt every third of its
    lease, whether or not the handler ever yields. Recreated after a fork (threads do not survive one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._due: dict[int, tuple[float, float, Context]] = {}  # id(ctx) -> (next due, interval, ctx)
        self._pid = 0
        self._thread: threading.Thread | None = None

    def register(self, ctx: Context, interval_s: float) -> None:
        with self._lock:
            self._due[id(ctx)] = (time.monotonic() + interval_s, interval_s, ctx)
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="mcq-heartbeat", daemon=True)
                self._thread.start()
        self._wake.set()

    def unregister(self, ctx: Context) -> None:
        with self._lock:
            self._due.pop(id(ctx), None)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                ready = [(k, iv, c) for k, (due, iv, c) in self._due.items() if due <= now]
                for k, iv, c in ready:
                    self._due[k] = (now + iv, iv, c)
                nxt = min((due for due, _, _ in self._due.values()), default=now + 1.0)
            # Every lease due now, one round trip per client and worker (a batch worker holds many).
            groups: dict[tuple[int, str], list[Context]] = {}
            for _k, _, ctx in ready:
                groups.setdefault((id(ctx.client), ctx.worker_id), []).append(ctx)
            for group in groups.values():
                for ctx in renew_together(group):
                    with self._lock:
                        self._due.pop(id(ctx), None)
            self._wake.wait(max(0.0, nxt - time.monotonic()))
            self._wake.clear()


HEARTBEATS = HeartbeatService()

"""Handlers registered by name, and the context a handler runs with.

::

    app = mc_queue.App()

    @app.handler("fix-issue", queue="agents", lease_ms=60_000, budget=mc_queue.Budget(max_attempts=4))
    def fix_issue(ctx: mc_queue.Context, payload: dict) -> dict:
        ctx.checkpoint("workspace_prepared", scope={"repository": payload["repo"]})
        ...
        return {"pull_request": 17}

Handlers are looked up by the name recorded in the task, in the App the worker was started with;
nothing is ever imported from a name found in Redis.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .client import DEFAULT_LEASE_MS, Client
from .codec import canonical_json, digest
from .effects import EffectUnknown, Perform, Reconcile, mint_key
from .errors import CancelRequested, InvalidArgument, McqError, PhaseOutOfOrder, WriteRefused
from .models import Attempt, Manifest, Task
from .policy import Budget, BudgetExceeded, RetryPolicy

if TYPE_CHECKING:
    from .worker import AppClient

DEFAULT_PHASES: tuple[str, ...] = (
    "claimed", "workspace_prepared", "verification_passed", "source_capture_done", "commit_done",
    "result_pending", "result_submitted",
)
DEFAULT_REUSABLE: frozenset[str] = frozenset({"source_capture_done"})
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")

Handler = Callable[["Context", dict[str, Any]], Any]


class LeaseLost(McqError):
    """This Attempt's lease is gone (expired, or ownership moved on): start no further side effect."""


@dataclass(frozen=True)
class HandlerSpec:
    name: str
    fn: Handler
    queue: str
    retry: RetryPolicy
    budget: Budget
    lease_ms: int
    timeout_s: float
    phases: tuple[str, ...]
    reusable_phases: frozenset[str]


@dataclass
class App:
    """A registry of handlers by name, with the defaults they inherit."""

    name: str = "mc_queue"
    default_queue: str = "default"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    budget: Budget = field(default_factory=Budget)
    lease_ms: int = DEFAULT_LEASE_MS
    timeout_s: float = 3600.0
    handlers: dict[str, HandlerSpec] = field(default_factory=dict)
    operations: dict[str, Reconcile] = field(default_factory=dict)

    def operation(self, name: str, reconcile: Reconcile) -> None:
        """Register how to ask the provider whether operation ``name`` with a key happened.

        The sweeper calls it for intents whose worker vanished: ``reconcile(key)`` returns the
        receipt, None when the provider certainly has nothing, or raises when it cannot tell.
        """
        mint_key("q:00000000000000000000000000", name, "x")  # validates the name
        self.operations[name] = reconcile

    def handler(self, name: str, *, queue: str | None = None, retry: RetryPolicy | None = None,
                budget: Budget | None = None, lease_ms: int | None = None, timeout_s: float | None = None,
                phases: tuple[str, ...] | None = None,
                reusable_phases: frozenset[str] | None = None) -> Callable[[Handler], Handler]:
        """Register ``fn(ctx, payload)`` under ``name``. Options are validated here, not at run time."""
        if not _NAME_RE.match(name):
            raise InvalidArgument(f"invalid handler name {name!r}: use 1-128 letters, digits, '_', '.', ':', '-'")
        if name in self.handlers:
            raise InvalidArgument(f"handler {name!r} is registered twice")
        lease = lease_ms or self.lease_ms
        timeout = timeout_s or self.timeout_s
        if lease < 1000:
            raise InvalidArgument(f"handler {name!r}: lease_ms must be at least 1000 (heartbeats run every third)")
        if timeout * 1000 < lease:
            raise InvalidArgument(f"handler {name!r}: timeout_s must be at least one lease length")
        ph = tuple(phases or DEFAULT_PHASES)
        reusable = frozenset(DEFAULT_REUSABLE & set(ph) if reusable_phases is None else reusable_phases)
        if not reusable <= set(ph):
            raise InvalidArgument(f"handler {name!r}: reusable phases {sorted(reusable - set(ph))} are not phases")

        def register(fn: Handler) -> Handler:
            from .keys import check_queue

            self.handlers[name] = HandlerSpec(
                name=name, fn=fn, queue=check_queue(queue or self.default_queue), retry=retry or self.retry,
                budget=budget or self.budget, lease_ms=lease, timeout_s=timeout, phases=ph, reusable_phases=reusable)
            return fn

        return register

    def spec(self, name: str) -> HandlerSpec:
        try:
            return self.handlers[name]
        except KeyError:
            known = ", ".join(sorted(self.handlers)) or "none"
            raise InvalidArgument(
                f"unknown handler {name!r}: app {self.name!r} registers {known}; register it with "
                f"@app.handler({name!r}) in the app the workers run") from None

    def connect(self, url: str | None = None, *, prefix: str | None = None, home: str | None = None) -> AppClient:
        """A client that refuses unknown handlers at enqueue and dispatches Attempts to RQ."""
        from . import connect
        from .worker import AppClient

        return AppClient(self, connect(url, prefix=prefix, home=home))


class Context:
    """What a handler gets: its task, Attempt, fence, payload and manifest, and the calls that
    keep the platform informed. Every call first checks the lease: after a refusal the handler
    learns :class:`LeaseLost` at its next call and may not start another side effect."""

    def __init__(self, client: Client, spec: HandlerSpec, task: Task, attempt: Attempt, fence: int,
                 worker_id: str, workspace: Path | Callable[[], Path],
                 operations: Mapping[str, Reconcile] | None = None) -> None:
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
        self.effects_used = False
        self._lost: str | None = None
        self._cancelled = False
        self._lock = threading.Lock()
        self._beat_lock = threading.Lock()  # serialises background heartbeats with their stop
        self._beating = False

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

    def _check(self) -> None:
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

    def _beat(self, *, cost: float = 0.0, tokens: int = 0, request_id: str | None = None) -> None:
        try:
            hb = self.client.heartbeat(self.attempt_id, self.fence, worker_id=self.worker_id,
                                       lease_ms=self.spec.lease_ms, cost=cost, tokens=tokens, request_id=request_id)
        except WriteRefused as exc:
            self._mark_lost(f"{type(exc).__name__}: {exc.message}")
            raise LeaseLost(str(exc), attempt_id=self.attempt_id, task_id=self.task.id) from exc
        if hb.cancel_requested:
            self._cancelled = True
        self._charged = (hb.cost, hb.tokens)

    # -- the handler's calls

    def heartbeat(self) -> None:
        """Renew the lease now (the worker also does it in the background, every third of a lease).
        Raises LeaseLost when ownership moved on, CancelRequested once a cancel was requested."""
        self._check()
        self._beat()
        self._check()

    def charge(self, cost: float = 0.0, tokens: int = 0) -> None:
        """Charge cost and tokens to this Attempt; raises BudgetExceeded past the task's budget."""
        self._check()
        if cost < 0 or tokens < 0:
            raise InvalidArgument("cost and tokens must be >= 0")
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

    def checkpoint(self, phase: str, data: Any = None, *, scope: Mapping[str, Any] | None = None) -> None:
        """Record that this Attempt reached ``phase`` (fenced; phases only move forward)."""
        self._check()
        if phase not in self.spec.phases:
            raise InvalidArgument(f"unknown phase {phase!r}; handler {self.spec.name!r} declares {self.spec.phases}")
        scope = dict(scope or {})
        record = {"phase": phase, "data": data, "scope": scope, "scope_digest": self.scope_digest(scope),
                  "task": self.task.id, "attempt": self.attempt.number}
        try:
            self.client.checkpoint(self.attempt_id, self.fence, phase, self.spec.phases.index(phase), record,
                                   worker_id=self.worker_id)
        except PhaseOutOfOrder:
            raise
        except WriteRefused as exc:
            self._mark_lost(f"{type(exc).__name__}: {exc.message}")
            raise LeaseLost(str(exc), attempt_id=self.attempt_id, task_id=self.task.id) from exc

    def reusable_checkpoint(self, phase: str, *, scope: Mapping[str, Any] | None = None) -> Any:
        """Data of ``phase`` recorded by an earlier Attempt of this task, when that phase is declared
        reusable (read-only) and its scope binding is identical to this one; else None."""
        self._check()
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

    def effect_key(self, operation: str, identity: str, *, per_attempt: bool = False) -> str:
        return mint_key(self.task.id, operation, identity, self.attempt.number if per_attempt else None)

    def effect(self, operation: str, identity: str, perform: Perform, reconcile: Reconcile | None = None, *,
               per_attempt: bool = False) -> Any:
        """Do a side effect at most once per logical operation, and return the provider's receipt.

        The intent is persisted (fenced) before ``perform(key)`` is called and the receipt after. A
        replay returns the recorded receipt without calling the provider. An intent left without a
        receipt by an earlier Attempt is reconciled with the provider first: found -> its receipt;
        certainly absent -> performed now; unknown -> :class:`EffectUnknown` (nothing is repeated).
        """
        self._check()
        ask = reconcile or self.operations.get(operation)
        if ask is None:
            raise InvalidArgument(f"operation {operation!r} has no reconcile: pass one, or register it with "
                                  f"app.operation({operation!r}, reconcile) so the sweeper can ask the provider")
        key = self.effect_key(operation, identity, per_attempt=per_attempt)
        record = {"operation": operation, "identity": identity, "per_attempt": per_attempt}
        self.effects_used = True
        status, existing = self._fenced(lambda: self.client.effect_begin(
            self.attempt_id, self.fence, key, record, worker_id=self.worker_id))
        if status == "DONE":
            assert existing is not None
            return existing.receipt
        if status == "PENDING":
            try:
                found = ask(key)
            except Exception as exc:
                raise EffectUnknown(f"cannot tell whether {key} happened: {type(exc).__name__}: {exc}",
                                    attempt_id=self.attempt_id, task_id=self.task.id) from exc
            if found is not None:
                self._fenced(lambda: self.client.effect_done(self.attempt_id, self.fence, key, "done", found,
                                                             source="reconcile", actor=self.worker_id))
                return found
            self._fenced(lambda: self.client.effect_done(self.attempt_id, self.fence, key, "absent",
                                                         "provider has no trace of it", source="reconcile",
                                                         actor=self.worker_id))
            status, _ = self._fenced(lambda: self.client.effect_begin(
                self.attempt_id, self.fence, key, record, worker_id=self.worker_id))
            if status != "OK":
                raise EffectUnknown(f"effect {key} changed while it was reconciled ({status})",
                                    attempt_id=self.attempt_id, task_id=self.task.id)
        self._check()
        receipt = perform(key)
        self._fenced(lambda: self.client.effect_done(self.attempt_id, self.fence, key, "done", receipt,
                                                     source="perform", actor=self.worker_id))
        return receipt

    def _fenced(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except WriteRefused as exc:
            self._mark_lost(f"{type(exc).__name__}: {exc.message}")
            raise LeaseLost(str(exc), attempt_id=self.attempt_id, task_id=self.task.id) from exc

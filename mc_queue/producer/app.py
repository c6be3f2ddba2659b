"""Handlers registered by name (the App), with the defaults they inherit.

::

    app = mc_queue.App()

    @app.handler("fix-issue", queue="agents", lease_ms=60_000, budget=mc_queue.Budget(max_attempts=4))
    def fix_issue(ctx: mc_queue.Context, payload: dict) -> dict:
        ctx.checkpoint("workspace_prepared", scope={"repository": payload["repo"]})
        ...
        return {"pull_request": 17}

Handlers are looked up by the name recorded in the task, in the App the worker was started with;
nothing is ever imported from a name found in Redis. What a handler runs with is
:class:`mc_queue.worker.context.Context`; how Attempts reach RQ is :mod:`mc_queue.producer.dispatch`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..client import DEFAULT_LEASE_MS
from ..client.fairness import MAX_WEIGHT
from ..client.limits import BreakerSetting
from ..client.producer import limits_text
from ..client.slots import MAX_SLOTS, ON_FULL, check_slot_key
from ..client.spend import check_ceiling
from ..contracts.codec import check_int, check_seconds, check_text
from ..contracts.config import Budget, Retention, RetryPolicy
from ..contracts.errors import InvalidArgument
from ..contracts.keys import SKIP_STEP, check_limit_name, check_queue
from ..contracts.periodic import CatchUp, Overlap, PeriodicSchedule
from ..policy.effects import Reconcile, mint_key
from ..store.backend import DEFAULT_MAX_LEASE_MS
from .dispatch import AppClient

# A handler that declares no phases names them freely: their order is the order an Attempt reaches
# them. These are the seed's phases; `source_capture_done` (read-only work) is reusable by default.
SEED_PHASES: tuple[str, ...] = (
    "claimed", "workspace_prepared", "verification_passed", "source_capture_done", "commit_done",
    "result_pending", "result_submitted",
)
DEFAULT_REUSABLE: frozenset[str] = frozenset({"source_capture_done"})
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")

Handler = Callable[..., Any]  # fn(ctx: mc_queue.Context, payload: dict) -> JSON result


@dataclass(frozen=True)
class HandlerSpec:
    name: str
    fn: Handler
    queue: str
    retry: RetryPolicy
    budget: Budget
    lease_ms: int
    timeout_s: float
    phases: tuple[str, ...] | None  # the declared order, or None: any name, in the order an Attempt reaches it
    reusable_phases: frozenset[str]
    limits: Mapping[str, int] = field(default_factory=dict)  # rate limit key -> cost, its tasks' by default
    # what its adapter supports: being stopped mid-run (a cancel), a later Attempt resuming from its checkpoints
    can_cancel: bool = True
    can_resume: bool = True


@dataclass(frozen=True)
class Fallback:
    """A prequalified substitute for dependency ``primary`` (``App.fallback``): the dependency ``key`` used
    instead while the primary's circuit breaker is open, with what it changes, declared, not improvised:
    ``quality`` (its semantic equivalence and what is lost), ``cost`` and ``latency`` (how they change),
    ``autonomy`` (a lower autonomy ceiling it imposes, for the handler to respect), and ``params``, what the
    handler calls it with (a model profile and its version: a provider failover changes the frozen model
    version, and the Attempt records the switch)."""

    primary: str
    key: str
    quality: str
    cost: str | None = None
    latency: str | None = None
    autonomy: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def skips(self) -> bool:
        """True for the declaration that the step can be skipped (``App.optional``): no key is called."""
        return self.key == SKIP_STEP


@dataclass(frozen=True)
class ProbeSpec:
    """A declared health probe (``App.probe``): the dependency key it speaks for, the check (raises, or
    returns False, when the dependency is not usable), how often a worker runs it and how long it may take."""

    key: str
    check: Callable[[], Any]
    every_s: float = 5.0
    timeout_s: float = 2.0


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
    # queue -> how long its ended tasks stay in Redis; published by `mcq worker` and `mcq sweeper --app`
    # (an operator's `mcq retention set` wins over it)
    retention: dict[str, Retention] = field(default_factory=dict)
    # name -> periodic schedule (app.periodic); published with the retention policies
    schedules: dict[str, PeriodicSchedule] = field(default_factory=dict)
    # rate limit key -> (units, per seconds); published like retention (an operator's `mcq limits set` wins)
    limits: dict[str, tuple[int, float]] = field(default_factory=dict)
    # dependency key -> its circuit breaker; published the same way (an operator's setting wins)
    breakers: dict[str, BreakerSetting] = field(default_factory=dict)
    # concurrency key (or family 'repo:*') -> (slots, on_full); published the same way
    concurrency_keys: dict[str, tuple[int, str]] = field(default_factory=dict)
    # queue -> its cap (backpressure: tasks not ended); published the same way
    caps: dict[str, int] = field(default_factory=dict)
    # key (or family 'tenant:*') -> (cost, tokens, per seconds, on_over): a spend ceiling; published the same way
    spend_ceilings: dict[str, tuple[float | None, int | None, float, str]] = field(default_factory=dict)
    # fairness key (or family 'tenant:*') -> its weight in the fair lanes; published the same way
    fair_shares: dict[str, int] = field(default_factory=dict)
    # fairness key (or family) -> its cap (tasks naming it not ended, every queue); published the same way
    key_caps: dict[str, int] = field(default_factory=dict)
    # dependency key -> its declared fallbacks, in the order they are tried (published like the breakers)
    fallbacks: dict[str, tuple[Fallback, ...]] = field(default_factory=dict)
    # dependency key -> its health probe, run by each worker process (mc_queue.worker.probes)
    probes: dict[str, ProbeSpec] = field(default_factory=dict)

    def publish_retention(self, client: Any) -> None:
        """Record this App's retention policies and periodic schedules in the namespace (source 'app'). An
        App that declares schedules withdraws those it published before (same App name) and no longer
        declares; an App that declares none leaves every schedule alone (a worker of a smaller App)."""
        for queue, policy in self.retention.items():
            client.operator.set_retention(check_queue(queue), policy, source="app")
        for key, (units, per_s) in self.limits.items():
            client.limits.set(key, units, per_s, source="app", reason=f"declared by app {self.name}")
        for key, setting in self.breakers.items():
            client.limits.set_breaker(key, setting, source="app", reason=f"declared by app {self.name}")
        for key, (slots, on_full) in self.concurrency_keys.items():
            client.slots.set(key, slots, on_full=on_full, source="app", reason=f"declared by app {self.name}")
        for queue, depth in self.caps.items():
            client.caps.set(queue, depth, source="app", reason=f"declared by app {self.name}")
        for key, fbs in self.fallbacks.items():
            client.limits.set_fallbacks(key, [fb.key for fb in fbs], source="app",
                                        reason=f"declared by app {self.name}")
        for key, (cost, tokens, per_s, on_over) in self.spend_ceilings.items():
            client.spend.set(key, cost=cost, tokens=tokens, per_s=per_s, on_over=on_over, source="app",
                             reason=f"declared by app {self.name}")
        for key, weight in self.fair_shares.items():
            client.fairness.set_weight(key, weight, source="app", reason=f"declared by app {self.name}")
        for key, max_open in self.key_caps.items():
            client.caps.set_key(key, max_open, source="app", reason=f"declared by app {self.name}")
        for schedule in self.schedules.values():
            client.periodic.publish(schedule)
        if self.schedules:
            for name, published in client.periodic.definitions().items():
                if published.app == self.name and name not in self.schedules:
                    client.periodic.withdraw(name)

    def periodic(self, name: str, handler: str, *, cron: str | None = None, every_s: float | None = None,
                 payload: dict[str, Any] | None = None, tz: str = "UTC", overlap: Overlap = "skip",
                 catch_up: CatchUp = "last", catch_up_window_s: float = 86_400.0, late_s: float = 60.0,
                 anchor: datetime | None = None) -> PeriodicSchedule:
        """Declare a periodic schedule of a registered handler: ``cron`` (five fields, in ``tz``) or
        ``every_s`` (ticks at ``anchor`` + k * every_s, the epoch by default). Each tick makes one task with
        ``payload``, whatever number of sweepers run. ``overlap``: what a tick does while the previous
        tick's task has not ended (skip, queue, cancel it); ``catch_up``: what ticks missed while no
        sweeper ran do (none, last, all within ``catch_up_window_s``); a tick is missed once it is
        ``late_s`` old. Validated here; published by ``mcq sweeper --app`` and ``mcq worker``."""
        spec = self.spec(handler)
        if name in self.schedules:
            raise InvalidArgument(f"periodic schedule {name!r} is declared twice")
        if anchor is not None and (anchor.tzinfo is None or anchor.utcoffset() is None):
            raise InvalidArgument("anchor must be a datetime with a time zone")
        try:
            schedule = PeriodicSchedule(
                name=name, handler=handler, queue=spec.queue, payload=dict(payload or {}), cron=cron,
                every_s=every_s, tz=tz, overlap=overlap, catch_up=catch_up, catch_up_window_s=catch_up_window_s,
                late_s=late_s, anchor_ms=round(anchor.timestamp() * 1000) if anchor else 0, app=self.name,
                retry_policy=spec.retry.model_dump(mode="json"), budget=spec.budget.model_dump(mode="json"),
                lease_ms=spec.lease_ms, timeout_s=spec.timeout_s)
        except ValueError as exc:
            raise InvalidArgument(f"periodic schedule {name!r}: {exc}") from None
        self.schedules[name] = schedule
        return schedule

    def limit(self, key: str, units: int, *, per_s: float) -> None:
        """Declare the rate limit of ``key`` ('github', 'model:openai'): ``units`` per sliding window of
        ``per_s`` seconds, fleet-wide (published by ``mcq worker`` and ``mcq sweeper --app``; an operator's
        ``mcq limits set`` wins). Tasks name the keys they need: ``@app.handler(..., limits={key: cost})``."""
        try:
            check_limit_name(key)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        check_int(units, what="units", low=1, high=999_999_999)
        check_seconds(per_s, what="per_s", high=30 * 86_400)
        self.limits[key] = (units, float(per_s))

    def breaker(self, key: str, *, failure_rate: float = 0.5, min_calls: int = 10, window_s: float = 60.0,
                open_s: float = 30.0, probes: int = 1, slow_s: float | None = None, slow_rate: float = 0.5,
                same_failure: int = 0) -> None:
        """Declare the circuit breaker of dependency ``key`` (:class:`mc_queue.client.limits.BreakerSetting`):
        while it is open no task naming the key is claimed; its calls go through ``ctx.call(key, fn)``, which
        records their outcomes. Published like :meth:`limit`; an operator's setting wins."""
        try:
            check_limit_name(key)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        setting = BreakerSetting(failure_rate=failure_rate, min_calls=min_calls, window_s=window_s, open_s=open_s,
                                 probes=probes, slow_s=slow_s, slow_rate=slow_rate, same_failure=same_failure)
        setting.text()  # InvalidArgument now, not at publication
        self.breakers[key] = setting

    def concurrency(self, key: str, slots: int, *, on_full: str = "wait") -> None:
        """Declare the concurrency key ``key`` (a bulkhead: 'tenant:acme', or a family 'repo:*' giving each
        'repo:<name>' its own slots): at most ``slots`` running Attempts of the tasks that name it
        (``enqueue(limits={key: 1})``), fleet-wide; one slot is a writer lease (``ctx.writer_fence(key)``).
        ``on_full``: wait (in line), reject (the new task is canceled) or supersede (the oldest running one
        is). Published like :meth:`limit`; an operator's ``mcq slots set`` wins."""
        check_slot_key(key)
        check_int(slots, what="slots", low=1, high=MAX_SLOTS)
        if on_full not in ON_FULL:
            raise InvalidArgument(f"on_full must be one of {', '.join(ON_FULL)}, got {on_full!r}")
        self.concurrency_keys[key] = (slots, on_full)

    def cap(self, queue: str, max_depth: int) -> None:
        """Cap ``queue`` at ``max_depth`` tasks not ended (backpressure, :mod:`mc_queue.client.caps`): beyond it
        enqueue refuses with :class:`~mc_queue.contracts.errors.QueueFull` and a retry-after, the lowest
        priorities first. Published like :meth:`limit`; an operator's cap wins."""
        check_queue(queue)
        check_int(max_depth, what="max_depth", low=1, high=100_000_000)
        self.caps[queue] = max_depth

    def key_cap(self, key: str, max_open: int) -> None:
        """Cap fairness key ``key`` (or each key of a family 'tenant:*') at ``max_open`` tasks naming it
        (``fair_key``) that have not ended, in every queue: beyond it enqueue refuses the key's new work with
        :class:`~mc_queue.contracts.errors.QueueFull`, the lowest priorities first. Published like
        :meth:`limit`; an operator's ``mcq fair cap`` wins."""
        check_slot_key(key)
        check_int(max_open, what="max_open", low=1, high=100_000_000)
        self.key_caps[key] = max_open

    def spend_ceiling(self, key: str, *, cost: float | None = None, tokens: int | None = None, per_s: float,
                      on_over: str = "wait") -> None:
        """Declare a spend ceiling (denial of wallet, :mod:`mc_queue.client.spend`): the Attempts of the tasks
        naming ``key`` (or each key of a family 'tenant:*') spend at most ``cost`` and/or ``tokens`` in any
        ``per_s`` seconds, each admitted with its budget's remainder reserved. ``on_over``: wait or reject.
        Published like :meth:`limit`; an operator's ``mcq spend set`` wins."""
        check_ceiling(key, cost, tokens, per_s, on_over)  # InvalidArgument now, not at publication
        self.spend_ceilings[key] = (cost, tokens, per_s, on_over)

    def fair_share(self, key: str, weight: int) -> None:
        """Declare the weight of fairness key ``key`` (or of each key of a family 'tenant:*'): while it and
        others have messages queued, its tasks get ``weight`` turns for one of a key of weight 1 (tasks name
        their key: ``enqueue(..., fair_key="tenant:acme")``; :mod:`mc_queue.client.fairness`). Published like
        :meth:`limit`; an operator's ``mcq fair set`` wins."""
        check_slot_key(key)
        check_int(weight, what="weight", low=1, high=MAX_WEIGHT)
        self.fair_shares[key] = weight

    def fallback(self, primary: str, key: str, *, quality: str, cost: str | None = None, latency: str | None = None,
                 autonomy: str | None = None, params: Mapping[str, Any] | None = None) -> Fallback:
        """Declare ``key`` a prequalified fallback of dependency ``primary`` (tried in the order declared):
        while the primary's circuit breaker is open, its tasks are still claimed when a fallback is up, and a
        handler's ``ctx.call(primary, fn, fallback=use)`` calls ``use(fallback)`` through the fallback's
        gateway instead, the switch recorded on the Attempt (``Attempt.fallbacks``, a ``fallback_used``
        event). Handlers naming the primary name its fallbacks too (cost 0), declared before or after them."""
        try:
            for k in (primary, key):
                check_limit_name(k)
        except ValueError as exc:
            raise InvalidArgument(f"{exc} (a step that can be skipped: App.optional)") from None
        fb = self._declare(Fallback(primary, key, quality, cost, latency, autonomy, dict(params or {})))
        for name, spec in self.handlers.items():  # handlers declared before: they name the fallback too
            if primary in spec.limits and key not in spec.limits:
                self.handlers[name] = replace(spec, limits={**spec.limits, key: 0})
        return fb

    def optional(self, primary: str, *, quality: str, cost: str | None = None,
                 latency: str | None = None) -> Fallback:
        """Declare that the step calling dependency ``primary`` can be skipped (tried after every fallback):
        while its breaker is down and no declared fallback is up, its tasks are still claimed, and a handler's
        ``ctx.call(primary, fn, fallback=use)`` calls ``use(fb)`` with ``fb.skips`` True instead, the skip
        recorded on the Attempt (``Attempt.fallbacks``: primary -> ``SKIP_STEP``, a ``step_skipped`` event).
        ``quality``: what the result lacks without the step."""
        try:
            check_limit_name(primary)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if any(fb.skips for fb in self.fallbacks.get(primary, ())):
            raise InvalidArgument(f"the step calling {primary!r} is declared optional once")
        return self._declare(Fallback(primary, SKIP_STEP, quality, cost, latency))

    def _declare(self, fb: Fallback) -> Fallback:
        check_text(fb.quality, what="quality", max_bytes=500, min_chars=1)
        have = self.fallbacks.get(fb.primary, ())
        if fb.key == fb.primary or any(f.key == fb.key for f in have) or len(have) >= 8:
            raise InvalidArgument(f"fallback {fb.key!r} of {fb.primary!r}: at most 8, distinct, not the primary "
                                  "itself")
        self.fallbacks[fb.primary] = tuple(sorted((*have, fb), key=lambda f: f.skips))  # (the skip is tried last)
        return fb

    def probe(self, key: str, check: Callable[[], Any], *, every_s: float = 5.0, timeout_s: float = 2.0) -> None:
        """Declare the health probe of dependency ``key``: each worker process calls ``check()`` every
        ``every_s`` (bounded by ``timeout_s``); while it raises, returns False or hangs, that worker claims no
        Attempt of a task naming the key (``needs=[key]`` or ``limits``). Cheap checks only (a HEAD request,
        a token's validity): it is this worker's view, the breaker is the fleet's (mc_queue.worker.probes)."""
        try:
            check_limit_name(key)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not callable(check):
            raise InvalidArgument(f"the probe of {key} must be callable, got {type(check).__name__}")
        check_seconds(every_s, what="every_s", high=3600)
        check_seconds(timeout_s, what="timeout_s", high=600)
        self.probes[key] = ProbeSpec(key, check, float(every_s), float(timeout_s))

    def operation(self, name: str, reconcile: Reconcile) -> None:
        """Register how to ask the provider whether operation ``name`` with a key happened.

        The sweeper calls it for intents whose worker vanished: ``reconcile(key)`` returns the
        receipt, None when the provider certainly has nothing, or raises when it cannot tell.
        """
        mint_key("q:00000000000000000000000000", name, "x")  # validates the name
        self.operations[name] = reconcile

    def handler(self, name: str, *, queue: str | None = None, retry: RetryPolicy | None = None,
                budget: Budget | None = None, lease_ms: int | None = None, timeout_s: float | None = None,
                phases: tuple[str, ...] | None = None, reusable_phases: frozenset[str] | None = None,
                limits: Mapping[str, int] | None = None, needs: tuple[str, ...] | list[str] = (),
                can_cancel: bool = True, can_resume: bool = True) -> Callable[[Handler], Handler]:
        """Register ``fn(ctx, payload)`` under ``name``. Options are validated here, not at run time.

        ``phases``: the checkpoint phases (``ctx.checkpoint(phase)``) in the order an Attempt must reach
        them; a phase not in the list stops the task as a configuration failure. Without it any phase
        name goes, in the order the Attempt first reaches it (a phase already reached cannot be recorded
        again with other data). ``reusable_phases``: phases whose data a later Attempt may reuse when
        its scope binding is identical (default: ``source_capture_done``). ``limits``: the rate limits its
        tasks need and the cost of each in units (``{"github": 1}``; :meth:`limit` sets a key's limit).
        ``needs``: dependencies its tasks need without taking units (cost 0): their circuit breakers
        (:meth:`breaker`) hold the tasks' claims while open. What its adapter supports, declared:
        ``can_cancel=False`` (it cannot be stopped mid-run: a concurrency key that supersedes its running
        holder waits for it instead of canceling it, so two never write at once), ``can_resume=False`` (a
        later Attempt starts over: no phase's checkpoint is reused)."""
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise InvalidArgument(f"invalid handler name {name!r}: use 1-128 letters, digits, '_', '.', ':', '-'")
        if name in self.handlers:
            raise InvalidArgument(f"handler {name!r} is registered twice")
        lease = lease_ms or self.lease_ms
        timeout = timeout_s or self.timeout_s
        if isinstance(lease, bool) or not isinstance(lease, int) or not 1000 <= lease <= DEFAULT_MAX_LEASE_MS:
            raise InvalidArgument(f"handler {name!r}: lease_ms must be an integer from 1000 (heartbeats run every "
                                  f"third) to {DEFAULT_MAX_LEASE_MS} (the default namespace ceiling)")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 30 * 86_400:
            raise InvalidArgument(f"handler {name!r}: timeout_s must be a number of seconds up to 30 days")
        if timeout * 1000 < lease:
            raise InvalidArgument(f"handler {name!r}: timeout_s must be at least one lease length")
        ph = None if phases is None else tuple(phases)
        if ph is not None and (not ph or len(set(ph)) != len(ph) or not all(
                isinstance(p, str) and _NAME_RE.fullmatch(p) for p in ph)):
            raise InvalidArgument(f"handler {name!r}: phases must be distinct names (letters, digits, '_', '.', ':', "
                                  f"'-'), in the order an Attempt reaches them; got {phases!r}")
        for what, flag in (("can_cancel", can_cancel), ("can_resume", can_resume)):
            if not isinstance(flag, bool):
                raise InvalidArgument(f"handler {name!r}: {what} must be True or False, got {flag!r}")
        if not can_resume and reusable_phases:
            raise InvalidArgument(f"handler {name!r}: can_resume=False reuses no phase, yet reusable_phases "
                                  f"names {sorted(reusable_phases)}")
        reusable: frozenset[str]
        if not can_resume:
            reusable = frozenset()
        elif reusable_phases is None:
            reusable = frozenset(DEFAULT_REUSABLE if ph is None else DEFAULT_REUSABLE & set(ph))
        else:
            reusable = frozenset(reusable_phases)
        if ph is not None and not reusable <= set(ph):
            raise InvalidArgument(f"handler {name!r}: reusable phases {sorted(reusable - set(ph))} are not phases")
        if isinstance(needs, str):
            raise InvalidArgument(f"handler {name!r}: needs is a list of dependency keys, got the string {needs!r}")
        all_limits = {**{key: 0 for key in needs}, **dict(limits or {})}
        for key in list(all_limits):  # a dependency's declared fallbacks: its tasks name them too
            for fb in self.fallbacks.get(key, ()):
                if not fb.skips:
                    all_limits.setdefault(fb.key, 0)
        limits_text(all_limits)  # InvalidArgument for a bad key or cost, now rather than at enqueue

        def register(fn: Handler) -> Handler:
            self.handlers[name] = HandlerSpec(
                name=name, fn=fn, queue=check_queue(queue or self.default_queue), retry=retry or self.retry,
                budget=budget or self.budget, lease_ms=lease, timeout_s=timeout, phases=ph, reusable_phases=reusable,
                limits=all_limits, can_cancel=can_cancel, can_resume=can_resume)
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
        from ..client.connect import connect

        return AppClient(self, connect(url, prefix=prefix, home=home))

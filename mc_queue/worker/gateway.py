"""The tool gateway of a running Attempt's dependencies: every call to a provider behind a key the task
names goes through it (``ctx.calling``, ``ctx.call``). Before the call its circuit breaker is checked and
its rate limit's units are counted from now (``lua/limit_stamp.lua``); after it, the outcome is recorded
for the breaker (``lua/breaker_record.lua``). When the breaker is open and the App declared fallbacks for
the key (``App.fallback``), the reliability controller chooses the first one that is up and the call goes
there, the switch recorded on the Attempt; a step declared optional (``App.optional``) is skipped when no
fallback is up, the skip recorded; with none, or no fallback given, the call is refused before it starts
(a capacity failure, retried when the breaker half-opens)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import redis

from ..client import Client
from ..contracts.errors import BreakerOpen, McqError, OverLimit
from ..contracts.models import FailureClass
from ..policy.classify import CapacityError, DependencyDown, RateLimited, classify
from ..producer.app import Fallback

log = logging.getLogger("mc_queue.worker")
T = TypeVar("T")
# Failure classes that count against a dependency's circuit breaker (its availability, not the request's).
DEPENDENCY_CLASSES = frozenset({FailureClass.PROVIDER, FailureClass.CAPACITY, FailureClass.EXECUTOR})


class Gateway:
    """One Attempt's gateway. ``check`` raises when the Attempt may not call (lease lost, cancel requested);
    ``fenced`` runs a fenced write, turning a refusal into a lost lease; ``now_ms`` is Redis's clock as the
    Attempt knows it; ``time_for`` the timeout budget's check; ``fallbacks`` the App's declarations."""

    def __init__(self, client: Client, attempt_id: str, fence: int, worker_id: str, *, check: Callable[[], None],
                 fenced: Callable[[Callable[[], Any]], Any], now_ms: Callable[[], int],
                 time_for: Callable[[str, float], float], fallbacks: Mapping[str, tuple[Fallback, ...]]) -> None:
        self.client, self.attempt_id, self.fence, self.worker_id = client, attempt_id, fence, worker_id
        self.check, self.fenced, self.now_ms, self.time_for = check, fenced, now_ms, time_for
        self.fallbacks = fallbacks

    def calling(self, key: str) -> None:
        """The gateway of ``key`` right before its call (see ``Context.calling``)."""
        self.check()
        try:
            self.fenced(lambda: self.client.leases.stamp_limit(self.attempt_id, self.fence, key,
                                                               worker_id=self.worker_id))
        except OverLimit as exc:
            raise CapacityError(str(exc), retry_after=max(0.0, (exc.due_ms - self.now_ms()) / 1000)) from exc
        except BreakerOpen as exc:
            raise DependencyDown(str(exc), retry_after=max(0.0, (exc.until_ms - self.now_ms()) / 1000)) from exc

    def call(self, key: str, fn: Callable[[], T], needs_s: float | None,
             fallback: Callable[[Fallback], T] | None) -> T:
        """Call ``key`` (see ``Context.call``); while its breaker is open, ``fallback(chosen)`` through the
        first declared fallback that is up."""
        if needs_s is not None:
            self.time_for(f"a call to {key}", needs_s)
        try:
            self.calling(key)
        except DependencyDown as down:
            if fallback is None:
                raise
            chosen = self._choose(key, down)
            if chosen is not None and chosen.skips:  # the step is skipped: no dependency is called
                return fallback(chosen)
            if chosen is not None:
                return self._outcome(chosen.key, lambda: fallback(chosen))
        return self._outcome(key, fn)

    def _choose(self, primary: str, down: DependencyDown) -> Fallback | None:
        """The reliability controller: the first declared fallback of ``primary`` whose gateway admits the
        call as its stand-in (the switch recorded, fenced, by ``lua/limit_stamp.lua``); None when the primary
        is up again (its own call stamped); ``down`` raised again when none is up (each refusal logged)."""
        for fb in self.fallbacks.get(primary, ()):
            try:
                used = self.fenced(self._stand_in(fb))
            except (BreakerOpen, OverLimit) as exc:
                log.info("attempt %s: fallback %s of %s is not usable: %s", self.attempt_id, fb.key, primary, exc)
                continue
            if not used:  # the primary's breaker closed meanwhile: the call is its own again
                self.calling(primary)
                return None
            if fb.skips:
                log.warning("attempt %s: %s is down, skipping the step (%s)", self.attempt_id, primary, fb.quality)
            else:
                log.warning("attempt %s: %s is down, calling its fallback %s (%s)", self.attempt_id, primary,
                            fb.key, fb.quality)
            return fb
        raise down

    def _stand_in(self, fb: Fallback) -> Callable[[], bool]:
        if fb.skips:
            return lambda: self.client.leases.stamp_skip(self.attempt_id, self.fence, fb.primary,
                                                         worker_id=self.worker_id)
        return lambda: self.client.leases.stamp_fallback(self.attempt_id, self.fence, fb.key, fb.primary,
                                                         worker_id=self.worker_id)

    def _outcome(self, key: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            result = fn()
        except Exception as exc:
            failure = classify(exc).failure
            down = failure.failure_class in DEPENDENCY_CLASSES and not isinstance(exc, (RateLimited, DependencyDown))
            self._record(key, not down, started, failure.fingerprint if down else "")
            raise
        self._record(key, True, started, "")
        return result

    def _record(self, key: str, ok: bool, started: float, fingerprint: str) -> None:
        elapsed = round((time.monotonic() - started) * 1000)
        try:
            self.client.limits.record(key, ok, elapsed, fingerprint=fingerprint, attempt_id=self.attempt_id,
                                      actor=self.worker_id)
        except (McqError, redis.RedisError) as exc:  # the call's own outcome stands; the breaker misses one
            log.warning("attempt %s: the outcome of a call to %s was not recorded for its breaker: %s",
                        self.attempt_id, key, exc)

"""Failure classes, retry policy and budgets: what happens after an Attempt fails.

Every failure is classified before anything is decided. The decision is one of:

- ``retry``      a new Attempt N+1, due after a backoff with full jitter (transient classes), or
                 carrying the handler's changed hypothesis (validation, repository);
- ``stop``       the task is blocked with an attention item saying what was tried, what changed
                 between tries and why another automatic Attempt is unsafe;
- ``quarantine`` the task is dead-lettered with its whole history (internal failures, poison).

The decision is computed here, from the task's recorded history, and applied atomically by
``fail.lua`` together with the failure itself. Only the holder of the current fence can fail an
Attempt, so the history it was computed from cannot change underneath it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..contracts.config import Budget, Decision, RetryPolicy, parse_config
from ..contracts.failures import fingerprint, format_traceback
from ..contracts.models import Attempt, Failure, FailureClass, Task

# --------------------------------------------------------------------------- typed handler errors


class HandlerError(Exception):
    """Raise from a handler to classify a failure. ``hypothesis`` is what a next Attempt would change."""

    failure_class: FailureClass = FailureClass.INTERNAL

    def __init__(self, message: str = "", *, hypothesis: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.hypothesis = hypothesis
        self.retry_after = retry_after


class AuthorizationError(HandlerError):
    failure_class = FailureClass.AUTHORIZATION


class ConfigurationFailure(HandlerError):
    failure_class = FailureClass.CONFIGURATION


class CapacityError(HandlerError):
    failure_class = FailureClass.CAPACITY


class RateLimited(CapacityError):
    """The provider behind rate limit ``key`` refused for capacity (a 429 with Retry-After): the worker
    pauses that key fleet-wide for ``retry_after`` seconds (every claim of a task naming it waits) and the
    Attempt fails as a capacity failure, retried after the pause; never counted as the same failure
    repeating (poison). :meth:`from_response` reads an httpx response's Retry-After."""

    def __init__(self, key: str, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message or f"rate limited by the provider of {key}", retry_after=retry_after)
        self.key = key

    @classmethod
    def from_response(cls, key: str, response: Any, *, default_s: float = 1.0) -> RateLimited:
        wait = _retry_after(response.headers.get("Retry-After"))
        return cls(key, f"{response.status_code} from the provider of {key}", retry_after=default_s if wait is None
                   else wait)


class DependencyDown(CapacityError):
    """A dependency call refused before it started: its circuit breaker is open (or half-open and this
    Attempt is no probe). A capacity failure retried after ``retry_after`` (when the breaker half-opens);
    never counted as the same failure repeating (poison)."""


class ProviderError(HandlerError):
    failure_class = FailureClass.PROVIDER


class ExecutorError(HandlerError):
    failure_class = FailureClass.EXECUTOR


class TimeoutBudgetExceeded(ExecutorError):
    """A call would not fit in what is left of the Attempt's timeout budget: refused before it started
    (an executor failure: the Attempt ran out of its time; a retry is a new Attempt with a new budget)."""


class ValidationFailure(HandlerError):
    failure_class = FailureClass.VALIDATION


class RepositoryError(HandlerError):
    failure_class = FailureClass.REPOSITORY


class InternalError(HandlerError):
    failure_class = FailureClass.INTERNAL


class Retry(HandlerError):
    """Ask for another Attempt after ``delay`` seconds (a transient condition the handler knows of)."""

    failure_class = FailureClass.CAPACITY

    def __init__(self, message: str = "retry requested by the handler", *, delay: float | None = None,
                 hypothesis: str | None = None) -> None:
        super().__init__(message, hypothesis=hypothesis, retry_after=delay)


class NonRetryable(HandlerError):
    """A failure no automatic Attempt can fix: the task stops and asks for attention.

    ``why_unsafe`` (a class attribute) says why in the attention item; None: the handler declared it so."""

    why_unsafe: str | None = None
    attention_kind = "non_retryable"

    def __init__(self, message: str = "", *, failure_class: FailureClass | str = FailureClass.VALIDATION) -> None:
        super().__init__(message)
        self.failure_class = FailureClass(failure_class)


class BudgetExceeded(NonRetryable):
    """A charge took the task past its cost or token budget: the task stops for a person."""

    def __init__(self, message: str) -> None:
        super().__init__(message, failure_class=FailureClass.CAPACITY)


@dataclass(frozen=True)
class Classified:
    failure: Failure
    hypothesis: str | None = None
    retry_after: float | None = None
    non_retryable: bool = False
    why_unsafe: str | None = None  # a NonRetryable's own explanation (mc_queue's, e.g. EffectUnknown)
    attention_kind: str = "non_retryable"


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            from datetime import UTC, datetime

            return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
        except (TypeError, ValueError):
            return None


def classify(exc: BaseException) -> Classified:
    """Map an exception to a failure class; typed handler errors first, then common exceptions."""
    type_name = type(exc).__qualname__
    message = str(exc)
    fc: FailureClass
    retry_after: float | None = None
    hypothesis: str | None = None
    if isinstance(exc, HandlerError):
        fc, retry_after, hypothesis = exc.failure_class, exc.retry_after, exc.hypothesis
    else:
        fc, retry_after = _classify_common(exc)
    failure = Failure(failure_class=fc, type=type_name, message=message[:2000],
                      fingerprint=fingerprint(fc, type_name, message),
                      retryable=not isinstance(exc, NonRetryable), traceback=format_traceback(exc))
    if isinstance(exc, NonRetryable):
        return Classified(failure, hypothesis, retry_after, True, exc.why_unsafe, exc.attention_kind)
    return Classified(failure, hypothesis, retry_after)


# Exception types outside mc_queue mapped to a failure class: providers register their own errors
# (mc_queue.providers.git registers GitError as a repository failure) instead of this module importing them.
Classifier = Callable[[BaseException], "tuple[FailureClass, float | None] | None"]
_REGISTERED: list[tuple[type[BaseException], FailureClass | Classifier]] = []


def register_failure_class(exc_type: type[BaseException], failure_class: FailureClass | Classifier) -> None:
    """Classify ``exc_type`` (and its subclasses) as ``failure_class``, or by a function returning
    (class, retry_after) or None to fall through. Later registrations take precedence."""
    _REGISTERED.insert(0, (exc_type, failure_class))


def _classify_common(exc: BaseException) -> tuple[FailureClass, float | None]:
    for exc_type, how in _REGISTERED:
        if isinstance(exc, exc_type):
            if isinstance(how, FailureClass):
                return how, None
            found = how(exc)
            if found is not None:
                return found
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        if status in (401, 403):
            return FailureClass.AUTHORIZATION, None
        if status in (408, 425, 429, 503):
            return FailureClass.CAPACITY, _retry_after(exc.response.headers.get("Retry-After"))
        if status >= 500:
            return FailureClass.PROVIDER, None
        if status in (400, 404, 409, 422):
            return FailureClass.VALIDATION, None
        return FailureClass.PROVIDER, None
    if isinstance(exc, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)):
        return FailureClass.PROVIDER, None
    if isinstance(exc, (TimeoutError, ConnectionError, subprocess.TimeoutExpired)):
        return FailureClass.PROVIDER, None
    if type(exc).__name__ == "JobTimeoutException":  # RQ killed a hung handler
        return FailureClass.EXECUTOR, None
    if isinstance(exc, MemoryError):
        return FailureClass.EXECUTOR, None
    if isinstance(exc, PermissionError):
        return FailureClass.AUTHORIZATION, None
    return FailureClass.INTERNAL, None


def _history(task: Task, current: Attempt, failure: Failure) -> list[dict[str, Any]]:
    rows = []
    for a in task.attempts:
        f = failure if a.number == current.number else a.failure
        rows.append({
            "attempt": a.number, "state": "failed" if a.number == current.number else a.state.value,
            "reason": a.reason, "hypothesis": a.hypothesis,
            "failure_class": f.failure_class.value if f else None, "fingerprint": f.fingerprint if f else None,
            "message": (f.message[:300] if f else None), "cost": a.cost, "tokens": a.tokens,
        })
    return rows


def _changes(task: Task) -> list[str]:
    out = []
    prev: Attempt | None = None
    for a in task.attempts:
        if prev is not None:
            if a.hypothesis and a.hypothesis != prev.hypothesis:
                out.append(f"attempt {a.number}: hypothesis changed to {a.hypothesis!r}")
            else:
                out.append(f"attempt {a.number}: no change of hypothesis ({a.reason})")
        prev = a
    return out


def decide(task: Task, attempt: Attempt, classified: Classified, policy: RetryPolicy, budget: Budget, *,
           cost: float = 0.0, tokens: int = 0, elapsed_s: float | None = None) -> Decision:
    """Decide what follows a failed Attempt, from the task's recorded history alone."""
    failure = classified.failure
    fc = failure.failure_class
    history = _history(task, attempt, failure)
    same_fp = sum(1 for row in history if row["fingerprint"] == failure.fingerprint)
    total_cost = sum(a.cost for a in task.attempts if a.number != attempt.number) + cost
    total_tokens = sum(a.tokens for a in task.attempts if a.number != attempt.number) + tokens
    interruptions = sum(1 for e in task.events if e.type == "attempt_created" and e.fields.get("actor") == "operator")

    def attention(kind: str, why_unsafe: str) -> dict[str, Any]:
        return {
            "task_id": task.id, "kind": kind, "failure_class": fc.value, "fingerprint": failure.fingerprint,
            "summary": f"{task.handler} on {task.id}: {fc.value} failure ({failure.type}: {failure.message[:200]})",
            "tried": history, "changed": _changes(task), "why_unsafe": why_unsafe,
            "budget": {"attempts": f"{attempt.number}/{budget.max_attempts}",
                       "same_fingerprint": f"{same_fp}/{budget.max_same_fingerprint}",
                       "cost": total_cost, "tokens": total_tokens, "interruptions": interruptions},
        }

    def stop(kind: str, why: str, exhausted: str = "") -> Decision:
        return Decision("stop", why, attention=attention(kind, why), budget_exhausted=exhausted)

    action = policy.actions[fc]
    if failure.type == BudgetExceeded.__qualname__:
        return stop("budget_exhausted", f"budget exhausted: {failure.message}", "cost_or_tokens")
    if classified.non_retryable:
        return stop(classified.attention_kind,
                    classified.why_unsafe or f"the handler declared this {fc.value} failure non-retryable")
    if action == "quarantine":
        return Decision("quarantine", f"{fc.value} failures quarantine the task for a person to examine",
                        attention=attention("quarantined", "an internal failure means the platform or the handler "
                                            "is broken; repeating it cannot help"))
    if action == "stop":
        return stop(fc.value, f"{fc.value} failures are never retried automatically: a person must fix the cause")
    # Budgets: any one exhausted stops the task.
    exhausted = None
    if attempt.number >= budget.max_attempts:
        exhausted = ("attempts", f"all {budget.max_attempts} attempts are used")
    elif same_fp >= budget.max_same_fingerprint and failure.type not in (RateLimited.__qualname__,
                                                                         DependencyDown.__qualname__):
        return Decision("quarantine", f"poison: the same failure ({failure.fingerprint}) happened {same_fp} times",
                        attention=attention("poison", f"the same failure repeated {same_fp} times; another attempt "
                                            "would fail the same way"), budget_exhausted="same_fingerprint")
    elif budget.max_cost is not None and total_cost >= budget.max_cost:
        exhausted = ("cost", f"cost {total_cost:g} reached the budget of {budget.max_cost:g}")
    elif budget.max_tokens is not None and total_tokens >= budget.max_tokens:
        exhausted = ("tokens", f"{total_tokens} tokens reached the budget of {budget.max_tokens}")
    elif budget.max_wall_s is not None and elapsed_s is not None and elapsed_s >= budget.max_wall_s:
        exhausted = ("wall_time", f"{elapsed_s:.0f}s of wall time reached the budget of {budget.max_wall_s:g}s")
    elif interruptions > budget.max_interruptions:
        exhausted = ("interruptions", f"{interruptions} human interruptions exceed the budget of "
                     f"{budget.max_interruptions}")
    if exhausted:
        return stop("budget_exhausted", f"budget exhausted: {exhausted[1]}; another automatic attempt would "
                    "spend more on the same evidence", exhausted[0])
    if action == "retry_if_new_hypothesis":
        tried = {a.hypothesis for a in task.attempts if a.hypothesis}
        if not classified.hypothesis or classified.hypothesis in tried:
            return stop(fc.value, f"a {fc.value} failure is retried only with a changed hypothesis, and the handler "
                        "gave none that was not tried already; repeating the same action would fail the same way")
        if same_fp > 1:
            return stop(fc.value, f"the changed hypothesis did not change the {fc.value} failure "
                        f"({failure.fingerprint} again)")
        return Decision("retry", f"{fc.value} failure with a changed hypothesis", 0.0,
                        next_reason=f"{fc.value} failure in attempt {attempt.number}: {failure.message[:200]}",
                        next_hypothesis=classified.hypothesis)
    delay = policy.backoff.delay(attempt.number, classified.retry_after)
    return Decision("retry", f"{fc.value} failure is transient: backoff {delay:.2f}s", delay,
                    next_reason=f"transient {fc.value} failure in attempt {attempt.number} "
                    f"({failure.type}); retry after backoff",
                    next_hypothesis=classified.hypothesis or "")


def decision_for(task: Task, attempt: Attempt, classified: Classified, *, cost: float = 0.0,
                 tokens: int = 0) -> Decision:
    """What the task's frozen retry policy and budget say about this failure of ``attempt``."""
    policy = parse_config(task.retry_policy, RetryPolicy)
    budget = parse_config(task.budget, Budget)
    stamps = [t for t in (attempt.heartbeat_at, attempt.suspect_at, attempt.started_at) if t]
    elapsed = (max(stamps) - task.created_at).total_seconds() if stamps else None
    return decide(task, attempt, classified, policy, budget, cost=cost, tokens=tokens, elapsed_s=elapsed)

"""Classification and decisions are pure functions of the failure and the task's history."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from mc_queue.contracts.config import Backoff, Budget, RetryPolicy
from mc_queue.contracts.failures import make_failure
from mc_queue.contracts.models import Attempt, AttemptState, Event, FailureClass, Task, TaskState
from mc_queue.policy.classify import (
    AuthorizationError,
    CapacityError,
    NonRetryable,
    Retry,
    ValidationFailure,
    classify,
    decide,
)

NOW = datetime(2026, 11, 30, tzinfo=UTC)
TYPE_NAMES = {FailureClass.VALIDATION: "ValidationFailure", FailureClass.CAPACITY: "CapacityError"}


def http_error(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    req = httpx.Request("POST", "http://provider.local/pulls")
    return httpx.HTTPStatusError("boom", request=req, response=httpx.Response(status, headers=headers, request=req))


@pytest.mark.parametrize("exc,cls", [
    (http_error(401), FailureClass.AUTHORIZATION),
    (http_error(403), FailureClass.AUTHORIZATION),
    (http_error(429), FailureClass.CAPACITY),
    (http_error(503), FailureClass.CAPACITY),
    (http_error(500), FailureClass.PROVIDER),
    (http_error(422), FailureClass.VALIDATION),
    (httpx.ReadTimeout("slow"), FailureClass.PROVIDER),
    (httpx.ConnectError("refused"), FailureClass.PROVIDER),
    (TimeoutError("t"), FailureClass.PROVIDER),
    (MemoryError(), FailureClass.EXECUTOR),
    (KeyError("x"), FailureClass.INTERNAL),
    (AuthorizationError("token revoked"), FailureClass.AUTHORIZATION),
    (CapacityError("busy"), FailureClass.CAPACITY),
    (ValidationFailure("tests fail"), FailureClass.VALIDATION),
    (NonRetryable("spec is contradictory"), FailureClass.VALIDATION),
])
def test_classification(exc: BaseException, cls: FailureClass) -> None:
    c = classify(exc)
    assert c.failure.failure_class is cls
    assert c.failure.fingerprint


def test_retry_after_header_is_honoured() -> None:
    c = classify(http_error(429, {"Retry-After": "7"}))
    assert c.retry_after == 7.0
    assert classify(Retry(delay=3)).retry_after == 3


def test_full_jitter_stays_inside_its_bounds() -> None:
    b = Backoff(base_s=1, max_s=30)
    for n in range(1, 8):
        for _ in range(200):
            d = b.delay(n)
            assert 0 <= d <= b.upper_bound(n) <= 30
    assert b.upper_bound(1) == 1 and b.upper_bound(3) == 4 and b.upper_bound(10) == 30
    assert b.delay(1, retry_after=12) >= 12  # a provider's Retry-After is a floor


def make_task(failures: list[tuple[FailureClass, str, str | None]], events: list[Event] | None = None) -> Task:
    attempts = []
    for i, (fc, msg, hyp) in enumerate(failures, start=1):
        attempts.append(Attempt(id=f"q:01ARZ3NDEKTSV4RRFFQ69G5FAV/{i}", task_id="q:01ARZ3NDEKTSV4RRFFQ69G5FAV",
                                number=i, state=AttemptState.FAILED if i < len(failures) else AttemptState.RUNNING,
                                hypothesis=hyp, reason="first dispatch" if i == 1 else "retry after failure",
                                failure=make_failure(fc, TYPE_NAMES.get(fc, "E"), msg) if i < len(failures) else None))
    return Task(id="q:01ARZ3NDEKTSV4RRFFQ69G5FAV", queue="q", handler="h", payload={}, payload_digest="d",
                state=TaskState.RUNNING, created_at=NOW, attempts=attempts, events=events or [])


def test_transient_failures_retry_with_backoff_until_the_attempt_budget() -> None:
    task = make_task([(FailureClass.CAPACITY, "busy", None)])
    d = decide(task, task.attempts[-1], classify(CapacityError("busy")), RetryPolicy(), Budget(max_attempts=3))
    assert d.action == "retry" and 0 <= d.delay_s <= 1
    task = make_task([(FailureClass.CAPACITY, "busy", None)] * 3)
    d = decide(task, task.attempts[-1], classify(CapacityError("busy 2")), RetryPolicy(),
               Budget(max_attempts=3, max_same_fingerprint=10))
    assert d.action == "stop" and d.budget_exhausted == "attempts"
    assert d.attention["tried"] and d.attention["why_unsafe"]


def test_authorization_stops_at_once_with_an_attention_item() -> None:
    task = make_task([(FailureClass.AUTHORIZATION, "", None)])
    d = decide(task, task.attempts[-1], classify(http_error(401)), RetryPolicy(), Budget())
    assert d.action == "stop" and d.task_state == "blocked"
    assert d.attention["kind"] == "authorization"


def test_validation_needs_a_new_hypothesis_and_stops_on_the_same_fingerprint() -> None:
    task = make_task([(FailureClass.VALIDATION, "test_x fails", None)])
    blind = decide(task, task.attempts[-1], classify(ValidationFailure("test_x fails")), RetryPolicy(), Budget())
    assert blind.action == "stop"
    new = decide(task, task.attempts[-1], classify(ValidationFailure("test_x fails", hypothesis="pin the dep")),
                 RetryPolicy(), Budget())
    assert new.action == "retry" and new.next_hypothesis == "pin the dep"
    task2 = make_task([(FailureClass.VALIDATION, "test_x fails", None), (FailureClass.VALIDATION, "", "pin the dep")])
    again = decide(task2, task2.attempts[-1],
                   classify(ValidationFailure("test_x fails", hypothesis="rewrite the parser")),
                   RetryPolicy(), Budget())
    assert again.action == "stop" and "did not change" in again.why


def test_internal_quarantines_and_non_retryable_stops() -> None:
    task = make_task([(FailureClass.INTERNAL, "", None)])
    assert decide(task, task.attempts[-1], classify(KeyError("k")), RetryPolicy(), Budget()).action == "quarantine"
    assert decide(task, task.attempts[-1], classify(NonRetryable("no")), RetryPolicy(), Budget()).action == "stop"


def test_policy_overrides_are_validated_and_merged() -> None:
    p = RetryPolicy(actions={FailureClass.INTERNAL: "stop"})
    assert p.actions[FailureClass.INTERNAL] == "stop" and p.actions[FailureClass.CAPACITY] == "retry"
    with pytest.raises(ValueError):
        RetryPolicy(actions={FailureClass.INTERNAL: "explode"})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        Budget(max_attempts=0)

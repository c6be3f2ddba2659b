"""The public API is deliberate: this list changes only on purpose."""

from __future__ import annotations

import mc_queue

EXPECTED = {
    "DEFAULT_LEASE_MS", "Attempt", "AttemptNotRunning", "AttemptState", "ClaimRejected", "Client",
    "ConfigurationError", "Event", "ExpiredLease", "Failure", "FailureClass", "IdempotencyConflict",
    "InvalidArgument", "InvalidPayload", "Lease", "LeaseExpired", "Manifest", "McqError", "NamespaceInfo",
    "NamespaceLost", "ResultConflict", "RetryRefused", "StaleFence", "Task", "TaskNotFound", "TaskState",
    "TransitionRefused", "WriteRefused", "connect", "make_failure",
    "App", "AuthorizationError", "Backoff", "Budget", "BudgetExceeded", "CapacityError", "ConfigurationFailure",
    "Context", "Decision", "ExecutorError", "HandlerError", "HandlerSpec", "Heartbeat", "InternalError",
    "LeaseLost", "NonRetryable", "PhaseOutOfOrder", "ProviderError", "RepositoryError", "Retry", "RetryPolicy",
    "Sweeper", "ValidationFailure", "classify",
    "CancelRequested", "EffectRecord", "EffectUnknown", "mint_key",
    "OutcomeUnknown", "Reconciler", "RecoveryIncomplete", "TaskPurged", "reconcile_attempt", "recover",
    "EffectNotBegun", "ReplicationUnconfirmed", "Overloaded", "QueueFull",
    "Outcome", "WaitTimedOut",
    "TimeoutBudgetExceeded", "RateLimited", "OverLimit", "DependencyDown", "Fallback",
}


def test_all_is_pinned() -> None:
    assert set(mc_queue.__all__) == EXPECTED
    for name in mc_queue.__all__:
        assert hasattr(mc_queue, name), name


def test_error_tree() -> None:
    assert issubclass(mc_queue.StaleFence, mc_queue.WriteRefused)
    assert issubclass(mc_queue.LeaseExpired, mc_queue.WriteRefused)
    assert issubclass(mc_queue.ClaimRejected, mc_queue.TransitionRefused)
    assert issubclass(mc_queue.InvalidPayload, ValueError)
    for name in mc_queue.__all__:
        obj = getattr(mc_queue, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, mc_queue.HandlerError):
            assert issubclass(obj, mc_queue.McqError), name

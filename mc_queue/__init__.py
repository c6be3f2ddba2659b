"""mc_queue: a Redis-backed task queue that never loses track of what happened.

Tasks keep a stable identity; every try is an append-only Attempt; a lease with a fencing
generation is the only authority to write; every transition and every refusal is an event.
"""

from __future__ import annotations

from .client import DEFAULT_LEASE_MS, Client
from .client.connect import connect
from .client.results import Outcome, WaitTimedOut
from .contracts.config import Backoff, Budget, Decision, RetryPolicy
from .contracts.errors import (
    AttemptNotRunning,
    CancelRequested,
    ClaimRejected,
    ConfigurationError,
    EffectNotBegun,
    IdempotencyConflict,
    InvalidArgument,
    InvalidPayload,
    LeaseExpired,
    McqError,
    NamespaceLost,
    OutcomeUnknown,
    OverLimit,
    Overloaded,
    PhaseOutOfOrder,
    ReplicationUnconfirmed,
    ResultConflict,
    RetryRefused,
    StaleFence,
    TaskNotFound,
    TaskPurged,
    TransitionRefused,
    WriteRefused,
)
from .contracts.failures import make_failure
from .contracts.models import (
    Attempt,
    AttemptState,
    EffectRecord,
    Event,
    ExpiredLease,
    Failure,
    FailureClass,
    Heartbeat,
    Lease,
    Manifest,
    NamespaceInfo,
    Task,
    TaskState,
)
from .ops.sweeper import Sweeper
from .policy.classify import (
    AuthorizationError,
    BudgetExceeded,
    CapacityError,
    ConfigurationFailure,
    ExecutorError,
    HandlerError,
    InternalError,
    NonRetryable,
    ProviderError,
    RateLimited,
    RepositoryError,
    Retry,
    TimeoutBudgetExceeded,
    ValidationFailure,
    classify,
)
from .policy.effects import EffectUnknown, mint_key
from .policy.reconcile import Reconciler, reconcile_attempt
from .policy.recovery import RecoveryIncomplete, recover
from .producer.app import App, HandlerSpec
from .worker.context import Context, LeaseLost

__version__ = "0.1.0"

__all__ = [
    "App",
    "Attempt",
    "AttemptNotRunning",
    "AttemptState",
    "AuthorizationError",
    "Backoff",
    "Budget",
    "BudgetExceeded",
    "CancelRequested",
    "CapacityError",
    "ClaimRejected",
    "Client",
    "ConfigurationError",
    "ConfigurationFailure",
    "Context",
    "DEFAULT_LEASE_MS",
    "Decision",
    "EffectRecord",
    "EffectUnknown",
    "Event",
    "ExecutorError",
    "ExpiredLease",
    "Failure",
    "FailureClass",
    "HandlerError",
    "HandlerSpec",
    "Heartbeat",
    "IdempotencyConflict",
    "InternalError",
    "EffectNotBegun",
    "InvalidArgument",
    "InvalidPayload",
    "Lease",
    "LeaseExpired",
    "LeaseLost",
    "Manifest",
    "McqError",
    "NamespaceInfo",
    "NamespaceLost",
    "NonRetryable",
    "OutcomeUnknown",
    "Overloaded",
    "PhaseOutOfOrder",
    "ReplicationUnconfirmed",
    "ProviderError",
    "Reconciler",
    "RecoveryIncomplete",
    "RepositoryError",
    "ResultConflict",
    "Retry",
    "RetryPolicy",
    "RetryRefused",
    "StaleFence",
    "Sweeper",
    "Task",
    "TaskNotFound",
    "Outcome",
    "WaitTimedOut",
    "TaskPurged",
    "TaskState",
    "TimeoutBudgetExceeded",
    "RateLimited",
    "OverLimit",
    "TransitionRefused",
    "ValidationFailure",
    "WriteRefused",
    "classify",
    "connect",
    "make_failure",
    "mint_key",
    "reconcile_attempt",
    "recover",
]

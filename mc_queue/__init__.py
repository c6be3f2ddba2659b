"""mc_queue: a Redis-backed task queue that never loses track of what happened.

Tasks keep a stable identity; every try is an append-only Attempt; a lease with a fencing
generation is the only authority to write; every transition and every refusal is an event.
"""

from __future__ import annotations

import os

from .app import App, Context, HandlerSpec, LeaseLost
from .client import DEFAULT_LEASE_MS, Client
from .effects import EffectRecord, EffectUnknown, mint_key
from .errors import (
    AttemptNotRunning,
    CancelRequested,
    ClaimRejected,
    ConfigurationError,
    IdempotencyConflict,
    InvalidArgument,
    InvalidPayload,
    LeaseExpired,
    McqError,
    NamespaceLost,
    PhaseOutOfOrder,
    ResultConflict,
    RetryRefused,
    StaleFence,
    TaskNotFound,
    TransitionRefused,
    WriteRefused,
)
from .failures import make_failure
from .models import (
    Attempt,
    AttemptState,
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
from .policy import (
    AuthorizationError,
    Backoff,
    Budget,
    BudgetExceeded,
    CapacityError,
    ConfigurationFailure,
    Decision,
    ExecutorError,
    HandlerError,
    InternalError,
    NonRetryable,
    ProviderError,
    RepositoryError,
    Retry,
    RetryPolicy,
    ValidationFailure,
    classify,
)
from .sweeper import Sweeper

__version__ = "0.1.0"


def connect(url: str | None = None, *, prefix: str | None = None, home: str | None = None, **kw: object) -> Client:
    """Connect to a namespace. ``url`` (or ``MCQ_REDIS_URL``) may be ``redis://``, ``rediss://``
    (TLS) or ``unix://``, with a password or ACL user. With neither, start or reuse the embedded
    private redis-server under ``home`` (``MCQ_HOME``, default ``./.mcq``).
    """
    url = url or os.environ.get("MCQ_REDIS_URL") or None
    prefix = prefix or os.environ.get("MCQ_PREFIX") or "mcq"
    if url:
        return Client(url, prefix=prefix, **kw)  # type: ignore[arg-type]
    from .embedded import ensure_server

    server = ensure_server(home)
    client = Client(server.url, prefix=prefix, witness_path=server.witness, **kw)  # type: ignore[arg-type]
    client.embedded = server
    return client


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
    "PhaseOutOfOrder",
    "ProviderError",
    "RepositoryError",
    "ResultConflict",
    "Retry",
    "RetryPolicy",
    "RetryRefused",
    "StaleFence",
    "Sweeper",
    "Task",
    "TaskNotFound",
    "TaskState",
    "TransitionRefused",
    "ValidationFailure",
    "WriteRefused",
    "classify",
    "connect",
    "make_failure",
    "mint_key",
]

"""The producer side: enqueue through an App's handlers, and hand Attempts to RQ (dispatch).

Dispatch records first, then sends: the outbox already holds every Attempt that must run, so an RQ
message lost between the two is sent again by the sweeper, and one sent twice is refused by the claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import redis
from rq.serializers import JSONSerializer

from ..client import DEFAULT_LEASE_MS, Client
from ..client.producer import NewTask
from ..contracts.config import Budget, RetryPolicy
from ..contracts.errors import InvalidArgument
from ..contracts.models import Attempt, AttemptState, Task, TaskState
from .transport import ENTRY, LaneQueue, clear_job, in_lane, job_description, job_id, rq_connection, rq_queue, waiting

DEFAULT_RECHECK_MS = 60_000
DEFAULT_CLAIM_GRACE_MS = 10_000


class _Spec(Protocol):
    @property
    def queue(self) -> str: ...

    @property
    def retry(self) -> RetryPolicy: ...

    @property
    def budget(self) -> Budget: ...

    @property
    def lease_ms(self) -> int: ...

    @property
    def timeout_s(self) -> float: ...


def _limits(spec: _Spec) -> Mapping[str, int] | None:
    """A handler's rate limits (``HandlerSpec.limits``); a spec of its own making may not have any."""
    limits: Mapping[str, int] | None = getattr(spec, "limits", None)
    return limits or None


class Handlers(Protocol):
    """What the producer needs of an App: a handler's spec by name (InvalidArgument when unknown)."""

    def spec(self, name: str) -> _Spec: ...


class AppClient:
    """A Client bound to an App: refuses unknown handlers and dispatches Attempts to RQ."""

    def __init__(self, app: Handlers, client: Client) -> None:
        self.app = app
        self.client = client
        self._rq = rq_connection(client)

    def enqueue(self, handler: str, payload: Any, *, idempotency_key: str | None = None, queue: str | None = None,
                **manifest: Any) -> Task:
        spec = self.app.spec(handler)
        manifest.setdefault("limits", _limits(spec))
        task = self.client.producer.enqueue(queue or spec.queue, handler, payload, idempotency_key,
                                   retry_policy=spec.retry, budget=spec.budget, lease_ms=spec.lease_ms,
                                   timeout_s=spec.timeout_s, **manifest)
        latest = task.latest
        # (a scheduled task is sent by the sweeper once due, a waiting one once released: no message waits
        # in RQ before then)
        if latest is not None and latest.state is AttemptState.PENDING and \
                task.state not in (TaskState.SCHEDULED, TaskState.WAITING):
            self.dispatch(task, latest)
        return task

    def enqueue_many(self, items: Sequence[Mapping[str, Any]]) -> list[Task]:
        """Enqueue many tasks of this App's handlers in one round trip, all or nothing
        (:meth:`Producer.enqueue_many`), then send each new one that is due to RQ. Each item is a mapping
        with ``handler`` and ``payload`` and any option of :meth:`enqueue` (``idempotency_key``, ``queue``,
        ``delay_s``, ``priority``, ``start_by`` ...); an unknown handler refuses the batch, naming the item."""
        batch = []
        for i, item in enumerate(items, 1):
            opts = dict(item)
            try:
                spec = self.app.spec(opts.pop("handler", ""))
                handler = item["handler"]
                payload = opts.pop("payload")
            except (KeyError, InvalidArgument) as exc:
                raise InvalidArgument(f"item {i}: {exc}; each item needs a registered handler and a payload") \
                    from None
            queue = opts.pop("queue", None) or spec.queue
            opts.setdefault("limits", _limits(spec))
            try:
                batch.append(NewTask(queue, handler, payload, retry_policy=spec.retry, budget=spec.budget,
                                     lease_ms=spec.lease_ms, timeout_s=spec.timeout_s, **opts))
            except TypeError as exc:
                raise InvalidArgument(f"item {i}: {exc}") from None
        tasks = self.client.producer.enqueue_many(batch)
        for task in tasks:
            latest = task.latest
            if latest is not None and latest.state is AttemptState.PENDING and task.state is not TaskState.SCHEDULED \
                    and not latest.dispatches:
                self.dispatch(task, latest)
        return tasks

    def dispatch(self, task: Task, attempt: Attempt, *, recheck_ms: int = DEFAULT_RECHECK_MS) -> None:
        dispatch(self.client, self._rq, task, attempt, recheck_ms=recheck_ms)

    def close(self) -> None:
        self.client.close()
        self._rq.close()


def dispatch(client: Client, rq: redis.Redis, task: Task, attempt: Attempt, *,
             recheck_ms: int = DEFAULT_RECHECK_MS, claim_grace_ms: int = DEFAULT_CLAIM_GRACE_MS) -> bool:
    """Send one Attempt to its RQ queue (record first, then send: the outbox already holds it), unless
    RQ already holds its job waiting, or started less than ``claim_grace_ms`` ago (a claim may be on
    its way; an older start that never reached its claim is sent again): then only the outbox's
    recheck moves. Returns True when a message was pushed. A job sent again is first cleared from RQ's registries."""
    manifest = attempt.manifest or task.manifest
    timeout = manifest.timeout_s if manifest else None
    queue = rq_queue(rq, client.keys.prefix, task.queue, task.priority)  # (its priority's RQ queue)
    if task.fair_key:  # its message waits in its key's fair lane, a ticket in the RQ queue
        queue = LaneQueue(queue.name, client=client, queue=task.queue, priority=task.priority, lane=task.fair_key,
                          connection=rq, serializer=JSONSerializer)
    jid = job_id(client.keys.prefix, attempt.id)
    if attempt.dispatches:  # sent before: RQ may still hold it, or remember it in a registry
        laned = bool(task.fair_key) and in_lane(client, task.queue, jid)
        if waiting(rq, queue, jid, claim_grace_ms=claim_grace_ms, laned=laned):
            client.schedule.mark_dispatched(attempt.id, recheck_ms=recheck_ms)
            return False
        clear_job(rq, queue, jid)
    queue.enqueue_call(func=ENTRY, args=(client.keys.prefix, attempt.id, task.lease_ms or DEFAULT_LEASE_MS),
                       job_id=jid, result_ttl=0, failure_ttl=7 * 86400, timeout=int(timeout) if timeout else None,
                       description=job_description(task.handler, attempt.id))
    client.schedule.mark_dispatched(attempt.id, recheck_ms=recheck_ms)
    return True

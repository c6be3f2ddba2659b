"""The producer's calls: create a Task and its first Attempt (enqueue)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from ..contracts.codec import check_int, check_text, encode_payload
from ..contracts.config import Budget, RetryPolicy
from ..contracts.errors import InvalidArgument, raise_for_reply
from ..contracts.frozen import compact
from ..contracts.history import whole_history
from ..contracts.keys import check_queue, new_task_id
from ..contracts.models import Manifest, Task, split_attempts
from ..store.backend import DEFAULT_LEASE_MS, Backend
from .base import Role, pairs
from .reads import Reads

MAX_DELAY_S = 10 * 365 * 86_400  # lua/includes/common.lua MAX_DELAY_MS
MAX_RUN_AT_MS = 253_402_300_799_999  # the last millisecond of the year 9999 (common.lua)
_HANDLER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")


class Producer(Role):
    """Creates tasks. The same producer idempotency key returns the same task."""

    def __init__(self, backend: Backend, reads: Reads) -> None:
        super().__init__(backend)
        self.reads = reads

    def enqueue(
        self,
        queue: str,
        handler: str,
        payload: Any,
        idempotency_key: str | None = None,
        *,
        executor: str | None = None,
        model: str | None = None,
        context: Mapping[str, Any] | None = None,
        base_sha: str | None = None,
        retry_policy: RetryPolicy | None = None,
        budget: Budget | None = None,
        policy_version: str | None = None,
        lease_ms: int | None = None,
        timeout_s: float | None = None,
        task_id: str | None = None,
        delay_s: float | None = None,
        run_at: datetime | None = None,
        start_by: datetime | timedelta | None = None,
        finish_by: datetime | timedelta | None = None,
        priority: int | None = None,
    ) -> Task:
        """Create a Task and its first Attempt. The same idempotency key returns the same task.

        ``delay_s`` (seconds from now) and ``run_at`` (a timezone-aware time) make the task
        ``scheduled``: it holds no lease and no transport message until due, and no claim takes it
        before. The due time is computed and compared on Redis's clock (the delay is added to
        Redis's ``TIME`` inside the script), so a producer's clock that is off changes nothing.
        With both, the later time counts; a time not after now is the plain path.

        ``start_by`` and ``finish_by`` (a timezone-aware time, or a timedelta from now on Redis's clock)
        are deadlines: a task not started by its ``start_by`` is not claimed, and the sweeper cancels it
        (the cancellation protocol, with the deadline as its reason); one not ended by its ``finish_by``
        is canceled the same way, its running Attempt signalled. A deadline that could never be met (past,
        before the task is due, a finish before the start) is refused (InvalidArgument), nothing written.

        ``priority``: 1 (most urgent) to 9, 5 by default. Its Attempts go to the RQ queue of that priority,
        and a worker takes from a more urgent one first (``mc_queue.producer.transport.PRIORITIES``).
        """
        try:
            check_queue(queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not isinstance(handler, str) or not 0 < len(handler) <= 128 or set(handler) - _HANDLER_CHARS \
                or not handler[0].isalnum():
            raise InvalidArgument(
                f"invalid handler name {handler!r}: use 1-128 letters, digits, '_', '.', ':', '-'"
            )
        if idempotency_key is not None:
            check_text(idempotency_key, what="idempotency key", max_bytes=512, spaces=False)
        lease = self._lease_ms(DEFAULT_LEASE_MS if lease_ms is None else lease_ms)
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not 0 < timeout_s <= 30 * 86_400):
            raise InvalidArgument(f"timeout_s must be a number of seconds in (0, 30 days], got {timeout_s!r}")
        delay_ms, run_at_ms = _due_args(delay_s, run_at)
        if priority is not None:
            check_int(priority, what="priority", low=1, high=9)
        deadlines = {"priority": "" if priority is None else priority,
                     "start_by_ms": self._deadline(start_by, "start_by"),
                     "finish_by_ms": self._deadline(finish_by, "finish_by")}
        text, payload_digest = encode_payload(payload)
        policy = retry_policy or RetryPolicy()
        try:
            manifest = Manifest(handler=handler, payload_digest=payload_digest,
                                policy_version=policy_version or policy.version,
                                executor=executor, model=model, context=dict(context or {}), base_sha=base_sha,
                                lease_ms=lease, timeout_s=timeout_s)
        except ValueError as exc:
            raise InvalidArgument(f"invalid manifest: {exc}") from None
        tid = task_id or new_task_id(queue)
        tk = self._task_keys(tid)
        if tk.pending != self.keys.pending(queue):
            raise InvalidArgument(f"task id {tid!r} does not belong to queue {queue!r}")
        argv = {"task_id": tid, "queue": queue, "handler": handler, "payload": text,
                "payload_digest": payload_digest, "idem_key": idempotency_key or "",
                "manifest": compact("manifest", manifest.model_dump(mode="json"),
                                    task={"handler": handler, "payload_digest": payload_digest}),
                "retry_policy": compact("retry_policy", policy.model_dump(mode="json")),
                "budget": compact("budget", (budget or Budget()).model_dump(mode="json")),
                "lease_ms": lease, "actor": self.actor, "delay_ms": delay_ms, "run_at_ms": run_at_ms, **deadlines}

        def call(epoch: str) -> list[Any]:
            return self._run("enqueue", {
                **self._ns_keys(), "idem": self.keys.idem, "queues": self.keys.queues, "counts": self.keys.counts,
                "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events, "pending": tk.pending,
                **tk.tomb_keys(), "deadlines": tk.deadlines,
            }, {**argv, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="enqueue", task_id=tid)
        if reply[0] == "OK" and len(reply) == 5:  # a new task, as the script left it: no second read
            fields, att = split_attempts(pairs(reply[2]), pairs(reply[3]))
            return Task.from_redis(fields, att,
                                   whole_history(fields, self._history(reply[4], tk.events)))
        return self.reads.get_task(str(reply[1]))  # DUP: the task may have moved on since


    def _deadline(self, value: datetime | timedelta | None, what: str) -> str:
        """A deadline as the enqueue script takes it: ms since the epoch ('' for none); a timedelta is
        counted from Redis's clock (one read), never this host's."""
        if value is None:
            return ""
        if isinstance(value, timedelta):
            if not timedelta(0) < value <= timedelta(seconds=MAX_DELAY_S):
                raise InvalidArgument(f"{what} must be a positive timedelta of at most ten years, got {value!r}")
            return str(self.backend.redis_time_ms() + math.ceil(value.total_seconds() * 1000))
        if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(f"{what} must be a datetime with a time zone or a timedelta, got {value!r}")
        ms = math.ceil(value.timestamp() * 1000)
        if not 0 <= ms <= MAX_RUN_AT_MS:
            raise InvalidArgument(f"{what} must be between 1970-01-01 and 9999-12-31 UTC, got {value.isoformat()}")
        return str(ms)


def _due_args(delay_s: float | None, run_at: datetime | None) -> tuple[str, str]:
    """The enqueue script's delay_ms and run_at_ms ('' for none), checked before anything is sent."""
    delay_ms = ""
    if delay_s is not None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not math.isfinite(delay_s) \
                or not 0 <= delay_s <= MAX_DELAY_S:
            raise InvalidArgument(f"delay_s must be a number of seconds in [0, {MAX_DELAY_S}] (ten years), "
                                  f"got {delay_s!r}")
        delay_ms = str(math.ceil(delay_s * 1000)) if delay_s > 0 else ""
    run_at_ms = ""
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidArgument(f"run_at must be a datetime with a time zone, got {type(run_at).__name__} "
                                  f"{run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidArgument(f"run_at {run_at.isoformat()} has no time zone: say which one "
                                  "(e.g. datetime(..., tzinfo=timezone.utc))")
        ms = math.ceil(run_at.timestamp() * 1000)
        if not 0 <= ms <= MAX_RUN_AT_MS:
            raise InvalidArgument(f"run_at must be between 1970-01-01 and 9999-12-31 UTC, got {run_at.isoformat()}")
        run_at_ms = str(ms)
    return delay_ms, run_at_ms

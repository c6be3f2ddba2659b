"""The producer's calls: create a Task and its first Attempt (enqueue)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..contracts.codec import check_int, check_text, encode_payload
from ..contracts.config import Budget, RetryPolicy
from ..contracts.errors import InvalidArgument, McqError, raise_for_reply
from ..contracts.frozen import compact
from ..contracts.history import whole_history
from ..contracts.keys import TaskKeys, check_limit_name, check_queue, new_task_id
from ..contracts.models import Manifest, Task, split_attempts
from ..store.backend import DEFAULT_LEASE_MS, Backend
from .base import Role, pairs
from .reads import Reads

MAX_DELAY_S = 10 * 365 * 86_400  # lua/includes/common.lua MAX_DELAY_MS
MAX_RUN_AT_MS = 253_402_300_799_999  # the last millisecond of the year 9999 (common.lua)
_HANDLER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")


MAX_BULK = 1000  # items in one enqueue_many


@dataclass(frozen=True)
class NewTask:
    """One task of :meth:`Producer.enqueue_many` (the arguments of :meth:`Producer.enqueue`)."""

    queue: str
    handler: str
    payload: Any
    idempotency_key: str | None = None
    executor: str | None = None
    model: str | None = None
    context: Mapping[str, Any] | None = None
    base_sha: str | None = None
    retry_policy: RetryPolicy | None = None
    budget: Budget | None = None
    policy_version: str | None = None
    lease_ms: int | None = None
    timeout_s: float | None = None
    task_id: str | None = None
    delay_s: float | None = None
    run_at: datetime | None = None
    start_by: datetime | timedelta | None = None
    finish_by: datetime | timedelta | None = None
    priority: int | None = None
    after: Sequence[str] | None = None
    after_mode: str = "succeeded"
    limits: Mapping[str, int] | None = None
    fair_key: str | None = None


MAX_AFTER = 100  # tasks one task may wait for (lua/enqueue_after.lua MAX_PARENTS)
AFTER_MODES = ("succeeded", "ended")


def _item_error(exc: McqError, item: int) -> McqError:
    """The same error, saying which item of a batch it is about (``.item``; once: a script's reason may say it)."""
    if f"item {item}: " not in str(exc):
        exc.args = (f"item {item}: {exc}",)
        exc.message = f"item {item}: {exc.message}"
    exc.item = item  # type: ignore[attr-defined]
    return exc


class Producer(Role):
    """Creates tasks. The same producer idempotency key returns the same task."""

    def __init__(self, backend: Backend, reads: Reads) -> None:
        super().__init__(backend)
        self.reads = reads

    def enqueue(self, queue: str, handler: str, payload: Any, idempotency_key: str | None = None,
                **options: Any) -> Task:
        """Create a Task and its first Attempt. The same idempotency key returns the same task.

        Options (all keyword): ``executor``, ``model``, ``context``, ``base_sha``, ``policy_version`` (the
        frozen manifest), ``retry_policy``, ``budget``, ``lease_ms``, ``timeout_s``, ``task_id``, and:

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

        ``after`` (task ids, at most 100) makes the task wait for those tasks to end first: it is
        ``waiting`` (no Attempt claimable, no transport message) until each has ended, then pending (or
        scheduled until its own due time). ``after_mode`` ``"succeeded"`` (the default): each must
        succeed, and one that ends otherwise (failed, blocked, quarantined, canceled) cancels this task,
        its reason naming the parent; ``"ended"``: any end counts. A parent that ended already counts at
        once (in mode succeeded, one that did not succeed refuses the enqueue: TransitionRefused); one
        not in Redis refuses it (TaskNotFound). The sweeper releases dependents within ~50 ms of their
        parents' end (``lua/release.lua``), from an obligation the parent's end records atomically.

        ``limits`` (``{"github": 1, "model:openai": 3}``: dependency key -> cost in its rate limit's units, at
        most 8; cost 0 names a dependency without taking units): every claim of the task's Attempts takes
        those units from each limit, all or none, on Redis's clock (``client.limits``; a key with no limit
        set is not limited), and is not made while a key's circuit breaker is open. An Attempt over a
        limit or behind an open breaker is not claimed: it stays pending, holds no lease, and is offered
        again when the units return or the breaker half-opens.

        ``fair_key`` ("tenant:acme"): the task's share of the workers is its key's, not its place in line. Its
        Attempts' messages wait in that key's fair lane of their RQ queue, and a worker takes from the lanes
        in turn, each key in proportion to its weight (``client.limits.set_weight``, 1 by default): a tenant
        with 10,000 queued tasks delays another's next task by at most one of its own per turn. Tasks
        without one are served in arrival order beside the lanes (each lane's turn is a place in that line).
        """
        n = NewTask(queue, handler, payload, idempotency_key, **options)
        tk, argv = self._item(n)
        parents = self._after(n.after, n.after_mode, argv["task_id"])
        script = "enqueue_after" if parents else "enqueue"
        items = [({"parent": self.keys.task(p).task}, {"parent_id": p}) for p in parents]
        if parents:
            argv["after_mode"] = n.after_mode

        def call(epoch: str) -> list[Any]:
            return self._run(script, {**self._ns_keys(), "idem": self.keys.idem, "queues": self.keys.queues,
                                      "counts": self.keys.counts, **self._item_keys(tk), "caps": self.keys.caps,
                                      "stats": self.keys.stats},
                             {**argv, "actor": self.actor, "epoch": epoch}, items)

        reply = self._with_epoch(call)
        tid = argv["task_id"]
        raise_for_reply(reply, script=script, task_id=tid)
        if reply[0] == "OK" and len(reply) == 5:  # a new task, as the script left it: no second read
            fields, att = split_attempts(pairs(reply[2]), pairs(reply[3]))
            return Task.from_redis(fields, att,
                                   whole_history(fields, self._history(reply[4], tk.events), att))
        return self.reads.get_task(str(reply[1]))  # DUP: the task may have moved on since

    def enqueue_many(self, items: Sequence[NewTask]) -> list[Task]:
        """Create many tasks in one round trip, all or nothing (``enqueue_many.lua``): one item refused (a
        bad argument, found here or by the script; a producer key or task id naming other work; a purged
        one; two items with one key or id; memory for the whole batch) refuses the batch, nothing is
        written, and the error names the item (``.item``, 1-based). An item that names work admitted
        before returns that task (the same batch sent twice makes each task once). At most MAX_BULK items."""
        if not items or len(items) > MAX_BULK:
            raise InvalidArgument(f"enqueue_many takes 1 to {MAX_BULK} items, got {len(items)}")
        built: list[tuple[TaskKeys, dict[str, Any]]] = []
        for i, item in enumerate(items, 1):
            if not isinstance(item, NewTask):
                raise InvalidArgument(f"item {i}: expected a NewTask, got {type(item).__name__}")
            if item.after:
                raise _item_error(InvalidArgument("enqueue_many does not take after=[...]; enqueue a task that "
                                                  "waits for others with enqueue(after=...)"), i)
            try:
                built.append(self._item(item))
            except InvalidArgument as exc:
                raise _item_error(exc, i) from None
        # (a new task keeps its Attempts in its own hash: no attempts key of the old kind for enqueue_many)
        per_item = [({k: v for k, v in self._item_keys(tk).items() if k != "attempts"}, argv) for tk, argv in built]

        def call(epoch: str) -> list[Any]:
            return self._run("enqueue_many", {**self._ns_keys(), "idem": self.keys.idem, "queues": self.keys.queues,
                                              "counts": self.keys.counts, "caps": self.keys.caps,
                                              "stats": self.keys.stats},
                             {"actor": self.actor, "epoch": epoch}, items=per_item)

        reply = self._with_epoch(call)
        if str(reply[0]) != "OK":
            which = int(reply[-1]) if len(reply) > 2 and str(reply[-1]).isdigit() else 0
            try:
                raise_for_reply(reply[:-1] if which else reply, script="enqueue",
                                task_id=built[which - 1][1]["task_id"] if which else None)
            except McqError as exc:
                raise _item_error(exc, which) if which else exc from None
        out = []
        for code, tid, raw in zip(reply[1], reply[2], reply[3], strict=True):
            if code == "OK":
                fields, att = split_attempts(pairs(raw), {})
                out.append(Task.from_redis(fields, att, whole_history(fields, [], att)))
            else:
                out.append(self.reads.get_task(str(tid)))  # DUP: the task admitted before, as it is now
        return out

    def _item_keys(self, tk: TaskKeys) -> dict[str, str]:
        """One task's keys as enqueue and enqueue_many take them."""
        return {"task": tk.task, "attempts": tk.attempts_v1, "events": tk.events, "pending": tk.pending,
                **tk.tomb_keys(), "deadlines": tk.deadlines}

    def _item(self, n: NewTask) -> tuple[TaskKeys, dict[str, Any]]:
        """One task's keys and arguments, every argument checked (InvalidArgument: nothing is sent)."""
        try:
            check_queue(n.queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not isinstance(n.handler, str) or not 0 < len(n.handler) <= 128 or set(n.handler) - _HANDLER_CHARS \
                or not n.handler[0].isalnum():
            raise InvalidArgument(
                f"invalid handler name {n.handler!r}: use 1-128 letters, digits, '_', '.', ':', '-'"
            )
        if n.idempotency_key is not None:
            check_text(n.idempotency_key, what="idempotency key", max_bytes=512, spaces=False)
        lease = self._lease_ms(DEFAULT_LEASE_MS if n.lease_ms is None else n.lease_ms)
        if n.timeout_s is not None and (isinstance(n.timeout_s, bool) or not isinstance(n.timeout_s, (int, float))
                                        or not 0 < n.timeout_s <= 30 * 86_400):
            raise InvalidArgument(f"timeout_s must be a number of seconds in (0, 30 days], got {n.timeout_s!r}")
        delay_ms, run_at_ms = _due_args(n.delay_s, n.run_at)
        if n.priority is not None:
            check_int(n.priority, what="priority", low=1, high=9)
        if n.fair_key is not None:
            try:
                check_limit_name(n.fair_key)
            except ValueError as exc:
                raise InvalidArgument(f"fair_key: {exc}") from None
        text, payload_digest = encode_payload(n.payload)
        policy = n.retry_policy or RetryPolicy()
        try:
            manifest = Manifest(handler=n.handler, payload_digest=payload_digest,
                                policy_version=n.policy_version or policy.version,
                                executor=n.executor, model=n.model, context=dict(n.context or {}),
                                base_sha=n.base_sha, lease_ms=lease, timeout_s=n.timeout_s)
        except ValueError as exc:
            raise InvalidArgument(f"invalid manifest: {exc}") from None
        tid = n.task_id or new_task_id(n.queue)
        tk = self._task_keys(tid)
        if tk.pending != self.keys.pending(n.queue):
            raise InvalidArgument(f"task id {tid!r} does not belong to queue {n.queue!r}")
        return tk, {
            "task_id": tid, "queue": n.queue, "handler": n.handler, "payload": text,
            "payload_digest": payload_digest, "idem_key": n.idempotency_key or "",
            "manifest": compact("manifest", manifest.model_dump(mode="json"),
                                task={"handler": n.handler, "payload_digest": payload_digest}),
            "retry_policy": compact("retry_policy", policy.model_dump(mode="json")),
            "budget": compact("budget", (n.budget or Budget()).model_dump(mode="json")),
            "lease_ms": lease, "delay_ms": delay_ms, "run_at_ms": run_at_ms,
            "start_by_ms": self._deadline(n.start_by, "start_by"),
            "finish_by_ms": self._deadline(n.finish_by, "finish_by"),
            "priority": "" if n.priority is None else n.priority, "limits": limits_text(n.limits),
            "fair_key": n.fair_key or ""}

    def _after(self, after: Sequence[str] | None, mode: str, task_id: str) -> list[str]:
        """The task ids a task waits for, checked (InvalidArgument: nothing is sent)."""
        if mode not in AFTER_MODES:
            raise InvalidArgument(f"after_mode must be one of {', '.join(AFTER_MODES)}, got {mode!r}")
        if after is None:
            return []
        if isinstance(after, str) or not isinstance(after, Sequence):
            raise InvalidArgument(f"after must be a list of task ids, got {type(after).__name__} {after!r:.100}")
        ids = list(after)
        if len(ids) > MAX_AFTER:
            raise InvalidArgument(f"after names {len(ids)} tasks: at most {MAX_AFTER} (wait for a task that waits "
                                  "for the rest)")
        for p in ids:
            if not isinstance(p, str):
                raise InvalidArgument(f"after: {p!r} is not a task id")
            self._task_keys(p)  # InvalidArgument for a malformed id
            if p == task_id:
                raise InvalidArgument("after: a task cannot wait for itself")
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"after: {next(p for p in ids if ids.count(p) > 1)} is named twice")
        return ids

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


MAX_LIMITS = 8  # rate limits one task may name (lua/includes/common.lua MAX_LIMITS)


def limits_text(limits: Mapping[str, int] | None) -> str:
    """A task's rate limits as the enqueue script takes them ("<key>=<cost>,...", keys sorted), checked:
    InvalidArgument before anything is sent."""
    if not limits:
        return ""
    if not isinstance(limits, Mapping):
        raise InvalidArgument(f"limits must be a mapping of rate limit key -> cost, got {type(limits).__name__}")
    if len(limits) > MAX_LIMITS:
        raise InvalidArgument(f"limits names {len(limits)} keys: at most {MAX_LIMITS}")
    for name, cost in limits.items():
        try:
            check_limit_name(name)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        check_int(cost, what=f"the cost of limit {name!r}", low=0, high=999_999_999)
    return ",".join(f"{name}={limits[name]}" for name in sorted(limits))


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

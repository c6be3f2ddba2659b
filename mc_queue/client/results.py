"""Waiting for a task's outcome: ``wait`` returns once the task ended (or waits for a person), with
its result or the reason it ended; ``wait_many`` does it for many tasks at once.

No lost wakeup, by construction: the waiter reads the task's recorded state, never a notification
that could be missed. A task that ended before the call returns at once; one that ends while the
waiter sleeps is seen at the next look. The looks start 10 ms apart and slow down to ``max_poll_s``
(one pipelined read of every task still waited for per look: a waiter costs Redis a few commands a
second, an Attempt costs nothing more). Cancel, quarantine, a failure that waits for a person and a
purge each end the wait with their reason; a task that does not exist ends it at once
(:class:`TaskNotFound`). The timeout is mandatory: past it, :class:`WaitTimedOut` says what state
the task was in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..contracts.errors import InvalidArgument, McqError, TaskNotFound
from ..contracts.models import Task
from .base import ENDED_STATES, Role
from .reads import Reads

MAX_WAIT_S = 7 * 86_400.0
FIRST_POLL_S = 0.01
MAX_POLL_S = 0.5
MAX_WAIT_TASKS = 10_000


class WaitTimedOut(McqError, TimeoutError):
    """The timeout passed before the task ended; ``states`` says where each task waited for was."""

    def __init__(self, message: str, *, states: dict[str, str], task_id: str | None = None) -> None:
        super().__init__(message, task_id=task_id)
        self.states = states


@dataclass(frozen=True)
class Outcome:
    """How a task ended: its state (``purged`` when it was deleted before the wait saw it end), its
    result (succeeded), why it ended, and the task as it was read (None when purged)."""

    task_id: str
    state: str
    result: Any
    reason: str
    task: Task | None

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"


def explain(task: Task) -> str:
    """Why the task is in its ended state, from its records."""
    latest = task.latest
    n = latest.number if latest is not None else 0
    if task.state.value == "succeeded":
        return f"attempt {n} succeeded"
    reasons = {"canceled": ("task_canceled",), "quarantined": ("task_quarantined", "attention_raised"),
               "blocked": ("attention_raised",), "failed": ("attempt_failed", "attempt_reconciled")}
    # (a decision's reason is the failure event's 'why')
    why = next((w for e in reversed(task.events) if e.type in reasons.get(task.state.value, ())
                and (w := e.fields.get("reason") or e.fields.get("why"))), "")
    if task.state.value == "canceled":
        return f"canceled: {why or task.cancel_requested or 'no reason recorded'}"
    failure = latest.failure if latest is not None else None
    what = f"attempt {n} failed ({failure.failure_class.value} {failure.type}: {failure.message})" if failure \
        else f"attempt {n} ended {latest.state.value if latest else 'without an attempt'}"
    waits = {"failed": "waits for a person to retry it", "blocked": "blocked: waits for a person",
             "quarantined": "quarantined (in the DLQ)"}[task.state.value]
    return f"{what}; {waits}" + (f": {why}" if why else "")


class Results(Role):
    """Waits for tasks to end (recorded state, read in bounded looks: no wakeup to lose)."""

    def __init__(self, backend: Any, reads: Reads) -> None:
        super().__init__(backend)
        self.reads = reads

    def wait(self, task_id: str, *, timeout_s: float, max_poll_s: float = MAX_POLL_S) -> Outcome:
        """The task's outcome once it ended (succeeded, canceled, failed, blocked, quarantined, or
        purged), at most ``timeout_s`` from now; else :class:`WaitTimedOut`."""
        return self.wait_many([task_id], timeout_s=timeout_s, max_poll_s=max_poll_s)[task_id]

    def wait_many(self, task_ids: Sequence[str], *, timeout_s: float,
                  max_poll_s: float = MAX_POLL_S) -> dict[str, Outcome]:
        """Every task's outcome, once all ended, at most ``timeout_s`` from now; else :class:`WaitTimedOut`
        (with every task's state then). A task that does not exist raises :class:`TaskNotFound` at once."""
        _check_seconds(timeout_s, "timeout_s", MAX_WAIT_S)
        _check_seconds(max_poll_s, "max_poll_s", 60.0)
        ids = list(dict.fromkeys(task_ids))
        if not ids or len(ids) > MAX_WAIT_TASKS:
            raise InvalidArgument(f"wait for 1 to {MAX_WAIT_TASKS} tasks, got {len(ids)}")
        for tid in ids:
            self._task_keys(tid)  # a malformed id is refused before any read
        deadline = time.monotonic() + timeout_s
        out: dict[str, Outcome] = {}
        poll = FIRST_POLL_S
        states: dict[str, str | None] = {}
        while True:
            waiting = [tid for tid in ids if tid not in out]
            states = self.reads.task_states(waiting)
            for tid in waiting:
                state = states[tid]
                if state is None:
                    out[tid] = self._gone(tid)
                elif state in ENDED_STATES:
                    task = self.reads.get_task(tid)
                    if task.state.value in ENDED_STATES:  # (it may have moved on since: a retry)
                        out[tid] = Outcome(tid, task.state.value, task.result if task.state.value == "succeeded"
                                           else None, explain(task), task)
            if len(out) == len(ids):
                return {tid: out[tid] for tid in ids}
            left = deadline - time.monotonic()
            if left <= 0:
                now = {tid: str(states.get(tid) or "gone") for tid in ids if tid not in out}
                raise WaitTimedOut(f"{len(now)} of {len(ids)} task(s) had not ended after {timeout_s:g}s: "
                                   + ", ".join(f"{t} {s}" for t, s in list(now.items())[:5])
                                   + (" ..." if len(now) > 5 else ""), states=now,
                                   task_id=ids[0] if len(ids) == 1 else None)
            time.sleep(min(poll, left))
            poll = min(max_poll_s, poll * 1.5)

    def _gone(self, task_id: str) -> Outcome:
        tomb = self.reads.tombstone(task_id)
        if tomb is None:
            raise TaskNotFound(f"no task {task_id} (never enqueued here, or purged and its tombstone window "
                               "passed)", task_id=task_id)
        why = tomb.get("reason") or "no reason recorded"
        by = tomb.get("actor") or "someone"
        return Outcome(task_id, "purged", None, f"purged by {by}: {why}", None)


def _check_seconds(value: Any, what: str, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= high:
        raise InvalidArgument(f"{what} must be a number of seconds in (0, {high:g}], got {value!r}")
    return float(value)

"""The sweeper: a pure ``run_once()`` plus a plain loop.

Each pass:

1. expires every lease past its expiry (Redis clock): the Attempt turns suspect, the fence moves;
2. reconciles suspect Attempts in bounded batches and applies the task's frozen retry policy
   (with no side effect recorded, a vanished worker's Attempt settles as an executor failure);
3. sends the outbox: Attempts whose dispatch never got claimed, and retries whose backoff is over.

Every step re-checks its condition inside its script, so two sweepers at once are safe, and a
sweeper killed mid-pass leaves nothing half-decided (a reconciling Attempt is taken up again).
Its cost grows with what is due (expired leases, suspects, due dispatches), not with the number of
tasks in Redis.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from .client import Client
from .errors import McqError, TransitionRefused
from .keys import parse_attempt_id
from .models import AttemptState

log = logging.getLogger("mc_queue.sweeper")


@dataclass
class SweepReport:
    expired: list[str] = field(default_factory=list)
    reconciled: dict[str, str] = field(default_factory=dict)  # attempt id -> task state after
    dispatched: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"expired": self.expired, "reconciled": self.reconciled, "dispatched": self.dispatched,
                "errors": self.errors}


class Sweeper:
    def __init__(self, client: Client, *, app: Any = None, batch: int = 200, actor: str | None = None,
                 recheck_ms: int = 60_000) -> None:
        self.client = client
        self.operations = dict(app.operations) if app is not None else {}
        self.batch = batch
        self.actor = actor or f"sweeper@{client.actor}"
        self.recheck_ms = recheck_ms
        self._rq: redis.Redis | None = None

    def run_once(self) -> SweepReport:
        report = SweepReport()
        for e in self.client.expire_leases(limit=self.batch, actor=self.actor):
            report.expired.append(e.attempt_id)
        overdue = self.client.due_cancels(limit=self.batch)
        if overdue:  # cancellation: the executor did not acknowledge in time, its lease is voided
            for e in self.client.void_leases(overdue, actor=self.actor,
                                             reason="cancel not acknowledged in time"):
                report.expired.append(e.attempt_id)
        self._reconcile(report)
        self._dispatch(report)
        return report

    def _reconcile(self, report: SweepReport) -> None:
        suspects = [str(a) for a in self.client.redis.zrange(self.client.keys.suspect, 0, self.batch - 1)]
        for aid in suspects:
            try:
                attempt = self.client.reconcile_attempt(aid, actor=self.actor, apply_policy=True,
                                                        operations=self.operations)
                task = self.client.get_task(attempt.task_id)
                report.reconciled[aid] = task.state.value
            except TransitionRefused as exc:  # settled meanwhile by another sweeper
                log.info("reconcile of %s skipped: %s", aid, exc)
            except McqError as exc:
                report.errors.append(f"{aid}: {exc}")

    def _dispatch(self, report: SweepReport) -> None:
        from .worker import dispatch, rq_connection

        due = self.client.due_dispatches(limit=self.batch)
        if not due:
            return
        if self._rq is None:
            self._rq = rq_connection(self.client)
        for aid in due:
            task_id, n = parse_attempt_id(aid)
            try:
                task = self.client.get_task(task_id)
            except McqError as exc:
                report.errors.append(f"{aid}: {exc}")
                continue
            attempt = task.attempts[n - 1] if n <= len(task.attempts) else None
            if attempt is None or attempt.state is not AttemptState.PENDING:
                self.client.mark_dispatched(aid, recheck_ms=self.recheck_ms)  # drops the stale entry
                continue
            dispatch(self.client, self._rq, task, attempt, recheck_ms=self.recheck_ms)
            report.dispatched.append(aid)

    def run(self, *, interval_s: float = 1.0, stop_after_s: float | None = None) -> None:
        """Loop run_once() every ``interval_s`` seconds (forever, or until ``stop_after_s``)."""
        started = time.monotonic()
        while stop_after_s is None or time.monotonic() - started < stop_after_s:
            t0 = time.monotonic()
            try:
                r = self.run_once()
                if r.expired or r.reconciled or r.dispatched or r.errors:
                    log.info("sweep: %s", r.as_dict())
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("sweep failed, Redis unreachable: %s", exc)
            except McqError as exc:
                log.error("sweep failed: %s", exc)
            time.sleep(max(0.0, interval_s - (time.monotonic() - t0)))

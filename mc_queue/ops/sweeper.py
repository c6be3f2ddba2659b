"""The sweeper: a pure ``run_once()`` plus a plain loop.

Each pass:

0. carries out what ended tasks owe the tasks waiting for them (``after=[...]``): released (pending,
   sent at once) or canceled (``lua/release.lua``); also between passes, in :meth:`Sweeper.promote`;
1. expires every lease past its expiry (Redis clock): the Attempt turns suspect, the fence moves;
   voids the leases of executors that did not acknowledge a cancel in time;
2. reconciles suspect Attempts in bounded batches and applies the task's frozen retry policy
   (with no side effect recorded, a vanished worker's Attempt settles as an executor failure);
3. walks each queue's pending index (a page a pass, in order of due time) and sends the Attempts
   that are claimable and were never dispatched (retries whose backoff is over) or whose dispatch
   was not claimed within ``recheck_ms`` (a job RQ still holds waiting or running is not pushed
   again; a paused queue's are sent once it is resumed); an outbox of versions before 2026-12 is
   drained the way it was sent;
4. tidies RQ: the job of a reconciled Attempt is removed from RQ's registries (the Attempt is
   settled, its message is moot), and, every ``tidy_every_s``, registry entries naming jobs RQ no
   longer holds are removed (``rq requeue --all`` and rq-dashboard fail on those), each message in a
   fair lane has its ticket, and idle keys' passes that say nothing are dropped (``transport.tidy_lanes``);
5. keeps Redis bounded: packs the history of tasks that finished ``pack_after_ms`` ago into one
   compressed document each (``lua/pack.lua``); deletes the ended tasks each queue's retention policy
   lets go (``Reads.retention``: age and/or count, finished and held tasks apart), in batches, each
   handed to the archive first when one is set, each leaving a tombstone (``lua/retire.lua``); and
   forgets producer keys whose tombstone window has passed (``lua/idem_trim.lua``) and spend ceilings'
   buckets no window counts any more (``lua/spend_trim.lua``). This step works
   for at most ``retention_budget_s`` a pass and goes on at the next one.

Every step re-checks its condition inside its script, so two sweepers at once are safe, and a
sweeper killed mid-pass leaves nothing half-decided (a reconciling Attempt is taken up again).
Its cost grows with what is due (expired leases, suspects, due dispatches), not with the number of
tasks in Redis. One bad index entry never stops a batch: an entry whose task is gone or that cannot
be read is dropped and logged (``orphan_index_entry``), any other error is reported and the pass
goes on. On a namespace that lost state the sweeper decides nothing and says so at every pass.
Every pass starts with the client's replication lineage check (:meth:`Backend.check_lineage`), so a
failover that lost acknowledged writes is found within one pass of the sweeper reaching the new
primary.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from ..client import Client
from ..client.maintenance import PACK_AFTER_MS
from ..contracts.errors import McqError, NamespaceLost, TaskNotFound, TransitionRefused
from ..contracts.keys import parse_attempt_id, parse_task_id
from ..contracts.models import AttemptState
from ..policy.reconcile import Reconciler
from ..producer.dispatch import DEFAULT_CLAIM_GRACE_MS, DEFAULT_RECHECK_MS, dispatch
from ..producer.transport import clear_job, forget_orphans, job_id, rq_connection, rq_queue, rq_queues_of, tidy_lanes
from .archive import ArchiveError, ArchiveSink, archive_and_retire
from .timing import age_priorities, enforce_deadlines

log = logging.getLogger("mc_queue.sweeper")


MAX_DUE_PAGE = 10_000  # due dispatches one pass reads at most, paused queues' entries included
PROMOTE_EVERY_S = 0.05  # how often Sweeper.run looks for what came due between passes
PROMOTE_LOOKBACK_MS = 2_000  # what came due before a sweeper first looked at a queue is left to the walk


@dataclass
class SweepReport:
    expired: list[str] = field(default_factory=list)
    reconciled: dict[str, str] = field(default_factory=dict)  # attempt id -> task state after
    dispatched: list[str] = field(default_factory=list)
    rechecked: list[str] = field(default_factory=list)  # due dispatches RQ still held: not pushed again
    tidied: list[str] = field(default_factory=list)  # RQ job ids removed from RQ's registries
    dropped: list[str] = field(default_factory=list)  # index entries that named nothing (orphans)
    errors: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)  # due dispatches of paused queues: not sent
    packed: int = 0  # finished tasks whose history was packed
    retired: dict[str, int] = field(default_factory=dict)  # "<queue>/<done|held>" -> tasks deleted by retention
    archived: int = 0  # records handed to the archive
    namespace: str = "ok"  # the namespace's state; anything but ok means this pass decided nothing
    archive_error: str = ""  # why retention stopped in this pass: the archive failed (nothing deleted)
    forgotten: list[str] = field(default_factory=list)  # queues with no task and no policy, forgotten
    ticks: list[str] = field(default_factory=list)  # periodic ticks decided: "<schedule>@<tick ms> <outcome>"
    deadlines: list[str] = field(default_factory=list)  # "<task id> start_by|finish_by": canceled for it
    aged: list[str] = field(default_factory=list)  # "<attempt id> p<from>-><to>": messages moved up by aging
    released: list[str] = field(default_factory=list)  # tasks whose parents all ended as they wait for: pending
    canceled: list[str] = field(default_factory=list)  # tasks canceled because a parent did not succeed
    woken: list[str] = field(default_factory=list)  # Attempts parked for a concurrency slot, made due as one returned

    def as_dict(self) -> dict[str, Any]:
        return {"expired": self.expired, "reconciled": self.reconciled, "dispatched": self.dispatched,
                "ticks": self.ticks, "deadlines": self.deadlines, "aged": self.aged, "released": self.released,
                "canceled": self.canceled, "woken": self.woken,
                "rechecked": self.rechecked, "tidied": self.tidied, "dropped": self.dropped, "errors": self.errors,
                "paused": self.paused, "packed": self.packed, "retired": self.retired, "archived": self.archived,
                "namespace": self.namespace, "archive_error": self.archive_error, "forgotten": self.forgotten}


class Sweeper:
    def __init__(self, client: Client, *, app: Any = None, batch: int = 200, actor: str | None = None,
                 recheck_ms: int = DEFAULT_RECHECK_MS, tidy_every_s: float = 60.0,
                 archive: ArchiveSink | None = None, pack_after_ms: int = PACK_AFTER_MS,
                 retention_budget_s: float = 1.0, retention_batch: int = 500,
                 claim_grace_ms: int = DEFAULT_CLAIM_GRACE_MS, priority_aging_ms: int | None = None) -> None:
        self.client = client
        self.priority_aging_ms = priority_aging_ms  # a message waits this long per priority level, then moves up
        self.actor = actor or f"sweeper@{client.actor}"
        self.reconciler = Reconciler(client, dict(app.operations) if app is not None else {}, actor=self.actor)
        self.batch, self.recheck_ms, self.claim_grace_ms = batch, recheck_ms, claim_grace_ms
        self.tidy_every_s = tidy_every_s
        self._rq: redis.Redis | None = None
        self._walk: dict[str, int] = {}  # queue -> rank in its pending index where the dispatch walk goes on
        self._came_due: dict[str, tuple[int, int]] = {}  # queue -> (due time, entries at it) promote reached
        self.next_due_s: float | None = None  # from the last promote: seconds to the next due time it saw
        self._tidied_at = float("-inf")
        self.archive = archive
        self.pack_after_ms, self.retention_budget_s = pack_after_ms, retention_budget_s
        self.retention_batch = retention_batch
        self.archive_error: str | None = None  # set while the archive fails (retention stopped)

    def run_once(self) -> SweepReport:
        started = time.monotonic()
        report = SweepReport()
        try:
            # The replication lineage first: a failover that lost acknowledged writes marks the namespace
            # lost here (the watermark of this host's processes against the primary's history).
            self.client.backend.check_lineage()
        except NamespaceLost as exc:
            log.error("namespace %r: %s", self.client.keys.prefix, exc)
        info = self.client.reads.namespace()
        if info.state == "missing":
            # A namespace nobody has written yet (a deployment starts its processes in any order): nothing
            # to sweep, nothing decided, nothing written that could look like a loss. The pass is recorded
            # below: the sweeper is alive.
            report.namespace = "missing"
        elif not info.usable:
            report.namespace = info.state
            log.error("namespace %r is %s (%s): the sweeper decides nothing until `mcq recover` has run",
                      self.client.keys.prefix, info.state, info.reason)
            return report
        else:
            self._sweep(report)
        # Liveness for metrics (mcq_sweeper_*): when the last pass ended (this host's clock), how long it
        # took, how many passes, and why retention is stopped ('' when it is not: the archive fails).
        # A refused write (Redis out of memory) costs the record, not the pass.
        pipe = self.client.redis.pipeline(transaction=True)
        pipe.hset(self.client.keys.sweeper, mapping={"last_pass_ms": int(time.time() * 1000),
                                                     "pass_ms": round((time.monotonic() - started) * 1000, 3),
                                                     "retention_error": self.archive_error or ""})
        pipe.hincrby(self.client.keys.sweeper, "passes", 1)
        try:
            pipe.execute()
        except redis.ResponseError as exc:
            log.warning("sweeper pass not recorded for metrics: %s", exc)
        return report

    def _sweep(self, report: SweepReport) -> None:
        try:
            self._tick(report)
            self._release(report)
            self._wake_slots(report, audit=True)
            self._deadlines(report)
            self._age(report)
            self._expire(report)
            self._reconcile(report)
            self._dispatch(report)
            self._tidy(report)
            self._bound(report)
        except NamespaceLost as exc:
            report.namespace = "lost"
            log.error("namespace %r lost state during this pass (%s): the sweeper stops deciding until "
                      "`mcq recover` has run", self.client.keys.prefix, exc)

    def _tick(self, report: SweepReport) -> None:
        """Periodic schedules: every tick that came due, decided once among all sweepers; the task a tick
        made goes to RQ at once (as an App's enqueue sends it), unless its queue is paused."""
        made: list[str] = []
        for t in self.client.periodic.run_due(actor=self.actor):
            report.ticks.append(f"{t.schedule}@{t.tick_ms} {t.outcome}" + (f" ({t.why})" if t.why else ""))
            if t.outcome in ("failed", "deferred"):
                report.errors.append(f"periodic {t.schedule}@{t.tick_ms}: {t.outcome}: {t.why}")
            elif t.outcome == "ran" and t.task_id:
                made.append(f"{t.task_id}/1")
        self._send_unpaused(made, report)

    def _release(self, report: SweepReport) -> None:
        """Tasks waiting for others whose parents ended (``Dependencies.release_due``): the pending ones go to
        RQ at once unless their queue is paused (the dispatch walk covers a crash in between)."""
        r = self.client.dependencies.release_due(limit=self.batch, actor=self.actor)
        report.released.extend(r.released)
        report.canceled.extend(r.canceled)
        report.errors.extend(r.errors)
        self._send_unpaused([f"{t}/1" for t in r.released], report)

    def _wake_slots(self, report: SweepReport, *, audit: bool = False) -> None:
        """Send the Attempts whose concurrency slot returned (``Slots.wake_due``; a pass audits first)."""
        report.woken += self.client.slots.wake_due(limit=self.batch, actor=self.actor, audit=audit)
        self._send_unpaused(report.woken, report)

    def _send_unpaused(self, aids: list[str], report: SweepReport) -> None:
        """Send these Attempts 1 of new or released tasks now, but not those of a paused queue (the dispatch
        walk sends them once it is resumed). One read of the paused queues, none when there is nothing."""
        if aids:
            paused = set(self.client.reads.paused_queues())
            self._send([aid for aid in aids if parse_task_id(parse_attempt_id(aid)[0]) not in paused], report)

    def _deadlines(self, report: SweepReport) -> None:
        missed, errors = enforce_deadlines(self.client, actor=self.actor, limit=self.batch)
        report.deadlines.extend(missed)
        report.errors.extend(errors)

    def _age(self, report: SweepReport) -> None:
        if self.priority_aging_ms:
            report.aged.extend(age_priorities(self.client, self.rq, aging_ms=self.priority_aging_ms,
                                              limit=self.batch))

    def _expire(self, report: SweepReport) -> None:
        expired = self.client.maintenance.expire_due(limit=self.batch, actor=self.actor)
        overdue = self.client.maintenance.due_cancels(limit=self.batch)
        if overdue:  # cancellation: the executor did not acknowledge in time, its lease is voided
            expired.merge(self.client.maintenance.expire(overdue, actor=self.actor, force=True,
                                             reason="cancel not acknowledged in time", index="cancels"))
        report.expired.extend(e.attempt_id for e in expired.expired)
        report.dropped.extend(expired.dropped)
        report.errors.extend(f"{m}: {why}" for m, why in expired.errors)

    def _drop(self, index: str, member: str, why: str, report: SweepReport) -> None:
        try:
            if self.client.maintenance.drop_index_entry(index, member, reason=why, actor=self.actor):
                report.dropped.append(member)
        except TransitionRefused as exc:  # the entry is right after all (state moved on meanwhile)
            log.info("%s entry %s kept: %s", index, member, exc)
        except McqError as exc:
            report.errors.append(f"{member}: {exc}")

    def _reconcile(self, report: SweepReport) -> None:
        for aid in self.client.reads.task_ids_of("suspect", limit=self.batch):
            try:
                parse_attempt_id(aid)
            except ValueError as exc:
                self._drop("suspect", aid, str(exc), report)
                continue
            try:
                attempt = self.reconciler.reconcile(aid, apply_policy=True)
                task = self.client.reads.get_task(attempt.task_id)
                report.reconciled[aid] = task.state.value
                clear_job(self.rq, rq_queue(self.rq, self.client.keys.prefix, task.queue, task.priority),
                          job_id(self.client.keys.prefix, aid), delete=True)
                report.tidied.append(job_id(self.client.keys.prefix, aid))
            except TaskNotFound:
                self._drop("suspect", aid, "no such task", report)
            except TransitionRefused as exc:  # settled meanwhile by another sweeper, or a stale entry
                log.info("reconcile of %s skipped: %s", aid, exc)
                self._drop("suspect", aid, str(exc), report)
            except NamespaceLost:
                raise
            except (redis.ConnectionError, redis.TimeoutError):
                raise
            except Exception as exc:  # one bad entry never stops the batch
                log.exception("reconcile of %s failed", aid)
                report.errors.append(f"{aid}: {type(exc).__name__}: {exc}")

    def _due_unpaused(self, report: SweepReport) -> list[str]:
        """Up to a batch of due dispatches of queues that are not paused: a page of each queue's
        dispatch walk (``Maintenance.dispatch_walk``), then what is due in an outbox of versions before
        2026-12. A paused queue's due Attempts are not sent (listed in ``report.paused``; sent after
        `mcq queue resume`); nor are its old outbox entries, and when they fill the head of the outbox
        the page grows past them (up to MAX_DUE_PAGE entries a pass) so that other queues' are not held
        back."""
        paused = set(self.client.reads.paused_queues())  # read once per pass
        walked: list[str] = []
        for queue in sorted(self.client.reads.queues()):
            if len(walked) >= self.batch:
                break
            page, self._walk[queue] = self.client.schedule.dispatch_walk(
                queue, offset=self._walk.get(queue, 0), limit=self.batch, recheck_ms=self.recheck_ms)
            if queue in paused:
                report.paused.extend(page)  # not sent: after `mcq queue resume`
            else:
                walked += page
        return walked[:self.batch] + self._old_outbox(report, paused)

    def _old_outbox(self, report: SweepReport, paused: set[str]) -> list[str]:
        limit = self.batch
        due = self.client.maintenance.due_dispatches(limit=limit)
        if not paused or not due:
            return due

        def held(aid: str) -> bool:
            try:
                return parse_task_id(parse_attempt_id(aid)[0]) in paused
            except ValueError:
                return False  # a malformed entry is dropped by the loop below

        while True:
            skipped = [a for a in due if held(a)]
            ready = [a for a in due if not held(a)]
            if len(ready) >= self.batch or len(due) < limit or limit >= MAX_DUE_PAGE:
                break
            limit = min(MAX_DUE_PAGE, len(skipped) + self.batch)
            due = self.client.maintenance.due_dispatches(limit=limit)
        report.paused.extend(skipped)
        return ready[:self.batch]

    def promote(self) -> list[str]:
        """Send what came due since the last look (a scheduled task, a retry after its backoff: ``came_due``),
        without waiting for the next pass; a paused queue's wait for the pass. Cheap enough to run between
        passes (:meth:`run` does, every ``promote_every_s``): two round trips when nothing came due, one for
        the periodic schedules (their ticks are decided here too); tasks whose parents ended are released and
        Attempts whose concurrency slot returned are woken here too. Returns the Attempts sent."""
        self._tick(SweepReport())
        pipe = self.client.redis.pipeline(transaction=False)
        pipe.smembers(self.client.keys.queues)
        pipe.hkeys(self.client.keys.paused)
        pipe.time()
        pipe.zcard(self.client.keys.released)
        pipe.zcard(self.client.keys.slotwake)
        queues, paused, (now_s, now_us), released, wake = pipe.execute()
        report = SweepReport()
        if released:  # parents ended with tasks waiting for them (no round trip of its own when none did)
            self._release(report)
        if wake:  # concurrency slots returned with Attempts waiting for them
            self._wake_slots(report)
        now = int(now_s) * 1000 + int(now_us) // 1000
        live = set(queues) - set(paused)
        for queue in live - set(self._came_due):
            self._came_due[queue] = (now - PROMOTE_LOOKBACK_MS, 0)  # older ones are the walk's
        cursors = {queue: self._came_due[queue] for queue in live}
        if not cursors:
            return report.dispatched
        ahead: dict[str, int] = {}
        due, self._came_due = self.client.schedule.came_due(cursors, limit=self.batch, next_due=ahead)
        now_ms = ahead.pop("now", now)
        self.next_due_s = (min(ahead.values()) - now_ms) / 1000 if ahead else None
        self._send(due, report)
        return report.dispatched

    def _dispatch(self, report: SweepReport) -> None:
        self._send(self._due_unpaused(report), report)

    def _send(self, aids: list[str], report: SweepReport) -> None:
        for aid in aids:
            try:
                task_id, n = parse_attempt_id(aid)
            except ValueError as exc:
                self._drop("outbox", aid, str(exc), report)
                continue
            try:
                task = self.client.reads.get_task(task_id)
                attempt = task.attempts[n - 1] if n <= len(task.attempts) else None
                if attempt is None or attempt.state is not AttemptState.PENDING:
                    self.client.schedule.mark_dispatched(aid, recheck_ms=self.recheck_ms)  # drops the stale entry
                    continue
                if dispatch(self.client, self.rq, task, attempt, recheck_ms=self.recheck_ms,
                            claim_grace_ms=self.claim_grace_ms):
                    report.dispatched.append(aid)
                else:
                    report.rechecked.append(aid)
            except TaskNotFound:
                self.client.schedule.mark_dispatched(aid, recheck_ms=self.recheck_ms)  # drops the orphan, logged
                report.dropped.append(aid)
            except NamespaceLost:
                raise
            except (redis.ConnectionError, redis.TimeoutError):
                raise
            except Exception as exc:
                log.exception("dispatch of %s failed", aid)
                report.errors.append(f"{aid}: {type(exc).__name__}: {exc}")

    @property
    def rq(self) -> redis.Redis:
        """The connection to RQ's keys (bytes responses), opened on first use."""
        if self._rq is None:
            self._rq = rq_connection(self.client)
        return self._rq

    def _tidy(self, report: SweepReport) -> None:
        if time.monotonic() - self._tidied_at < self.tidy_every_s:
            return
        self._tidied_at = time.monotonic()
        for queue in self.client.reads.queues():
            for rq_q in rq_queues_of(self.rq, self.client.keys.prefix, queue):  # (each priority's)
                report.tidied.extend(forget_orphans(self.rq, rq_q, limit=self.batch))
            tidy_lanes(self.client, self.rq, queue)  # (tickets for what waits in its fair lanes)

    def keep_bounded(self) -> SweepReport:
        """Step 5 alone (pack, retire, forget expired producer keys): for a process that runs it apart
        from the other steps, and for the soak benchmark."""
        report = SweepReport()
        self._bound(report)
        return report

    def _bound(self, report: SweepReport) -> None:
        """Step 5: pack, retire, forget expired producer keys and empty queues; at most retention_budget_s of
        work for packing and retiring."""
        deadline = time.monotonic() + self.retention_budget_s
        c = self.client
        while time.monotonic() < deadline:
            n = c.maintenance.pack_due(limit=self.retention_batch, min_age_ms=self.pack_after_ms)
            report.packed += n
            if n < self.retention_batch:
                break
        self._retire(report, deadline)
        c.maintenance.trim(limit=1000)  # producer keys past their window, spend buckets past every window
        forgotten = c.maintenance.forget_empty_queues(limit=100, actor=self.actor)
        report.forgotten.extend(forgotten)
        for queue in forgotten:  # RQ's registries of a queue no longer listed are tidied once, here
            for rq_q in rq_queues_of(self.rq, c.keys.prefix, queue):
                report.tidied.extend(forget_orphans(self.rq, rq_q, limit=self.batch))

    def _retire(self, report: SweepReport, deadline: float) -> None:
        """Delete what each queue's retention policy lets go (archived first when an archive is set)."""
        c = self.client
        now = c.backend.redis_time_ms()
        queues = c.reads.queues()
        policies = c.reads.retention_policies(queues)  # one read for every queue
        for queue in queues:
            policy, source = policies[queue]
            for kind, age_s, keep, states in (
                    ("done", policy.done_s, policy.done_keep, ("succeeded", "canceled")),
                    ("held", policy.held_s, policy.held_keep, ("failed", "blocked", "quarantined"))):
                if age_s is None and keep is None:
                    continue
                before = now - int(age_s * 1000) if age_s is not None else None
                reason = (f"retention ({source} policy of queue {queue}: {kind} "
                          f"{'kept ' + str(age_s) + ' s' if age_s is not None else ''}"
                          f"{' newest ' + str(keep) if keep is not None else ''})")
                total = 0
                while time.monotonic() < deadline:
                    rows = c.maintenance.ended_tasks(queue, kind, before_ms=before, keep_newest=keep,
                                                     limit=self.retention_batch)
                    if not rows:
                        break
                    try:
                        out = archive_and_retire(c, self.archive, rows, states=states, reason=reason,
                                                 tombstone_s=policy.tombstone_s, now_ms=now, actor=self.actor)
                    except ArchiveError as exc:
                        # Nothing was deleted. Retention stops here (until the archive works again); the
                        # other steps of every pass go on: leases expire, suspects are reconciled.
                        self._archive_failed(report, exc)
                        return
                    report.archived += out["archived"]
                    total += out["retired"]
                    if out["refused"]:
                        report.errors.append(f"{queue}/{kind}: {out['refused']} index entries named tasks in "
                                             "another state (left in place)")
                    if len(rows) < self.retention_batch or out["retired"] == 0:
                        break
                if total:
                    report.retired[f"{queue}/{kind}"] = total
                    c.operator.log_event("tasks_retired", {"queue": queue, "kind": kind, "count": total,
                                                           "actor": self.actor,
                                              "reason": reason, "archive": repr(self.archive) if self.archive else ""})
        self.archive_error = None

    def _archive_failed(self, report: SweepReport, exc: ArchiveError) -> None:
        first = self.archive_error is None
        self.archive_error = exc.message
        report.errors.append(f"retention stopped: {exc.message}")
        report.archive_error = exc.message
        (log.error if first else log.warning)(
            "retention is stopped: %s. Tasks are kept in Redis until the archive can be written again (free "
            "space, a writable folder); leases, reconciliation and dispatch go on", exc.message)

    def run(self, *, interval_s: float = 1.0, stop_after_s: float | None = None,
            promote_every_s: float = PROMOTE_EVERY_S) -> None:
        """Loop run_once() every ``interval_s`` seconds (forever, or until ``stop_after_s``), and
        :meth:`promote` every ``promote_every_s`` between passes."""
        started = time.monotonic()
        while stop_after_s is None or time.monotonic() - started < stop_after_s:
            t0 = time.monotonic()
            try:
                r = self.run_once()
                if r.expired or r.reconciled or r.dispatched or r.errors or r.dropped or r.tidied or r.retired \
                        or r.ticks or r.released or r.canceled or r.woken:
                    log.info("sweep: %s", r.as_dict())
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("sweep failed, Redis unreachable: %s", exc)
            except McqError as exc:
                log.error("sweep failed: %s", exc)
            # Between passes, what comes due (a scheduled task, a retry's backoff ended) is sent
            # within promote_every_s of its due time, not at the next pass.
            while (left := interval_s - (time.monotonic() - t0)) > 0:
                # (sooner when the last look saw the next due time coming: a rate limit's units returning)
                soon = self.next_due_s
                self.next_due_s = None
                time.sleep(min(left, promote_every_s, promote_every_s if soon is None else max(0.002, soon)))
                if promote_every_s < left:
                    try:
                        self.promote()
                    except (redis.ConnectionError, redis.TimeoutError) as exc:
                        log.warning("promote failed, Redis unreachable: %s", exc)
                        break
                    except McqError as exc:
                        log.error("promote failed: %s", exc)
                        break

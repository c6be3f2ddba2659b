"""Batch mode: one worker process drains many short Attempts per round trip, each still fenced, leased
and evented on its own.

:class:`McqBatchWorker` is RQ's in-process worker (its registration, queues, ``rq info`` and ``rq
suspend`` as RQ keeps them) that takes up to ``batch`` messages from its RQ queue at once instead of one:
the first by RQ's blocking dequeue, the rest in one pipeline of LMOVEs into RQ's intermediate list. It
screens them all (one read of every task), then works through them in **chunks**, each one round trip
to mc_queue's scripts: the completions of the chunk just run and the claims of the next
(:meth:`LeaseHolder.batch`, BullMQ's moveToFinished-and-fetch-next), and one pipeline of RQ's
bookkeeping (the finished jobs' ends, the next jobs' starts, as RQ's SimpleWorker writes them).

**Bounded by time.** A chunk is sized so that running it takes about ``chunk_ms`` (it starts at one
Attempt, doubles while a chunk runs in under half of that and halves when one runs over), and a
completion waits at most ``chunk_ms`` for the next round trip: a handler that takes seconds makes
chunks of one (the plain path's cost, plus nothing), a no-op handler chunks of the whole batch. A crash
strands at most one chunk's leases, and a pool's death watch voids them at once
(:mod:`mc_queue.worker.pool`); messages taken but not claimed yet wait in RQ's intermediate list, and
their Attempts, still pending and unclaimed, are sent again by the sweeper's dispatch walk. Every
Attempt a chunk claimed keeps its lease renewed by the process's heartbeat thread from its claim (the
leases of one process in one round trip) until its own handler ends. A stop request ends the batch
after the Attempt that is running: what was claimed and not started has its lease given up at once
(voided and reconciled, nothing ran), and what was not claimed goes back to the front of RQ's queue.

What changes against RQ's SimpleWorker: RQ sees one worker running several jobs (its executions), and
its per-job hooks (callbacks, retries, dependents) are not called (an mc_queue job has none,
:class:`~mc_queue.worker.jobs.McqJob`). A job's RQ timeout still bounds its own Attempt's handler.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta
from typing import Any, cast

import redis
from rq import Queue
from rq.executions import Execution
from rq.job import Job
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.worker import WorkerStatus

from ..client.holder import Claim, Completion
from ..contracts.errors import InvalidArgument, McqError, ReplicationUnconfirmed, TransitionRefused
from ..producer.transport import TICKET, take_from_lane
from .attempt import (
    Admission,
    Refusal,
    Runtime,
    Started,
    completion_outcome,
    finish_started,
    not_claimed,
    record_refusal,
    runtime,
    start_claimed,
    void_and_reconcile,
)
from .jobs import McqJob, screen_jobs
from .runner import WORKER_CLASSES, McqBaseWorker, McqSimpleWorker, dispose_job

log = logging.getLogger("mc_queue.worker")

DEFAULT_BATCH = 20  # messages one batch takes from RQ
MAX_BATCH = 500
DEFAULT_CHUNK_MS = 100.0  # a chunk of Attempts runs in about this; a completion waits at most this long


class McqBatchWorker(McqSimpleWorker):
    """RQ's in-process worker, draining up to ``batch`` Attempts per dequeue (see the module)."""

    batch = DEFAULT_BATCH
    chunk_ms = DEFAULT_CHUNK_MS
    size = 1  # the chunk size reached (each batch starts where the last one left it)

    def execute_job(self, job: Job, queue: Queue) -> None:
        rt = runtime()
        try:
            self._drain(rt, queue, cast(McqJob, job))
        finally:
            self._admitted = None
            if self._grace is not None:
                self._grace.cancel()
            self.set_state(WorkerStatus.IDLE)

    def _screen(self, rt: Runtime, jobs: list[McqJob], queue: Queue) -> list[tuple[McqJob, Admission]]:
        """The jobs a worker may act on, bound to their Attempts; each refused one recorded and removed."""
        admitted: list[tuple[McqJob, Admission]] = []
        for j, verdict in zip(jobs, screen_jobs(rt, jobs, queue.name), strict=True):
            if isinstance(verdict, Refusal):
                record_refusal(rt, verdict, job_id=str(j.id)[:300], queue=queue.name)
                dispose_job(self.connection, j, queue)
            else:
                j.admit(verdict)
                admitted.append((j, verdict))
        return admitted

    def _take_more(self, queue: Queue, count: int) -> list[McqJob]:
        """Up to ``count`` more messages of this queue, moved into RQ's intermediate list as RQ's own
        dequeue moves one (so a crash here leaves them where RQ's cleanup looks)."""
        if count <= 0:
            return []
        pipe = self.connection.pipeline(transaction=False)
        for _ in range(count):  # (RQ's rule: with several queues a message is popped, with one moved)
            if len(self.queues) == 1:
                pipe.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
            else:
                pipe.lpop(queue.key)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in pipe.execute() if i is not None]
        if TICKET in ids:  # messages waiting in fair lanes: each ticket takes the one fair_pop.lua chooses
            if len(self.queues) == 1:
                self.connection.lrem(queue.intermediate_queue_key, ids.count(TICKET), TICKET)
            client = runtime().client
            ids = [j for j in (take_from_lane(client, queue.key) if i == TICKET else i for i in ids) if j is not None]
        if not ids:
            return []
        out: list[McqJob] = []
        gone: list[str] = []
        for jid, fetched in zip(ids, McqJob.fetch_many(ids, self.connection, self.serializer), strict=True):
            if fetched is None:
                gone.append(jid)  # deleted after it was queued: RQ's dequeue skips those too
            else:
                out.append(cast(McqJob, fetched))
        if gone:
            pipe = self.connection.pipeline(transaction=False)
            for jid in gone:
                pipe.lrem(queue.intermediate_queue_key, 1, jid)
            pipe.execute()
        return out

    # -- the chunks

    def _drain(self, rt: Runtime, queue: Queue, first: McqJob) -> None:
        """Chunk after chunk: each takes from RQ only what it claims at once (a crash strands no message
        taken and not claimed), up to ``batch`` messages in all before RQ's loop has its turn again."""
        leases = rt.client.leases
        ready = self._screen(rt, [first], queue)
        taken, size = 1, self.size
        deferred: list[tuple[Completion, str]] = []  # (completion, handler), sent with the next round trip
        ended: list[tuple[McqJob, Execution]] = []  # RQ jobs run since the last bookkeeping
        try:
            while not self._stop_requested:
                if len(ready) < size and taken < self.batch:
                    more = self._take_more(queue, min(size - len(ready), self.batch - taken))
                    taken += len(more)
                    ready += self._screen(rt, more, queue)
                if not ready:
                    break
                chunk, ready = ready[:size], ready[size:]
                claims = [leases.claim_request(adm.task_id, expect_attempt=adm.number, budget_s=adm.timeout_s,
                                               limits=adm.limits)
                          for _, adm in chunk]
                got = self._round_trip(rt, deferred, claims)
                deferred = []
                executions = self._rq_bookkeeping(ended, [j for j, _ in chunk], queue)
                ended = []
                started: list[tuple[McqJob, Started]] = []
                for (j, adm), lease in zip(chunk, got, strict=True):
                    st: Started | dict[str, Any]
                    if isinstance(lease, (TransitionRefused, ReplicationUnconfirmed)):
                        st = not_claimed(rt, adm, lease)
                    elif isinstance(lease, BaseException):
                        log.warning("attempt %s: not claimed: %s", adm.attempt_id, lease)
                        st = {"skipped": str(lease)}
                    else:
                        st = start_claimed(rt, adm, lease)
                    if isinstance(st, Started):
                        started.append((j, st))
                    else:
                        ended.append((j, executions[j.id]))
                t0 = time.monotonic()
                for i, (j, st) in enumerate(started):
                    if self._stop_requested:
                        self._give_up(rt, [s for _, s in started[i:]], "the worker is stopping")
                        ended.extend((k, executions[k.id]) for k, _ in started[i:])
                        break
                    completions: list[Completion] = []
                    self._admitted = st.adm
                    j.started_at = now()
                    try:
                        with self.death_penalty_class(st.adm.timeout_s, JobTimeoutException, job_id=j.id):
                            finish_started(rt, st, defer=completions)
                    except BaseException:
                        self._give_up(rt, [s for _, s in started[i + 1:]], "the worker stopped during its batch")
                        raise
                    finally:
                        self._admitted = None
                        j.ended_at = now()
                        ended.append((j, executions[j.id]))
                    if completions and not deferred:
                        first_deferred = time.monotonic()
                    deferred.extend((c, st.ctx.task.handler) for c in completions)
                    if deferred and 1000 * (time.monotonic() - first_deferred) >= self.chunk_ms:
                        self._round_trip(rt, deferred, [])  # no completion waits longer than chunk_ms
                        deferred = []
                took_ms = 1000 * (time.monotonic() - t0)
                if took_ms < self.chunk_ms / 2 and len(chunk) == size:
                    size = min(size * 2, self.batch)
                elif took_ms > self.chunk_ms:
                    size = max(1, size // 2)
                self.size = size
        finally:
            # Whatever ended the batch: what finished is recorded, RQ told, and what was not claimed
            # goes back to the front of RQ's queue (each step on its own: Redis may be the reason).
            with contextlib.suppress(McqError, redis.RedisError):
                if deferred:
                    self._round_trip(rt, deferred, [])
            with contextlib.suppress(redis.RedisError):
                self._rq_bookkeeping(ended, [], queue)
            if ready:  # taken and not claimed (a stop request): back to the front of RQ's queue
                self._return_to_rq([j for j, _ in ready], queue)

    def _round_trip(self, rt: Runtime, deferred: list[tuple[Completion, str]], claims: list[Claim]) -> list[Any]:
        """The deferred completions and the next chunk's claims, in one round trip; each completion's
        outcome logged and acted on (a cancel acknowledged) as the plain path does. Returns the leases
        (or why not) of the claims."""
        leases = rt.client.leases
        try:
            batch = leases.batch(rt.worker_id, complete=[c for c, _ in deferred], claim=claims)
        except ReplicationUnconfirmed as exc:
            # Applied on the primary only: the completions stand there (a failover may take them: the
            # leases then run out and the sweeper reconciles them); the claims run nothing.
            for c, _ in deferred:
                log.warning("attempt %s: its completion is not confirmed by the replicas: %s", c.attempt_id,
                            exc.message)
            taken = [f"{c.task_id}/{r[1]}" for c, r in zip(claims, exc.replies[len(deferred):], strict=False)
                     if isinstance(r, list) and len(r) > 1 and str(r[0]) in ("OK", "DUP")]
            if taken:
                with contextlib.suppress(McqError, redis.RedisError):
                    rt.client.operator.void_leases(taken, actor=rt.worker_id,
                                                   reason="claim not confirmed by the replicas")
            return [exc] * len(claims)
        for (c, handler), done in zip(deferred, batch.completed, strict=True):
            completion_outcome(rt, c.attempt_id, c.fence, handler, done)
        return list(batch.claimed)

    def _give_up(self, rt: Runtime, started: list[Started], why: str) -> None:
        """Claimed Attempts this batch will not run: their heartbeats stop and their leases are voided now
        (by holder) and reconciled; nothing of theirs ran."""
        if not started:
            return
        for st in started:
            st.ctx.stop_heartbeats()
        void_and_reconcile(rt.client, rt.app, [st.adm.attempt_id for st in started], holder=rt.worker_id,
                           why=f"claimed by a batch that ended before running it ({why})")

    # -- RQ's bookkeeping, a pipeline per chunk

    def _rq_bookkeeping(self, ended: list[tuple[McqJob, Execution]], starting: list[McqJob],
                        queue: Queue) -> dict[str, Execution]:
        """RQ's ends of the jobs run (their counts and working time, the job and its execution deleted:
        result_ttl 0) and the starts of the next ones (their executions, status started, out of the
        intermediate list), as RQ's SimpleWorker writes them one job at a time, in one transaction."""
        executions: dict[str, Execution] = {}
        if not ended and not starting:
            return executions
        with self.connection.pipeline() as pipe:
            working = timedelta()
            for j, execution in ended:
                if j.started_at is None:
                    j.started_at = now()
                if j.ended_at is None:
                    j.ended_at = now()
                working += j.ended_at - j.started_at
                j.delete_ran(pipe)
                self.cleanup_execution(j, pipeline=pipe, execution=execution)
            if ended:  # the worker's job count and working time, as RQ adds them a job at a time
                pipe.hincrby(self.key, "successful_job_count", len(ended))
                self.increment_total_working_time(working, pipe)
            ttl = 0
            for j in starting:
                job_ttl = self.get_heartbeat_ttl(j)
                ttl = max(ttl, job_ttl)
                execution = Execution.create(j, job_ttl, pipeline=pipe, worker_name=self.name)
                self.executions[execution.id] = execution
                executions[j.id] = execution
                j.heartbeat(now(), job_ttl, pipeline=pipe)
                j.prepare_for_execution(self.name, pipeline=pipe)
                pipe.persist(j.key)
                pipe.lrem(queue.intermediate_queue_key, 1, j.id)
            if starting:
                self.set_state(WorkerStatus.BUSY, pipeline=pipe)
                self.heartbeat(ttl, pipeline=pipe)
            pipe.execute()
        return executions

    def _return_to_rq(self, jobs: list[McqJob], queue: Queue) -> None:
        """Messages taken and not claimed, back at the front of their queue in their order."""
        with contextlib.suppress(redis.RedisError):
            pipe = self.connection.pipeline()
            for j in reversed(jobs):
                pipe.lrem(queue.intermediate_queue_key, 1, j.id)
                pipe.lpush(queue.key, j.id)
            pipe.execute()


def worker_class(kind: str, *, batch: int = DEFAULT_BATCH, chunk_ms: float = DEFAULT_CHUNK_MS) -> type[McqBaseWorker]:
    """The worker class ``mcq worker --kind KIND`` runs: fork, simple, or batch with its batch size and
    chunk time (a class of its own, so that a pool's forked workers have them too)."""
    if kind != "batch":
        return WORKER_CLASSES[kind]
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise InvalidArgument(f"batch must be a whole number from 1 to {MAX_BATCH}, got {batch!r}")
    if isinstance(chunk_ms, bool) or not isinstance(chunk_ms, (int, float)) or not 1 <= chunk_ms <= 60_000:
        raise InvalidArgument(f"chunk_ms must be a number of milliseconds from 1 to 60000, got {chunk_ms!r}")
    return type("McqBatchWorker", (McqBatchWorker,), {"batch": batch, "chunk_ms": float(chunk_ms)})

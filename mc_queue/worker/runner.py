"""The consumer side's bridge to RQ: RQ carries Attempts to worker processes; mc_queue stays the authority.

Here are RQ's worker classes as mc_queue runs them (every job screened before it runs, a liveness key,
the stop rules below), how a worker process is configured, and which workers are live. Running an
Attempt and writing its outcome is :mod:`mc_queue.worker.attempt`'s; what a job must be before it runs,
:mod:`mc_queue.worker.jobs`'s.

**Stopping.** SIGTERM or SIGINT stops an idle worker at once; a busy one finishes its Attempt
(warm shutdown) for up to ``grace_s`` seconds. A second signal, or the end of the grace period,
stops it at once (a forking worker kills the process running the handler): the Attempt is not
failed, its lease runs out and the sweeper reconciles it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, cast

import redis
from rq import Queue, SimpleWorker, Worker
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import BaseWorker, WorkerStatus

from ..client import Client
from ..contracts import failpoints
from ..contracts.errors import McqError
from ..contracts.keys import parse_attempt_id
from ..producer.app import App
from ..producer.transport import PRIORITIES, TICKET, rq_connection, rq_queue_name, split_rq_name, take_from_lane
from .attempt import (
    DEFAULT_GRACE_S,
    Admission,
    Refusal,
    Runtime,
    describe_exit,
    horse_died,
    record_refusal,
    runtime,
    set_runtime,
    void_and_reconcile,
)
from .jobs import McqJob, screen_job
from .probes import Probes
from .workspace import WorkspaceRoot, default_root

log = logging.getLogger("mc_queue.worker")

EXIT_STOPPED_MIDWAY = 5  # `mcq worker`'s exit code when it stopped before its Attempt finished
# RQ's worker_ttl: an idle worker's blocking dequeue lasts worker_ttl - 15 s and its socket times out
# 10 s later. RQ's default (420: a 405 s BLMOVE) left workers blocked for minutes on a connection to a
# primary that had failed over (bench/failover.py); with 35 an idle worker re-asks where the primary
# is within ~30 s, at the cost of one BLMOVE every 20 s.
WORKER_TTL_S = 35


def dispose_job(connection: redis.Redis, job: Job, queue: Queue) -> None:
    """A refused job leaves RQ: out of the queue's intermediate list, its hash deleted (if it was an
    Attempt's message, the outbox sends it again)."""
    pipe = connection.pipeline(transaction=False)
    pipe.lrem(queue.intermediate_queue_key, 1, job.id)
    pipe.delete(job.key)
    pipe.execute()


class _NoJobOk(logging.Filter):
    """RQ's per-job success lines ("Job OK", "Successfully completed") say nothing about the Attempt
    (an Attempt that failed or was quarantined is a finished RQ job): mc_queue logs the outcome."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "Job OK" not in msg and not msg.startswith("Successfully completed")


_NO_JOB_OK = _NoJobOk()

_TEMPLATE: tuple[App, Client, Path, float] | None = None
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def configure(app: App, client: Client, workspace_root: str | os.PathLike[str] | None = None, *,
              home: str | os.PathLike[str] | None = None, grace_s: float = DEFAULT_GRACE_S) -> Path:
    """Set what every worker built in this process (or forked from it, as RQ's pool does) runs with.
    The workspace root defaults to ``<home>/workspaces/<prefix>`` (``home``: ``$MCQ_HOME``, the
    embedded server's folder); a home others may write to is refused (ConfigurationError)."""
    global _TEMPLATE
    root = Path(workspace_root) if workspace_root else default_root(client.keys.prefix, home)
    if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not 0 <= grace_s <= 86_400:
        raise McqError(f"grace_s must be a number of seconds from 0 to 86400, not {grace_s!r}")
    _TEMPLATE = (app, client, root, float(grace_s))
    return root


def worker_died(name: str, pid: int, exitcode: int | None) -> list[str]:
    """A worker process of this process's pool that ran its Attempts itself (SimpleWorker) ended: the
    leases it still held are voided now, by holder, and their Attempts reconciled (nothing else would
    until the leases ran out). A fork worker's Attempts run in work horses that may outlive it: those are
    left to their leases. Returns the Attempts voided."""
    if _TEMPLATE is None:
        return []
    app, client, _, _ = _TEMPLATE
    try:
        held = client.reads.leases_held_by(name)
    except redis.RedisError as exc:
        log.error("worker %s (pid %d) ended; its leases could not be read (%s): they run out by themselves",
                  name, pid, exc)
        return []
    how = describe_exit(exitcode, exitcode=True)
    return void_and_reconcile(client, app, held, holder=name, why=f"worker {name} (pid {pid}) running it ended ({how})")


def _install_runtime(name: str) -> Runtime:
    """Build this worker's Runtime and remove stale workspaces before it polls for work.

    A workspace is stale when its name is this namespace's and its Attempt holds no lease right now
    (the lease index says so): several workers and several namespaces may share one root, and none
    deletes another's live workspace.
    """
    if _TEMPLATE is None:
        raise McqError("call mc_queue.worker.runner.configure(app, client) before building a worker")
    app, client, root, grace_s = _TEMPLATE
    info = client.backend.open_namespace()  # the epoch, loaded once here: forked work horses inherit it
    # Workspace names carry the namespace's epoch: the same prefix on another Redis server sharing this
    # root has another epoch, and its live workspaces are never taken for this namespace's stale ones.
    workspaces = WorkspaceRoot(root, namespace=client.keys.prefix, epoch=info.epoch or None)

    def live() -> set[str]:
        return {workspaces.name_for(str(a)) for a in client.redis.zrange(client.keys.leases, 0, -1)}

    report = workspaces.cleanup_stale(keep=live)
    if report.removed or report.refused:
        log.warning("workspace cleanup in %s: removed %s; left alone %s", workspaces.root, report.removed,
                    report.refused)
    app.publish_retention(client)
    worker_id = _SAFE.sub("_", name)
    probes = Probes(app.probes, record=client.operator.audit, worker_id=worker_id) if app.probes else None
    rt = Runtime(app=app, client=client, worker_id=worker_id, workspaces=workspaces, cleanup=report,
                 grace_s=grace_s, probes=probes)
    set_runtime(rt)
    rq_log = logging.getLogger("rq.worker")
    if _NO_JOB_OK not in rq_log.filters:
        rq_log.addFilter(_NO_JOB_OK)
    return rt


JOB_MONITORING_INTERVAL_S = 5  # how often a worker waiting on its work horse wakes (RQ's default: 30)
LIVENESS_TTL_MS = 10_000  # a worker's liveness key lives this long after its last refresh
LIVENESS_EVERY_S = 3.0  # and is refreshed this often by a thread of the worker process
LIVENESS_SEEN_MS = 86_400_000  # "<liveness key>:seen": the worker kept one (refreshed with it, PX a day)
# RQ's own bookkeeping, lean (issue 17): how often the worker re-sends what RQ re-sends around every job.
HEARTBEAT_EVERY_S = 5.0  # the same heartbeat (same TTL: worker_ttl + 60 = 95 s) at most this often
SUSPENSION_CHECK_EVERY_S = 1.0  # `rq suspend` is seen within this (RQ: before every job)
BURST_PING_EVERY_S = 1.0  # a burst worker's reachability check before a dequeue (see dequeue_job_and_maintain_ttl)
PUBSUB_WAKE_S = 0.2  # how often the thread of RQ's command channel wakes (a socket wait, no Redis command)
PUBSUB_STOP_S = 3.0  # leaving, wait this long for that thread at most (RQ's handler of a link error sleeps 2 s)


class McqBaseWorker(BaseWorker):
    """What mc_queue adds to RQ's workers: every job screened before it runs, stop requests honoured
    (idle: now; busy: after the Attempt, within ``grace_s``; a second signal: now), and what happened
    recorded for the exit code (``stop_signal``, ``forced``, ``drained``, ``redis_error``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("worker_ttl", WORKER_TTL_S)
        # A worker waiting on its work horse wakes this often (RQ: 30 s) and only then acts on a second
        # signal that arrived meanwhile: a stop then took grace + 30 s (compose killed the pool first).
        kwargs.setdefault("job_monitoring_interval", JOB_MONITORING_INTERVAL_S)
        super().__init__(*args, **kwargs)
        rt = _install_runtime(self.name)
        self.grace_s = rt.grace_s
        self.log_job_description = False  # a job's description is free text anyone can write
        self.stop_signal: int | None = None
        self.forced = False
        self.drained = False
        self.redis_error: str | None = None
        self.burst = False
        self._admitted: Admission | None = None
        self._stop_at = 0.0
        self._grace: threading.Timer | None = None
        self._grace_over = False
        self._beat: tuple[float, int] | None = None  # (when, TTL) of the last heartbeat sent
        self._suspension_checked = -1e9
        self._pinged = -1e9
        self._dequeuing = False  # waiting in RQ's dequeue: the one place a stop may interrupt at once

    # -- the loop

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        self.burst = burst
        stop = threading.Event()
        beat = threading.Thread(target=self._liveness, args=(stop,), name="mcq-liveness", daemon=True)
        beat.start()
        probes = runtime().probes
        if probes is not None:  # (a thread of this process: each pool worker runs its own)
            threading.Thread(target=probes.loop, args=(stop,), name="mcq-probes", daemon=True).start()
        try:
            worked = bool(super().work(burst, *args, **kwargs))
        finally:
            stop.set()
            beat.join(timeout=2)
            client = runtime().client
            with contextlib.suppress(redis.RedisError):
                key = client.keys.worker(runtime().worker_id)
                client.redis.delete(key, key + ":seen")
        if self.forced:
            # Stopped before its Attempt finished (RQ's loop swallowed the exit of a simple worker's
            # force stop): the process says so by its exit code, in a pool's worker process too.
            raise SystemExit(EXIT_STOPPED_MIDWAY)
        return worked

    def subscribe(self) -> None:
        """RQ's command channel (``rq`` stop and kill commands), its thread waking every PUBSUB_WAKE_S, not
        every 60 s (RQ's): leaving, RQ stops that thread and closes its connection, which with redis-py 8.2 waited
        until the thread woke, so a stopped or drained worker's process lingered up to 60 s
        (tests/integration/test_example_app.py's stop grace, bench_priority's drain)."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = cast(Any, self.pubsub.run_in_thread(  # (typed None in RQ until then)
            sleep_time=PUBSUB_WAKE_S, daemon=True, exception_handler=self._pubsub_exception_handler))

    def teardown(self) -> None:
        """RQ's, and the command channel's thread stopped whatever happens: RQ registers the worker's death
        first, which on a link that just broke raises before it unsubscribes, and the thread it left
        behind reconnected and subscribed to this worker's channel for the rest of the process's life, one
        more each time Redis went away mid-job (tests/faults/test_worker_relink.py)."""
        try:
            super().teardown()  # type: ignore[no-untyped-call]  # (untyped in RQ)
        finally:
            if not self.is_horse:  # (a work horse shares its parent's sockets: never its channel's)
                self.unsubscribe()

    def unsubscribe(self) -> None:
        """Stop the command channel's thread (at most PUBSUB_STOP_S) and close its connection; the UNSUBSCRIBE
        is sent when the link allows. Once: a second call finds no thread."""
        thread, self.pubsub_thread = self.pubsub_thread, None
        if thread is None:
            return
        with contextlib.suppress(redis.RedisError, OSError):
            self.pubsub.unsubscribe()
        try:
            thread.stop(timeout=PUBSUB_STOP_S)  # redis-py 8: clears its flag and joins, bounded here
        except TypeError:
            thread.stop()  # older redis-py: clears the flag; the thread leaves at its next wake
        with contextlib.suppress(redis.RedisError, OSError):
            self.pubsub.close()

    def _liveness(self, stop: threading.Event) -> None:
        """mc_queue's own liveness key for this process, ``{prefix}:w:<worker id>`` ("<host> <pid>"), PX
        LIVENESS_TTL_MS, refreshed every LIVENESS_EVERY_S by this thread: a killed process's key is gone
        within LIVENESS_TTL_MS, whatever RQ's worker registration says."""
        rt = runtime()
        key = rt.client.keys.worker(rt.worker_id)
        value = f"{socket.gethostname()} {os.getpid()}"
        while True:
            try:
                pipe = rt.client.redis.pipeline(transaction=False)
                pipe.set(key, value, px=LIVENESS_TTL_MS)
                # "this worker keeps a liveness key": its absence then means dead, not an older worker
                pipe.set(key + ":seen", value, px=LIVENESS_SEEN_MS)
                if rt.probes is not None:  # what its probes say, gone with the liveness key
                    pipe.delete(key + ":probes")
                    pipe.hset(key + ":probes", mapping=cast(Any, rt.probes.published()))
                    pipe.pexpire(key + ":probes", LIVENESS_TTL_MS)
                pipe.execute()
            except redis.RedisError as exc:  # Redis away for a moment: the next beat tries again
                log.warning("worker liveness key not refreshed: %s", exc)
            if stop.wait(LIVENESS_EVERY_S):
                return

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        # RQ's dequeue waits for Redis forever; a burst worker says it cannot reach it. Checked at most
        # once a second (a drain's next dequeue follows a write that just went through).
        if self.burst and time.monotonic() - self._pinged >= BURST_PING_EVERY_S:
            try:
                self.connection.ping()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.redis_error = f"{type(exc).__name__}: {exc}"
                raise
            self._pinged = time.monotonic()
        self._dequeuing = True
        try:
            if self._stop_requested:  # (a stop that came after the loop's own check: not into the wait)
                raise StopRequested()
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        finally:
            self._dequeuing = False
        if result is None and self.burst:
            self.drained = True
        return result

    def execute_job(self, job: Job, queue: Queue) -> None:
        rt = runtime()
        mjob = cast(McqJob, job)
        try:
            adm = screen_job(rt, mjob, queue.name)
        except Refusal as refusal:
            record_refusal(rt, refusal, job_id=str(job.id)[:300], queue=queue.name)
            dispose_job(self.connection, job, queue)
            return
        mjob.admit(adm)
        self._admitted = adm
        try:
            super().execute_job(job, queue)
        finally:
            self._admitted = None
            if self._grace is not None:
                self._grace.cancel()

    # -- RQ's bookkeeping, lean (issue 17). RQ re-sends its worker heartbeat (three round trips, unpipelined)
    # before and after every job, writes the worker's state twice, checks for `rq suspend`, reads the
    # job's status and executions back (seven reads) to delete a job it just ran, and watches the job's
    # dependents. mc_queue's records are the truth, and an mc_queue job has no dependents, no result
    # kept and no rate limit: the same keys end the same way with about a third of the round trips.
    # `rq info` stays truthful: worker registration, state, current execution, job counts and working
    # time are written as RQ writes them; a worker's last_heartbeat may lag up to HEARTBEAT_EVERY_S.

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat in one round trip, and not again within HEARTBEAT_EVERY_S with the same TTL
        (a longer TTL set for a job is always brought back down at once: a dead worker leaves `rq info`
        when RQ says it does)."""
        ttl = timeout or self.worker_ttl + 60
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            self._beat = (time.monotonic(), ttl)
            return
        if self._beat is not None and self._beat[1] == ttl and time.monotonic() - self._beat[0] < HEARTBEAT_EVERY_S:
            return
        pipe = self.connection.pipeline(transaction=False)
        super().heartbeat(timeout, pipeline=pipe)
        pipe.execute()
        self._beat = (time.monotonic(), ttl)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's set_state, but a state already written is not written again (RQ sets "idle" after a job
        and again before the next dequeue)."""
        if pipeline is None and state == self.get_state():
            return
        super().set_state(state, pipeline=pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        """`rq suspend` honoured within SUSPENSION_CHECK_EVERY_S instead of a round trip before every job."""
        if time.monotonic() - self._suspension_checked < SUSPENSION_CHECK_EVERY_S:
            return
        super().check_for_suspension(burst)
        self._suspension_checked = time.monotonic()

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """The job's end time, without RQ's extra write of the job's heartbeat: the job is deleted (or,
        failed, kept as RQ keeps it) in the bookkeeping right after."""
        if not isinstance(job, McqJob):
            super().handle_execution_ended(job, queue, heartbeat_ttl)
            return
        job.ended_at = now()

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry: Any, execution: Any) -> None:
        """RQ's success bookkeeping of an mc_queue job in one transaction: the worker's counts and working
        time, the job and its execution records deleted (result_ttl 0). No dependents to watch or move,
        no result, no repeat, no rate-limit slot: an mc_queue job has none of them (McqJob)."""
        if not isinstance(job, McqJob) or job.get_result_ttl(self.default_result_ttl) != 0:
            super().handle_job_success(job, queue, started_job_registry, execution)
            return
        assert job.started_at is not None and job.ended_at is not None
        with self.connection.pipeline() as pipe:
            self.increment_successful_job_count(pipeline=pipe)
            self.increment_total_working_time(job.ended_at - job.started_at, pipe)
            job.delete_ran(pipe)
            self.cleanup_execution(job, pipeline=pipe, execution=execution)
            # What RQ writes right after, one round trip each: the worker idle again, its heartbeat back
            # to the idle TTL (a forking worker's parent writes both again: the child's are not its own).
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            self.heartbeat(pipeline=pipe)
            failpoints.hit("worker.between_jobs", attempt=str(job.id), worker=self.name)
            pipe.execute()

    def handle_work_horse_killed(self, job: Job, retpid: int, ret_val: int, rusage: Any) -> None:
        """The work horse died (SIGKILL, the OOM killer, a crash): its Attempt's lease is voided now rather
        than when it runs out, and the Attempt reconciled at once (:func:`horse_died`)."""
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)  # type: ignore[no-untyped-call]
        adm = self._admitted
        if adm is not None:
            horse_died(runtime(), adm.attempt_id, retpid, ret_val)

    # -- stopping

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM / SIGINT: stop now when idle, else after the current Attempt, within grace_s."""
        self.stop_signal = signum
        self._stop_at = time.monotonic()
        adm = self._admitted
        if not self._dequeuing and self.get_state() != WorkerStatus.BUSY:
            # Between two jobs (recording the last one's success, claiming the next): RQ would raise
            # StopRequested here, inside whatever Redis call the main thread is in, where the job's handling
            # swallows it and the stop is lost (the worker then waited in its next dequeue until killed).
            # The loop stops at its next turn instead, as it does for a busy worker.
            signal.signal(signal.SIGINT, self.request_force_stop)
            signal.signal(signal.SIGTERM, self.request_force_stop)
            self._shutdown_requested_date = now()
            self._stop_requested = True
            return
        if self._dequeuing and adm is None:
            # Waiting for work, whatever state RQ recorded last: stop now. RQ decides by that state, and a
            # worker whose state still said busy was told to stop "after its job" while it waited for one, in
            # a wait that never looks at that request (a drained worker then ignored SIGTERM for good).
            signal.signal(signal.SIGINT, self.request_force_stop)
            signal.signal(signal.SIGTERM, self.request_force_stop)
            self._shutdown_requested_date = now()
            raise StopRequested()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]  # (idle: raises, stops now)
        if adm is not None and self._grace is None:
            log.warning("stop requested (%s): finishing attempt %s first, for at most %gs (--grace); a second "
                        "signal stops now", signal.Signals(signum).name, adm.attempt_id, self.grace_s)
            # Started after RQ installed its force-stop handler: with --grace 0 the timer's signal must
            # land there, not in this handler again (the worker then waited for the Attempt for good).
            self._grace = threading.Timer(self.grace_s, self._grace_ran_out)
            self._grace.daemon = True
            self._grace.start()

    def _grace_ran_out(self) -> None:
        self._grace_over = True
        os.kill(os.getpid(), signal.SIGTERM)  # request_force_stop, in the main thread

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """A second signal, or the grace period over: stop now. The Attempt is not failed: the process
        running it ends, its lease runs out and the sweeper reconciles it."""
        if not self._grace_over and time.monotonic() - self._stop_at < 1.0:
            return  # RQ's rule: a pool's duplicate of the first signal, within a second, is ignored
        adm = self._admitted
        if adm is None:
            return  # the Attempt finished meanwhile: the loop stops at its next turn
        self.forced = True
        log.warning("stopping now (%s): attempt %s is left to its lease; the sweeper reconciles it",
                    "grace period over" if self._grace_over else "second signal", adm.attempt_id)
        if self.horse_pid:
            self.kill_horse()
            self.wait_for_horse()
        raise SystemExit(EXIT_STOPPED_MIDWAY)


class McqWorker(McqBaseWorker, Worker):
    """RQ's forking worker: each Attempt runs in a fresh child process."""


class McqSimpleWorker(McqBaseWorker, SimpleWorker):
    """RQ's in-process worker: no fork per job (faster, less isolation)."""

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's two preparations of a job in one transaction: its execution record (the worker's, RQ's
        prepare_execution) and the job's start (RQ's prepare_job_execution, a forking worker's child's):
        in one process they follow each other anyway. The same writes as RQ's, one round trip less."""
        if not isinstance(job, McqJob):
            return super().prepare_execution(job)
        ttl = self.get_heartbeat_ttl(job)
        with self.connection.pipeline() as pipe:
            execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            self.heartbeat(ttl, pipeline=pipe)
            job.heartbeat(now(), ttl, pipeline=pipe)
            job.prepare_for_execution(self.name, pipeline=pipe)
            pipe.persist(job.key)
            if len(self.queues) == 1:  # RQ's rule (perform_job): the job leaves the intermediate list
                pipe.lrem(self.queue_class(job.origin, connection=self.connection).intermediate_queue_key, 1, job.id)
            pipe.execute()
        job.prepared = True
        return execution

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        if isinstance(job, McqJob) and job.prepared:
            job.prepared = False  # done with the execution record (prepare_execution)
            self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")  # type: ignore[no-untyped-call]  # as RQ
            return
        super().prepare_job_execution(job, remove_from_intermediate_queue)


WORKER_CLASSES: dict[str, type[McqWorker] | type[McqSimpleWorker]] = {"fork": McqWorker,
                                                                      "simple": McqSimpleWorker}


class McqQueue(Queue):
    """RQ's Queue, popping from several queues (a worker listens to every priority of its queues) in one
    round trip when it must not block (RQ's burst dequeue: an LPOP per queue): a BLPOP of them all, in
    their order, that waits a millisecond at most. A ticket popped (``transport.TICKET``: a message waits
    in a fair lane) is exchanged for the message ``lua/fair_pop.lua`` chooses (one more round trip, only
    for tasks with a fairness key); a ticket with nothing behind it is skipped."""

    @classmethod
    def lpop(cls, queue_keys: Any, timeout: int | None, connection: redis.Redis | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if timeout is not None or len(queue_keys) < 2 or connection is None:
                left = None if deadline is None else max(1, round(deadline - time.monotonic()))
                result = super().lpop(queue_keys, left, connection=connection)  # (DequeueTimeout when none)
            else:
                result = connection.blpop(list(queue_keys), 0.001)
            if result is None or (result[1] != TICKET and result[1] != TICKET.encode()):
                return result
            key = result[0].decode() if isinstance(result[0], bytes) else str(result[0])
            jid = take_from_lane(runtime().client, key)
            if jid is not None:
                return key, jid


def rq_names(client: Client, queues: list[str]) -> list[str]:
    """The RQ queues a worker of these queues listens to, in the order it takes from them: every queue's
    most urgent priority first, then every queue's next one (``transport.PRIORITIES``)."""
    return [rq_queue_name(client.keys.prefix, q, p) for p in PRIORITIES for q in queues]


def rq_queues(client: Client, queues: list[str], conn: redis.Redis) -> list[Queue]:
    return [McqQueue(name, connection=conn, serializer=JSONSerializer, job_class=McqJob)
            for name in rq_names(client, queues)]


def make_worker(app: App, client: Client, queues: list[str], *, kind: str = "fork", name: str | None = None,
                workspace_root: str | os.PathLike[str] | None = None, home: str | os.PathLike[str] | None = None,
                grace_s: float = DEFAULT_GRACE_S, worker_class: type[McqBaseWorker] | None = None) -> McqBaseWorker:
    """An RQ worker that runs this app's Attempts (stale workspaces are cleaned when it is built):
    ``worker_class``, else the class of ``kind`` (fork or simple; a batch worker's class comes from
    :func:`mc_queue.worker.batch.worker_class`)."""
    configure(app, client, workspace_root, home=home, grace_s=grace_s)
    conn = rq_connection(client)
    cls = worker_class or WORKER_CLASSES[kind]
    return cls(rq_queues(client, queues, conn), connection=conn,
               name=name or f"{socket.gethostname()}.{os.getpid()}", serializer=JSONSerializer, job_class=McqJob,
               queue_class=McqQueue)


def live_workers(client: Client) -> list[dict[str, Any]]:
    """The RQ workers serving this namespace's queues, with their health probe (RQ's worker
    heartbeat: when it last reported, and whether that is recent) and the leases they hold now."""
    conn = rq_connection(client)
    try:
        holders: dict[str, list[dict[str, Any]]] = {}
        held = cast(list[tuple[str, float]], client.redis.zrange(client.keys.leases, 0, -1, withscores=True))
        for aid, exp in held:
            task_id, n = parse_attempt_id(str(aid))
            tk = client.keys.task(task_id)
            worker = client.redis.hget(tk.attempts, f"{n}.worker") or client.redis.hget(tk.attempts_v1, f"{n}.worker")
            holders.setdefault(str(worker), []).append({"attempt": str(aid), "lease_expires_ms": int(exp)})
        now = time.time()
        out = []
        found = []
        for w in Worker.all(connection=conn, serializer=JSONSerializer):
            queues = list(dict.fromkeys(parts[1] for q in w.queue_names()
                                        if (parts := split_rq_name(q)) is not None and parts[0] == client.keys.prefix))
            if queues:
                found.append((w, queues, _SAFE.sub("_", w.name)))
        pipe = client.redis.pipeline(transaction=False)
        for _, _, worker_id in found:
            pipe.pttl(client.keys.worker(worker_id))
            pipe.exists(client.keys.worker(worker_id) + ":seen")
            pipe.hgetall(client.keys.worker(worker_id) + ":probes")
        replies = pipe.execute() if found else []
        for (w, queues, worker_id), pttl, marked, probes in zip(found, replies[::3], replies[1::3], replies[2::3],
                                                                 strict=True):
            seen = w.last_heartbeat.timestamp() if w.last_heartbeat else None
            # Alive: mc_queue's own liveness key (refreshed every few seconds by the worker process) exists;
            # a killed process's key is gone within LIVENESS_TTL_MS, while RQ still lists it for a while.
            # A worker that never kept one (not an mc_queue worker, or one from before) is judged by RQ alone.
            alive = int(pttl) > 0 or not int(marked)
            out.append({
                "worker": worker_id, "pid": w.pid, "hostname": w.hostname, "state": w.get_state() if alive else "dead",
                "queues": queues,
                "last_heartbeat_s_ago": None if seen is None else round(now - seen, 1),
                "alive": alive, "liveness_ttl_ms": max(int(pttl), 0),
                "healthy": alive and seen is not None and now - seen < w.worker_ttl,
                "leases": holders.pop(worker_id, []),
                # its health probes (app.probe), as it last published them: key -> 'ok' | 'failing <why>'
                "probes": dict(sorted(cast(dict[str, str], probes).items())) if alive else {},
            })
        for worker_id, leases in sorted(holders.items()):  # leases held by processes RQ no longer lists
            out.append({"worker": worker_id, "pid": None, "hostname": None, "state": "gone", "queues": [],
                        "last_heartbeat_s_ago": None, "alive": False, "liveness_ttl_ms": 0, "healthy": False,
                        "leases": leases, "probes": {}})
        return out
    finally:
        conn.close()

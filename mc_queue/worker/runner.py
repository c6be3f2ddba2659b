"""The consumer side's bridge to RQ: RQ carries Attempts to worker processes; mc_queue stays the authority.

An RQ job carries only ids, serialized as JSON: ``run_attempt(prefix, attempt_id, lease_ms)``
(:mod:`mc_queue.producer.transport`). A message delivered twice is refused by the claim (the second claim
finds the Attempt taken) and ends quietly; a message lost is sent again from the outbox by the
sweeper. The lease length comes from the task (frozen at enqueue), never from the message.

**Nothing in a job is trusted.** Anyone able to write ``rq:*`` keys can write a job, so before a
job runs, the worker process that took it (not a forked child) screens it, and refuses it, recorded
through :meth:`Client.audit` (``transport_job_refused`` in the capped refusals log) and removed from
RQ, when:

- its payload is not JSON, it names another function than mc_queue's entry (nothing is imported or
  unpickled), an instance, or other arguments than ``(prefix, attempt id, lease ms)``;
- it carries an RQ option mc_queue never sets (webhooks, success/failure/stopped callbacks, their
  timeouts, dependencies, retries, repeats, meta, a job TTL, a group, a rate limit, or any field
  RQ may add later): the job hash may hold only the fields mc_queue's producer and RQ's own
  bookkeeping write;
- its recorded origin is not the queue it was taken from, or that queue is not its task's;
- its namespace is not this worker's, its attempt id is malformed, its task or Attempt does not
  exist, or its handler is not in this worker's App.

A refused job touches nothing of its task: no claim, no failure, no event; the task waits for a
proper message to a worker that has its handler. The options mc_queue does set take mc_queue's
values, never the job's: the RQ timeout is the task's (frozen at enqueue), results are not kept
(``result_ttl`` 0) and a failed RQ job is kept 7 days. :class:`McqJob` also answers every option
above as unset (no webhooks, no callbacks, no dependencies, no retries), so no code path of RQ can
act on one.

**Outcomes.** ``run_attempt`` returns the Attempt's outcome and logs it: a failure at WARNING (ERROR
when the task stops or is quarantined) with its class, type, fingerprint, the decision and the
traceback; RQ's "Job OK" lines, which say nothing about the Attempt, are not logged. RQ's job
timeout does not fail the Attempt: the worker gives up its lease (:meth:`Client.void_leases`), the
Attempt turns suspect and the sweeper reconciles its effects with their providers before anything
is retried.

**Stopping.** SIGTERM or SIGINT stops an idle worker at once; a busy one finishes its Attempt
(warm shutdown) for up to ``grace_s`` seconds. A second signal, or the end of the grace period,
stops it at once (a forking worker kills the process running the handler): the Attempt is not
failed, its lease runs out and the sweeper reconciles it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, cast

import redis
from rq import Queue, SimpleWorker, Worker
from rq.defaults import CALLBACK_TIMEOUT
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.worker import BaseWorker

from ..client import Client
from ..contracts.errors import CancelRequested, McqError, ReplicationUnconfirmed, TransitionRefused, WriteRefused
from ..contracts.failures import make_failure
from ..contracts.keys import parse_attempt_id
from ..contracts.models import Attempt, FailureClass, Manifest, Task
from ..policy.classify import Classified, classify, decision_for
from ..producer.app import App
from ..producer.transport import ENTRY, rq_connection, rq_queue_name
from .context import Context, LeaseLost
from .workspace import CleanupReport, WorkspaceRoot, default_root

log = logging.getLogger("mc_queue.worker")

DEFAULT_GRACE_S = 30.0
EXIT_STOPPED_MIDWAY = 5  # `mcq worker`'s exit code when it stopped before its Attempt finished
RESULT_TTL = 0  # what mc_queue.producer.dispatch.dispatch sets: no RQ result is kept (mc_queue records it)
FAILURE_TTL_S = 7 * 86_400  # what mc_queue.producer.dispatch.dispatch sets for a failed RQ job
RQ_DEFAULT_TIMEOUT_S = int(Queue.DEFAULT_TIMEOUT)  # RQ's timeout for a job sent without one
# RQ's worker_ttl: an idle worker's blocking dequeue lasts worker_ttl - 15 s and its socket times out
# 10 s later. RQ's default (420: a 405 s BLMOVE) left workers blocked for minutes on a connection to a
# primary that had failed over (bench/failover.py); with 35 an idle worker re-asks where the primary
# is within ~30 s, at the cost of one BLMOVE every 20 s.
WORKER_TTL_S = 35

# The fields of an RQ job hash mc_queue's producer writes, and those RQ's bookkeeping adds while it
# runs or fails one. Anything else is an option mc_queue never sets.
JOB_FIELDS = frozenset({
    "data", "origin", "description", "created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat",
    "worker_name", "status", "timeout", "result_ttl", "failure_ttl", "success_callback_name",
    "failure_callback_name", "stopped_callback_name", "group_id", "exc_info", "result",
})
_MUST_BE_EMPTY = ("success_callback_name", "failure_callback_name", "stopped_callback_name", "group_id")


# --------------------------------------------------------------------------- worker side


@dataclass
class Runtime:
    """What a worker process runs with; set before RQ's work loop starts (forked horses inherit it)."""

    app: App
    client: Client
    worker_id: str
    workspaces: WorkspaceRoot
    cleanup: CleanupReport | None = None
    keep_failed_workspaces: bool = False
    grace_s: float = DEFAULT_GRACE_S


_RUNTIME: Runtime | None = None


def set_runtime(rt: Runtime | None) -> None:
    global _RUNTIME
    _RUNTIME = rt


def runtime() -> Runtime:
    if _RUNTIME is None:
        raise McqError("this process is not an mc_queue worker (start it with `mcq worker --app M:app`)")
    return _RUNTIME


@dataclass(frozen=True)
class Admission:
    """A message this worker may act on: its Attempt, and what the task says about it."""

    prefix: str
    attempt_id: str
    task_id: str
    number: int
    queue: str  # the task's mc_queue queue
    handler: str
    timeout_s: int  # the RQ job timeout, from the task's manifest (what the producer sets)


class Refusal(Exception):
    """A message this worker must not act on, and why (recorded, never run)."""

    def __init__(self, why: str, *, attempt: Any = None, func_name: Any = None) -> None:
        super().__init__(why)
        self.why = why
        self.attempt = attempt
        self.func_name = func_name


def admit(rt: Runtime, prefix: Any, attempt_id: Any) -> Admission:
    """Read the task before anything is claimed: the message must be for this namespace, an
    existing task and Attempt, and a handler this worker's App has. Raises :class:`Refusal`."""
    ns = rt.client.keys.prefix
    if prefix != ns:
        raise Refusal(f"job for namespace {str(prefix)[:200]!r}, this worker serves {ns!r}", attempt=attempt_id)
    try:
        task_id, n = parse_attempt_id(attempt_id)
    except ValueError as exc:
        raise Refusal(str(exc), attempt=attempt_id) from None
    tk = rt.client.keys.task(task_id)
    pipe = rt.client.redis.pipeline(transaction=False)
    pipe.hmget(tk.task, ["queue", "handler", "manifest"])
    pipe.hmget(tk.attempts, [f"{n}.state", f"{n}.manifest"])
    (queue, handler, manifest), (state, attempt_manifest) = pipe.execute()
    if not queue or not handler:
        raise Refusal(f"no task {task_id} in namespace {ns!r}", attempt=attempt_id)
    if handler not in rt.app.handlers:
        known = ", ".join(sorted(rt.app.handlers)) or "none"
        raise Refusal(f"handler {handler!r} of task {task_id} is not registered in app {rt.app.name!r} of this "
                      f"worker (it registers {known}): the task waits, untouched, for a worker whose app has it",
                      attempt=attempt_id)
    if not state:
        raise Refusal(f"task {task_id} has no Attempt {n}", attempt=attempt_id)
    timeout_s: float | None = None
    raw = attempt_manifest or manifest
    if raw:
        with contextlib.suppress(ValueError):
            timeout_s = Manifest.model_validate_json(raw).timeout_s
    return Admission(prefix=ns, attempt_id=str(attempt_id), task_id=task_id, number=n, queue=str(queue),
                     handler=str(handler), timeout_s=max(1, int(timeout_s)) if timeout_s else RQ_DEFAULT_TIMEOUT_S)


def run_attempt(prefix: str, attempt_id: str, lease_ms: int | None = None) -> dict[str, Any]:
    """Run one Attempt in this process (the RQ entry's name; a worker runs the job it admitted with
    :func:`run_admitted`). The task is read first: a message for another namespace, a missing task
    or Attempt, or a handler the App does not have is refused without touching the task.
    ``lease_ms`` from the message is ignored: the claim takes the task's own lease length."""
    rt = runtime()
    try:
        adm = admit(rt, prefix, attempt_id)
    except Refusal as refusal:
        return _record_refusal(rt, refusal, attempt=attempt_id)
    return run_admitted(adm)


def run_admitted(adm: Admission) -> dict[str, Any]:
    """Claim the Attempt, run its handler, record the outcome. Never raises for an outcome mc_queue
    recorded; a rejected claim (a duplicate or late message) ends quietly."""
    rt = runtime()
    client = rt.client
    attempt_id, task_id, n = adm.attempt_id, adm.task_id, adm.number
    try:
        lease = client.leases.claim_attempt(task_id, rt.worker_id, lease_ms=None, expect_attempt=n,
                                     request_id=uuid.uuid4().hex)
    except TransitionRefused as exc:  # ClaimRejected: a duplicate or late message, or a canceled task
        log.info("attempt %s: not claimed: %s", attempt_id, exc.message)
        return {"skipped": exc.message}
    except ReplicationUnconfirmed as exc:
        # The claim is on the primary only: a failover could forget it while the handler acts. The
        # Attempt does not run; its lease is given up (or runs out) and the sweeper reconciles it.
        with contextlib.suppress(McqError, redis.RedisError):
            client.operator.void_leases([attempt_id], actor=rt.worker_id, reason="claim not confirmed by the replicas")
        log.warning("attempt %s: not run: %s", attempt_id, exc.message)
        return {"unconfirmed": exc.message}
    task = client.reads.get_task(task_id)
    attempt = task.attempts[n - 1]
    spec = rt.app.handlers.get(task.handler)
    if spec is None:  # admitted a moment ago: only a task rewritten in between gets here
        failure = make_failure(FailureClass.CONFIGURATION, "UnknownHandler",
                               f"handler {task.handler!r} is not registered in app {rt.app.name!r} of worker "
                               f"{rt.worker_id}")
        return _fail(client, rt, task, attempt, lease.fence, Classified(failure))
    ctx = Context(client, spec, task, attempt, lease.fence, rt.worker_id,
                  functools.partial(rt.workspaces.create, attempt_id), rt.app.operations,
                  recovered_at_ms=lease.recovered_at_ms)
    ctx.start_heartbeats((lease.lease_ms or spec.lease_ms) / 3000)
    outcome: dict[str, Any]
    try:
        try:
            result = spec.fn(ctx, task.payload)
        finally:
            ctx.stop_heartbeats()
        ctx.check()
        if ctx.effects_used and (spec.phases is None or "result_pending" in spec.phases):
            # Seed 003: the result is on file before the completion, so a worker dying in between
            # leaves a result the reconciler can prove, not a rerun of every effect.
            ctx.checkpoint("result_pending", {"result": result})
        try:
            client.leases.complete_quietly(attempt_id, lease.fence, result, worker_id=rt.worker_id)
            outcome = {"succeeded": attempt_id}
            log.info("attempt %s (%s) succeeded", attempt_id, task.handler)
        except CancelRequested:
            outcome = _acknowledge(client, rt, attempt_id, lease.fence)
        except WriteRefused as exc:
            outcome = {"refused": exc.message}
            log.warning("attempt %s: its completion was refused: %s", attempt_id, exc.message)
    except LeaseLost as exc:
        outcome = {"lease_lost": exc.message}
        log.warning("attempt %s: lease lost, nothing more recorded by this worker: %s", attempt_id, exc.message)
    except CancelRequested:
        outcome = _acknowledge(client, rt, attempt_id, lease.fence)
    except JobTimeoutException as exc:
        outcome = _timed_out(client, rt, attempt_id, ctx, exc)
    except Exception as exc:
        outcome = _fail(client, rt, task, attempt, lease.fence, classify(exc), exc)
    except BaseException:
        # SystemExit (the worker is stopping now), KeyboardInterrupt: the Attempt is not failed here.
        # Its heartbeats have stopped; its lease runs out and the sweeper reconciles what it did.
        log.warning("attempt %s: the worker stopped before its handler finished; its lease runs out and the "
                    "sweeper reconciles it", attempt_id)
        raise
    keep = rt.keep_failed_workspaces and "succeeded" not in outcome
    if ctx.workspace_created and not keep:
        with contextlib.suppress(OSError):
            rt.workspaces.remove(ctx.workspace)
    return outcome


def _record_refusal(rt: Runtime, refusal: Refusal, **fields: Any) -> dict[str, Any]:
    """A message this worker must not act on: recorded in the capped refusals log, not run."""
    record = {**{k: v for k, v in fields.items() if v is not None}, "worker": rt.worker_id, "reason": refusal.why}
    if refusal.attempt is not None:
        record["attempt"] = str(refusal.attempt)[:300]
    if refusal.func_name is not None:
        record["func_name"] = str(refusal.func_name)[:300]
    try:
        rt.client.operator.audit("transport_job_refused", record)
    except (McqError, redis.RedisError) as exc:
        log.error("could not record a refused transport message (%s): %s", exc, record)
    log.warning("refused transport message %s: %s", record.get("job_id") or record.get("attempt"), refusal.why)
    return {"refused": refusal.why}


def _acknowledge(client: Client, rt: Runtime, attempt_id: str, fence: int) -> dict[str, Any]:
    """Cancellation step three: the executor stopped; it gives up its lease for reconciliation."""
    try:
        client.leases.acknowledge_cancel(attempt_id, fence, worker_id=rt.worker_id)
        log.info("attempt %s: cancel acknowledged", attempt_id)
        return {"cancel_acknowledged": attempt_id}
    except (WriteRefused, TransitionRefused) as exc:
        return {"refused": exc.message}


def _timed_out(client: Client, rt: Runtime, attempt_id: str, ctx: Context, exc: BaseException) -> dict[str, Any]:
    """RQ's job timeout ended the handler, maybe in the middle of a side effect: the Attempt is not
    failed here. The worker gives up its lease (the fence moves, the Attempt turns suspect) and the
    sweeper reconciles its effects with their providers, then the retry policy decides."""
    ctx.stop_heartbeats()
    why = (f"RQ's job timeout ended the handler ({str(exc)[:200]}); its effects are reconciled with their "
           "providers before anything is retried")
    try:
        voided = client.operator.void_leases([attempt_id], actor=rt.worker_id, reason=why)
    except McqError as err:  # the lease runs out by itself and the sweeper takes it from there
        log.error("attempt %s: timed out; giving up its lease failed (%s): it expires by itself", attempt_id, err)
        voided = []
    log.warning("attempt %s: the job timeout ended its handler; its lease was %s, the sweeper reconciles it",
                attempt_id, "given up" if voided else "already gone")
    return {"timed_out": attempt_id, "lease_voided": bool(voided)}


def _fail(client: Client, rt: Runtime, task: Task, attempt: Attempt, fence: int,
          classified: Classified, exc: BaseException | None = None) -> dict[str, Any]:
    f = classified.failure
    try:
        fresh = client.reads.get_task(task.id)
        current = fresh.attempts[attempt.number - 1]
        decision = decision_for(fresh, current, classified, cost=current.cost, tokens=current.tokens)
        if decision.action != "retry":
            # No next Attempt will reconcile effects this one started without a receipt: say so.
            pending = [k for k, r in client.reads.effects(task.id).items() if r.state == "intent"]
            if pending:
                why = (f"{decision.attention.get('why_unsafe', '')}; effects started but not confirmed by their "
                       f"provider: {', '.join(pending)} (a retry reconciles them before anything is redone)")
                decision = dataclasses.replace(
                    decision, attention={**decision.attention, "pending_effects": pending, "why_unsafe": why})
        client.leases.fail_attempt(attempt.id, fence, f, worker_id=rt.worker_id, decision=decision)
    except CancelRequested:
        return _acknowledge(client, rt, attempt.id, fence)
    except WriteRefused as err:
        log.warning("attempt %s failed (%s %s, fingerprint %s) but the failure was refused: %s", attempt.id,
                    f.failure_class.value, f.type, f.fingerprint, err.message, exc_info=exc)
        return {"refused": err.message}
    level = logging.WARNING if decision.action == "retry" else logging.ERROR
    log.log(level, "attempt %s (%s) failed: %s %s: %s (fingerprint %s); decision: %s: %s", attempt.id, task.handler,
            f.failure_class.value, f.type, f.message[:500], f.fingerprint, decision.action, decision.why,
            exc_info=exc)
    return {"failed": attempt.id, "decision": decision.action, "why": decision.why}


# --------------------------------------------------------------------------- RQ integration


class ForeignJobRefused(McqError):
    """An RQ job reached execution without an mc_queue worker's admission (never expected)."""


_UNDECODABLE = "<a payload that cannot be decoded as JSON>"


def _func_name(job: Job) -> Any:
    """RQ's func_name, except that a payload it cannot decode is named, not raised (RQ reads the name
    for its process title before the job runs)."""
    try:
        return Job.func_name.fget(job)  # type: ignore[attr-defined]
    except Exception:
        return _UNDECODABLE


def _unset(make: Callable[[], Any]) -> Any:
    """A job option that always reads as unset, whatever RQ restored from Redis (writes are dropped)."""
    return property(lambda self: make(), lambda self, value: None)


class McqJob(Job):
    """An RQ Job that never imports a name found in Redis and answers every RQ option mc_queue does not
    set as unset: no callbacks, no webhooks, no dependencies, no retries, no repeats, no job TTL, no
    group, no rate limit. It runs only once a worker admitted it (:func:`screen_job`), with the
    admission's Attempt and the task's timeout."""

    func_name = property(_func_name, Job.func_name.fset)  # type: ignore[attr-defined]
    webhooks = _unset(list)
    _dependency_ids = _unset(list)
    allow_dependency_failures = _unset(lambda: None)
    retries_left = _unset(lambda: None)
    retry_intervals = _unset(lambda: None)
    enqueue_at_front_on_retry = _unset(lambda: False)
    repeats_left = _unset(lambda: None)
    repeat_intervals = _unset(lambda: None)
    rate_limit_key = _unset(lambda: None)
    rate_limit_concurrency = _unset(lambda: None)
    ttl = _unset(lambda: None)
    group_id = _unset(lambda: None)
    success_callback_timeout = _unset(lambda: CALLBACK_TIMEOUT)
    failure_callback_timeout = _unset(lambda: CALLBACK_TIMEOUT)
    stopped_callback_timeout = _unset(lambda: CALLBACK_TIMEOUT)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admission: Admission | None = None
        self.raw_fields: dict[str, bytes] = {}
        self.unreadable: str | None = None

    def restore(self, raw_data: Any) -> Any:
        """RQ's restore, keeping the raw hash for screening; a field RQ cannot parse makes the job
        refused instead of raising out of RQ's dequeue (which would end the worker's loop)."""
        self.raw_fields = {(k.decode(errors="replace") if isinstance(k, bytes) else str(k)): v
                           for k, v in dict(raw_data).items()}
        self.unreadable = None
        try:
            return super().restore(raw_data)
        except NoSuchJobError:
            raise
        except Exception as exc:
            self.unreadable = f"its RQ fields cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
            return None

    def admit(self, admission: Admission) -> None:
        """Bind the job to the Attempt it was admitted for; the options mc_queue sets take mc_queue's
        values: the task's timeout, no result kept, a failed job kept 7 days."""
        self.admission = admission
        self.timeout = admission.timeout_s
        self.result_ttl = RESULT_TTL
        self.failure_ttl = FAILURE_TTL_S

    @property
    def func(self) -> Callable[..., Any]:
        if self.admission is None:
            return functools.partial(_not_admitted, str(self.id))
        return functools.partial(run_admitted, self.admission)

    def _execute(self) -> Any:
        """Run the admitted Attempt; never the function or arguments the job names."""
        return self.func()

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None


def _not_admitted(job_id: str) -> None:
    raise ForeignJobRefused(f"RQ job {job_id} was not admitted by an mc_queue worker: nothing is run")


def screen_job(rt: Runtime, job: McqJob, queue_name: str) -> Admission:
    """Everything a job must be before it runs (see the module's docstring). Raises :class:`Refusal`."""
    if job.unreadable:
        raise Refusal(job.unreadable)
    name = job.func_name
    if name == _UNDECODABLE:  # a pickle or garbage: never unpickled
        raise Refusal("its payload cannot be decoded as JSON", func_name="?")
    if name != ENTRY:
        raise Refusal(f"it names {str(name)[:200]!r}; mc_queue workers run only {ENTRY}, nothing is imported",
                      func_name=name)
    args, kwargs, instance = job.args, job.kwargs, job.instance
    if instance is not None:
        raise Refusal("it names an instance to call the entry function on; mc_queue's entry is a plain function",
                      func_name=name)
    if (kwargs or not isinstance(args, (list, tuple)) or len(args) not in (2, 3)
            or not all(isinstance(a, str) for a in args[:2])
            or (len(args) == 3 and (isinstance(args[2], bool) or not isinstance(args[2], int)))):
        raise Refusal("its arguments are not (prefix, attempt id, lease ms)", func_name=name)
    options = sorted(set(job.raw_fields) - JOB_FIELDS) + [f for f in _MUST_BE_EMPTY if job.raw_fields.get(f)]
    if options:
        raise Refusal(f"it carries RQ option(s) mc_queue never sets: {', '.join(options)[:500]}; a worker acts on "
                      "no option it did not set", attempt=args[1], func_name=name)
    origin = job.raw_fields.get("origin", b"").decode(errors="replace")
    if origin != queue_name:
        raise Refusal(f"it was taken from RQ queue {queue_name!r} but its origin says {origin[:200]!r}",
                      attempt=args[1], func_name=name)
    adm = admit(rt, args[0], args[1])
    expected = rq_queue_name(adm.prefix, adm.queue)
    if queue_name != expected:
        raise Refusal(f"it came on RQ queue {queue_name!r}, but task {adm.task_id} is on queue {adm.queue!r} "
                      f"(RQ queue {expected!r})", attempt=args[1], func_name=name)
    return adm


def _dispose(connection: redis.Redis, job: Job, queue: Queue) -> None:
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
    rt = Runtime(app=app, client=client, worker_id=_SAFE.sub("_", name), workspaces=workspaces,
                 cleanup=report, grace_s=grace_s)
    set_runtime(rt)
    rq_log = logging.getLogger("rq.worker")
    if _NO_JOB_OK not in rq_log.filters:
        rq_log.addFilter(_NO_JOB_OK)
    return rt


JOB_MONITORING_INTERVAL_S = 5  # how often a worker waiting on its work horse wakes (RQ's default: 30)
LIVENESS_TTL_MS = 10_000  # a worker's liveness key lives this long after its last refresh
LIVENESS_EVERY_S = 3.0  # and is refreshed this often by a thread of the worker process
LIVENESS_SEEN_MS = 86_400_000  # "<liveness key>:seen": the worker kept one (refreshed with it, PX a day)


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

    # -- the loop

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        self.burst = burst
        stop = threading.Event()
        beat = threading.Thread(target=self._liveness, args=(stop,), name="mcq-liveness", daemon=True)
        beat.start()
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
                pipe.execute()
            except redis.RedisError as exc:  # Redis away for a moment: the next beat tries again
                log.warning("worker liveness key not refreshed: %s", exc)
            if stop.wait(LIVENESS_EVERY_S):
                return

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        if self.burst:  # RQ's dequeue waits for Redis forever; a burst worker says it cannot reach it
            try:
                self.connection.ping()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.redis_error = f"{type(exc).__name__}: {exc}"
                raise
        result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        if result is None and self.burst:
            self.drained = True
        return result

    def execute_job(self, job: Job, queue: Queue) -> None:
        rt = runtime()
        mjob = cast(McqJob, job)
        try:
            adm = screen_job(rt, mjob, queue.name)
        except Refusal as refusal:
            _record_refusal(rt, refusal, job_id=str(job.id)[:300], queue=queue.name)
            _dispose(self.connection, job, queue)
            return
        mjob.admit(adm)
        self._admitted = adm
        try:
            super().execute_job(job, queue)
        finally:
            self._admitted = None
            if self._grace is not None:
                self._grace.cancel()

    # -- stopping

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM / SIGINT: stop now when idle, else after the current Attempt, within grace_s."""
        self.stop_signal = signum
        self._stop_at = time.monotonic()
        adm = self._admitted
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


WORKER_CLASSES: dict[str, type[McqWorker] | type[McqSimpleWorker]] = {"fork": McqWorker,
                                                                      "simple": McqSimpleWorker}


def rq_queues(client: Client, queues: list[str], conn: redis.Redis) -> list[Queue]:
    return [Queue(rq_queue_name(client.keys.prefix, q), connection=conn, serializer=JSONSerializer,
                  job_class=McqJob) for q in queues]


def make_worker(app: App, client: Client, queues: list[str], *, kind: str = "fork", name: str | None = None,
                workspace_root: str | os.PathLike[str] | None = None, home: str | os.PathLike[str] | None = None,
                grace_s: float = DEFAULT_GRACE_S) -> McqBaseWorker:
    """An RQ worker that runs this app's Attempts (stale workspaces are cleaned when it is built)."""
    configure(app, client, workspace_root, home=home, grace_s=grace_s)
    conn = rq_connection(client)
    cls = WORKER_CLASSES[kind]
    return cls(rq_queues(client, queues, conn), connection=conn,
               name=name or f"{socket.gethostname()}.{os.getpid()}", serializer=JSONSerializer, job_class=McqJob)


def live_workers(client: Client) -> list[dict[str, Any]]:
    """The RQ workers serving this namespace's queues, with their health probe (RQ's worker
    heartbeat: when it last reported, and whether that is recent) and the leases they hold now."""
    conn = rq_connection(client)
    try:
        prefix = f"mcq:{client.keys.prefix}:"
        holders: dict[str, list[dict[str, Any]]] = {}
        held = cast(list[tuple[str, float]], client.redis.zrange(client.keys.leases, 0, -1, withscores=True))
        for aid, exp in held:
            task_id, n = parse_attempt_id(str(aid))
            worker = client.redis.hget(client.keys.task(task_id).attempts, f"{n}.worker")
            holders.setdefault(str(worker), []).append({"attempt": str(aid), "lease_expires_ms": int(exp)})
        now = time.time()
        out = []
        found = []
        for w in Worker.all(connection=conn, serializer=JSONSerializer):
            queues = [q for q in w.queue_names() if q.startswith(prefix)]
            if queues:
                found.append((w, queues, _SAFE.sub("_", w.name)))
        pipe = client.redis.pipeline(transaction=False)
        for _, _, worker_id in found:
            pipe.pttl(client.keys.worker(worker_id))
            pipe.exists(client.keys.worker(worker_id) + ":seen")
        replies = pipe.execute() if found else []
        for (w, queues, worker_id), pttl, marked in zip(found, replies[::2], replies[1::2], strict=True):
            seen = w.last_heartbeat.timestamp() if w.last_heartbeat else None
            # Alive: mc_queue's own liveness key (refreshed every few seconds by the worker process) exists;
            # a killed process's key is gone within LIVENESS_TTL_MS, while RQ still lists it for a while.
            # A worker that never kept one (not an mc_queue worker, or one from before) is judged by RQ alone.
            alive = int(pttl) > 0 or not int(marked)
            out.append({
                "worker": worker_id, "pid": w.pid, "hostname": w.hostname, "state": w.get_state() if alive else "dead",
                "queues": [q[len(prefix):] for q in queues],
                "last_heartbeat_s_ago": None if seen is None else round(now - seen, 1),
                "alive": alive, "liveness_ttl_ms": max(int(pttl), 0),
                "healthy": alive and seen is not None and now - seen < w.worker_ttl,
                "leases": holders.pop(worker_id, []),
            })
        for worker_id, leases in sorted(holders.items()):  # leases held by processes RQ no longer lists
            out.append({"worker": worker_id, "pid": None, "hostname": None, "state": "gone", "queues": [],
                        "last_heartbeat_s_ago": None, "alive": False, "liveness_ttl_ms": 0, "healthy": False,
                        "leases": leases})
        return out
    finally:
        conn.close()

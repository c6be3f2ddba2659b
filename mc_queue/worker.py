"""The single bridge to RQ: RQ carries Attempts to worker processes; mc_queue stays the authority.

An RQ job carries only ids, serialized as JSON: ``run_attempt(prefix, attempt_id, lease_ms)``.
Its job id is derived from the attempt id, so dispatching an Attempt twice makes one RQ job; a
message delivered twice is refused by the claim (the second claim finds the Attempt taken) and ends
quietly; a message lost is sent again from the outbox by the sweeper.

RQ imports whatever function a job names, so anyone able to write Redis could make every worker
run ``os.system``. mc_queue's workers use :class:`McqJob`, which resolves only mc_queue's own entry
function and no callbacks; any other job is refused, recorded, and never imported.

Inside the process that runs the handler, a heartbeat thread renews the lease every third of a
lease length, whether or not the handler ever yields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis
from rq import Queue, SimpleWorker, Worker
from rq.job import Job
from rq.serializers import JSONSerializer

from .app import App, Context, LeaseLost
from .client import DEFAULT_LEASE_MS, Client, quiet_connection_kwargs
from .errors import CancelRequested, McqError, TransitionRefused, WriteRefused
from .failures import make_failure
from .keys import parse_attempt_id
from .models import Attempt, AttemptState, FailureClass, Task
from .policy import Classified, classify
from .workspace import CleanupReport, WorkspaceRoot

ENTRY = "mc_queue.worker.run_attempt"
DEFAULT_RECHECK_MS = 60_000
log = logging.getLogger("mc_queue.worker")


def rq_queue_name(prefix: str, queue: str) -> str:
    return f"mcq:{prefix}:{queue}"


def job_id(prefix: str, attempt_id: str) -> str:
    """One RQ job id per Attempt (RQ allows only [A-Za-z0-9_-] in ids)."""
    task_id, n = parse_attempt_id(attempt_id)
    ulid = task_id.rsplit(":", 1)[1]
    ns = hashlib.sha1(f"{prefix}\0{task_id.rsplit(':', 1)[0]}".encode()).hexdigest()[:8]
    return f"mcq-{ns}-{ulid}-{n}"


def rq_connection(client: Client) -> redis.Redis:
    """RQ needs bytes responses; same server and credentials as the client."""
    return redis.Redis.from_url(client.url, socket_timeout=30, socket_connect_timeout=10,
                                **quiet_connection_kwargs())


# --------------------------------------------------------------------------- producer side


class AppClient:
    """A Client bound to an App: refuses unknown handlers and dispatches Attempts to RQ."""

    def __init__(self, app: App, client: Client) -> None:
        self.app = app
        self.client = client
        self._rq = rq_connection(client)

    def enqueue(self, handler: str, payload: Any, *, idempotency_key: str | None = None, queue: str | None = None,
                **manifest: Any) -> Task:
        spec = self.app.spec(handler)
        task = self.client.enqueue(queue or spec.queue, handler, payload, idempotency_key,
                                   retry_policy=spec.retry, budget=spec.budget, lease_ms=spec.lease_ms,
                                   timeout_s=spec.timeout_s, **manifest)
        latest = task.latest
        if latest is not None and latest.state is AttemptState.PENDING:
            self.dispatch(task, latest)
        return task

    def dispatch(self, task: Task, attempt: Attempt, *, recheck_ms: int = DEFAULT_RECHECK_MS) -> None:
        dispatch(self.client, self._rq, task, attempt, recheck_ms=recheck_ms)

    def close(self) -> None:
        self.client.close()
        self._rq.close()


def dispatch(client: Client, rq: redis.Redis, task: Task, attempt: Attempt, *,
             recheck_ms: int = DEFAULT_RECHECK_MS) -> None:
    """Send one Attempt to its RQ queue (record first, then send: the outbox already holds it)."""
    manifest = attempt.manifest or task.manifest
    lease_ms = manifest.lease_ms if manifest else None
    timeout = manifest.timeout_s if manifest else None
    queue = Queue(rq_queue_name(client.keys.prefix, task.queue), connection=rq, serializer=JSONSerializer)
    queue.enqueue_call(func=ENTRY, args=(client.keys.prefix, attempt.id, lease_ms or DEFAULT_LEASE_MS),
                       job_id=job_id(client.keys.prefix, attempt.id), result_ttl=0, failure_ttl=7 * 86400,
                       timeout=int(timeout) if timeout else None)
    client.mark_dispatched(attempt.id, recheck_ms=recheck_ms)


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


_RUNTIME: Runtime | None = None


def set_runtime(rt: Runtime | None) -> None:
    global _RUNTIME
    _RUNTIME = rt


def runtime() -> Runtime:
    if _RUNTIME is None:
        raise McqError("this process is not an mc_queue worker (start it with `mcq worker --app M:app`)")
    return _RUNTIME


class HeartbeatService:
    """One daemon thread per process renews the lease of every registered Attempt every third of its
    lease, whether or not the handler ever yields. Recreated after a fork (threads do not survive one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._due: dict[int, tuple[float, float, Context]] = {}  # id(ctx) -> (next due, interval, ctx)
        self._pid = 0
        self._thread: threading.Thread | None = None

    def register(self, ctx: Context, interval_s: float) -> None:
        ctx._beating = True
        with self._lock:
            self._due[id(ctx)] = (time.monotonic() + interval_s, interval_s, ctx)
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="mcq-heartbeat", daemon=True)
                self._thread.start()
        self._wake.set()

    def unregister(self, ctx: Context) -> None:
        """After this returns no heartbeat of ``ctx`` is in flight or will start (so none can land
        after the completion and be refused as stale)."""
        with self._lock:
            self._due.pop(id(ctx), None)
        with ctx._beat_lock:
            ctx._beating = False

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                ready = [(k, iv, c) for k, (due, iv, c) in self._due.items() if due <= now]
                for k, iv, c in ready:
                    self._due[k] = (now + iv, iv, c)
                nxt = min((due for due, _, _ in self._due.values()), default=now + 1.0)
            for _k, _, ctx in ready:
                with ctx._beat_lock:
                    alive = ctx._beating and self._beat(ctx)
                if not alive:
                    with self._lock:
                        self._due.pop(id(ctx), None)
            self._wake.wait(max(0.0, nxt - time.monotonic()))
            self._wake.clear()

    @staticmethod
    def _beat(ctx: Context) -> bool:
        """Renew once; False when this Attempt's lease is gone for good."""
        try:
            ctx._beat()
        except LeaseLost:
            return False
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.warning("heartbeat of %s failed (%s); retrying", ctx.attempt_id, exc)
        except McqError as exc:  # namespace lost or similar: stop claiming authority
            ctx._mark_lost(f"{type(exc).__name__}: {exc}")
            return False
        return True


HEARTBEATS = HeartbeatService()


def run_attempt(prefix: str, attempt_id: str, lease_ms: int) -> dict[str, Any]:
    """The RQ job function: claim the Attempt, run its handler, record the outcome. Never raises for
    an outcome mc_queue recorded; a rejected claim (a duplicate message) ends quietly."""
    rt = runtime()
    client = rt.client
    if prefix != client.keys.prefix:
        return {"refused": f"job for namespace {prefix!r}, this worker serves {client.keys.prefix!r}"}
    task_id, n = parse_attempt_id(attempt_id)
    lease_ms = max(1000, min(int(lease_ms), 3_600_000))
    try:
        lease = client.claim_attempt(task_id, rt.worker_id, lease_ms=lease_ms, expect_attempt=n,
                                     request_id=uuid.uuid4().hex)
    except TransitionRefused as exc:  # ClaimRejected: a duplicate or late message, or a canceled task
        return {"skipped": exc.message}
    task = client.get_task(task_id)
    attempt = task.attempts[n - 1]
    spec = rt.app.handlers.get(task.handler)
    if spec is None:
        failure = make_failure(FailureClass.CONFIGURATION, "UnknownHandler",
                               f"handler {task.handler!r} is not registered in app {rt.app.name!r} of worker "
                               f"{rt.worker_id}")
        return _fail(client, rt, task, attempt, lease.fence, Classified(failure))
    ctx = Context(client, spec, task, attempt, lease.fence, rt.worker_id,
                  functools.partial(rt.workspaces.create, attempt_id), rt.app.operations)
    HEARTBEATS.register(ctx, spec.lease_ms / 3000)
    outcome: dict[str, Any]
    try:
        try:
            result = spec.fn(ctx, task.payload)
        finally:
            HEARTBEATS.unregister(ctx)
        ctx._check()
        if ctx.effects_used and "result_pending" in spec.phases:
            # Seed 003: the result is on file before the completion, so a worker dying in between
            # leaves a result the reconciler can prove, not a rerun of every effect.
            ctx.checkpoint("result_pending", {"result": result})
        try:
            client._complete(attempt_id, lease.fence, result, worker_id=rt.worker_id)
            outcome = {"succeeded": attempt_id}
        except CancelRequested:
            outcome = _acknowledge(client, rt, attempt_id, lease.fence)
        except WriteRefused as exc:
            outcome = {"refused": exc.message}
    except LeaseLost as exc:
        outcome = {"lease_lost": exc.message}
    except CancelRequested:
        outcome = _acknowledge(client, rt, attempt_id, lease.fence)
    except Exception as exc:
        outcome = _fail(client, rt, task, attempt, lease.fence, classify(exc))
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: record as an executor failure
        classified = classify(exc)
        failure = make_failure(FailureClass.EXECUTOR, type(exc).__qualname__, str(exc))
        _fail(client, rt, task, attempt, lease.fence, Classified(failure, classified.hypothesis))
        raise
    keep = rt.keep_failed_workspaces and "succeeded" not in outcome
    if ctx.workspace_created and not keep:
        with contextlib.suppress(OSError):
            rt.workspaces.remove(ctx.workspace)
    return outcome


def _acknowledge(client: Client, rt: Runtime, attempt_id: str, fence: int) -> dict[str, Any]:
    """Cancellation step three: the executor stopped; it gives up its lease for reconciliation."""
    try:
        client.acknowledge_cancel(attempt_id, fence, worker_id=rt.worker_id)
        return {"cancel_acknowledged": attempt_id}
    except (WriteRefused, TransitionRefused) as exc:
        return {"refused": exc.message}


def _fail(client: Client, rt: Runtime, task: Task, attempt: Attempt, fence: int,
          classified: Classified) -> dict[str, Any]:
    try:
        fresh = client.get_task(task.id)
        current = fresh.attempts[attempt.number - 1]
        decision = client.policy_decision(fresh, current, classified, cost=current.cost, tokens=current.tokens)
        if decision.action != "retry":
            # No next Attempt will reconcile effects this one started without a receipt: say so.
            pending = [k for k, r in client.effects(task.id).items() if r.state == "intent"]
            if pending:
                why = (f"{decision.attention.get('why_unsafe', '')}; effects started but not confirmed by their "
                       f"provider: {', '.join(pending)} (a retry reconciles them before anything is redone)")
                decision = dataclasses.replace(
                    decision, attention={**decision.attention, "pending_effects": pending, "why_unsafe": why})
        client.fail_attempt(attempt.id, fence, classified.failure, worker_id=rt.worker_id, decision=decision)
        return {"failed": attempt.id, "decision": decision.action, "why": decision.why}
    except CancelRequested:
        return _acknowledge(client, rt, attempt.id, fence)
    except WriteRefused as exc:
        return {"refused": exc.message}


# --------------------------------------------------------------------------- RQ integration


def _refuse_foreign(func_name: str, job: Job, *_args: Any, **_kwargs: Any) -> None:
    rt = _RUNTIME
    if rt is not None:
        with contextlib.suppress(Exception):
            rt.client.redis.xadd(rt.client.keys.nslog, {
                "type": "transport_job_refused", "job_id": job.id, "func_name": str(func_name)[:300],
                "worker": rt.worker_id,
                "reason": "mc_queue workers run only their own entry function; the job was not imported"})
    raise ForeignJobRefused(f"refused RQ job {job.id}: it names {func_name!r}; mc_queue workers run only {ENTRY}")


class ForeignJobRefused(McqError):
    """An RQ job on an mc_queue queue named a function other than mc_queue's entry."""


class McqJob(Job):
    """An RQ Job that never imports a name found in Redis: only mc_queue's entry, no callbacks."""

    @property
    def func(self) -> Callable[..., Any]:
        if self.func_name == ENTRY and not self.kwargs:
            return run_attempt
        return functools.partial(_refuse_foreign, str(self.func_name), self)

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None


_TEMPLATE: tuple[App, Client, Path] | None = None
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def configure(app: App, client: Client, workspace_root: str | os.PathLike[str] | None = None) -> Path:
    """Set what every worker built in this process (or forked from it, as RQ's pool does) runs with."""
    global _TEMPLATE
    root = Path(workspace_root or Path(os.environ.get("MCQ_HOME", ".mcq")) / "workspaces")
    _TEMPLATE = (app, client, root)
    return root


def _install_runtime(name: str) -> Runtime:
    """Build this worker's Runtime and remove stale workspaces before it polls for work.

    A workspace is stale unless its Attempt holds a lease right now (the lease index says so):
    several workers may share one root, and none deletes another's live workspace.
    """
    if _TEMPLATE is None:
        raise McqError("call mc_queue.worker.configure(app, client) before building a worker")
    app, client, root = _TEMPLATE
    workspaces = WorkspaceRoot(root)
    def live() -> set[str]:
        return {workspaces.name_for(str(a)) for a in client.redis.zrange(client.keys.leases, 0, -1)}

    report = workspaces.cleanup_stale(keep=live)
    if report.removed or report.refused:
        log.warning("workspace cleanup in %s: removed %s; refused %s", workspaces.root, report.removed,
                    report.refused)
    client.namespace()  # load the epoch once here: forked work horses inherit it
    rt = Runtime(app=app, client=client, worker_id=_SAFE.sub("_", name), workspaces=workspaces,
                 cleanup=report)
    set_runtime(rt)
    return rt


class McqWorker(Worker):
    """RQ's forking worker: each Attempt runs in a fresh child process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _install_runtime(self.name)


class McqSimpleWorker(SimpleWorker):
    """RQ's in-process worker: no fork per job (faster, less isolation)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _install_runtime(self.name)


WORKER_CLASSES: dict[str, type[Worker] | type[SimpleWorker]] = {"fork": McqWorker, "simple": McqSimpleWorker}


def rq_queues(client: Client, queues: list[str], conn: redis.Redis) -> list[Queue]:
    return [Queue(rq_queue_name(client.keys.prefix, q), connection=conn, serializer=JSONSerializer,
                  job_class=McqJob) for q in queues]


def make_worker(app: App, client: Client, queues: list[str], *, kind: str = "fork", name: str | None = None,
                workspace_root: str | os.PathLike[str] | None = None) -> Worker | SimpleWorker:
    """An RQ worker that runs this app's Attempts (stale workspaces are cleaned when it is built)."""
    configure(app, client, workspace_root)
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
        for w in Worker.all(connection=conn, serializer=JSONSerializer):
            queues = [q for q in w.queue_names() if q.startswith(prefix)]
            if not queues:
                continue
            seen = w.last_heartbeat.timestamp() if w.last_heartbeat else None
            worker_id = _SAFE.sub("_", w.name)
            out.append({
                "worker": worker_id, "pid": w.pid, "hostname": w.hostname, "state": w.get_state(),
                "queues": [q[len(prefix):] for q in queues],
                "last_heartbeat_s_ago": None if seen is None else round(now - seen, 1),
                "healthy": seen is not None and now - seen < w.worker_ttl,
                "leases": holders.pop(worker_id, []),
            })
        for worker_id, leases in sorted(holders.items()):  # leases held by processes RQ no longer lists
            out.append({"worker": worker_id, "pid": None, "hostname": None, "state": "gone", "queues": [],
                        "last_heartbeat_s_ago": None, "healthy": False, "leases": leases})
        return out
    finally:
        conn.close()

"""The consumer side's bridge to RQ: RQ carries Attempts to worker processes; mc_queue stays the authority.

An RQ job carries only ids, serialized as JSON: ``run_attempt(prefix, attempt_id, lease_ms)``
(:mod:`mc_queue.transport`). A message delivered twice is refused by the claim (the second claim
finds the Attempt taken) and ends quietly; a message lost is sent again from the outbox by the
sweeper. The lease length comes from the task (frozen at enqueue), never from the message.

RQ imports whatever function a job names, so anyone able to write Redis could make every worker
run ``os.system``. mc_queue's workers use :class:`McqJob`, which resolves only mc_queue's own entry
function and no callbacks; any other job (a foreign function, a payload RQ cannot decode, an
entry-function job for another namespace or with a malformed id) is refused, recorded in the
namespace log as ``transport_job_refused``, and never imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import socket
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

from .app import App
from .client import Client
from .context import Context, LeaseLost
from .errors import CancelRequested, McqError, TransitionRefused, WriteRefused
from .failures import make_failure
from .keys import parse_attempt_id
from .models import Attempt, FailureClass, Task
from .policy import Classified, classify, decision_for
from .transport import ENTRY, rq_connection, rq_queue_name
from .workspace import CleanupReport, WorkspaceRoot

log = logging.getLogger("mc_queue.worker")


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


def run_attempt(prefix: str, attempt_id: str, lease_ms: int | None = None) -> dict[str, Any]:
    """The RQ job function: claim the Attempt, run its handler, record the outcome. Never raises for
    an outcome mc_queue recorded; a rejected claim (a duplicate message) ends quietly. ``lease_ms``
    from the message is ignored: the claim takes the task's own lease length."""
    rt = runtime()
    client = rt.client
    if prefix != client.keys.prefix:
        return _refuse_message(rt, attempt_id, f"job for namespace {prefix!r}, this worker serves "
                               f"{client.keys.prefix!r}")
    try:
        task_id, n = parse_attempt_id(attempt_id)
    except ValueError as exc:
        return _refuse_message(rt, attempt_id, str(exc))
    try:
        lease = client.claim_attempt(task_id, rt.worker_id, lease_ms=None, expect_attempt=n,
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
    ctx.start_heartbeats((lease.lease_ms or spec.lease_ms) / 3000)
    outcome: dict[str, Any]
    try:
        try:
            result = spec.fn(ctx, task.payload)
        finally:
            ctx.stop_heartbeats()
        ctx.check()
        if ctx.effects_used and "result_pending" in spec.phases:
            # Seed 003: the result is on file before the completion, so a worker dying in between
            # leaves a result the reconciler can prove, not a rerun of every effect.
            ctx.checkpoint("result_pending", {"result": result})
        try:
            client.complete_quietly(attempt_id, lease.fence, result, worker_id=rt.worker_id)
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


def _refuse_message(rt: Runtime, attempt_id: Any, why: str) -> dict[str, Any]:
    """A message with mc_queue's entry function that this worker must not act on: recorded, not run."""
    with contextlib.suppress(Exception):
        rt.client.audit("transport_job_refused", {"attempt": str(attempt_id)[:300], "worker": rt.worker_id,
                                                  "reason": why})
    log.warning("refused a transport message for %r: %s", attempt_id, why)
    return {"refused": why}


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
        decision = decision_for(fresh, current, classified, cost=current.cost, tokens=current.tokens)
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


def _refuse_foreign(func_name: str, job_id: str, why: str, *_args: Any, **_kwargs: Any) -> None:
    rt = _RUNTIME
    if rt is not None:
        with contextlib.suppress(Exception):
            rt.client.audit("transport_job_refused", {"job_id": job_id, "func_name": func_name[:300],
                                                      "worker": rt.worker_id, "reason": why})
    raise ForeignJobRefused(f"refused RQ job {job_id}: {why}")


class ForeignJobRefused(McqError):
    """An RQ job on an mc_queue queue named a function other than mc_queue's entry."""


_UNDECODABLE = "<a payload that cannot be decoded as JSON>"


def _func_name(job: Job) -> Any:
    """RQ's func_name, except that a payload it cannot decode is named, not raised (RQ reads the name
    for its process title before the job runs)."""
    try:
        return Job.func_name.fget(job)  # type: ignore[attr-defined]
    except Exception:
        return _UNDECODABLE


class McqJob(Job):
    """An RQ Job that never imports a name found in Redis: only mc_queue's entry, no callbacks."""

    func_name = property(_func_name, Job.func_name.fset)  # type: ignore[attr-defined]

    @property
    def func(self) -> Callable[..., Any]:
        try:
            name = self.func_name
            args, kwargs = (self.args, self.kwargs) if name != _UNDECODABLE else ((), {})
        except Exception:
            name = _UNDECODABLE
        if name == _UNDECODABLE:  # a pickle or garbage: never run, never unpickled
            return functools.partial(_refuse_foreign, "?", str(self.id), "its payload cannot be decoded as JSON")
        if name == ENTRY and not kwargs:
            if len(args) not in (2, 3) or not all(isinstance(a, (str, int)) for a in args):
                return functools.partial(_refuse_foreign, str(name), str(self.id),
                                         "its arguments are not (prefix, attempt id, lease ms)")
            return run_attempt
        return functools.partial(_refuse_foreign, str(name), str(self.id),
                                 f"it names {str(name)[:200]!r}; mc_queue workers run only {ENTRY}, nothing "
                                 "is imported")

    def _execute(self) -> Any:
        """RQ's _execute, except that a payload it cannot decode reaches the refusal instead of raising
        before anything is recorded."""
        fn = self.func
        try:
            args, kwargs = self.args, self.kwargs
        except Exception:
            args, kwargs = (), {}
        return fn(*args, **kwargs)

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
    client.open_namespace()  # load the epoch once here: forked work horses inherit it
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

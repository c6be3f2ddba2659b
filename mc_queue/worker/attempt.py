"""One Attempt in a worker process: its admission (the task read before anything is claimed), the claim,
the handler under its Context, and how the outcome is written.

An RQ job carries only ids, serialized as JSON: ``run_attempt(prefix, attempt_id, lease_ms)``
(:mod:`mc_queue.producer.transport`). A message delivered twice is refused by the claim (the second claim
finds the Attempt taken) and ends quietly; a message lost is sent again from the outbox by the
sweeper. The lease length comes from the task (frozen at enqueue), never from the message.

**Outcomes.** ``run_attempt`` returns the Attempt's outcome and logs it: a failure at WARNING (ERROR
when the task stops or is quarantined) with its class, type, fingerprint, the decision and the
traceback; RQ's "Job OK" lines, which say nothing about the Attempt, are not logged. RQ's job
timeout does not fail the Attempt: the worker gives up its lease (:meth:`Operator.void_leases`), the
Attempt turns suspect and the sweeper reconciles its effects with their providers before anything
is retried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from rq import Queue
from rq.timeouts import JobTimeoutException

from ..client import Client
from ..client.holder import Completion
from ..contracts import failpoints
from ..contracts.codec import canonical_json
from ..contracts.errors import (
    CancelRequested,
    McqError,
    OverLimit,
    ReplicationUnconfirmed,
    TransitionRefused,
    WriteRefused,
)
from ..contracts.failures import make_failure
from ..contracts.frozen import expand
from ..contracts.keys import limit_names, parse_attempt_id
from ..contracts.models import Attempt, FailureClass, Lease, Manifest, Task
from ..contracts.packing import LONG_MARK, join_long
from ..policy.classify import Classified, RateLimited, classify, decision_for
from ..policy.reconcile import Reconciler
from ..producer.app import App, HandlerSpec
from ..producer.dispatch import dispatch
from ..producer.transport import rq_connection
from .context import Context, LeaseLost
from .probes import Probes
from .workspace import CleanupReport, WorkspaceRoot

log = logging.getLogger("mc_queue.worker")

DEFAULT_GRACE_S = 30.0
MAX_PAUSE_S = 3600.0  # the longest pause a provider's Retry-After sets on a rate limit key
SUPERSEDE_ACK_MS = 10_000  # how long a superseded holder has to stop before its lease is voided
RQ_DEFAULT_TIMEOUT_S = int(Queue.DEFAULT_TIMEOUT)  # RQ's timeout for a job sent without one


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
    probes: Probes | None = None  # the App's health probes, run by a thread of this worker process


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
    limits: tuple[str, ...] = ()  # the task's rate limit keys (its claim takes their units)


class Refusal(Exception):
    """A message this worker must not act on, and why (recorded, never run)."""

    def __init__(self, why: str, *, attempt: Any = None, func_name: Any = None,
                 resend_in_ms: int | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.attempt = attempt
        self.func_name = func_name
        self.resend_in_ms = resend_in_ms  # a reason of this worker's own: send it again this soon


def admit(rt: Runtime, prefix: Any, attempt_id: Any) -> Admission:
    """Read the task before anything is claimed: the message must be for this namespace, an
    existing task and Attempt, and a handler this worker's App has. Raises :class:`Refusal`."""
    got = admit_many(rt, [(prefix, attempt_id)])[0]
    if isinstance(got, Refusal):
        raise got
    return got


def admit_many(rt: Runtime, messages: Sequence[tuple[Any, Any]]) -> list[Admission | Refusal]:
    """:func:`admit` for many (prefix, attempt id) messages, their tasks read in one round trip."""
    ns = rt.client.keys.prefix
    out: list[Admission | Refusal | None] = [None] * len(messages)
    reads: list[tuple[int, str, int]] = []
    pipe = rt.client.redis.pipeline(transaction=False)
    for i, (prefix, attempt_id) in enumerate(messages):
        if prefix != ns:
            out[i] = Refusal(f"job for namespace {str(prefix)[:200]!r}, this worker serves {ns!r}", attempt=attempt_id)
            continue
        try:
            task_id, n = parse_attempt_id(attempt_id)
        except ValueError as exc:
            out[i] = Refusal(str(exc), attempt=attempt_id)
            continue
        tk = rt.client.keys.task(task_id)
        pipe.hmget(tk.task, ["queue", "handler", "manifest", "payload_digest", f"{n}.state", "limits"])
        pipe.hmget(tk.attempts_v1, [f"{n}.state", f"{n}.manifest"])  # (a task written before 2026-12)
        reads.append((i, task_id, n))
    replies = pipe.execute() if reads else []
    for (i, task_id, n), own, old in zip(reads, replies[::2], replies[1::2], strict=True):
        try:
            out[i] = _admission(rt, str(messages[i][1]), task_id, n, own, old)
        except Refusal as refusal:
            out[i] = refusal
    return [o for o in out if o is not None]


def _admission(rt: Runtime, attempt_id: str, task_id: str, n: int, own: list[Any], old: list[Any]) -> Admission:
    ns = rt.client.keys.prefix
    (queue, handler, manifest, payload_digest, state, limits), (old_state, attempt_manifest) = own, old
    state = state or old_state
    if (manifest or "")[:1] == LONG_MARK:  # a manifest over 64 bytes, kept in chunks (its fields manifest#<i>)
        manifest = join_long(cast(dict[str, str], rt.client.redis.hgetall(rt.client.keys.task(task_id).task))
                             ).get("manifest")
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
        with contextlib.suppress(ValueError, McqError):
            timeout_s = Manifest.model_validate_json(
                # (only its timeout is read here: a short payload keeps no digest, and none is needed)
                expand("manifest", raw, handler=handler, payload_digest=payload_digest or "")).timeout_s
    names = limit_names(str(limits or ""))
    blocked = rt.probes.refusal(names) if rt.probes is not None else None
    if blocked:  # this worker's view: sent again once its probe may pass, to it or another
        raise Refusal(blocked[0], attempt=attempt_id, resend_in_ms=max(1, round(blocked[1] * 1000)))
    return Admission(prefix=ns, attempt_id=attempt_id, task_id=task_id, number=n, queue=str(queue),
                     handler=str(handler), timeout_s=max(1, int(timeout_s)) if timeout_s else RQ_DEFAULT_TIMEOUT_S,
                     limits=names)


def run_attempt(prefix: str, attempt_id: str, lease_ms: int | None = None) -> dict[str, Any]:
    """Run one Attempt in this process (the RQ entry's name; a worker runs the job it admitted with
    :func:`run_admitted`). The task is read first: a message for another namespace, a missing task
    or Attempt, or a handler the App does not have is refused without touching the task.
    ``lease_ms`` from the message is ignored: the claim takes the task's own lease length."""
    rt = runtime()
    try:
        adm = admit(rt, prefix, attempt_id)
    except Refusal as refusal:
        return record_refusal(rt, refusal, attempt=attempt_id)
    return run_admitted(adm)


def run_admitted(adm: Admission) -> dict[str, Any]:
    """Claim the Attempt, run its handler, record the outcome. Never raises for an outcome mc_queue
    recorded; a rejected claim (a duplicate or late message) ends quietly."""
    rt = runtime()
    failpoints.hit("attempt.before_claim", attempt=adm.attempt_id, worker=rt.worker_id)
    try:
        lease = rt.client.leases.claim_attempt(adm.task_id, rt.worker_id, lease_ms=None, expect_attempt=adm.number,
                                               request_id=uuid.uuid4().hex, with_task=True, budget_s=adm.timeout_s,
                                               limits=adm.limits)
    except (TransitionRefused, ReplicationUnconfirmed) as exc:
        return not_claimed(rt, adm, exc)
    started = start_claimed(rt, adm, lease)
    return started if isinstance(started, dict) else finish_started(rt, started)


def _holder_spec(rt: Runtime, task_id: str) -> HandlerSpec | None:
    """The handler of a superseded holder's task, as this worker's App declares it (None: unknown here)."""
    try:
        return rt.app.handlers.get(rt.client.reads.get_task(task_id).handler)
    except McqError:
        return None


def not_claimed(rt: Runtime, adm: Admission, exc: McqError) -> dict[str, Any]:
    """A claim that did not give this worker the Attempt: a duplicate or late message, or a canceled task
    (ClaimRejected), ends quietly; a claim the replicas did not confirm runs nothing and gives its lease up."""
    if isinstance(exc, ReplicationUnconfirmed):
        # The claim is on the primary only: a failover could forget it while the handler acts. The
        # Attempt does not run; its lease is given up (or runs out) and the sweeper reconciles it.
        with contextlib.suppress(McqError, redis.RedisError):
            rt.client.operator.void_leases([adm.attempt_id], actor=rt.worker_id,
                                           reason="claim not confirmed by the replicas")
        log.warning("attempt %s: not run: %s", adm.attempt_id, exc.message)
        return {"unconfirmed": exc.message}
    if isinstance(exc, OverLimit) and exc.supersede:
        # A concurrency key that supersedes its running holder: this Attempt waits in line (first) while the
        # holder's task is canceled; its slot returns when the holder acknowledges or its lease is voided.
        holder = parse_attempt_id(exc.supersede)[0]
        spec = _holder_spec(rt, holder)
        if spec is not None and not spec.can_cancel:
            # Its adapter cannot be stopped mid-run: canceling it would void its lease while it keeps
            # running, two writers at once. This Attempt waits in line for it instead (woken as it ends).
            log.info("attempt %s: not superseding %s: handler %s declares it cannot be canceled; waiting",
                     adm.attempt_id, exc.supersede, spec.name)
            return {"waiting": exc.message, "not_superseding": exc.supersede,
                    "why": f"handler {spec.name} declares it cannot be canceled"}
        try:
            rt.client.operator.cancel_task(holder, f"superseded by {adm.attempt_id}: {exc.message}",
                                           actor=rt.worker_id, ack_timeout_ms=SUPERSEDE_ACK_MS)
        except McqError as err:  # ended meanwhile, or gone: its slot is back already
            log.info("attempt %s: superseding %s: %s", adm.attempt_id, exc.supersede, err.message)
        return {"waiting": exc.message, "superseding": exc.supersede}
    log.info("attempt %s: not claimed: %s", adm.attempt_id, exc.message)
    return {"skipped": exc.message}


@dataclass
class Started:
    """A claimed Attempt whose lease the process's heartbeat thread renews, ready to run its handler."""

    adm: Admission
    lease: Lease
    ctx: Context
    spec: HandlerSpec


def start_claimed(rt: Runtime, adm: Admission, lease: Lease) -> Started | dict[str, Any]:
    """Make the claimed Attempt's Context and start renewing its lease (a batch starts all it claimed
    before it runs the first: those waiting their turn keep their leases)."""
    client = rt.client
    task = lease.task or client.reads.get_task(adm.task_id)  # the claim read it: no round trip here
    attempt = task.attempts[adm.number - 1]
    spec = rt.app.handlers.get(task.handler)
    if spec is None:  # admitted a moment ago: only a task rewritten in between gets here
        failure = make_failure(FailureClass.CONFIGURATION, "UnknownHandler",
                               f"handler {task.handler!r} is not registered in app {rt.app.name!r} of worker "
                               f"{rt.worker_id}")
        return _fail(client, rt, task, attempt, lease.fence, Classified(failure))
    ctx = Context(client, spec, task, attempt, lease.fence, rt.worker_id,
                  functools.partial(rt.workspaces.create, adm.attempt_id), rt.app.operations,
                  recovered_at_ms=lease.recovered_at_ms, deadline_ms=lease.deadline_ms, now_ms=lease.claimed_now_ms,
                  fallbacks=rt.app.fallbacks)
    ctx.start_heartbeats((lease.lease_ms or spec.lease_ms) / 3000)
    return Started(adm, lease, ctx, spec)


def finish_started(rt: Runtime, st: Started, *, defer: list[Completion] | None = None) -> dict[str, Any]:
    """Run the handler and record its outcome. ``defer``: a success's completion is appended there, to
    be sent with the batch's next round trip (:func:`completion_outcome` then says how it went),
    instead of sent now."""
    client, ctx, spec = rt.client, st.ctx, st.spec
    attempt_id, task = st.adm.attempt_id, ctx.task
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
        if defer is not None:
            defer.append(Completion(attempt_id, st.lease.fence, canonical_result(result)))
            outcome = {"completing": attempt_id}
        else:
            try:
                client.leases.complete_quietly(attempt_id, st.lease.fence, result, worker_id=rt.worker_id)
                done: McqError | None = None
            except (CancelRequested, WriteRefused) as exc:
                done = exc
            outcome = completion_outcome(rt, attempt_id, st.lease.fence, task.handler, done)
    except LeaseLost as exc:
        outcome = {"lease_lost": exc.message}
        log.warning("attempt %s: lease lost, nothing more recorded by this worker: %s", attempt_id, exc.message)
    except CancelRequested:
        outcome = _acknowledge(client, rt, attempt_id, st.lease.fence)
    except JobTimeoutException as exc:
        outcome = _timed_out(client, rt, attempt_id, ctx, exc)
    except RateLimited as exc:  # the provider said so: every worker holds the key's claims until Retry-After
        with contextlib.suppress(McqError, redis.RedisError):
            client.limits.pause(exc.key, min(max(exc.retry_after or 1.0, 0.001), MAX_PAUSE_S), source="worker",
                                reason=f"{exc} (attempt {attempt_id}, worker {rt.worker_id})"[:2000],
                                actor=rt.worker_id)
        outcome = _fail(client, rt, task, ctx.attempt, st.lease.fence, classify(exc), exc)
    except Exception as exc:
        outcome = _fail(client, rt, task, ctx.attempt, st.lease.fence, classify(exc), exc)
    except BaseException:
        # SystemExit (the worker is stopping now), KeyboardInterrupt: the Attempt is not failed here.
        # Its heartbeats have stopped; its lease runs out and the sweeper reconciles what it did.
        log.warning("attempt %s: the worker stopped before its handler finished; its lease runs out and the "
                    "sweeper reconciles it", attempt_id)
        raise
    keep = rt.keep_failed_workspaces and "succeeded" not in outcome and "completing" not in outcome
    if ctx.workspace_created and not keep:
        with contextlib.suppress(OSError):
            rt.workspaces.remove(ctx.workspace)
    if ctx.attempt.slots and "completing" not in outcome:
        pass_slots_on(rt)
    return outcome


def pass_slots_on(rt: Runtime) -> None:
    """The Attempt held concurrency slots and stopped: the waiters its end woke are made due and sent now
    by this worker, not at the sweeper's next look (which does it when this fails: a wake is idempotent)."""
    try:
        woken = rt.client.slots.wake_due(limit=10, actor=rt.worker_id)
        if not woken:
            return
        rq = rq_connection(rt.client)
        try:
            for aid in woken:
                task_id, n = parse_attempt_id(aid)
                task = rt.client.reads.get_task(task_id)
                dispatch(rt.client, rq, task, task.attempts[n - 1])
        finally:
            rq.close()
    except (McqError, redis.RedisError) as exc:
        log.info("waiters for a returned slot left to the sweeper: %s", exc)


def canonical_result(result: Any) -> Any:
    """The result as its completion will send it: a value that is not JSON fails the Attempt here, in
    its handler's place (classified as the immediate completion's refusal would be), not in the batch."""
    canonical_json(result, what="result")
    return result


def completion_outcome(rt: Runtime, attempt_id: str, fence: int, handler: str, done: BaseException | None
                       ) -> dict[str, Any]:
    """What a completion sent (now, or with a batch) came to: succeeded, a cancel to acknowledge, or refused."""
    if done is None:
        log.info("attempt %s (%s) succeeded", attempt_id, handler)
        return {"succeeded": attempt_id}
    if isinstance(done, CancelRequested):
        return _acknowledge(rt.client, rt, attempt_id, fence)
    message = done.message if isinstance(done, McqError) else str(done)
    log.warning("attempt %s: its completion was refused: %s", attempt_id, message)
    return {"refused": message}


def record_refusal(rt: Runtime, refusal: Refusal, **fields: Any) -> dict[str, Any]:
    """A message this worker must not act on: recorded in the capped refusals log, not run."""
    record = {**{k: v for k, v in fields.items() if v is not None}, "worker": rt.worker_id, "reason": refusal.why}
    if refusal.attempt is not None:
        record["attempt"] = str(refusal.attempt)[:300]
    if refusal.func_name is not None:
        record["func_name"] = str(refusal.func_name)[:300]
    try:
        rt.client.operator.audit("transport_job_refused", record)
        if refusal.resend_in_ms and refusal.attempt is not None:
            rt.client.schedule.resend_soon(str(refusal.attempt), in_ms=refusal.resend_in_ms)
    except (McqError, redis.RedisError) as exc:  # (the sweeper's recheck sends it again anyway)
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




def horse_died(rt: Runtime, attempt_id: str, pid: int, status: int) -> bool:
    """The process running ``attempt_id`` for this worker died: void its lease now (fenced, and only if this
    worker holds it: the dead process may have been a duplicate message's, refused while another worker
    runs the Attempt) and reconcile the Attempt with its providers at once, as the sweeper would after the
    lease ran out. Returns True when the lease was voided. Never raises: what fails here is left to the
    lease and the sweeper."""
    return bool(void_and_reconcile(rt.client, rt.app, [attempt_id], holder=rt.worker_id,
                                   why=f"the process running it (pid {pid}) died ({describe_exit(status)})"))


def describe_exit(status: int | None, *, exitcode: bool = False) -> str:
    """How a process ended: from a waitpid status, or (``exitcode``) a multiprocessing exit code
    (minus the signal that ended it, else its exit status)."""
    if status is None:
        return "no status"
    if exitcode:
        return f"signal {-status}" if status < 0 else f"exit status {status}"
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


def void_and_reconcile(client: Client, app: App, attempt_ids: list[str], *, holder: str, why: str) -> list[str]:
    """Void the leases of ``attempt_ids`` that ``holder`` holds (expire.lua by holder: a lease another worker
    holds is left alone) and reconcile each voided Attempt with its providers at once. Returns the
    Attempts voided. Never raises: what fails here is left to the lease and the sweeper."""
    if not attempt_ids:
        return []
    try:
        voided = [e.attempt_id for e in client.operator.void_leases(attempt_ids, actor=holder, holder=holder,
                                                                      reason=f"{why}: its lease is voided at once")]
    except (McqError, redis.RedisError) as exc:
        log.error("attempts %s: %s; voiding their leases failed (%s): they run out by themselves", attempt_ids, why,
                  exc)
        return []
    if not voided:
        log.info("attempts %s: %s, holding no lease of %s", attempt_ids, why, holder)
        return []
    log.warning("attempts %s: %s; leases voided, reconciling now", voided, why)
    reconciler = Reconciler(client, app.operations, actor=holder)
    for aid in voided:
        try:
            reconciler.reconcile(aid, apply_policy=True)
        except Exception as exc:  # a provider down, a transition refused: the sweeper reconciles it at its next pass
            log.warning("attempt %s: reconciling it after its process died failed (%s); the sweeper will", aid, exc)
    return voided

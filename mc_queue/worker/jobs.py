"""What an RQ job must be before a worker runs it, and the Job class that acts on nothing else.

**Nothing in a job is trusted.** Anyone able to write ``rq:*`` keys can write a job, so before a
job runs, the worker process that took it (not a forked child) screens it, and refuses it, recorded
through :meth:`Operator.audit` (``transport_job_refused`` in the capped refusals log) and removed from
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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from rq.defaults import CALLBACK_TIMEOUT
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.results import Result

from ..contracts.errors import McqError
from ..producer.transport import ENTRY, rq_queue_name, rq_queue_names
from .attempt import Admission, Refusal, Runtime, admit_many, run_admitted

RESULT_TTL = 0  # what mc_queue.producer.dispatch.dispatch sets: no RQ result is kept (mc_queue records it)
FAILURE_TTL_S = 7 * 86_400  # what mc_queue.producer.dispatch.dispatch sets for a failed RQ job

# The fields of an RQ job hash mc_queue's producer writes, and those RQ's bookkeeping adds while it
# runs or fails one. Anything else is an option mc_queue never sets.
JOB_FIELDS = frozenset({
    "data", "origin", "description", "created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat",
    "worker_name", "status", "timeout", "result_ttl", "failure_ttl", "success_callback_name",
    "failure_callback_name", "stopped_callback_name", "group_id", "exc_info", "result",
})
_MUST_BE_EMPTY = ("success_callback_name", "failure_callback_name", "stopped_callback_name", "group_id")


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
        self.prepared = False  # RQ's start of the job was written with its execution (McqSimpleWorker)
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

    def delete(self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False) -> None:
        """RQ's delete, for a job whose hash may be gone: a second delivery of one Attempt (a message
        sent again after one that never reached its claim) ends after its twin finished and deleted
        the hash (no result is kept). RQ then raised out of its success bookkeeping, reading the
        status to find the registry to leave, and logged the refused duplicate as a crash. There is
        no registry entry of that status left; what this delivery's own heartbeat and execution wrote
        is removed. (RQ reads the status before it queues anything: caught, nothing was half done, and
        the common case costs no extra read.)"""
        try:
            super().delete(pipeline=pipeline, remove_from_queue=remove_from_queue, delete_dependents=delete_dependents)
            return
        except InvalidJobOperation:
            if self.connection.hget(self.key, "status"):
                raise  # not the gone-hash case
        connection = pipeline if pipeline is not None else self.connection
        self.execution_registry.delete(job=self, pipeline=connection)  # type: ignore[arg-type]  # (as RQ does)
        connection.delete(self.key, self.dependents_key, self.dependencies_key,
                          Result.get_key(self.id))  # type: ignore[no-untyped-call]

    def delete_ran(self, pipeline: Any) -> None:
        """Delete, in the worker's success bookkeeping, the job it just ran, without reading anything
        back: the job hash (and the dependents, dependencies and result keys RQ deletes with it) and its
        execution index. The worker's own execution is deleted with it (RQ's cleanup_execution); another
        delivery's execution, if one is still running, cleans up its own when it ends, and one whose
        worker died leaves RQ's started registry at its expiry (RQ's registry cleanup skips a job that
        is gone). RQ's delete reads the status and every execution back first: seven round trips."""
        pipeline.delete(self.key, self.dependents_key, self.dependencies_key, Result.get_key(self.id),  # type: ignore[no-untyped-call]
                        self.execution_registry.key)

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
    got = screen_jobs(rt, [job], queue_name)[0]
    if isinstance(got, Refusal):
        raise got
    return got


def screen_jobs(rt: Runtime, jobs: Sequence[McqJob], queue_name: str) -> list[Admission | Refusal]:
    """:func:`screen_job` for the jobs a batch took from one RQ queue, their tasks read in one round trip."""
    out: list[Admission | Refusal | None] = [None] * len(jobs)
    messages: list[tuple[int, tuple[Any, Any]]] = []
    for i, job in enumerate(jobs):
        try:
            messages.append((i, _message(job, queue_name)))
        except Refusal as refusal:
            out[i] = refusal
    for (i, (_, aid)), adm in zip(messages, admit_many(rt, [m for _, m in messages]), strict=True):
        if isinstance(adm, Admission) and queue_name not in rq_queue_names(adm.prefix, adm.queue):
            adm = Refusal(f"it came on RQ queue {queue_name!r}, but task {adm.task_id} is on queue {adm.queue!r} "
                          f"(RQ queue {rq_queue_name(adm.prefix, adm.queue)!r} or one of its priorities)",
                          attempt=aid, func_name=ENTRY)
        out[i] = adm
    return [o for o in out if o is not None]


def _message(job: McqJob, queue_name: str) -> tuple[Any, Any]:
    """The (prefix, attempt id) a job carries, once it passed every check that needs no read."""
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
    return args[0], args[1]

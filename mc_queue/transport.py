"""How mc_queue names things in RQ, its execution transport (the producer and the worker both use it).

An RQ job carries only ids, serialized as JSON: ``mc_queue.worker.run_attempt(prefix, attempt_id,
lease_ms)`` (the worker takes the lease length from the task, not from the message). Its job id is
derived from the attempt id, so dispatching an Attempt twice makes one RQ job; a job RQ still holds
queued is never pushed again (:func:`waiting`), and one sent again is first cleared from RQ's
registries (:func:`clear_job`), so RQ's own counts (``rq info``) show one entry per waiting Attempt.
Its ``description`` (:func:`job_description`) names the handler, the task and the Attempt, for
rq-dashboard and anything else that lists RQ's jobs.
"""

from __future__ import annotations

import hashlib
import time

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from .client import Client, quiet_connection_kwargs
from .keys import parse_attempt_id
from .urls import make_redis

ENTRY = "mc_queue.worker.run_attempt"


def rq_queue_name(prefix: str, queue: str) -> str:
    return f"mcq:{prefix}:{queue}"


def job_id(prefix: str, attempt_id: str) -> str:
    """One RQ job id per Attempt (RQ allows only [A-Za-z0-9_-] in ids)."""
    task_id, n = parse_attempt_id(attempt_id)
    ulid = task_id.rsplit(":", 1)[1]
    ns = hashlib.sha1(f"{prefix}\0{task_id.rsplit(':', 1)[0]}".encode()).hexdigest()[:8]
    return f"mcq-{ns}-{ulid}-{n}"


def job_description(handler: str, attempt_id: str) -> str:
    """The RQ job's ``description``: what rq-dashboard and other listings of RQ's jobs show for it instead
    of RQ's default, the entry call (``mc_queue.worker.run_attempt('ops', 'mail:01.../1', 3000)``): the
    handler, the task and the Attempt. Shown only; a worker neither reads nor trusts it (it acts on the
    ids in the job's arguments, after its claim)."""
    task_id, n = parse_attempt_id(attempt_id)
    return f"{handler} task {task_id} attempt {n}"


def rq_connection(client: Client) -> redis.Redis:
    """RQ needs bytes responses; same server and credentials as the client, built by the same factory
    (a sentinel URL follows a failover here too)."""
    return make_redis(client.target, socket_timeout=30, socket_connect_timeout=10, **quiet_connection_kwargs())


def rq_queue(rq: redis.Redis, prefix: str, queue: str) -> Queue:
    return Queue(rq_queue_name(prefix, queue), connection=rq, serializer=JSONSerializer)


def waiting(rq: redis.Redis, queue: Queue, jid: str) -> bool:
    """True when RQ holds this job waiting in its queue's list, or running in a worker whose
    execution is still live (RQ's started registry): sending it again would make a second entry
    for one Attempt. Anything else (no job, a lost list entry, a started job whose worker died
    before its claim, failed, finished) means the message must be sent again."""
    pipe = rq.pipeline(transaction=False)
    pipe.hget(Job.key_for(jid), "status")
    pipe.lpos(queue.key, jid)
    status, position = pipe.execute()
    if status == b"queued":
        return position is not None
    if status == b"started":
        now = time.time()
        return any(score > now for _, score in rq.zscan_iter(queue.started_job_registry.key, match=f"{jid}:*"))
    return False


def clear_job(rq: redis.Redis, queue: Queue, jid: str, *, delete: bool = False) -> None:
    """Remove this job id from its queue's list and every registry RQ keeps for the queue (and its
    hash with ``delete``): before it is sent again, and once its Attempt is settled, so that no
    registry names a job RQ no longer has (``rq requeue --all`` and rq-dashboard fail on those)."""
    started = queue.started_job_registry.key
    executions = [m for m, _ in rq.zscan_iter(started, match=f"{jid}:*", count=1000)]
    pipe = rq.pipeline(transaction=False)
    pipe.lrem(queue.key, 0, jid)
    for registry in (queue.failed_job_registry, queue.finished_job_registry, queue.canceled_job_registry,
                     queue.deferred_job_registry, queue.scheduled_job_registry):
        pipe.zrem(registry.key, jid)
    if executions:
        pipe.zrem(started, *executions)
    if delete:
        pipe.delete(Job.key_for(jid))
    pipe.execute()


def orphaned(rq: redis.Redis, queue: Queue, *, limit: int = 500) -> list[str]:
    """Job ids the queue's failed and finished registries name but RQ no longer holds (up to ``limit``
    of each, oldest first): left by jobs deleted after they were recorded there."""
    out: list[str] = []
    for registry in (queue.failed_job_registry, queue.finished_job_registry):
        ids = [m.decode() if isinstance(m, bytes) else str(m) for m in rq.zrange(registry.key, 0, limit - 1)]
        if not ids:
            continue
        pipe = rq.pipeline(transaction=False)
        for jid in ids:
            pipe.exists(Job.key_for(jid))
        out.extend(j for j, found in zip(ids, pipe.execute(), strict=True) if not found)
    return out


def forget_orphans(rq: redis.Redis, queue: Queue, *, limit: int = 500) -> list[str]:
    """Remove :func:`orphaned` ids from the queue's registries; returns them."""
    ids = orphaned(rq, queue, limit=limit)
    if ids:
        pipe = rq.pipeline(transaction=False)
        for registry in (queue.failed_job_registry, queue.finished_job_registry):
            pipe.zrem(registry.key, *ids)
        pipe.execute()
    return ids

"""How mc_queue names things in RQ, its execution transport (the producer and the worker both use it).

An RQ job carries only ids, serialized as JSON: ``mc_queue.worker.run_attempt(prefix, attempt_id, lease_ms)``
(the worker takes the lease length from the task, not from the message). Its job id is
derived from the attempt id, so dispatching an Attempt twice makes one RQ job; a job RQ still holds
queued is never pushed again (:func:`waiting`), and one sent again is first cleared from RQ's
registries (:func:`clear_job`), so RQ's own counts (``rq info``) show one entry per waiting Attempt.
Its ``description`` (:func:`job_description`) names the handler, the task and the Attempt, for
rq-dashboard and anything else that lists RQ's jobs.

mc_queue is the only source of truth; RQ's registries must not contradict it. RQ moves a job to its
failed registry for 7 days when the process running it dies (a work horse killed after its Attempt's
outcome was recorded, a worker lost in a failover whose execution RQ later calls abandoned), whatever
mc_queue decided; :func:`forget_orphans` (the sweeper's tidying, every ``tidy_every_s``) removes the
failed and executing entries of Attempts mc_queue has settled, and their jobs.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, cast

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import utcparse

from ..client import Client
from ..contracts.errors import OutcomeUnknown
from ..contracts.keys import Keys, parse_attempt_id
from ..contracts.models import TERMINAL_ATTEMPT_STATES
from ..store.backend import quiet_connection_kwargs
from ..store.urls import make_redis

ENTRY = "mc_queue.worker.run_attempt"
TICKET = "mcq-fair"  # in an RQ queue's list, a message waiting in one of its fair lanes (no job has this id)
PRIORITIES = range(1, 10)  # 1 is the most urgent; a worker empties a more urgent RQ queue before the next
DEFAULT_PRIORITY = 5  # a task without a priority (its RQ queue is the queue's plain one)


def rq_queue_name(prefix: str, queue: str, priority: int = DEFAULT_PRIORITY) -> str:
    """The RQ queue of a queue's Attempts of one priority: ``mcq:<prefix>:<queue>`` for the default, and
    ``mcq:<prefix>:<queue>@p<n>`` for the others ('@' is in neither a prefix nor a queue name)."""
    base = f"mcq:{prefix}:{queue}"
    return base if priority == DEFAULT_PRIORITY else f"{base}@p{priority}"


def rq_queue_names(prefix: str, queue: str) -> list[str]:
    """Every RQ queue of a queue, most urgent first (the order a worker takes them in)."""
    return [rq_queue_name(prefix, queue, p) for p in PRIORITIES]


def split_rq_name(name: str) -> tuple[str, str, int] | None:
    """(prefix, queue, priority) of one of mc_queue's RQ queue names, or None."""
    if not name.startswith("mcq:"):
        return None
    base, at, level = name.removeprefix("mcq:").rpartition("@p") if "@p" in name else (name[4:], "", "")
    prefix, _, queue = base.rpartition(":")
    if not prefix or not queue:
        return None
    if at:
        if not level.isdigit() or int(level) not in PRIORITIES or int(level) == DEFAULT_PRIORITY:
            return None
        return prefix, queue, int(level)
    return prefix, queue, DEFAULT_PRIORITY


def _job_ns(prefix: str, queue: str) -> str:
    return hashlib.sha1(f"{prefix}\0{queue}".encode()).hexdigest()[:8]


def job_id(prefix: str, attempt_id: str) -> str:
    """One RQ job id per Attempt (RQ allows only [A-Za-z0-9_-] in ids)."""
    task_id, n = parse_attempt_id(attempt_id)
    queue, _, ulid = task_id.rpartition(":")
    return f"mcq-{_job_ns(prefix, queue)}-{ulid}-{n}"


def attempt_of(queue: Queue, jid: str) -> str | None:
    """The attempt id an RQ job id of this queue names (:func:`job_id`'s inverse), or None when mc_queue
    did not make it for this queue."""
    parts = split_rq_name(queue.name)
    if parts is None:
        return None
    prefix, name, _ = parts
    head = f"mcq-{_job_ns(prefix, name)}-"
    if not jid.startswith(head):
        return None
    ulid, _, n = jid[len(head):].rpartition("-")
    aid = f"{name}:{ulid}/{n}"
    try:
        parse_attempt_id(aid)
    except ValueError:
        return None
    return aid if job_id(prefix, aid) == jid else None


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


def rq_queue(rq: redis.Redis, prefix: str, queue: str, priority: int = DEFAULT_PRIORITY) -> Queue:
    return Queue(rq_queue_name(prefix, queue, priority), connection=rq, serializer=JSONSerializer)


def rq_queues_of(rq: redis.Redis, prefix: str, queue: str) -> list[Queue]:
    """Every RQ queue of a queue (each priority), most urgent first."""
    return [rq_queue(rq, prefix, queue, p) for p in PRIORITIES]


class LaneQueue(Queue):
    """An RQ queue whose messages of one fairness key wait in that key's fair lane (``lua/fair_push.lua``,
    in the same MULTI as RQ's job record), the RQ queue itself holding a ticket (:data:`TICKET`) in their
    place: a worker blocked on the RQ queue wakes as for any message, and the ticket takes the lane
    ``lua/fair_pop.lua`` chooses (:func:`take_from_lane`)."""

    def __init__(self, name: str, *, client: Client, queue: str, priority: int, lane: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.lane_keys = lane_keys(client, queue, priority)
        self.lane = lane
        self.mcq_client = client

    def push_job_id(self, job_id: str, pipeline: Any = None, at_front: bool = False) -> None:
        conn = pipeline if pipeline is not None else self.connection.pipeline(transaction=True)
        (conn.lpush if at_front else conn.rpush)(self.key, TICKET)
        self.mcq_client.backend.pipelined(conn, "fair_push", self.lane_keys, {"lane": self.lane, "job_id": job_id})
        if pipeline is None:
            conn.execute()


def move_laned(client: Client, rq: redis.Redis, queue: str, source: int, target: int, jid: str) -> bool:
    """Move a message waiting at the head of its fair lane in the RQ queue of priority ``source`` to its key's
    lane of priority ``target`` (priority aging; :func:`move_message` for the others): out of the source lane
    (``lua/fair_take.lua``; False when a worker took it meanwhile: nothing else is done), then, in one MULTI,
    one ticket fewer in the source RQ queue, its job's origin, the target lane and a ticket there. A crash
    between the two loses the message, which the sweeper's dispatch walk sends again."""
    reply = client.backend.run("fair_take", lane_keys(client, queue, source), {"job_id": jid})
    if reply[0] != "OK":
        return False
    prefix = client.keys.prefix
    pipe = rq.pipeline(transaction=True)
    pipe.lrem(rq_queue(rq, prefix, queue, source).key, 1, TICKET)
    pipe.hset(Job.key_for(jid), "origin", rq_queue_name(prefix, queue, target))
    LaneQueue(rq_queue_name(prefix, queue, target), client=client, queue=queue, priority=target, lane=str(reply[1]),
              connection=rq).push_job_id(jid, pipeline=pipe)
    pipe.execute()
    return True


def lane_keys(client: Client, queue: str, priority: int) -> dict[str, str]:
    return {"lanes": client.keys.fair_lanes(queue, priority), "turns": client.keys.fair_turns(queue, priority)}


def in_lane(client: Client, queue: str, jid: str) -> bool:
    """True when this job id waits in a fair lane of one of its queue's RQ queues (aging may have moved it
    from its own priority's)."""
    pipe = client.redis.pipeline(transaction=False)
    for p in PRIORITIES:
        pipe.hexists(client.keys.fair_lanes(queue, p), f"j:{jid}")
    return any(pipe.execute())


def take_from_lane(client: Client, rq_key: str) -> str | None:
    """A worker popped a ticket from the RQ queue ``rq_key`` (``rq:queue:<name>``): the job id of the
    message ``lua/fair_pop.lua`` chooses from its lanes, or None (a ticket one too many, or one of
    another namespace: skipped). A link broken during the pop loses at most the message it took, which
    the sweeper sends again (its Attempt not claimed in time)."""
    parts = split_rq_name(rq_key.removeprefix(Queue.redis_queue_namespace_prefix))
    if parts is None or parts[0] != client.keys.prefix:
        return None
    try:
        reply = client.backend.run("fair_pop", {**lane_keys(client, parts[1], parts[2]), "limits": client.keys.limits},
                                   {"limit": 100})
    except (OutcomeUnknown, redis.ConnectionError, redis.TimeoutError):
        return None
    return str(reply[1]) if reply[0] == "OK" else None


def tidy_lanes(client: Client, rq: redis.Redis, queue: str) -> int:
    """The sweeper's care of a queue's fair lanes: give each message waiting in them a ticket in its RQ queue
    (a failover that kept a lane's entry and lost its ticket would strand it: workers only look in a lane
    for a ticket; a ticket too many only wakes a worker for nothing), and drop the passes idle keys left
    (``client.fairness.trim``). Returns the tickets pushed."""
    client.fairness.trim(queue)
    pushed = 0
    for p, lanes in client.fairness.backlog(queue).items():
        queued = sum(lanes.values())
        rq_key = rq_queue(rq, client.keys.prefix, queue, p).key
        tickets = cast(list[int] | None, rq.lpos(rq_key, TICKET, count=0))
        missing = queued - len(tickets or [])
        if missing > 0:
            rq.rpush(rq_key, *([TICKET] * missing))
            pushed += missing
    return pushed


def waiting(rq: redis.Redis, queue: Queue, jid: str, *, claim_grace_ms: int, laned: bool = False) -> bool:
    """True when RQ holds this job waiting in its queue's list, or started by a worker less than
    ``claim_grace_ms`` ago whose execution is still live (RQ's started registry): sending it again
    would make a second entry for one Attempt. The caller asks only for an Attempt still pending,
    and mc_queue's worker claims right after RQ starts a job, so a start older than the grace is a
    delivery that never reached its claim (a connection cut between RQ's start and the claim, a
    worker frozen or killed there), whatever RQ's registry says: its entry stays live for the job
    timeout + 60 s. Anything else (no job, a lost list entry, failed, finished) means the message
    must be sent again. RQ's start time is the worker's clock: a skewed one sends early (a duplicate
    message, refused by the claim) or late (by the skew), never loses the Attempt. ``laned``: its message
    waits in a fair lane (:func:`in_lane`), the RQ queue's list holding a ticket for it. A message priority
    aging moved waits in the list its job's origin names (one more round trip, only then)."""
    pipe = rq.pipeline(transaction=False)
    pipe.hmget(Job.key_for(jid), ["status", "started_at", "origin"])
    pipe.lpos(queue.key, jid)
    (status, started_at, origin), position = pipe.execute()
    if status == b"queued":
        moved = origin.decode() if origin and origin.decode() != queue.name else None
        parts, own = split_rq_name(moved or ""), split_rq_name(queue.name)
        if position is None and moved and parts and own and parts[:2] == own[:2]:  # aging moved it up a level
            position = rq.lpos(Queue(moved, connection=rq).key, jid)
        return position is not None or laned
    if status == b"started":
        now = time.time()
        try:
            started = utcparse(started_at.decode()).timestamp() if started_at else 0.0
        except ValueError:
            started = 0.0
        if 1000 * (now - started) >= claim_grace_ms:
            return False
        return any(score > now for _, score in rq.zscan_iter(queue.started_job_registry.key, match=f"{jid}:*"))
    return False


def move_message(rq: redis.Redis, source: Queue, target: Queue, jid: str) -> bool:
    """Move a waiting message to another RQ queue of its queue (priority aging): out of ``source`` (False when
    a worker took it meanwhile: nothing else is done), then to the back of ``target``, its job's origin
    with it (a worker refuses a job whose origin is not the queue it came from). A crash between the two
    loses the message, which the sweeper's dispatch walk sends again."""
    if not rq.lrem(source.key, 1, jid):
        return False
    pipe = rq.pipeline(transaction=True)
    pipe.hset(Job.key_for(jid), "origin", target.name)
    pipe.rpush(target.key, jid)
    pipe.execute()
    return True


def clear_job(rq: redis.Redis, queue: Queue, jid: str, *, delete: bool = False) -> None:
    """Remove this job id from its queue's list (and from the lists of the queue's other priorities, where
    aging may have moved it) and every registry RQ keeps for the queue (and its hash with ``delete``):
    before it is sent again, and once its Attempt is settled, so that no registry names a job RQ no
    longer has (``rq requeue --all`` and rq-dashboard fail on those)."""
    started = queue.started_job_registry.key
    executions = [m for m, _ in rq.zscan_iter(started, match=f"{jid}:*", count=1000)]
    pipe = rq.pipeline(transaction=False)
    pipe.lrem(queue.key, 0, jid)
    parts = split_rq_name(queue.name)
    for name in rq_queue_names(parts[0], parts[1]) if parts else []:
        if name != queue.name:
            pipe.lrem(Queue(name, connection=rq).key, 0, jid)
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


def settled(rq: redis.Redis, queue: Queue, *, limit: int = 500) -> list[str]:
    """Job ids the queue's failed or started registry names (up to ``limit`` of each, oldest first) whose
    Attempt mc_queue has settled (succeeded, failed, canceled; a packed task's), or does not hold (a
    retired task, an Attempt it never had): RQ must call none of them failed or executing. An Attempt
    still pending, running or suspect keeps its entries (the outbox sends it again, or the sweeper's
    reconciliation clears them). ``rq``: the bytes connection of :func:`rq_connection`."""
    jids = [m.decode() if isinstance(m, bytes) else str(m)
            for m in rq.zrange(queue.failed_job_registry.key, 0, limit - 1)]
    jids += [(m.decode() if isinstance(m, bytes) else str(m)).split(":", 1)[0]
             for m in rq.zrange(queue.started_job_registry.key, 0, limit - 1)]
    found = {jid: aid for jid in dict.fromkeys(jids) if (aid := attempt_of(queue, jid)) is not None}
    if not found:
        return []
    parts = split_rq_name(queue.name)
    if parts is None:
        return []
    keys = Keys(parts[0])
    pipe = rq.pipeline(transaction=False)
    for aid in found.values():
        task_id, n = parse_attempt_id(aid)
        tk = keys.task(task_id)
        pipe.hmget(tk.task, "state", "packed", f"{n}.state")  # (its Attempts are in the task hash)
        pipe.hget(tk.attempts_v1, f"{n}.state")  # (or, written before 2026-12, in a hash of their own)
    replies = pipe.execute()
    terminal = {s.value.encode() for s in TERMINAL_ATTEMPT_STATES}
    out = []
    for jid, (task_state, packed, new), old in zip(found, replies[::2], replies[1::2], strict=True):
        state = new or old
        if task_state is None or packed or state is None or state in terminal:
            out.append(jid)
    return out


def forget_orphans(rq: redis.Redis, queue: Queue, *, limit: int = 500) -> list[str]:
    """Remove :func:`orphaned` ids from the queue's registries, and every trace RQ keeps of the
    :func:`settled` ones (their registry entries and their job, as :func:`clear_job` does): ``rq info``
    and rq-dashboard then count no failed or executing job mc_queue contradicts. Returns the ids."""
    ids = orphaned(rq, queue, limit=limit)
    if ids:
        pipe = rq.pipeline(transaction=False)
        for registry in (queue.failed_job_registry, queue.finished_job_registry):
            pipe.zrem(registry.key, *ids)
        pipe.execute()
    done = settled(rq, queue, limit=limit)
    for jid in done:
        clear_job(rq, queue, jid, delete=True)
    return ids + done

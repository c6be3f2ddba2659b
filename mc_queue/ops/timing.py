"""The sweeper's two steps about time that producers set: deadlines, and the aging of priorities.

**Deadlines** (:func:`enforce_deadlines`): a task not started by its ``start_by`` (no claim takes it after
it) or not ended by its ``finish_by`` is canceled through the cancellation protocol, the deadline as its
reason; a task that started in time is checked again at its ``finish_by``. The queues' deadline indexes
are the sweeper's reminders; every decision is taken on the task as it is now.

**Aging** (:func:`age_priorities`): a message waits in its priority's RQ queue at most ``aging_ms`` per
level; past that it moves one level up per ``aging_ms`` since its Attempt was dispatched (Redis's clock),
so a task of the lowest priority reaches the most urgent one after 8 x ``aging_ms`` and then waits its
turn there: no priority starves for ever. A message a worker took meanwhile is not moved. A message waiting
in a fair lane moves to its key's lane a level up (``transport.move_laned``), where it takes its key's turn.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import redis

from ..client import Client
from ..client.base import ENDED_STATES
from ..contracts.errors import McqError, NamespaceLost, TaskNotFound, TransitionRefused
from ..producer.transport import PRIORITIES, attempt_of, move_laned, move_message, rq_queue


def enforce_deadlines(client: Client, *, actor: str, limit: int) -> tuple[list[str], list[str]]:
    """Cancel the tasks that missed a deadline; returns ("<task id> start_by|finish_by" canceled, errors)."""
    now, due = client.schedule.deadlines_due(limit=limit)
    missed_out: list[str] = []
    errors: list[str] = []
    for d in due:
        try:
            missed: str | None = None
            when = 0
            nxt: int | None = None
            if d.state is None or d.state in ENDED_STATES:
                pass
            elif d.start_by is not None and d.start_by <= now and not d.started:
                missed, when = "start_by", d.start_by
            elif d.finish_by is not None and d.finish_by <= now:
                missed, when = "finish_by", d.finish_by
            else:
                nxt = d.finish_by if d.finish_by is not None and d.finish_by > now else None
            if missed:
                iso = datetime.fromtimestamp(when / 1000, tz=UTC).isoformat(timespec="milliseconds")
                verb = "started" if missed == "start_by" else "ended"
                client.operator.cancel_task(d.task_id, f"deadline missed: not {verb} by its {missed} ({iso}, Redis "
                                            "clock)", actor=actor)
                client.redis.hincrby(client.keys.stats, f"deadline_missed|{d.queue}|{missed}", 1)
                missed_out.append(f"{d.task_id} {missed}")
            client.schedule.deadline_checked(d.queue, d.task_id, nxt)
        except (TransitionRefused, TaskNotFound):
            client.schedule.deadline_checked(d.queue, d.task_id, None)  # it ended meanwhile
        except NamespaceLost:
            raise
        except McqError as exc:
            errors.append(f"deadline of {d.task_id}: {exc}")
    return missed_out, errors


def age_priorities(client: Client, rq: redis.Redis, *, aging_ms: int, limit: int) -> list[str]:
    """Move the messages that waited ``aging_ms`` per level up (see the module); returns what moved as
    "<attempt id> p<from>-><to>". The oldest of each list are looked at, ``limit`` at most per list."""
    now = client.backend.redis_time_ms()
    moved: list[str] = []
    prefix = client.keys.prefix
    for queue in client.reads.queues():
        laned = client.fairness.backlog(queue)  # (the priorities with fair lanes queued: one round trip)
        for level in PRIORITIES[1:]:
            q = rq_queue(rq, prefix, queue, level)
            jids = [j.decode() if isinstance(j, bytes) else str(j) for j in rq.lrange(q.key, 0, limit - 1)]
            aids = [(jid, attempt_of(q, jid)) for jid in jids]
            stamps = _dispatched_at(client, [aid for _, aid in aids])
            for (jid, aid), at in zip(aids, stamps, strict=True):
                if aid is None or not at:
                    continue
                target = max(PRIORITIES[0], level - (now - int(at)) // aging_ms)
                if target < level and move_message(rq, q, rq_queue(rq, prefix, queue, target), jid):
                    moved.append(f"{aid} p{level}->p{target}")
            if level in laned:
                moved.extend(_age_lanes(client, rq, queue, level, now=now, aging_ms=aging_ms, limit=limit))
    return moved


def _dispatched_at(client: Client, aids: list[str | None]) -> list[str | None]:
    """When each Attempt was last dispatched (None: never, or no Attempt), in one round trip."""
    if not aids:
        return []
    pipe = client.redis.pipeline(transaction=False)
    for aid in aids:
        tid, _, n = (aid or "-:-/0").rpartition("/")
        pipe.hget((client.keys.task(tid) if aid else client.keys.nowhere()).task, f"{n}.dispatched_at")
    return cast(list[str | None], pipe.execute())


def _age_lanes(client: Client, rq: redis.Redis, queue: str, level: int, *, now: int, aging_ms: int,
               limit: int) -> list[str]:
    """Aging in the fair lanes of one RQ queue: the head of each key's lane moves up while it waited long
    enough (a lane is in dispatch order, so the message behind a young head is young too); ``limit``
    messages at most are looked at."""
    keys = client.keys
    lanes = keys.fair_lanes(queue, level)
    names = cast(list[str], client.redis.zrange(keys.fair_turns(queue, level), 0, limit - 1))
    q = rq_queue(rq, keys.prefix, queue, level)
    moved: list[str] = []
    looked = 0
    while names and looked < limit:
        pipe = client.redis.pipeline(transaction=False)
        for name in names:
            pipe.hget(lanes, f"{name}|h")
        heads = cast(list[str | None], pipe.execute())
        pipe = client.redis.pipeline(transaction=False)
        for name, h in zip(names, heads, strict=True):
            pipe.hget(lanes, f"{name}|{h}")
        jids = cast(list[str | None], pipe.execute())
        aids = [attempt_of(q, jid) if jid else None for jid in jids]
        stamps = _dispatched_at(client, aids)
        looked += len(names)
        again: list[str] = []
        for name, jid, aid, at in zip(names, jids, aids, stamps, strict=True):
            if jid is None or aid is None or not at:
                continue
            target = max(PRIORITIES[0], level - (now - int(at)) // aging_ms)
            if target < level and move_laned(client, rq, queue, level, target, jid):
                moved.append(f"{aid} p{level}->p{target}")
                again.append(name)  # its next message may have waited as long
        names = again
    return moved

"""The dispatch schedule: which Attempts must be handed to the transport, and when. It is the queues'
pending indexes (scored by due time) and each Attempt's ``dispatched_at``: no index entry of its own.
The sweeper walks each index a page a pass (:meth:`Schedule.dispatch_walk`: what was never sent, or
not claimed in time) and, between passes, looks at what just came due (:meth:`Schedule.came_due`: a
scheduled task, a retry after its backoff); each send is recorded (:meth:`Schedule.mark_dispatched`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..contracts.codec import check_int
from ..contracts.errors import Code, raise_for_reply
from ..contracts.keys import check_queue
from .base import Role


@dataclass(frozen=True)
class DeadlineDue:
    """A task whose deadline came (Schedule.deadlines_due): its state (None: gone), whether its first
    Attempt started, and its deadlines (ms, Redis clock)."""

    queue: str
    task_id: str
    state: str | None
    started: bool
    start_by: int | None
    finish_by: int | None


class Schedule(Role):
    """What is due to be sent to the transport (Redis clock), and the record of each send."""

    def dispatch_walk(self, queue: str, *, offset: int = 0, limit: int = 500,
                      recheck_ms: int) -> tuple[list[str], int]:
        """A page of the queue's pending index from rank ``offset``: the Attempts claimable now (Redis
        clock) that were never handed to the transport, or were more than ``recheck_ms`` ago and are
        still unclaimed (their message lost, or waiting behind others: the caller checks). Returns them
        and the offset of the next page: 0 once the walk reached the end of what is due."""
        check_queue(queue)
        check_int(offset, what="offset", low=0, high=10**9)
        check_int(limit, what="limit", low=1, high=10_000)
        check_int(recheck_ms, what="recheck_ms", low=1, high=86_400_000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(self.keys.pending(queue), offset, offset + limit - 1, withscores=True)
        (now_s, now_us), page = pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000
        due = [str(tid) for tid, score in page if score <= now]
        out = [aid for aid, state, at, _, resend in self._pending_attempts(due)
               if state == "pending" and (not at or int(at) + recheck_ms <= now
                                          or (resend and int(at) < int(resend) <= now))]
        more = len(page) == limit and len(due) == limit
        return out, offset + limit if more else 0

    def came_due(self, cursors: Mapping[str, tuple[int, int]], *, limit: int = 500,
                 next_due: dict[str, int] | None = None) -> tuple[list[str], dict[str, tuple[int, int]]]:
        """What came due in each queue since its cursor ``(score, seen)`` (the due time reached and how
        many entries at it were already looked at): the Attempts whose due time was set (a scheduled
        task, a retry after its backoff) that are pending and were never handed to the transport. A
        plain Attempt 1 is sent by its producer at enqueue, so it is left to :meth:`dispatch_walk`.
        Returns them and each queue's next cursor; cost grows with what came due (two round trips,
        three when something did), not with what waits. ``next_due``: filled with each queue's next due time
        (ms, Redis clock) among the entries read, when one was not due yet (when to look next), and 'now'."""
        check_int(limit, what="limit", low=1, high=10_000)
        queues = sorted(cursors)
        for queue in queues:
            check_queue(queue)
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        for queue in queues:
            score, seen = cursors[queue]
            pipe.zrangebyscore(self.keys.pending(queue), score, "+inf", start=seen, num=limit, withscores=True)
        (now_s, now_us), *pages = pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000
        nxt: dict[str, tuple[int, int]] = {}
        due: list[str] = []
        nexts = next_due
        if nexts is not None:
            nexts.clear()
            nexts["now"] = now
        for queue, page in zip(queues, pages, strict=True):
            score, seen = cursors[queue]
            last = score
            ahead = False  # an entry not due yet was reached: everything due up to now was seen
            for tid, s in page:
                if s > now:
                    ahead = True
                    if nexts is not None and s != float("inf"):
                        nexts[queue] = int(s)
                    break
                due.append(str(tid))
                last = int(s)
            # The next look starts at a score, not after a count of entries: a claim removes its entry from
            # the index meanwhile, and a count would then skip one never seen (a task sent up to a pass
            # late). Entries at that score are read again; the dispatched ones are left out below. Only a
            # full page all at one score (more than ``limit`` due in one millisecond) goes on by count.
            if ahead or len(page) < limit:  # seen up to now: go on from now
                nxt[queue] = (now, 0)
            else:
                nxt[queue] = (last, 0) if last != score else (score, seen + len(page))
        out = [aid for aid, state, at, own_due, _ in self._pending_attempts(due)
               if state == "pending" and not at and (own_due or not aid.endswith("/1"))]
        return out, nxt

    def _pending_attempts(self, task_ids: Sequence[str]) -> list[tuple[str, str, str, str, str]]:
        """Each task's latest Attempt: (attempt id, state, dispatched_at, its own stored due_at, resend_at), in
        two round trips (none when there is nothing to read); a task that is gone or unreadable is left out."""
        keys = [(tid, tk) for tid in task_ids if (tk := self._task_keys_or_none(tid)) is not None]
        if not keys:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for _, tk in keys:
            pipe.hget(tk.task, "attempts")
        numbers = [str(n or "") for n in pipe.execute()]
        for (_, tk), n in zip(keys, numbers, strict=True):
            for k in (tk.task, tk.attempts_v1):  # (an Attempt written before 2026-12 is in the task's :a)
                pipe.hmget(k, [f"{n}.state", f"{n}.dispatched_at", f"{n}.due_at", f"{n}.resend_at"])
        fields = pipe.execute()
        out = []
        for i, ((tid, _), n) in enumerate(zip(keys, numbers, strict=True)):
            (state, at, due, resend), (old_state, old_at, old_due, old_resend) = fields[2 * i], fields[2 * i + 1]
            if n:
                out.append((f"{tid}/{n}", state or old_state or "", at or old_at or "", due or old_due or "",
                            resend or old_resend or ""))
        return out

    def deadlines_due(self, *, limit: int = 500) -> tuple[int, list[DeadlineDue]]:
        """Redis's time now, and the tasks whose next deadline (start_by, then finish_by) has come, in every
        queue's deadline index, with what the sweeper needs to judge each: the task's state, whether its
        first Attempt ever started, and both deadlines. A task that is gone has ``state`` None."""
        check_int(limit, what="limit", low=1, high=10_000)
        queues = sorted(str(x) for x in cast(set[str], self.redis.smembers(self.keys.queues)))
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        for queue in queues:
            pipe.zrangebyscore(self.keys.deadlines(queue), "-inf", "+inf", start=0, num=limit, withscores=True)
        (now_s, now_us), *pages = pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000
        due = [(queue, str(tid)) for queue, page in zip(queues, pages, strict=True) for tid, score in page
               if score <= now]
        for _, tid in due:
            tk = self._task_keys_or_none(tid)
            pipe.hmget(tk.task if tk else self.keys.nowhere().task, ["state", "1.started_at", "start_by", "finish_by"])
        rows = pipe.execute() if due else []
        out = [DeadlineDue(queue, tid, state, bool(started), int(sb) if sb else None, int(fb) if fb else None)
               for (queue, tid), (state, started, sb, fb) in zip(due, rows, strict=True)]
        return now, out

    def deadline_checked(self, queue: str, task_id: str, next_ms: int | None) -> None:
        """The sweeper judged a task's deadline: check it again at ``next_ms`` (its finish_by), or never
        (None: it ended, or it was canceled for it). One command: the index is the sweeper's reminder,
        every decision is taken again on the task itself."""
        key = self.keys.deadlines(check_queue(queue))
        if next_ms is None:
            self.redis.zrem(key, task_id)
        else:
            self.redis.zadd(key, {task_id: next_ms}, xx=True)

    def mark_dispatched(self, member: str, *, recheck_ms: int) -> bool:
        """The Attempt was handed to the transport; look again after ``recheck_ms`` if unclaimed."""
        return self._mark(member, recheck_ms, "")

    def _mark(self, member: str, recheck_ms: int | str, resend_ms: int | str) -> bool:
        """mark_dispatched.lua: a dispatch (``recheck_ms``) or a resend (``resend_ms``), the other ''."""
        _, _, tk = self._attempt(member)

        def call(epoch: str) -> list[Any]:
            return self._run("mark_dispatched", {**self._ns_keys(), "outbox": self.keys.outbox, "task": tk.task,
                                                 "attempts": tk.attempts_v1},
                             {"member": member, "recheck_ms": recheck_ms, "actor": self.actor, "epoch": epoch,
                              "resend_ms": resend_ms})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="mark_dispatched", attempt_id=member)
        return bool(reply[0] == Code.OK)

    def resend_soon(self, member: str, *, in_ms: int) -> bool:
        """A worker refused the Attempt's message for a reason of its own (a failing health probe): send it
        again ``in_ms`` from now (Redis clock) rather than a whole recheck after its dispatch. Not a dispatch;
        a dispatch after it makes it moot. False, nothing written: no longer pending."""
        check_int(in_ms, what="in_ms", low=1, high=86_400_000)
        return self._mark(member, "", in_ms)

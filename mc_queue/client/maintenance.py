"""The sweeper's calls: what is due in the time indexes, expiring leases, the dispatch walk and its
marks, packing finished histories, retiring ended tasks, and the trims that keep Redis bounded."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..contracts.codec import check_int, check_text
from ..contracts.errors import Code, InvalidArgument, McqError, NamespaceLost, raise_for_reply
from ..contracts.history import whole_history
from ..contracts.keys import TaskKeys, check_queue
from ..contracts.models import ExpiredLease, attempt_fields, split_attempts
from ..contracts.packing import pack
from .base import INDEXES, Role, printable, raised

log = logging.getLogger("mc_queue.client")

PACK_MAX_BYTES = 4_194_304  # a larger packed document is not swapped in (common.lua PACK_MAX_BYTES)
PACK_AFTER_MS = 60_000  # a finished task's history is packed this long after it finished (resends land first)


@dataclass
class ExpireReport:
    """What one expire pass did: leases expired, index entries dropped (orphans), errors per entry, and
    how many entries left the lease index (``removed``: a pass that removes none made no progress)."""

    expired: list[ExpiredLease] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    removed: int = 0

    def merge(self, other: ExpireReport) -> None:
        self.expired += other.expired
        self.dropped += other.dropped
        self.errors += other.errors
        self.removed += other.removed



class Maintenance(Role):
    """Bookkeeping that re-derives from Redis's own state: safe to repeat, safe to run twice."""

    def due_dispatches(self, *, limit: int = 500) -> list[str]:
        """Attempt ids in the outbox of versions before 2026-12 whose (re)dispatch time has come (Redis
        clock): it drains (mark_dispatched drops each entry), and :meth:`dispatch_walk` does its job now."""
        return self._due("outbox", limit)

    def due_cancels(self, *, limit: int = 500) -> list[str]:
        """Running Attempts whose executor did not acknowledge a cancel in time."""
        return self._due("cancels", limit)

    def due_leases(self, *, limit: int = 500) -> list[str]:
        """Lease index entries whose expiry has come (Redis clock)."""
        return self._due("leases", limit)

    def _due(self, index: str, limit: int) -> list[str]:
        reply = self._run("due", {"index": getattr(self.keys, index)},
                          {"limit": check_int(limit, what="limit", low=1, high=10_000)})
        raise_for_reply(reply, script="due")
        return [str(m) for m in reply[1:]]

    def expire_leases(self, *, limit: int = 500, actor: str | None = None,
                      max_batches: int = 1000) -> list[ExpiredLease]:
        """Every lease past its expiry (Redis clock) -> Attempt suspect, fence bumped. Bounded batches;
        entries whose task is gone, or that cannot be read, are dropped and logged on the way."""
        return self.expire_due(limit=limit, actor=actor, max_batches=max_batches).expired

    def expire_due(self, *, limit: int = 500, actor: str | None = None, max_batches: int = 1000) -> ExpireReport:
        """expire_leases with the whole report: what expired, what was dropped, what failed."""
        total = ExpireReport()
        for _ in range(max_batches):
            members = self.due_leases(limit=limit)
            if not members:
                break
            report = self.expire(members, actor=actor or self.actor, force=False, reason="lease expired")
            total.merge(report)
            if len(members) < limit or report.removed == 0:
                break
        return total

    def expire(self, members: list[str], *, actor: str, force: bool, reason: str,
               recovering_epoch: str | None = None, index: str = "leases", holder: str = "") -> ExpireReport:
        """expire.lua for each member of the lease (or cancel) index (one pipeline). ``holder``: only a lease
        that worker holds is expired or voided. One bad entry never
        stops the others: an unreadable member is dropped (index_drop), an error is reported in ``errors``."""
        check_text(reason, what="reason", max_bytes=2000)
        check_text(holder, what="holder", max_bytes=200)
        epoch = recovering_epoch or self._epoch()
        report = ExpireReport()
        calls: list[tuple[dict[str, str], dict[str, Any]]] = []
        readable: list[str] = []
        for member in members:
            try:
                _, _, tk = self._attempt(member)
            except InvalidArgument as exc:
                try:
                    report.removed += self.drop_index_entry(index, member, reason=str(exc), actor=actor,
                                                            recovering_epoch=recovering_epoch)
                except McqError as err:
                    report.errors.append((member, str(err)))
                continue
            readable.append(member)
            calls.append(({"meta": self.keys.meta, "epochs": self.keys.epochs, "nslog": self.keys.nslog,
                           "leases": self.keys.leases, "stats": self.keys.stats, "suspect": self.keys.suspect,
                           "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events,
                           "cancels": self.keys.cancels, "fence": tk.fence, "lease": tk.lease, **self._slot_keys()},
                          {"member": member, "actor": actor, "force": force, "reason": reason, "epoch": epoch,
                           "holder": holder}))
        if not calls:
            return report
        replies = self.runner.run_many("expire", calls)
        stale = [i for i, r in enumerate(replies) if isinstance(r, list) and r and r[0] == Code.E_EPOCH]
        if stale and recovering_epoch is None:  # a recovery ran elsewhere: reload the epoch once and resend
            self.ns.forget()
            epoch = self._epoch()
            again = self.runner.run_many("expire", [(calls[i][0], {**calls[i][1], "epoch": epoch}) for i in stale])
            for i, reply in zip(stale, again, strict=True):
                replies[i] = reply
        for member, reply in zip(readable, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise McqError(f"expire of {member} failed: {reply}", attempt_id=member, script="expire")
                raise_for_reply(reply, script="expire", attempt_id=member)
            except McqError as exc:
                if isinstance(exc, NamespaceLost):
                    raise
                report.errors.append((member, str(exc)))
                continue
            if reply[0] == Code.OK:
                report.expired.append(ExpiredLease(member, old_fence=int(reply[2]), new_fence=int(reply[1])))
                report.removed += 1
            elif "dropped" in str(reply[1]):
                report.dropped.append(member)
                report.removed += 1
        return report

    def drop_index_entry(self, index: str, member: str, *, reason: str, actor: str | None = None,
                         recovering_epoch: str | None = None) -> int:
        """Remove an index entry that names no task or the wrong state (logged as orphan_index_entry).
        Returns 1 when it was dropped, 0 when it was not there. Raises TransitionRefused when the entry is right."""
        if index not in INDEXES:
            raise InvalidArgument(f"index must be one of {INDEXES}")
        try:
            tk = self._attempt(member)[2]
        except InvalidArgument:
            tk = self.keys.nowhere()

        def call(epoch: str) -> list[Any]:
            return self._run("index_drop", {**self._ns_keys(), "index": getattr(self.keys, index), "task": tk.task,
                                            "attempts": tk.attempts_v1},
                             {"kind": index, "member": member.encode("utf-8", "surrogateescape"),
                              "actor": actor or self.actor, "reason": printable(reason, 2000), "epoch": epoch})

        # Recovery presents the epoch it recovers to; anyone else presents the one it knows, reloaded
        # once after a recovery elsewhere (as every other call does).
        reply = call(recovering_epoch) if recovering_epoch else self._with_epoch(call)
        raise_for_reply(reply, script="index_drop", attempt_id=member)
        return 1 if reply[0] == Code.OK else 0

    def pack_due(self, *, limit: int = 200, min_age_ms: int = PACK_AFTER_MS) -> int:
        """Pack the history of up to ``limit`` tasks that finished at least ``min_age_ms`` ago (Redis's
        clock) into one compressed document each (``lua/pack.lua``). Returns how many were packed.

        First the tasks to try again (one that changed between its read and its pack; and what a version
        before 2026-12 listed in its topack index), then each queue's done index, walked in order of
        finishing from where the last walk ended (the sweeper hash's ``pack|<queue>``: the score reached
        and how many entries with that score were walked), at most ten pages of ``limit`` a call."""
        check_int(limit, what="limit", low=1, high=10_000)
        cutoff = self.backend.redis_time_ms() - check_int(min_age_ms, what="min_age_ms", high=365 * 86_400_000)
        ids = [str(m) for m in self.redis.zrangebyscore(self.keys.topack, "-inf", cutoff, start=0, num=limit)]
        packed = self.pack_tasks(ids) if ids else 0
        for queue in sorted(cast(set[str], self.redis.smembers(self.keys.queues))):
            pages = 0
            while packed < limit and pages < 10:
                pages += 1
                got, more = self._pack_page(queue, cutoff, limit)
                packed += got
                if not more:
                    break
        return packed

    def _pack_page(self, queue: str, cutoff: int, limit: int) -> tuple[int, bool]:
        """Pack the next page of the queue's done index walk; returns how many were packed and whether
        the walk may go on (the page was full)."""
        where = f"pack|{queue}"
        at = str(self.redis.hget(self.keys.sweeper, where) or "-inf 0").split(" ")
        score, skip = (at[0], int(at[1])) if len(at) == 2 and at[1].isdecimal() else ("-inf", 0)
        page = cast(list[tuple[str, float]], self.redis.zrangebyscore(
            self.keys.done(queue), score, cutoff, start=skip, num=limit, withscores=True))
        if not page:
            return 0, False
        pipe = self.redis.pipeline(transaction=False)
        keys = [(str(tid), tk) for tid, _ in page if (tk := self._task_keys_or_none(str(tid))) is not None]
        for _, tk in keys:
            pipe.hget(tk.task, "packed")
        todo = [tid for (tid, _), done in zip(keys, pipe.execute() if keys else [], strict=True) if not done]
        packed = self.pack_tasks(todo) if todo else 0
        last = page[-1][1]
        same = sum(1 for _, s in page if s == last)
        reached = f"{int(last)} {skip + same if str(int(last)) == score else same}"
        self.redis.hset(self.keys.sweeper, where, reached)
        return packed, len(page) == limit

    def pack_tasks(self, ids: Sequence[str]) -> int:
        """Pack these finished tasks' histories now (each only if it is finished and unchanged since read).
        Returns how many were packed; the others are left as they are."""
        read = self.redis.pipeline(transaction=False)
        keys: list[TaskKeys] = []
        named: list[str] = []
        for tid in ids:
            tk = self._task_keys_or_none(tid)
            if tk is None:
                self.redis.zrem(self.keys.topack, tid)
                continue
            keys.append(tk)
            named.append(tid)
            read.hgetall(tk.task)
            read.hgetall(tk.attempts_v1)
            read.lrange(tk.events, 0, -1)
            read.hgetall(tk.effects)
        raw = read.execute(raise_on_error=False)
        calls = []
        called: list[str] = []  # the task id of each call
        for i, tk in enumerate(keys):
            fields, att, history, fx = raised(raw[4 * i: 4 * i + 4], but=2)
            stored = self._history(history, tk.events)
            held = attempt_fields(fields or {}, att)  # as pack.lua counts them
            try:
                fields, att = split_attempts(fields or {}, att)
            except ValueError as exc:  # a long value missing a chunk: left unpacked, every read names it
                log.warning("task %s: left unpacked: %s", tk.task, exc)
                self.redis.zrem(self.keys.topack, str((fields or {}).get("id")))
                continue
            # A task gone or already packed gets a placeholder document: the script answers NOOP before reading it.
            blob = pack(fields, att, whole_history(fields, stored, att), fx) if fields and not fields.get("packed") \
                else b"mcz1-placeholder"
            if len(blob) > PACK_MAX_BYTES:
                log.warning("task %s: its packed history would be %d bytes (above %d): left unpacked",
                            fields.get("id"), len(blob), PACK_MAX_BYTES)
                self.redis.zrem(self.keys.topack, str(fields.get("id")))
                continue
            calls.append(({**self._ns_keys(), "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events,
                           "effects": tk.effects, "fence": tk.fence, "topack": self.keys.topack},
                          {"blob": blob, "updated_at": int(fields.get("updated_at") or 0) if fields else 0,
                           "last_event": stored[-1][0] if stored else "0-0", "fields": held, "effects": len(fx),
                           "epoch": self.ns.epoch or "", "actor": self.actor}))
            called.append(named[i])
        packed = 0
        for tid, reply in zip(called, self.runner.run_many("pack", calls), strict=True):
            if isinstance(reply, Exception):
                raise reply
            if reply[0] == Code.OK:
                packed += 1
            elif reply[0] == "E_CHANGED":  # written to since it was read: tried again at the next pass
                self.redis.zadd(self.keys.topack, {tid: 0})
            elif reply[0] != "NOOP":
                raise_for_reply(reply, script="pack")
        return packed

    def ended_tasks(self, queue: str, kind: str, *, before_ms: int | None = None, keep_newest: int | None = None,
                    limit: int = 500) -> list[tuple[str, int]]:
        """(task id, ended at ms) of a queue's ended tasks, oldest first, from its done index (``kind``
        'done': succeeded, canceled) or held index ('held': failed, blocked, quarantined): those that
        ended before ``before_ms`` (Redis's clock, ms since the epoch), and those beyond the newest
        ``keep_newest``; at most ``limit``. Cost bounded by the limit (no scan)."""
        self._queue_name(queue)
        if kind not in ("done", "held"):
            raise InvalidArgument(f"kind must be 'done' or 'held', got {kind!r}")
        key = self.keys.done(queue) if kind == "done" else self.keys.held(queue)
        check_int(limit, what="limit", low=1, high=100_000)
        found: dict[str, float] = {}
        if before_ms is not None:
            found.update(cast(list[tuple[str, float]],
                              self.redis.zrangebyscore(key, "-inf", f"({before_ms}", start=0, num=limit,
                                                       withscores=True)))
        if keep_newest is not None:
            excess = int(self.redis.zcard(key)) - check_int(keep_newest, what="keep_newest", high=10**9)
            if excess > 0:
                found.update(cast(list[tuple[str, float]],
                                  self.redis.zrange(key, 0, min(excess, limit) - 1, withscores=True)))
        rows = sorted(((str(m), int(sc)) for m, sc in found.items()), key=lambda r: (r[1], r[0]))
        return rows[:limit]

    def retire_batch(self, rows: Sequence[tuple[str, int]], *, states: Sequence[str], reason: str,
                     tombstone_s: float, actor: str | None = None, log_each: bool = False,
                     seen: Mapping[str, str] | None = None) -> dict[str, int]:
        """Retire many tasks read from an index, each only if its entry still has the score read, in one
        pipeline. ``seen``: task id -> its version as archived (:meth:`task_snapshot`); such a task is
        deleted only if it is still that version. Returns counts: retired, skipped (changed or gone
        since read), refused."""
        calls = []
        for tid, score in rows:
            tk = self._task_keys_or_none(tid)
            if tk is None:
                continue
            calls.append((self._retire_keys(tk), self._retire_argv(states, reason, actor, tombstone_s, score,
                                                                   log_each, (seen or {}).get(tid, ""))))
        out = {"retired": 0, "skipped": 0, "refused": 0}
        for reply in self.runner.run_many("retire", calls) if calls else []:
            if isinstance(reply, Exception):
                raise reply
            if reply[0] == Code.OK:
                out["retired"] += 1
            elif reply[0] == "NOOP":
                out["skipped"] += 1
            elif reply[0] == "E_STATE":
                out["refused"] += 1
            else:
                raise_for_reply(reply, script="retire")
        return out

    def forget_empty_queues(self, *, limit: int = 100, actor: str | None = None) -> list[str]:
        """Forget up to ``limit`` queues that hold no task, have no retention policy and are not paused
        (``lua/queue_forget.lua`` re-checks each): they leave the queue set with their zero counters and
        the console's samples. The next enqueue on one brings it back. Returns the queues forgotten."""
        check_int(limit, what="limit", low=1, high=10_000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.smembers(self.keys.queues)
        pipe.hgetall(self.keys.counts)
        pipe.hkeys(self.keys.retention)
        pipe.hkeys(self.keys.paused)
        queues, counts, policies, paused = pipe.execute()
        busy = {f.rpartition("|")[0] for f, v in counts.items() if v not in ("0", 0)}
        kept = set(paused) | {p.removeprefix("app:") for p in policies}
        calls = []
        for queue in sorted(set(queues) - busy - kept)[:limit]:
            try:
                check_queue(queue)
            except ValueError:
                continue
            calls.append(({**self._ns_keys(), "queues": self.keys.queues, "counts": self.keys.counts,
                           "retention": self.keys.retention, "paused": self.keys.paused,
                           "pending": self.keys.pending(queue), "done": self.keys.done(queue),
                           "held": self.keys.held(queue), "samples": self.keys.queue_samples(queue)},
                          {"queue": queue, "actor": actor or self.actor, "epoch": self.ns.epoch or ""}))
        forgotten = []
        for (_, argv), reply in zip(calls, self.runner.run_many("queue_forget", calls) if calls else [], strict=True):
            if isinstance(reply, Exception):
                raise reply
            if reply[0] == Code.OK:
                forgotten.append(str(argv["queue"]))
            elif reply[0] != "NOOP":
                raise_for_reply(reply, script="queue_forget")
        return forgotten

    def trim(self, *, limit: int = 1000) -> int:
        """The sweeper's trims of bookkeeping nothing reads any more: :meth:`trim_idempotency` and
        :meth:`trim_spend`. Returns how many entries went."""
        return self.trim_idempotency(limit=limit) + self.trim_spend(limit=limit)

    def trim_spend(self, *, limit: int = 1000) -> int:
        """Drop the spend ceilings' buckets no window can count any more (``lua/spend_trim.lua``, ``limit``
        keys a call, every key). Returns how many went."""
        check_int(limit, what="limit", low=1, high=1000)
        dropped, after = 0, ""
        while True:
            reply = self.runner.run("spend_trim", {"spent": self.keys.spent}, {"limit": limit, "after": after})
            raise_for_reply(reply, script="spend_trim")
            dropped += int(reply[1])
            after = str(reply[2])
            if not after:
                return dropped

    def trim_idempotency(self, *, limit: int = 1000) -> int:
        """Forget producer keys whose retired task's tombstone window has passed. Returns how many."""
        reply = self.runner.run("idem_trim", {**self._ns_keys(), "idem": self.keys.idem,
                                              "idem_until": self.keys.idem_until},
                                {"limit": check_int(limit, what="limit", low=1, high=10_000),
                                 "epoch": self.ns.epoch or "", "actor": self.actor})
        if reply[0] == Code.E_NONS:
            return 0  # no namespace yet: nothing to forget
        raise_for_reply(reply, script="idem_trim")
        return int(reply[1])

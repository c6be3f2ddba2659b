"""The reads: a task with its Attempts, events and effects, lists through the indexes, queue
status, the namespace overview, the logs. They never create anything."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis

from ..contracts.codec import check_int
from ..contracts.config import Retention
from ..contracts.errors import InvalidArgument, McqError, TaskNotFound
from ..contracts.history import whole_history
from ..contracts.keys import TOMB_FULL, check_queue, parse_attempt_id, parse_task_id
from ..contracts.models import EffectRecord, NamespaceInfo, Task, attempt_fields, split_attempts
from ..contracts.packing import LONG_MARK, Packed, join_chunks, join_parts, tombstone_record, unpack
from ..store.backend import DEFAULT_MAX_LEASE_MS
from .base import ENDED_STATES, INDEXES, Role, raised

log = logging.getLogger("mc_queue.client")

LISTABLE_STATES = ("scheduled", "waiting", "pending", "backoff", "running", *ENDED_STATES)  # states an index finds
LIST_SCAN_FACTOR = 10  # list_tasks looks at no more than this many index entries per row asked for
ENQUEUE_MEMORY_SHARE = 0.9  # lua/includes/common.lua's ENQUEUE_MEMORY_SHARE: enqueue refuses above it


class Reads(Role):
    """Everything that explains what happened, read only."""

    def namespace(self) -> NamespaceInfo:
        """The namespace's state, read only: ok | lost | recovering, or missing when Redis has none
        (reported as lost when it left traces or the embedded witness remembers it)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.meta)
        pipe.exists(self.keys.queues, self.keys.leases)
        meta, traces = pipe.execute()
        if meta:
            return NamespaceInfo(self.keys.prefix, meta.get("state") or "lost", meta.get("epoch", ""),
                                 int(meta.get("seq") or 0), int(meta.get("floor") or 0),
                                 meta.get("lost_reason", ""), int(meta.get("max_lease_ms") or DEFAULT_MAX_LEASE_MS))
        witness = self.ns.read_witness()
        if witness or traces:
            why = f"the witness remembers epoch {witness}" if witness else "the namespace still holds tasks"
            return NamespaceInfo(self.keys.prefix, "lost", witness or "", 0, 0,
                                 f"namespace meta is missing but {why}: Redis lost state")
        return NamespaceInfo(self.keys.prefix, "missing", "", 0, 0, "no such namespace yet")

    def get_task(self, task_id: str) -> Task:
        """The task with every Attempt and its whole event history (one round trip)."""
        rec, fence, pttl = self._read_task(task_id)
        if rec is None:
            raise TaskNotFound(f"no task {task_id} in namespace {self.keys.prefix!r}", task_id=task_id)
        return Task.from_redis(rec.fields, rec.attempts, rec.events, fence=fence, lease_pttl_ms=pttl)

    def task_record(self, task_id: str) -> Packed | None:
        """Everything Redis holds of a task as stored (hash fields, Attempt fields, events, effects), read
        from its live keys or its packed document; None when there is no such task. What the archive keeps."""
        return self._read_task(task_id)[0]

    def task_snapshot(self, task_id: str) -> tuple[Packed | None, str]:
        """The task as stored (:meth:`task_record`) and its version as ``retire.lua``'s ``seen`` compares it:
        ``'<updated_at> <last event id> <Attempt fields> <effects>'`` of its live keys ('0-0 0 0' when packed:
        a packed task has no live event stream, Attempts or effects)."""
        rec, _, _, version = self._read_task_versioned(task_id)
        return rec, version

    def _read_task(self, task_id: str) -> tuple[Packed | None, str | None, int]:
        """One round trip: the task as stored (live or packed), its fence and its lease's PTTL."""
        rec, fence, pttl, _ = self._read_task_versioned(task_id)
        return rec, fence, pttl

    def _read_task_versioned(self, task_id: str) -> tuple[Packed | None, str | None, int, str]:
        tk = self._task_keys(task_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(tk.task)
        pipe.hgetall(tk.attempts_v1)
        pipe.lrange(tk.events, 0, -1)
        pipe.hgetall(tk.effects)
        pipe.get(tk.fence)  # (a task written before its fence counter moved into its hash)
        pipe.pttl(tk.lease)
        fields, att, history, fx, fence, pttl = raised(pipe.execute(raise_on_error=False), but=2)
        stored = self._history(history, tk.events)
        if not fields:
            return None, None, int(pttl), ""
        # As retire.lua counts them: the fields of the hash that holds the Attempts (attempts_of).
        last = stored[-1][0] if stored else "0-0"
        version = f"{fields.get('updated_at') or 0} {last} {attempt_fields(fields, att)} {len(fx)}"
        try:
            fields, att = split_attempts(fields, att)
        except ValueError as exc:
            raise McqError(f"task {task_id}: {exc}") from None
        events = whole_history(fields, stored, att)
        fence = fields.get("fence") or fence  # the counter lives in the task hash (lua/includes/common.lua)
        if fields.get("packed"):
            return self._unpacked(task_id, fields), fence, int(pttl), version
        return (Packed(fields=fields, attempts=att, events=events, effects=fx),
                fence, int(pttl), version)

    @staticmethod
    def _unpacked(task_id: str, fields: Mapping[str, str]) -> Packed:
        """The document of a packed task hash (fields z0, z1, ...; pack.lua), its state the hash's."""
        try:
            return unpack(join_chunks(fields), fields)
        except ValueError as exc:
            raise McqError(f"task {task_id}: its packed history does not read ({exc})") from None

    def is_packed(self, task_id: str) -> bool:
        """Whether the task's history has been packed (a finished task, read back from one document)."""
        return bool(self.redis.hexists(self._task_keys(task_id).task, "packed"))

    def effects(self, task_id: str) -> dict[str, EffectRecord]:
        """Every side effect of the task: key -> intent / receipt record."""
        tk = self._task_keys(task_id)
        raw = cast(dict[str, str], self.redis.hgetall(tk.effects))
        if not raw and self.is_packed(task_id):
            raw = self._unpacked(task_id, cast(dict[str, str], self.redis.hgetall(tk.task))).effects
        return {k: EffectRecord.from_json(v) for k, v in sorted(raw.items())}

    def tombstone(self, task_id: str) -> dict[str, Any] | None:
        """A purged task's tombstone (who purged it, why, until when its id and key are refused), or None."""
        tk = self._task_keys(task_id)
        rest = task_id[-19:]
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(tk.tomb)  # (one written before tombstones moved into buckets)
        pipe.time()
        for b in tk.tombs:
            pipe.hmget(b, [rest, f"{rest}.k", f"{rest}.q"])
            pipe.hlen(b)
        old, (now_s, now_us), *walk = pipe.execute()
        if old:
            return cast(dict[str, Any], json.loads(cast(str, old)))
        for i, b in enumerate(tk.tombs):  # the path tomb_level walks
            (entry, idem_key, request_id), size = walk[2 * i], walk[2 * i + 1]
            if entry:
                ref = f"r:{entry.rsplit(' ', 1)[-1]}"
                record = self._whole(b, ref, cast("str | None", self.redis.hget(b, ref))) or "{}"
                return tombstone_record(task_id, entry, record,
                                        self._whole(b, f"{rest}.k", idem_key), self._whole(b, f"{rest}.q", request_id),
                                        int(now_s) * 1000 + int(now_us) // 1000)
            if int(size) < TOMB_FULL:
                break
        return None

    def _whole(self, key: str, name: str, value: str | None) -> str | None:
        """A value written by the scripts' put, its chunks joined when it was long."""
        if not value or value[:1] != LONG_MARK:
            return value
        parts = cast(list[str], self.redis.hmget(key, [f"{name}#{i}" for i in range(int(value[1:]))]))
        return join_parts(p for p in parts if p)

    def task_states(self, task_ids: Sequence[str]) -> dict[str, str | None]:
        """Each task's state now (None: no such task), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hget(self._task_keys(tid).task, "state")
        return dict(zip(task_ids, cast(list[str | None], pipe.execute()), strict=True))

    def list_tasks(self, *, queue: str | None = None, states: Sequence[str] | None = None,
                   handler: str | None = None, created_before_ms: int | None = None,
                   created_after_ms: int | None = None, limit: int = 50, priority: int | None = None,
                   schedule: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """Tasks found through the indexes (never a scan of the keyspace), oldest index entry first:
        scheduled, pending and backoff (the queues' pending indexes, by due time), running (lease and suspect indexes),
        succeeded and canceled (the queues' done indexes, newest first), failed, blocked and
        quarantined (the queues' held indexes). At most ``LIST_SCAN_FACTOR * limit`` index
        entries are looked at; the second value says whether that bound was reached (more may match).
        ``priority``: only tasks of that priority (5: those without one); ``schedule``: only tasks a periodic
        schedule of that name made (its ticks and its triggers)."""
        wanted = set(states or LISTABLE_STATES)
        unknown = wanted - set(LISTABLE_STATES)
        if unknown:
            raise InvalidArgument(f"state(s) {sorted(unknown)} are in no index; listable: {', '.join(LISTABLE_STATES)}")
        if queue is not None:
            try:
                check_queue(queue)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
        check_int(limit, what="limit", low=1, high=10_000)
        cap = LIST_SCAN_FACTOR * limit
        candidates: list[str] = []
        truncated = False

        def take(members: list[Any], strip_attempt: bool) -> None:
            nonlocal truncated
            for m in members:
                tid = str(m).rpartition("/")[0] if strip_attempt else str(m)
                if len(candidates) >= cap:
                    truncated = True
                    return
                if tid and tid not in seen:
                    seen.add(tid)
                    candidates.append(tid)

        seen: set[str] = set()
        qs = [queue] if queue else self.queues()
        reads = self.redis.pipeline(transaction=False)  # every index read in one round trip, in this order
        groups: list[tuple[int, bool]] = []  # (replies, strip the attempt number)
        if wanted & {"scheduled", "pending", "backoff"}:
            for q in qs:
                reads.zrange(self.keys.pending(q), 0, cap)
            groups.append((len(qs), False))
        if "waiting" in wanted:  # (scored +inf in the pending index until released)
            for q in qs:
                reads.zrangebyscore(self.keys.pending(q), "+inf", "+inf", start=0, num=cap + 1)
            groups.append((len(qs), False))
        if "running" in wanted:
            reads.zrange(self.keys.leases, 0, cap)
            reads.zrange(self.keys.suspect, 0, cap)
            groups.append((2, True))
        if wanted & {"failed", "blocked", "quarantined"}:
            for q in qs:
                reads.zrange(self.keys.held(q), 0, cap)
            groups.append((len(qs), False))
        if wanted & {"succeeded", "canceled"}:
            for q in qs:
                reads.zrevrange(self.keys.done(q), 0, cap)
            groups.append((len(qs), False))
        replies = iter(reads.execute())
        for n, strip in groups:
            for _ in range(n):
                take(cast(list[Any], next(replies)), strip)
        pipe = self.redis.pipeline(transaction=False)
        keep: list[str] = []
        for tid in candidates:
            try:
                if queue is not None and parse_task_id(tid) != queue:
                    continue
                pipe.hmget(self.keys.task(tid).task, "state", "queue", "handler", "created_at", "updated_at",
                           "attempts", "priority", "idem_key")
                keep.append(tid)
            except ValueError:
                continue  # an unreadable index member: the sweeper drops those
        rows: list[dict[str, Any]] = []
        for tid, (state, q, h, created, updated, n, prio, key) in zip(keep, pipe.execute(), strict=True):
            if state is None or state not in wanted or (handler is not None and h != handler):
                continue
            if priority is not None and int(prio or 5) != priority:
                continue
            if schedule is not None and not (key or "").startswith(f"periodic:{schedule}:"):
                continue
            created_ms = int(created or 0)
            if created_before_ms is not None and created_ms > created_before_ms:
                continue
            if created_after_ms is not None and created_ms < created_after_ms:
                continue
            rows.append({"task_id": tid, "queue": q, "handler": h, "state": state, "created_at_ms": created_ms,
                         "updated_at_ms": int(updated or created or 0), "attempts": int(n or 0),
                         "priority": int(prio or 5)})
            if len(rows) >= limit:
                break
        return rows, truncated

    def leases_held_by(self, worker: str, *, limit: int = 10_000) -> list[str]:
        """Attempt ids whose lease ``worker`` holds, from the lease index (oldest first, at most ``limit``
        entries looked at; one round trip for the index, one for the holders)."""
        members = [str(m) for m in self.redis.zrange(self.keys.leases, 0, check_int(limit, what="limit", low=1,
                                                                                    high=1_000_000) - 1)]
        pipe = self.redis.pipeline(transaction=False)
        kept = []
        for member in members:
            try:
                tid, n = parse_attempt_id(member)
            except ValueError:
                continue  # an unreadable index member: the sweeper drops those
            tk = self.keys.task(tid)
            pipe.hget(tk.attempts, f"{n}.worker")
            pipe.hget(tk.attempts_v1, f"{n}.worker")  # (a task written before 2026-12)
            kept.append(member)
        got = pipe.execute()
        return [m for m, new, old in zip(kept, got[::2], got[1::2], strict=True) if (new or old) == worker]

    def task_ids_of(self, index: str, *, limit: int = 1000) -> list[str]:
        """Members of one of the namespace's time indexes (leases, suspect, outbox, cancels), oldest first."""
        if index not in INDEXES:
            raise InvalidArgument(f"index must be one of {INDEXES}")
        return [str(m) for m in self.redis.zrange(getattr(self.keys, index), 0, limit - 1)]

    def queues(self) -> list[str]:
        """The namespace's queue names (every queue a task was ever enqueued on)."""
        return sorted(cast(set[str], self.redis.smembers(self.keys.queues)))

    def status(self) -> dict[str, dict[str, Any]]:
        """Per queue: task counts by state, and the queue age (oldest claimable pending Attempt)."""
        counts = cast(dict[str, str], self.redis.hgetall(self.keys.counts))
        out: dict[str, dict[str, Any]] = {q: {"counts": {}, "queue_age_ms": 0} for q in self.queues()}
        for name, value in counts.items():
            queue, _, state = name.rpartition("|")
            # ('@<key>|open': a fairness key's, not a queue's; '<queue>|bytes': its payloads', not a state)
            if int(value) and not queue.startswith("@") and state != "bytes":
                out.setdefault(queue, {"counts": {}, "queue_age_ms": 0})["counts"][state] = int(value)
        now = self.backend.redis_time_ms()
        pipe = self.redis.pipeline(transaction=False)
        for q in out:
            pipe.zrangebyscore(self.keys.pending(q), "-inf", now, start=0, num=1, withscores=True)
        for q, oldest in zip(out, pipe.execute(), strict=True):
            out[q]["queue_age_ms"] = max(0, now - int(oldest[0][1])) if oldest else 0
        return out

    def overview(self) -> dict[str, Any]:
        """Namespace-wide figures from the indexes (no scan of tasks): live leases, suspect or
        reconciling Attempts, attention items, quarantined tasks, Attempts claimable and not claimed
        (outbox_due), namespace state."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.leases)
        pipe.zcard(self.keys.suspect)
        pipe.hlen(self.keys.attention)
        pipe.zcard(self.keys.dlq)
        pipe.time()
        leases, suspect, attention, dlq, (now_s, now_us) = pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcount(self.keys.outbox, "-inf", now)  # (an outbox of versions before 2026-12, draining)
        for q in self.queues():
            pipe.zcount(self.keys.pending(q), "-inf", now)
        due = sum(int(c) for c in pipe.execute())  # claimable and not claimed: sent, or due to be
        info = self.namespace()
        return {"leases_live": int(leases), "suspect": int(suspect), "attention": int(attention),
                "quarantined": int(dlq), "outbox_due": due, "namespace_state": info.state,
                "namespace_reason": info.reason, **self.memory()}

    def memory(self) -> dict[str, int | None]:
        """Redis memory as the enqueue high-water mark sees it: used and ``maxmemory`` bytes (0: no
        limit), and the headroom left before enqueue refuses new work (90% of maxmemory; None without
        a limit). All None when INFO is not allowed for this user."""
        try:
            info = self.redis.info("memory")
        except redis.ResponseError:
            return {"memory_used_bytes": None, "memory_max_bytes": None, "enqueue_headroom_bytes": None}
        used, limit = int(info.get("used_memory") or 0), int(info.get("maxmemory") or 0)
        headroom = int(limit * ENQUEUE_MEMORY_SHARE) - used if limit else None
        return {"memory_used_bytes": used, "memory_max_bytes": limit, "enqueue_headroom_bytes": headroom}

    def attention_items(self) -> list[dict[str, Any]]:
        """Open attention items (stopped or quarantined tasks), oldest task first."""
        raw = cast(dict[str, str], self.redis.hgetall(self.keys.attention))
        return [json.loads(raw[k]) for k in sorted(raw)]

    def namespace_events(self, *, count: int | None = None) -> list[dict[str, str]]:
        entries = cast(list[tuple[str, dict[str, str]]], self.redis.xrange(self.keys.nslog, count=count))
        return [dict(f, id=i) for i, f in entries]

    def refusals(self, count: int = 100) -> list[dict[str, str]]:
        """The newest entries of the refusals log (newest first), each with its stream id as ``id``."""
        entries = cast(list[tuple[str, dict[str, str]]], self.redis.xrevrange(self.keys.refused, count=count))
        return [dict(f, id=i) for i, f in entries]

    def paused_queues(self) -> dict[str, dict[str, Any]]:
        """Paused queues: queue -> {"reason", "actor", "at"} (ms), read only."""
        raw = cast(dict[str, str], self.redis.hgetall(self.keys.paused))
        out: dict[str, dict[str, Any]] = {}
        for q, value in sorted(raw.items()):
            try:
                out[q] = dict(json.loads(value))
            except (ValueError, TypeError):
                out[q] = {"reason": str(value)[:200]}
        return out

    def dlq(self) -> list[tuple[str, int]]:
        """Quarantined tasks: (task id, quarantined at ms), oldest first."""
        rows = cast(list[tuple[str, float]], self.redis.zrange(self.keys.dlq, 0, -1, withscores=True))
        return [(str(m), int(score)) for m, score in rows]

    def dlq_fingerprints(self) -> dict[str, list[str]]:
        """The DLQ grouped by the fingerprint of each task's last failure: fingerprint -> task ids,
        oldest quarantine first ('' when the last Attempt recorded none)."""
        ids = [t for t, _ in self.dlq()]
        pipe = self.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(self._task_keys(tid).task, "attempts")
        numbers = pipe.execute()
        for tid, n in zip(ids, numbers, strict=True):
            tk = self._task_keys(tid)
            pipe.hget(tk.attempts, f"{n or 0}.fingerprint")
            pipe.hget(tk.attempts_v1, f"{n or 0}.fingerprint")  # (a task written before 2026-12)
        out: dict[str, list[str]] = {}
        got = pipe.execute()
        for tid, new, old in zip(ids, got[::2], got[1::2], strict=True):
            out.setdefault(str(new or old or ""), []).append(tid)
        return out

    def retention(self, queue: str) -> tuple[Retention, str]:
        """A queue's retention policy in force and where it comes from: 'operator', 'app' or 'default'."""
        self._queue_name(queue)
        op, app = cast(list[str | None], self.redis.hmget(self.keys.retention, queue, f"app:{queue}"))
        return self._policy_in_force(queue, op, app)

    def retention_policies(self, queues: Sequence[str]) -> dict[str, tuple[Retention, str]]:
        """:meth:`retention` of each queue, in one read."""
        stored = cast(dict[str, str], self.redis.hgetall(self.keys.retention))
        return {q: self._policy_in_force(q, stored.get(q), stored.get(f"app:{q}")) for q in queues}

    @staticmethod
    def _policy_in_force(queue: str, op: str | None, app: str | None) -> tuple[Retention, str]:
        for text, source in ((op, "operator"), (app, "app")):
            if text:
                try:
                    return Retention.model_validate_json(text), source
                except ValueError:
                    log.warning("queue %s: the %s retention policy in Redis does not read; using the next one", queue,
                                source)
        return Retention(), "default"

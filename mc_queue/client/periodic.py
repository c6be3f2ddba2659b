"""Periodic schedules in a namespace: published by the App that declares them, ticked by the sweepers.

Every tick makes exactly one task, however many sweepers run and whichever of them dies when. Each
sweeper (:meth:`Periodic.run_due`) plans the ticks that came due since the schedule's cursor (its
catch-up policy says which missed ones run) and decides each with ``periodic_decide``, which moves the
cursor once per tick for everybody: the first sweeper to decide a tick chooses its task id and keeps it
as the schedule's pending tick; it (or, if it died, the next sweeper) makes that task, with that id and
the producer key ``periodic:<name>:<tick>`` (a second enqueue of either returns the same task), then
closes the tick with ``periodic_done``. A tick is due on Redis's clock, never a sweeper's.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from ..contracts.codec import check_text
from ..contracts.config import Budget, RetryPolicy
from ..contracts.errors import (
    IdempotencyConflict,
    InvalidArgument,
    McqError,
    Overloaded,
    ReplicationUnconfirmed,
    TaskNotFound,
    TaskPurged,
    TransitionRefused,
    raise_for_reply,
)
from ..contracts.keys import new_task_id
from ..contracts.models import Task
from ..contracts.periodic import NAME_RE, PeriodicSchedule, periodic_from_json, tick_key
from ..store.backend import Backend
from .base import Role
from .operator import Operator
from .producer import Producer

COUNTS = ("ran", "failed", "skipped_missed", "skipped_overlap", "skipped_paused", "triggered")


@dataclass(frozen=True)
class Tick:
    """What one decision of a tick came to: ``ran`` (its task made), ``skipped`` (why: paused, missed,
    overlap), ``failed`` (its task cannot be made: why), ``deferred`` (made at a later pass: why)."""

    schedule: str
    tick_ms: int
    outcome: str
    why: str = ""
    task_id: str | None = None
    count: int = 1


class Periodic(Role):
    """Periodic schedules: publish (the App), tick (the sweeper), list, pause, resume, trigger (a person)."""

    def __init__(self, backend: Backend, producer: Producer, operator: Operator) -> None:
        super().__init__(backend)
        self.producer = producer
        self.operator = operator

    # -- the App's

    def publish(self, schedule: PeriodicSchedule, *, actor: str | None = None) -> bool:
        """Record a schedule's definition (``periodic_publish``). A new one starts after now; one published
        again keeps its cursor, pause and counts. False when this very definition was published already."""
        return self._publish(schedule.name, schedule.model_dump_json(), actor)

    def withdraw(self, name: str, *, actor: str | None = None) -> bool:
        """Withdraw a published schedule (its state and counts stay); False when it was not published."""
        return self._publish(self._name(name), "", actor)

    def _publish(self, name: str, spec: str, actor: str | None) -> bool:
        who = check_text(actor or self.actor, what="actor", max_bytes=200, spaces=False)

        def call(epoch: str) -> list[Any]:
            return self._run("periodic_publish", {**self._ns_keys(), "periodic": self.keys.periodic,
                                                  "state": self.keys.periodic_state(name)},
                             {"name": name, "spec": spec, "actor": who, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="periodic_publish")
        return bool(reply[0] == "OK")

    # -- reading

    def definitions(self) -> dict[str, PeriodicSchedule]:
        """The published schedules by name (one that cannot be read is left out, never acted on)."""
        out: dict[str, PeriodicSchedule] = {}
        for name, text in sorted(cast(dict[str, str], self.redis.hgetall(self.keys.periodic)).items()):
            try:
                out[name] = periodic_from_json(text)
            except InvalidArgument:
                continue
        return out

    def status(self) -> list[dict[str, Any]]:
        """Each published schedule: its definition, rule, pause, cursor, pending tick, last tick and the
        state of its task, the next tick (Redis's clock) and its counts."""
        defs = self.definitions()
        if not defs:
            return []
        now = self.backend.redis_time_ms()
        pipe = self.redis.pipeline(transaction=False)
        for name in defs:
            pipe.hgetall(self.keys.periodic_state(name))
        states = cast(list[dict[str, str]], pipe.execute())
        tasks = {st.get("last_task") for st in states if st.get("last_task")}
        task_states = self._task_states(sorted(t for t in tasks if t))
        rows = []
        for (name, spec), st in zip(defs.items(), states, strict=True):
            cursor = int(st.get("cursor") or 0)
            nxt = spec.next_tick(max(cursor, now))
            last_task = st.get("last_task") or None
            rows.append({
                "name": name, "handler": spec.handler, "queue": spec.queue, "rule": spec.rule,
                "overlap": spec.overlap, "catch_up": spec.catch_up, "app": spec.app,
                "paused": _json_or_none(st.get("paused")), "cursor_ms": cursor,
                "next_tick_ms": nxt, "pending": st.get("pending") or None,
                "last_tick_ms": int(st["last_tick"]) if st.get("last_tick") else None, "last_task": last_task,
                "last_task_state": task_states.get(last_task) if last_task else None,
                "counts": {c: int(st.get(c) or 0) for c in COUNTS},
            })
        return rows

    def _task_states(self, ids: list[str]) -> dict[str, str | None]:
        pipe = self.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(self.keys.task(tid).task, "state")
        return dict(zip(ids, cast(list[str | None], pipe.execute()), strict=True)) if ids else {}

    # -- a person's

    def pause(self, name: str, *, reason: str, actor: str | None = None) -> bool:
        """Skip the schedule's ticks as they come due until :meth:`resume` (recorded with who and why)."""
        return self._pause(name, "pause", reason, actor)

    def resume(self, name: str, *, reason: str, actor: str | None = None) -> bool:
        """Undo :meth:`pause` (recorded); the ticks skipped meanwhile stay skipped."""
        return self._pause(name, "resume", reason, actor)

    def _pause(self, name: str, action: str, reason: str, actor: str | None) -> bool:
        self._name(name)
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        who = check_text(actor or self.actor, what="actor", max_bytes=200, spaces=False)

        def call(epoch: str) -> list[Any]:
            return self._run("periodic_pause", {**self._ns_keys(), "periodic": self.keys.periodic,
                                                "state": self.keys.periodic_state(name)},
                             {"name": name, "action": action, "actor": who, "reason": reason, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="periodic_pause")
        return bool(reply[0] == "OK")

    def trigger(self, name: str, *, actor: str | None = None, request_id: str | None = None) -> Task:
        """Make the schedule's task now, outside its ticks and its overlap policy (a person's explicit
        request; its producer key ``periodic:<name>:trigger:<request id>``: the same request id again
        returns the same task)."""
        spec = self.definitions().get(self._name(name))
        if spec is None:
            raise TaskNotFound(f"no periodic schedule named {name!r} is published (`mcq schedule list`)")
        req = request_id or uuid.uuid4().hex
        check_text(req, what="request_id", max_bytes=64, spaces=False)
        task = self._make(spec, f"periodic:{name}:trigger:{req}", None)
        self.redis.hincrby(self.keys.periodic_state(name), "triggered", 1)
        return task

    # -- the sweeper's

    def run_due(self, *, actor: str | None = None) -> list[Tick]:
        """Decide and make every tick of every published schedule that came due (the sweeper calls this
        each pass; any number of sweepers may). Returns what each decision came to."""
        defs = self.definitions()
        if not defs:
            return []
        who = actor or self.actor
        now = self.backend.redis_time_ms()
        pipe = self.redis.pipeline(transaction=False)
        for name in defs:
            pipe.hmget(self.keys.periodic_state(name), ["cursor", "last_task", "pending"])
        out: list[Tick] = []
        for (name, spec), (cursor, last_task, pending) in zip(defs.items(), pipe.execute(), strict=True):
            if cursor is None:
                continue  # published, state not made yet (periodic_publish makes both at once)
            try:
                out.extend(self._run_schedule(spec, int(cursor), last_task or "", pending, now, who))
            except (McqError, ValueError) as exc:  # one schedule's trouble never stops the others
                out.append(Tick(name, 0, "deferred", f"{type(exc).__name__}: {exc}"))
        return out

    def _run_schedule(self, spec: PeriodicSchedule, cursor: int, last_task: str, pending: str | None, now: int,
                      who: str) -> list[Tick]:
        out: list[Tick] = []
        if pending:  # a tick decided to run whose task was not confirmed (its sweeper died): it comes first
            made = self._close_pending(spec, pending, last_task, who)
            out.append(made)
            if made.outcome != "ran":
                return out  # it stays pending: nothing after it is decided before it is made
            last_task = made.task_id or last_task
        for tick, count, missed in spec.plan(cursor, now):
            for _ in range(3):  # a tick pending meanwhile (another sweeper's) first; a changed last task read again
                reply = self._decide(spec.name, tick, count, new_task_id(spec.queue), last_task, spec.overlap,
                                     missed, who)
                if reply[0] == "PENDING":
                    made = self._close(spec, int(reply[1]), str(reply[2]), reply[3] == "1", last_task, who)
                    out.append(made)
                    if made.outcome != "ran":
                        return out
                    last_task = str(reply[2])
                    continue
                if reply[0] == "NOOP" and "read again" in str(reply[1]):
                    last_task = str(self.redis.hget(self.keys.periodic_state(spec.name), "last_task") or "")
                    continue
                break
            if reply[0] == "OK" and reply[1] == "skip":
                out.append(Tick(spec.name, tick, "skipped", str(reply[2]), count=count))
            elif reply[0] == "OK" and reply[1] == "run":
                made = self._close(spec, tick, str(reply[2]), reply[3] == "1", last_task, who)
                out.append(made)
                if made.outcome != "ran":
                    return out
                last_task = str(reply[2])
        return out

    def _close_pending(self, spec: PeriodicSchedule, pending: str, last_task: str, who: str) -> Tick:
        tick, task_id, cancel = [*pending.split(" "), "", "", ""][:3]
        if not tick.isdigit() or not task_id:
            raise InvalidArgument(f"schedule {spec.name}: its pending tick {pending[:200]!r} cannot be read")
        return self._close(spec, int(tick), task_id, cancel == "1", last_task, who)

    def _decide(self, name: str, tick: int, count: int, task_id: str, prev: str, overlap: str, missed: str,
                who: str) -> list[Any]:
        state = self.keys.periodic_state(name)
        prev_key = self.keys.task(prev).task if prev else state

        def call(epoch: str) -> list[Any]:
            return self._run("periodic_decide", {**self._ns_keys(), "state": state, "prev": prev_key},
                             {"tick": tick, "count": count, "task_id": task_id, "prev_id": prev,
                              "overlap": overlap, "missed": "1" if missed else "", "actor": who, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="periodic_decide")
        return reply

    def _close(self, spec: PeriodicSchedule, tick: int, task_id: str, cancel_previous: bool, previous: str,
               who: str) -> Tick:
        """Make a tick's task (cancelling the previous one first when the overlap policy says so) and close
        the tick; a refusal that may pass (memory, replicas) leaves it pending for the next pass."""
        if cancel_previous and previous:
            when = datetime.fromtimestamp(tick / 1000, tz=UTC).isoformat()
            try:
                self.operator.cancel_task(previous, f"periodic schedule {spec.name}: the tick of {when} cancels the "
                                          "previous run (overlap policy 'cancel')", actor=who)
            except (TransitionRefused, TaskNotFound):
                pass  # it ended meanwhile, or is gone: nothing to cancel
        made_id = task_id
        try:
            made_id = self._make(spec, tick_key(spec.name, tick), task_id).id  # (the key's task, if it named one)
            outcome, why = "made", ""
        except (Overloaded, ReplicationUnconfirmed) as exc:
            return Tick(spec.name, tick, "deferred", exc.message, task_id)
        except (InvalidArgument, IdempotencyConflict, TaskPurged) as exc:
            outcome, why = "failed", exc.message
        reply = self._with_epoch(lambda epoch: self._run(
            "periodic_done", {**self._ns_keys(), "state": self.keys.periodic_state(spec.name),
                              "task": self.keys.task(made_id).task},
            {"name": spec.name, "tick": tick, "task_id": task_id, "made_id": made_id, "outcome": outcome,
             "why": why[:2000], "actor": who, "epoch": epoch}))
        raise_for_reply(reply, script="periodic_done", task_id=made_id)
        return Tick(spec.name, tick, "ran" if outcome == "made" else "failed", why, made_id)

    def _make(self, spec: PeriodicSchedule, key: str, task_id: str | None) -> Task:
        return self.producer.enqueue(
            spec.queue, spec.handler, spec.payload, key, task_id=task_id,
            retry_policy=RetryPolicy.model_validate(spec.retry_policy) if spec.retry_policy else None,
            budget=Budget.model_validate(spec.budget) if spec.budget else None,
            lease_ms=spec.lease_ms, timeout_s=spec.timeout_s)

    @staticmethod
    def _name(name: str) -> str:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise InvalidArgument(f"invalid schedule name {name!r}: 1-64 of letters, digits, '_', '.', '-'")
        return name


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}

"""What every role of the client shares: the backend it runs scripts through, the keys of a task and an
Attempt, the arguments every fenced write carries, and the helpers that turn records into script arguments.

A role is a thin view of one :class:`~mc_queue.store.backend.Backend`: it holds no state of its own, so
any number of them share one connection and one namespace memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import redis

from ..contracts.codec import MAX_INT, canonical_json, check_int, check_text
from ..contracts.config import Decision
from ..contracts.errors import InvalidArgument, raise_for_reply
from ..contracts.failures import fingerprint
from ..contracts.frozen import expand
from ..contracts.history import WRONGTYPE, Event, decode_events
from ..contracts.keys import TaskKeys, check_queue, parse_attempt_id, parse_task_id
from ..contracts.models import Attempt, Failure, payload_digest_of
from ..contracts.packing import join_long
from ..store.backend import Backend

INDEXES = ("leases", "suspect", "outbox", "cancels")
ENDED_STATES = ("succeeded", "canceled", "failed", "blocked", "quarantined")  # no Attempt of theirs can run


class Role:
    """The calls one kind of caller makes, on a shared :class:`Backend`."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.keys = backend.keys
        self.ns = backend.ns
        self.redis = backend.redis
        self.runner = backend.runner
        self.actor = backend.actor
        self.max_lease_ms = backend.max_lease_ms

    def _run(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any],
             items: Sequence[tuple[Mapping[str, str], Mapping[str, Any]]] = ()) -> list[Any]:
        return self.backend.run(name, keys, argv, items)

    def _with_epoch(self, call: Callable[[str], list[Any]]) -> list[Any]:
        return self.backend.with_epoch(call)

    def _epoch(self) -> str:
        return self.backend.epoch()

    def _end_keys(self, tk: TaskKeys) -> dict[str, str]:
        """The indexes a task's end moves (lua index_end): its queue's done and held, and the namespace's
        released index (a task with dependents enters it as it ends)."""
        return {"done": tk.done, "held": tk.held, "released": self.keys.released}

    def _slot_keys(self) -> dict[str, str]:
        """What an Attempt's end returns: its concurrency slots (lua slots_free: who holds, who waits, who to
        wake) and its spend ceilings' reservations (lua spend_settle)."""
        return {"slotheld": self.keys.slotheld, "slotwait": self.keys.slotwait, "slotwake": self.keys.slotwake,
                "spent": self.keys.spent}

    def _ns_keys(self) -> dict[str, str]:
        return self.backend.ns_keys()

    def _key_admin(self, op: str, key: str, base: str, reason: str, source: str, sources: Sequence[str],
                   actor: str | None, **argv: Any) -> list[Any]:
        """One ``lua/limit_admin.lua`` change of a key's settings (``base``: the key, or a family's name without
        its '*'; checked by the caller), the reason and source checked first; ``argv``: the op's own arguments
        (the rest are sent empty)."""
        check_text(reason, what="reason", max_bytes=2000, min_chars=1)
        if source not in sources:
            raise InvalidArgument(f"source must be one of {', '.join(sources)}, got {source!r}")
        who = actor or self.actor
        args = {"limit": None, "window_ms": None, "for_ms": None, "breaker": "", "on_full": "", "tokens": None,
                "fallbacks": "",
                **argv}

        def call(epoch: str) -> list[Any]:
            return self._run("limit_admin", {**self._ns_keys(), "limits": self.keys.limits,
                                             "log": self.keys.limit_log(base),
                                             "window": self.keys.breaker_window(base)},
                             {"epoch": epoch, "actor": who, "op": op, "key": key, "source": source, "reason": reason,
                              **args})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="limit_admin")
        return reply

    def _history(self, reply: Any, key: str) -> list[Event]:
        """A task's events from the LRANGE of its history in a pipeline run with ``raise_on_error=False``;
        a history kept as a stream (written before histories became lists) is read with XRANGE instead."""
        if isinstance(reply, redis.ResponseError):
            if not str(reply).startswith(WRONGTYPE):
                raise reply
            return [(str(i), dict(f)) for i, f in cast(list[tuple[str, dict[str, str]]], self.redis.xrange(key))]
        return decode_events(cast(list[str], reply))

    def _task_keys(self, task_id: str) -> TaskKeys:
        try:
            return self.keys.task(task_id)
        except ValueError as exc:
            raise InvalidArgument(str(exc), task_id=task_id) from None

    def _attempt(self, attempt_id: str) -> tuple[str, int, TaskKeys]:
        try:
            task_id, n = parse_attempt_id(attempt_id)
        except ValueError as exc:
            raise InvalidArgument(str(exc), attempt_id=attempt_id) from None
        return task_id, n, self.keys.task(task_id)

    def _fenced_args(self, attempt_id: str, fence: int, worker: str) -> dict[str, Any]:
        """The arguments every fenced write carries: who, the fence, and the client's evidence."""
        check_int(fence, what="fence", high=MAX_INT)
        check_text(worker, what="worker_id", max_bytes=200)
        proof = self.ns.proof(attempt_id, fence)
        return {"fence": fence, "worker": worker, "epoch": self._epoch(), "min_seq": self.ns.seq_seen,
                "proof": "" if proof is None else proof}

    def _lease_ms(self, lease_ms: Any, *, what: str = "lease_ms") -> int:
        return check_int(lease_ms, what=what, low=1, high=self.max_lease_ms)

    def _queue_name(self, queue: str) -> str:
        try:
            return check_queue(queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def _task_keys_or_none(self, task_id: str) -> TaskKeys | None:
        try:
            return self.keys.task(task_id)
        except ValueError:
            return None

    def _retire_keys(self, tk: TaskKeys) -> dict[str, str]:
        return {**self._ns_keys(), "counts": self.keys.counts, "idem": self.keys.idem,
                "idem_until": self.keys.idem_until, "dlq": self.keys.dlq, "attention": self.keys.attention,
                "done": tk.done, "held": tk.held, "topack": self.keys.topack, "task": tk.task,
                "attempts": tk.attempts_v1, "events": tk.events, "effects": tk.effects, "fence": tk.fence,
                **tk.tomb_keys()}

    def _retire_argv(self, states: Sequence[str], reason: str, actor: str | None, tombstone_s: float,
                     score: int | None, log_each: bool, seen: str) -> dict[str, Any]:
        bad = set(states) - set(ENDED_STATES)
        if not states or bad:
            raise InvalidArgument(f"states must be some of {', '.join(ENDED_STATES)}; got {sorted(states)}")
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        if isinstance(tombstone_s, bool) or not isinstance(tombstone_s, (int, float)) or \
                not 0 <= tombstone_s <= 3650 * 86_400:
            raise InvalidArgument(f"tombstone_s must be between 0 and 3650 days in seconds, got {tombstone_s!r}")
        return {"states": "|" + "|".join(sorted(set(states))) + "|", "score": "" if score is None else score,
                "actor": actor or self.actor, "reason": reason, "tombstone_ms": int(tombstone_s * 1000),
                "log": "task" if log_each else "", "epoch": self.ns.epoch or "", "seen": seen}


def pairs(flat: list[Any]) -> dict[str, str]:
    """A hash as a script returns it (HGETALL: name, value, ...) as a dict."""
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def attempt_from_snapshot(task_id: str, n: int, flat: list[Any]) -> Attempt:
    """Attempt n from a script's attempt snapshot ("<n>.<field>", value, ..., and the task's manifest as
    "manifest", json, with "handler" and "payload_digest" that a compact manifest leaves out:
    lua/includes/common.lua attempt_snapshot)."""
    prefix = f"{n}."
    cut = len(prefix)
    fields: dict[str, str] = {}
    task: dict[str, str] = {}
    for i in range(0, len(flat), 2):
        name = str(flat[i])
        if name.startswith(prefix):
            fields[name[cut:]] = str(flat[i + 1])
        elif name in ("manifest", "handler", "payload_digest", "created_at", "payload"):
            task[name] = str(flat[i + 1])  # (the payload: in the whole hash a short one comes with)
    fields = join_long(fields)
    manifest = task.get("manifest")
    if manifest:
        manifest = expand("manifest", manifest, handler=task.get("handler") or None,
                          payload_digest=payload_digest_of(task) or None)
    return Attempt.from_fields(task_id, n, fields, manifest=manifest, task_created=task.get("created_at"))


def printable(text: str, limit: int) -> str:
    """Text cut to ``limit`` bytes of UTF-8 with control characters and lone surrogates replaced:
    for recording what a caller sent when that is itself what was wrong."""
    clean = "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in text)
    data = clean.encode("utf-8", "replace")[:limit]
    return data.decode("utf-8", "ignore")


def decision_args(d: Decision | None, *, default: str) -> dict[str, Any]:
    """A decision as the ARGV fail.lua and reconcile_settle.lua take."""
    return {"decision": d.action if d else default, "why": printable(d.why, 2000) if d else "",
            "next_reason": printable(d.next_reason, 2000) if d else "",
            "next_hypothesis": printable(d.next_hypothesis, 2000) if d else "",
            "delay_ms": min(int(d.delay_s * 1000), 365 * 86_400_000) if d else 0,
            "attention": canonical_json(d.attention, what="attention") if d and d.attention else "",
            "budget": d.budget_exhausted if d else ""}


def as_failure(failure: Failure | Mapping[str, Any]) -> Failure:
    """A Failure with its fingerprint (computed when missing)."""
    if isinstance(failure, Mapping):
        try:
            failure = Failure.model_validate(dict(failure))
        except Exception as exc:
            raise InvalidArgument(f"failure is not a valid Failure record: {exc}") from None
    if not isinstance(failure, Failure):
        raise InvalidArgument(f"failure must be a Failure (classify an exception first with "
                              f"mc_queue.classify(exc).failure), got {type(failure).__name__}")
    if not failure.fingerprint:
        return failure.model_copy(update={
            "fingerprint": fingerprint(failure.failure_class, failure.type, failure.message)})
    if len(failure.fingerprint) != 16 or set(failure.fingerprint) - set("0123456789abcdef"):
        raise InvalidArgument(f"failure fingerprint {failure.fingerprint!r} is not 16 lowercase hex digits; "
                              "leave it empty to have it computed")
    return failure


def parse_queue(task_id: str) -> str:
    """The queue of a task id (InvalidArgument when it is not one)."""
    try:
        return parse_task_id(task_id)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def raised(replies: Sequence[Any], *, but: int) -> list[Any]:
    """A pipeline's replies (run with ``raise_on_error=False``), raising the first error among them except
    the one at index ``but`` (the history read, which :meth:`Role._history` judges)."""
    for i, reply in enumerate(replies):
        if i != but and isinstance(reply, Exception):
            raise reply
    return list(replies)

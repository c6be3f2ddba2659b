"""Task, Attempt, Event, Lease: the records mc_queue keeps, and their states.

Which script moves a Task or an Attempt from which state to which, and who causes it, is the table
in :mod:`mc_queue.contracts.states` (rendered into the README).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .codec import digest
from .frozen import OMITTED, expand
from .keys import attempt_id
from .packing import LONG_MARK, join_long


class TaskState(StrEnum):
    SCHEDULED = "scheduled"  # its first Attempt is not due yet (enqueue with delay_s or run_at)
    WAITING = "waiting"  # it waits for other tasks to end first (enqueue with after=[...])
    PENDING = "pending"
    RUNNING = "running"
    BACKOFF = "backoff"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"
    QUARANTINED = "quarantined"
    CANCELED = "canceled"


class AttemptState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUSPECT = "suspect"
    RECONCILING = "reconciling"
    CANCELED = "canceled"


TERMINAL_ATTEMPT_STATES = frozenset({AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELED})
# Attempt 1's reason (lua/enqueue.lua makes every Attempt 1 and does not store it: from_fields fills it in,
# as it fills in every Attempt's worktree, its id).
FIRST_DISPATCH = "first dispatch"


class FailureClass(StrEnum):
    """Failure domains (chapter 002): each has its own permitted response."""

    AUTHORIZATION = "authorization"
    CONFIGURATION = "configuration"
    CAPACITY = "capacity"
    PROVIDER = "provider"
    EXECUTOR = "executor"
    VALIDATION = "validation"
    REPOSITORY = "repository"
    INTERNAL = "internal"


def ms_to_dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Manifest(_Record):
    """What an Attempt froze when it was created; never edited afterwards."""

    handler: str
    payload_digest: str
    policy_version: str = "default-v1"
    executor: str | None = None
    model: str | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    base_sha: str | None = None
    lease_ms: int | None = None
    timeout_s: float | None = None


class Failure(_Record):
    """A classified failure. ``fingerprint`` is stable across tries: class, type, normalised message."""

    failure_class: FailureClass
    type: str
    message: str = ""
    fingerprint: str = ""
    retryable: bool | None = None
    traceback: str | None = None  # bounded: the newest frames, newest last (contracts.failures.format_traceback)


def _spend_reserved(text: str) -> dict[str, tuple[float, int]]:
    """An Attempt's 'spend' ("<key> <cost thousandths> <tokens> <bucket ms>,..."): key -> (cost, tokens)."""
    out: dict[str, tuple[float, int]] = {}
    for item in text.split(","):
        parts = item.split(" ")
        if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
            out[parts[0]] = (int(parts[1]) / 1000, int(parts[2]))
    return out


class Attempt(_Record):
    id: str
    task_id: str
    number: int
    state: AttemptState
    previous: str | None = None
    reason: str | None = None
    hypothesis: str | None = None
    manifest: Manifest | None = None
    worktree: str | None = None
    worker_id: str | None = None
    fence: int | None = None
    lease_ms: int | None = None
    lease_expires_at: datetime | None = None
    heartbeat_at: datetime | None = None
    created_at: datetime | None = None
    due_at: datetime | None = None
    started_at: datetime | None = None
    deadline_at: datetime | None = None  # when its timeout budget ends (set at claim, Redis clock)
    suspect_at: datetime | None = None
    ended_at: datetime | None = None
    failure: Failure | None = None
    result: Any = None
    evidence: Any = None
    settled_by: str | None = None
    cost: float = 0.0
    tokens: int = 0
    elapsed_ms: int | None = None
    phase: str | None = None
    checkpoints: dict[str, Any] = Field(default_factory=dict)
    limited: int = 0  # how many claims a rate limit deferred (lua/claim.lua E_LIMITED)
    limited_by: str | None = None  # the last deferral's reason
    # concurrency keys it held a slot of -> the writer fence its claim got (lua/claim.lua 'slots')
    slots: dict[str, int] = Field(default_factory=dict)
    waiting_for: str | None = None  # the concurrency key it is parked in line for (lua/claim.lua 'parked')
    # spend ceilings it reserved on at claim -> (cost, tokens) reserved: its budget's rest (lua/claim.lua 'spend')
    spend: dict[str, tuple[float, int]] = Field(default_factory=dict)
    # dependencies whose breaker was down at its claim -> the declared fallback that let it be claimed
    admitted_via: dict[str, str] = Field(default_factory=dict)
    # dependencies its calls went around (breaker open) -> the declared fallback they went to (limit_stamp.lua)
    fallbacks: dict[str, str] = Field(default_factory=dict)
    dispatches: int = 0  # how many times the outbox handed it to the transport or checked it was still there

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_ATTEMPT_STATES

    @classmethod
    def from_fields(cls, task_id: str, number: int, f: dict[str, str], *, manifest: str | None = None,
                    task_created: str | None = None) -> Attempt:
        """An Attempt from its fields in the attempts hash; ``manifest``: the task's, for an Attempt that
        keeps none of its own; ``task_created``: the task's created_at, Attempt 1's created_at and due_at
        when it keeps none of its own (lua/enqueue.lua does not store them twice)."""
        if number == 1 and task_created and "created_at" not in f:
            f = {**f, "created_at": task_created, "due_at": f.get("due_at") or task_created}
        def ms(name: str) -> datetime | None:
            v = f.get(name)
            return ms_to_dt(int(v)) if v else None

        def js(name: str) -> Any:
            v = f.get(name)
            return json.loads(v) if v else None

        prev = f.get("prev")
        return cls(
            id=attempt_id(task_id, number),
            task_id=task_id,
            number=number,
            state=AttemptState(f.get("state", "pending")),
            previous=attempt_id(task_id, int(prev)) if prev else None,
            reason=f.get("reason") or (FIRST_DISPATCH if number == 1 else None),
            hypothesis=f.get("hypothesis") or None,
            manifest=Manifest.model_validate_json(expand("manifest", f.get("manifest") or manifest or ""))
            if f.get("manifest") or manifest else None,
            worktree=f.get("worktree") or attempt_id(task_id, number),
            worker_id=f.get("worker") or None,
            fence=int(f["fence"]) if f.get("fence") else None,
            lease_ms=int(f["lease_ms"]) if f.get("lease_ms") else None,
            lease_expires_at=ms("lease_exp"),
            heartbeat_at=ms("hb_at") or ms("started_at"),  # (the claim stores none: lua/claim.lua)
            created_at=ms("created_at"),
            due_at=ms("due_at"),
            started_at=ms("started_at"),
            deadline_at=ms("deadline"),
            suspect_at=ms("suspect_at"),
            ended_at=ms("ended_at"),
            failure=Failure.model_validate_json(f["failure"]) if f.get("failure") else None,
            result=js("result"),
            evidence=js("evidence"),
            settled_by=f.get("settled_by") or None,
            cost=float(f.get("cost") or 0),
            tokens=int(f.get("tokens") or 0),
            elapsed_ms=int(f["elapsed_ms"]) if f.get("elapsed_ms") else _ran_ms(f),
            phase=f.get("phase") or None,
            checkpoints={k[5:]: json.loads(v) for k, v in f.items() if k.startswith("ckpt.")},
            dispatches=int(f.get("dispatches") or 0),
            limited=int(f.get("limited") or 0),
            limited_by=f.get("limited_by") or None,
            slots={k: int(v) for k, _, v in (i.partition(" ") for i in (f.get("slots") or "").split(",") if i)},
            waiting_for=(f.get("parked") or "").partition("\n")[0] or None,
            spend=_spend_reserved(f.get("spend") or ""),
            admitted_via=dict(i.partition(">")[::2] for i in (f.get("admitted_via") or "").split(",") if ">" in i),
            fallbacks=dict(i.partition(">")[::2] for i in (f.get("fallbacks") or "").split(",") if ">" in i),
        )


def _ran_ms(f: Mapping[str, str]) -> int | None:
    """How long a success the worker recorded ran (lua/complete.lua stores no elapsed_ms: its ended_at
    less its started_at); None for any other Attempt without elapsed_ms."""
    if f.get("state") == "succeeded" and not f.get("settled_by") and f.get("started_at") and f.get("ended_at"):
        return int(f["ended_at"]) - int(f["started_at"])
    return None


class Event(_Record):
    """One entry of a task's append-only history."""

    id: str
    type: str
    at: datetime
    attempt: int | None = None
    fields: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_stream(cls, entry_id: str, fields: dict[str, str]) -> Event:
        f = dict(fields)
        typ = f.pop("type", "?")
        att = f.pop("attempt", None)
        return cls(id=entry_id, type=typ, at=ms_to_dt(int(entry_id.split("-")[0])),  # type: ignore[arg-type]
                   attempt=int(att) if att else None, fields=f)


def split_attempts(fields: Mapping[str, str],
                   v1: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """A task hash as stored (HGETALL) as its own fields and its Attempts' ('<n>.<field>', the names
    that start with a digit), or with ``v1``, the Attempts hash of a task written before 2026-12 that
    keeps them apart (``TaskKeys.attempts_v1``); each with its long values joined (:func:`join_long`,
    whose ValueError names a missing chunk)."""
    own = join_long({k: v for k, v in fields.items() if not k[:1].isdigit()})
    if v1:
        return own, join_long(v1)
    return own, join_long({k: v for k, v in fields.items() if k[:1].isdigit()})


def attempt_fields(fields: Mapping[str, str], v1: Mapping[str, str]) -> int:
    """How many fields the hash that holds a task's Attempts has, as the scripts count it (HLEN after
    attempts_of in lua/includes/common.lua): the task hash when it has Attempt 1's state, else the
    Attempts hash of its own (``v1``, empty for a packed task)."""
    return len(fields) if "1.state" in fields else len(v1)


def by_number(att: Mapping[str, str]) -> dict[int, dict[str, str]]:
    """An Attempts hash ('<n>.<field>': value) as the fields of each Attempt, by number (the task's own
    fields, when given the task hash, are left out)."""
    by_n: dict[int, dict[str, str]] = {}
    for key, value in att.items():
        num, _, name = key.partition(".")
        if not num.isdigit():
            continue
        by_n.setdefault(int(num), {})[name] = value
    return by_n


def payload_digest_of(f: Mapping[str, str]) -> str:
    """A task's payload digest: its hash's field, or, for a payload of at most 64 bytes that keeps none
    (lua/includes/admit.lua), the digest of the payload itself (``f``: the task's fields, long values
    joined or the payload short and whole); '' when neither is there."""
    stored = f.get("payload_digest")
    if stored:
        return stored
    payload = f.get("payload")
    return digest(payload) if payload is not None and payload[:1] != LONG_MARK else ""


# The fields a compact event (marked '~': lua/claim.lua, lua/complete.lua) leaves to its Attempt's.
SAME_AS_ATTEMPT = {"attempt_claimed": ("worker", "fence", "lease_exp", "lease_ms"),
                   "attempt_succeeded": ("worker", "fence", "result_digest")}


def filled_in(event: dict[str, str], task: dict[str, str],
              attempts: Mapping[int, Mapping[str, str]] | None = None) -> dict[str, str]:
    """An event's fields with what the scripts do not store twice filled in: from the task hash,
    task_created's handler and payload digest (the task's, which never change) and Attempt 1's reason
    in attempt_created ('first dispatch'); from its Attempt's fields (``attempts``: by number, names
    without the '<n>.' prefix), what a compact attempt_claimed or attempt_succeeded (marked '~') says
    only once: the worker, the fence, the result digest (of the result itself when the Attempt keeps
    none: a result of at most 64 bytes), the lease (its first expiry is the Attempt's started_at plus its
    lease_ms). An event written before keeps its own."""
    typ = event.get("type")
    if event.get("~") == "1" and typ in SAME_AS_ATTEMPT:
        a = (attempts or {}).get(int(event.get("attempt") or 0), {})
        same = {"lease_exp": str(int(a.get("started_at") or 0) + int(a.get("lease_ms") or 0))} \
            if typ == "attempt_claimed" else {}
        if typ == "attempt_succeeded" and not a.get("result_digest") and a.get("result") is not None:
            same = {"result_digest": digest(a["result"])}  # a short result keeps no digest (lua/complete.lua)
        out = {k: v for k, v in event.items() if k != "~"}
        out.update({k: same.get(k, a.get(k, "")) for k in SAME_AS_ATTEMPT[typ]})
        return out
    if typ == "task_created" and "payload_digest" not in event:
        return {**event, "handler": task.get("handler", ""), "payload_digest": payload_digest_of(task)}
    if typ == "attempt_created" and "reason" not in event and event.get("attempt") == "1":
        return {**event, "reason": FIRST_DISPATCH}
    return event


class Task(_Record):
    id: str
    queue: str
    handler: str
    payload: dict[str, Any]
    payload_digest: str
    idempotency_key: str | None = None
    state: TaskState
    created_at: datetime
    updated_at: datetime | None = None
    fence: int = 0  # the task's fence counter (the last fence issued; 0 before the first claim)
    lease_ms: int | None = None  # the lease length every claim gets (frozen at enqueue)
    lease_pttl_ms: int | None = None  # what is left of the live lease (PTTL of its key), None without one
    attempt_count: int = 0
    active_attempt: int | None = None
    retry_policy: str | None = None
    budget: str | None = None
    manifest: Manifest | None = None
    result: Any = None
    cancel_requested: str | None = None
    priority: int = 5  # 1 (most urgent) .. 9: the RQ queue its Attempts are sent to (5: not stored)
    fair_key: str | None = None  # its fairness key: its Attempts' messages wait in that key's fair lane
    start_by: datetime | None = None  # deadlines (Redis clock): started by, ended by; else the sweeper cancels it
    finish_by: datetime | None = None
    after: list[str] = Field(default_factory=list)  # the tasks it waits for (enqueue with after=[...]) ...
    after_mode: str | None = None  # ... 'succeeded' (each must succeed, else it is canceled) or 'ended'
    after_left: list[str] = Field(default_factory=list)  # those still to end (empty once released)
    dependents: list[str] = Field(default_factory=list)  # the tasks that waited or wait for this one
    attempts: list[Attempt] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)

    @property
    def latest(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @classmethod
    def from_redis(cls, f: dict[str, str], att: dict[str, str], events: list[tuple[str, dict[str, str]]], *,
                   fence: str | None = None, lease_pttl_ms: int | None = None) -> Task:
        by_n = by_number(att)
        # An Attempt's frozen manifest is the task's, kept once in the task hash (an Attempt written before
        # that, or one with a manifest of its own, keeps its field).
        manifest = expand("manifest", f["manifest"], handler=f.get("handler"), payload_digest=payload_digest_of(f)) \
            if f.get("manifest") else None
        attempts = [Attempt.from_fields(f["id"], n, by_n[n], manifest=manifest, task_created=f.get("created_at"))
                    for n in sorted(by_n)]
        return cls(
            id=f["id"],
            queue=f["queue"],
            handler=f["handler"],
            payload=json.loads(f["payload"]),
            payload_digest=payload_digest_of(f),
            idempotency_key=f.get("idem_key") or None,
            state=TaskState(f["state"]),
            created_at=ms_to_dt(int(f["created_at"])),  # type: ignore[arg-type]
            # Not stored while it is created_at (lua/enqueue.lua).
            updated_at=ms_to_dt(int(f.get("updated_at") or f["created_at"])),
            fence=int(fence or 0),
            lease_ms=int(f["lease_ms"]) if f.get("lease_ms") else None,
            lease_pttl_ms=lease_pttl_ms if lease_pttl_ms is not None and lease_pttl_ms >= 0 else None,
            attempt_count=int(f.get("attempts") or 0),
            active_attempt=int(f["active"]) if f.get("active") else None,
            retry_policy=expand("retry_policy", f.get("retry_policy") or OMITTED),
            budget=expand("budget", f.get("budget") or OMITTED),
            manifest=Manifest.model_validate_json(manifest) if manifest else None,
            # The succeeded Attempt's result (a task written before kept a copy of its own).
            result=json.loads(f["result"]) if f.get("result") else
            next((a.result for a in reversed(attempts) if a.state == AttemptState.SUCCEEDED), None),
            cancel_requested=f.get("cancel_requested") or None,
            priority=int(f["priority"]) if f.get("priority") else 5,
            fair_key=f.get("fair_key") or None,
            start_by=ms_to_dt(int(f["start_by"])) if f.get("start_by") else None,
            finish_by=ms_to_dt(int(f["finish_by"])) if f.get("finish_by") else None,
            after=(f.get("after") or "").split(),
            after_mode=f.get("after_mode") or None,
            after_left=(f.get("after_left") or "").split(),
            dependents=(f.get("dependents") or "").split(),
            attempts=attempts,
            events=[Event.from_stream(i, filled_in(e, f, by_n)) for i, e in events],
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """Execution ownership of one Attempt: valid while ``fence`` is current and the lease is live."""

    attempt_id: str
    fence: int
    expires_at_ms: int
    worker_id: str
    task_id: str
    number: int
    seq: int = 0  # the namespace's claim sequence when this lease was issued
    lease_ms: int = 0  # the lease length granted (each renewal extends it by as much)
    recovered_at_ms: int = 0  # when the namespace was last recovered (Redis clock), 0: never
    # The task as the claim left it, when asked for (claim_attempt(with_task=True)): its fields and
    # Attempts, not its events (a worker runs the Attempt from these; get_task reads the whole history).
    task: Task | None = None
    claimed_now_ms: int = field(default=0, compare=False)  # Redis's clock when the claim (or its resend) ran
    deadline_ms: int = 0  # when the Attempt's timeout budget ends (Redis clock), 0: it has none

    @property
    def expires_at(self) -> datetime:
        return datetime.fromtimestamp(self.expires_at_ms / 1000, tz=UTC)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A renewed lease: new expiry (ms, Redis clock), whether cancellation was requested, and what
    the Attempt has been charged so far."""

    expires_at_ms: int
    cancel_requested: bool
    cost: float
    tokens: int


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    attempt_id: str
    old_fence: int
    new_fence: int


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """A namespace as Redis holds it. ``state``: ok | lost | recovering, or ``missing`` when Redis has
    no meta for it (``lost`` too when it left traces or the embedded witness remembers it)."""

    prefix: str
    state: str
    epoch: str
    seq: int
    floor: int
    reason: str = ""
    max_lease_ms: int = 0

    @property
    def usable(self) -> bool:
        return self.state in ("ok", "missing")


class EffectRecord(BaseModel):
    """One side effect of a task: its intent (before the provider is called) and its receipt."""

    model_config = ConfigDict(frozen=True, extra="allow")

    key: str = ""
    operation: str = ""  # '' only in a record written past effect_begin's checks (it reconciles as unknown)
    identity: str = ""
    state: str = "intent"  # intent | done | absent | unknown
    attempt: int = 0
    fence: str = ""
    worker: str = ""
    intent_at: int | None = None
    receipt: Any = None
    receipt_at: int | None = None
    receipt_attempt: int | None = None
    settled_by: str | None = None
    source: str | None = None
    note: str | None = None

    @classmethod
    def from_json(cls, text: str) -> EffectRecord:
        data = json.loads(text)
        given = data.pop("record_json", None)
        if given:  # the caller's record as it was sent; the scripts' own fields beside it take precedence
            data = {**json.loads(given), **data}
        raw = data.pop("receipt_json", None)
        if raw:
            data["receipt"] = json.loads(raw)
        return cls.model_validate(data)

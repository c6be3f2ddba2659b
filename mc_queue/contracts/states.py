"""The state machine as data: every move of a Task or an Attempt, the script that makes it, and who
causes it. The README's state table is rendered from :data:`TRANSITIONS` (``render_markdown``); tests
check that every state a script in ``lua/`` writes is a listed edge, that every change a real run
makes is one, and that every listed edge happens.

``src`` is ``""`` where the record is created, ``dst`` is ``""`` where it is deleted. A Task's
``running`` covers its Attempt being running, suspect or reconciling; only reconciliation settles it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .models import AttemptState, TaskState

Entity = Literal["task", "attempt"]


@dataclass(frozen=True)
class Edge:
    entity: Entity
    src: str
    dst: str
    script: str
    actor: str
    note: str = ""


def _edges(entity: Entity, srcs: str, dsts: str, script: str, actor: str, note: str = "") -> list[Edge]:
    return [Edge(entity, s if s != "-" else "", d if d != "-" else "", script, actor, note)
            for s in srcs.split("|") for d in dsts.split("|")]


_DECIDED = "failed|pending|backoff|blocked|quarantined"  # what a failure's decision leaves the task in

TRANSITIONS: tuple[Edge, ...] = tuple(
    # ------------------------------------------------------------------ Task
    _edges("task", "-", "pending|scheduled", "enqueue", "producer",
           "a new task with its first Attempt; scheduled while a delay or run_at keeps it from being due")
    + _edges("task", "-", "pending|scheduled", "enqueue_many", "producer",
             "many new tasks, all or nothing, each as enqueue makes it")
    + _edges("task", "-", "pending|scheduled|waiting", "enqueue_after", "producer",
             "a new task that waits for others (after=[...]) until each ended; at once as enqueue if all have")
    + _edges("task", "waiting", "pending|scheduled|canceled", "release", "sweeper",
             "its last parent ended: due now or at its own due time; canceled when a parent did not succeed "
             "and it asked that each succeed")
    + _edges("task", "pending|backoff|scheduled", "running|canceled", "claim", "worker",
             "backoff and scheduled only once due; canceled when a concurrency key it names is full and rejects "
             "the newest (on_full reject)")
    + _edges("task", "running", "succeeded", "complete", "worker holding the fence")
    + _edges("task", "running", _DECIDED, "fail", "worker holding the fence; the policy decides",
             "wait -> failed, retry -> pending|backoff, stop -> blocked, quarantine -> quarantined")
    + _edges("task", "running", "succeeded|canceled|" + _DECIDED, "reconcile_settle", "sweeper or operator",
             "after an expired or voided lease: proven done, canceled, or a failure and its decision")
    + _edges("task", "failed|blocked", "pending|backoff", "retry", "operator or policy",
             "Mission Control's rules: no active Attempt, the latest failed, a reason >= 10 characters")
    + _edges("task", "pending|backoff|scheduled|waiting|failed|blocked", "canceled", "cancel",
             "operator, or the sweeper for a missed deadline",
             "nothing running; a running Attempt is signalled instead and reconciliation ends it")
    + _edges("task", "quarantined", "pending", "dlq_replay", "operator", "a person's decision, with a reason")
    + _edges("task", "quarantined", "-", "dlq_purge", "operator", "deleted with its history; a tombstone stays")
    + _edges("task", "succeeded|canceled|failed|blocked|quarantined", "-", "retire", "sweeper or operator",
             "retention or `mcq tasks purge`: deleted with every key and index entry; a tombstone stays")
    # ------------------------------------------------------------------ Attempt
    + _edges("attempt", "-", "pending", "enqueue", "producer", "Attempt 1")
    + _edges("attempt", "-", "pending", "enqueue_many", "producer", "Attempt 1 of each new task")
    + _edges("attempt", "-", "pending", "enqueue_after", "producer", "Attempt 1, not claimable while its task waits")
    + _edges("attempt", "-", "pending", "fail", "policy", "Attempt N+1 of a retry decision")
    + _edges("attempt", "-", "pending", "reconcile_settle", "policy", "Attempt N+1 of a retry decision")
    + _edges("attempt", "-", "pending", "retry", "operator or policy", "Attempt N+1 with its reason")
    + _edges("attempt", "-", "pending", "dlq_replay", "operator", "Attempt N+1 out of the DLQ")
    + _edges("attempt", "pending", "running|canceled", "claim", "worker",
             "a new fence (INCR) and a lease key (PXAT expiry); canceled when a full concurrency key rejects it")
    + _edges("attempt", "running", "succeeded", "complete", "worker holding the fence and a live lease")
    + _edges("attempt", "running", "failed", "fail", "worker holding the fence and a live lease")
    + _edges("attempt", "running", "suspect", "expire", "sweeper, or the worker whose process died",
             "lease key gone (or voided: recovery, cancel not acknowledged, its process died); the fence moves on")
    + _edges("attempt", "running", "suspect", "cancel_ack", "worker holding the fence",
             "the executor stopped after a cancel request; the fence moves on")
    + _edges("attempt", "suspect", "reconciling", "reconcile_begin", "sweeper or operator")
    + _edges("attempt", "reconciling", "succeeded|failed|canceled", "reconcile_settle", "sweeper or operator",
             "with the evidence the decision rests on")
    + _edges("attempt", "pending", "canceled", "cancel", "operator, or the sweeper for a missed deadline")
    + _edges("attempt", "pending", "canceled", "release", "sweeper", "a parent of its task did not succeed")
    + _edges("attempt", "failed", "-", "dlq_purge", "operator",
             "the history of a quarantined task (its Attempts all failed), deleted with it")
    + _edges("attempt", "succeeded|failed|canceled", "-", "retire", "sweeper or operator",
             "the history of an ended task, deleted with it (after the archive, when one is set)")
)

TASK_STATES = tuple(s.value for s in TaskState)
ATTEMPT_STATES = tuple(s.value for s in AttemptState)


def edges_of(entity: Entity) -> list[Edge]:
    return [e for e in TRANSITIONS if e.entity == entity]


def allowed(entity: Entity, src: str, dst: str, script: str) -> bool:
    """Is this change one the table lists?"""
    return any(e.entity == entity and e.src == src and e.dst == dst and e.script == script for e in TRANSITIONS)


def render_markdown() -> str:
    """The README's state table: one row per (entity, from, script), the states it may go to."""
    rows: dict[tuple[str, str, str], list[Edge]] = {}
    for e in TRANSITIONS:
        rows.setdefault((e.entity, e.src, e.script), []).append(e)
    out = ["| entity | from | script | to | who | note |", "|---|---|---|---|---|---|"]
    for (entity, src, script), group in rows.items():
        dst = " \\| ".join(e.dst or "(deleted)" for e in group)
        out.append(f"| {entity} | {src or '(new)'} | `{script}` | {dst} | {group[0].actor} | "
                   f"{group[0].note.replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"

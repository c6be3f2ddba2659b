"""The operator's calls: retry, cancel, the DLQ, pausing queues, retention policies and purges,
reconciliation's settle, recovery, and the audit entries no script writes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..contracts.codec import canonical_json, check_int, check_text, model_json
from ..contracts.config import Decision, Retention
from ..contracts.errors import Code, InvalidArgument, raise_for_reply
from ..contracts.keys import check_queue
from ..contracts.models import Attempt, ExpiredLease, Failure
from ..store.backend import Backend
from .base import Role, attempt_from_snapshot, decision_args, printable
from .maintenance import Maintenance

NSLOG_MAX = 100_000  # the namespace log's cap (common.lua NSLOG_MAX)
DEFAULT_TOMBSTONE_S = 30 * 86_400  # how long a purged task's id and producer key stay refused
REFUSED_LOG_MAX = 10_000  # about how many entries the refusals log keeps (XADD MAXLEN ~)


class Operator(Role):
    """What a person (or their tooling) decides; every act is recorded with its reason."""

    def __init__(self, backend: Backend, maintenance: Maintenance) -> None:
        super().__init__(backend)
        self.maintenance = maintenance

    def retry_task(self, task_id: str, reason: str, hypothesis: str | None = None, *, delay_ms: int = 0,
                   actor: str | None = None, request_id: str | None = None) -> Attempt:
        """Append Attempt N+1 (pending) with its reason and hypothesis, under Mission Control's rules."""
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000)
        check_text(hypothesis or "", what="hypothesis", max_bytes=2000)
        check_int(delay_ms, what="delay_ms", high=365 * 86_400_000)
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("retry", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts_v1,
                "events": tk.events, "pending": tk.pending,
                "attention": self.keys.attention, "stats": self.keys.stats, **self._end_keys(tk),
            }, {"reason": reason, "hypothesis": hypothesis or "", "actor": actor or self.actor, "request_id": req,
                "delay_ms": delay_ms, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="retry", task_id=task_id)
        return attempt_from_snapshot(task_id, int(reply[1]), reply[3])

    def cancel_task(self, task_id: str, reason: str, *, actor: str | None = None,
                    ack_timeout_ms: int = 30_000) -> str:
        """Start the cancellation protocol. Returns 'canceled' (nothing was running) or 'signaled'
        (the executor hears it at its next heartbeat; the sweeper voids its lease after the timeout)."""
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        check_int(ack_timeout_ms, what="ack_timeout_ms", high=86_400_000)

        def call(epoch: str) -> list[Any]:
            return self._run("cancel", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts_v1,
                "events": tk.events, "pending": tk.pending, "cancels": self.keys.cancels,
                "stats": self.keys.stats, "attention": self.keys.attention, **self._end_keys(tk),
                "slotwait": self.keys.slotwait,
            }, {"reason": reason, "actor": actor or self.actor, "timeout_ms": ack_timeout_ms, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="cancel", task_id=task_id)
        return str(reply[1])

    def dlq_replay(self, task_id: str, reason: str, hypothesis: str | None = None, *,
                   actor: str | None = None, request_id: str | None = None) -> Attempt:
        """Take a quarantined task out of the DLQ as a new Attempt with its reason (a person's decision)."""
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        check_text(hypothesis or "", what="hypothesis", max_bytes=2000)
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("dlq_replay", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts_v1,
                "events": tk.events, "pending": tk.pending, "dlq": self.keys.dlq,
                "attention": self.keys.attention, "stats": self.keys.stats, **self._end_keys(tk),
            }, {"reason": reason, "hypothesis": hypothesis or "", "actor": actor or self.actor, "request_id": req,
                "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="dlq_replay", task_id=task_id)
        return attempt_from_snapshot(task_id, int(reply[1]), reply[2])

    def dlq_purge(self, task_id: str, *, reason: str, actor: str | None = None,
                  keep_key_s: float = DEFAULT_TOMBSTONE_S, request_id: str | None = None) -> int:
        """Delete a quarantined task and its history for good; returns how many Attempts it had.

        Its id and producer idempotency key stay refused by enqueue for ``keep_key_s`` seconds (a
        tombstone, 30 days by default; 0 frees them at once), so the same work does not run again.
        """
        tk = self._task_keys(task_id)
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        if isinstance(keep_key_s, bool) or not isinstance(keep_key_s, (int, float)) or \
                not 0 <= keep_key_s <= 3650 * 86_400:
            raise InvalidArgument(f"keep_key_s must be between 0 and 3650 days in seconds, got {keep_key_s!r}")
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("dlq_purge", {
                **self._ns_keys(), "counts": self.keys.counts, "idem": self.keys.idem, "dlq": self.keys.dlq,
                "attention": self.keys.attention, "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events,
                "effects": tk.effects, **tk.tomb_keys(), "stats": self.keys.stats, "held": tk.held,
                "idem_until": self.keys.idem_until, "fence": tk.fence,
            }, {"actor": actor or self.actor, "reason": reason, "tombstone_ms": int(keep_key_s * 1000),
                "request_id": req, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="dlq_purge", task_id=task_id)
        return int(reply[1])

    def pause_queue(self, queue: str, *, reason: str, actor: str | None = None) -> bool:
        """queue_pause: claims of the queue's Attempts are refused and the sweeper does not dispatch them
        until :meth:`resume_queue`; recorded in the namespace log. False when it was already paused."""
        return self._queue_pause(queue, "pause", reason, actor)

    def resume_queue(self, queue: str, *, reason: str, actor: str | None = None) -> bool:
        """queue_pause: undo :meth:`pause_queue` (recorded). False when the queue was not paused."""
        return self._queue_pause(queue, "resume", reason, actor)

    def _queue_pause(self, queue: str, action: str, reason: str, actor: str | None) -> bool:
        try:
            check_queue(queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        who = check_text(actor or self.actor, what="actor", max_bytes=200, spaces=False)

        def call(epoch: str) -> list[Any]:
            return self._run("queue_pause", {**self._ns_keys(), "paused": self.keys.paused},
                             {"queue": queue, "action": action, "actor": who, "reason": reason, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="queue_pause")
        return bool(reply[0] == Code.OK)

    def set_retention(self, queue: str, retention: Retention | None, *, source: str = "operator",
                      actor: str | None = None, reason: str = "") -> None:
        """Record a queue's retention policy: the operator's (wins) or the App's (``source="app"``);
        ``None`` removes that source's policy. An operator's change is audited in the namespace log."""
        self._queue_name(queue)
        if source not in ("operator", "app"):
            raise InvalidArgument(f"source must be 'operator' or 'app', got {source!r}")
        if source == "operator":
            check_text(reason, what="reason", max_bytes=2000, min_chars=10)
        field_name = queue if source == "operator" else f"app:{queue}"
        pipe = self.redis.pipeline(transaction=True)
        if retention is None:
            pipe.hdel(self.keys.retention, field_name)
        else:
            pipe.hset(self.keys.retention, field_name, model_json(retention))
        pipe.execute()
        if source == "operator":
            policy = model_json(retention) if retention else "(the App's or the default)"
            self.log_event("retention_set", {"queue": queue, "actor": actor or self.actor, "reason": reason,
                                         "policy": policy})

    def retire_task(self, task_id: str, *, states: Sequence[str], reason: str, actor: str | None = None,
                    tombstone_s: float = Retention().tombstone_s, score: int | None = None,
                    log_each: bool = True) -> str | None:
        """Delete one ended task with every key and index entry (``lua/retire.lua``), if its state is one
        of ``states``; a tombstone keeps its id and producer key refused for ``tombstone_s``. Returns the
        state it was in, or None when there was no such task. Refused (TransitionRefused) in another state."""
        tk = self._task_keys(task_id)
        reply = self.runner.run("retire", self._retire_keys(tk),
                                self._retire_argv(states, reason, actor, tombstone_s, score, log_each, ""))
        if reply[0] == "NOOP":
            return None
        raise_for_reply(reply, script="retire", task_id=task_id)
        return str(reply[1])

    def begin_reconcile(self, attempt_id: str, *, actor: str | None = None) -> bool:
        """suspect -> reconciling (True), or already reconciling (False: a reconciler died mid-way)."""
        task_id, n, tk = self._attempt(attempt_id)

        def call(epoch: str) -> list[Any]:
            return self._run("reconcile_begin", {**self._ns_keys(), "task": tk.task, "attempts": tk.attempts_v1,
                                                 "events": tk.events, "stats": self.keys.stats},
                             {"n": n, "actor": actor or self.actor, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="reconcile_begin", task_id=task_id, attempt_id=attempt_id)
        return bool(reply[0] == Code.OK)

    def settle_attempt(self, attempt_id: str, actor: str, outcome: str, *, result: Any = None,
                       failure: Failure | None = None, evidence: Any = None,
                       decision: Decision | None = None) -> Attempt:
        """reconciling -> succeeded | failed | canceled, with the evidence and (failed) the decision."""
        task_id, n, tk = self._attempt(attempt_id)
        argv = {"n": n, "actor": actor, "outcome": outcome,
                "result": canonical_json(result, what="result") if outcome == "succeeded" else "",
                "failure": model_json(failure) if failure else "",
                "fclass": failure.failure_class.value if failure else "",
                "fingerprint": failure.fingerprint if failure else "",
                "evidence": canonical_json(evidence, what="evidence"),
                **decision_args(decision, default="wait" if outcome == "failed" else "")}

        def call(epoch: str) -> list[Any]:
            return self._run("reconcile_settle", {
                **self._ns_keys(), "counts": self.keys.counts, "suspect": self.keys.suspect, "task": tk.task,
                "attempts": tk.attempts_v1, "stats": self.keys.stats, "events": tk.events, "pending": tk.pending,
                "attention": self.keys.attention, "dlq": self.keys.dlq,
                **self._end_keys(tk),
            }, {**argv, "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="reconcile_settle", task_id=task_id, attempt_id=attempt_id)
        return attempt_from_snapshot(task_id, n, reply[2])

    def void_leases(self, members: list[str], *, actor: str | None = None, reason: str,
                    recovering_epoch: str | None = None, holder: str = "") -> list[ExpiredLease]:
        """Void live leases now (fence bumped, Attempt suspect): recovery, an unacknowledged cancel, or a
        worker whose process running them died (``holder``: only the leases that worker holds)."""
        return self.maintenance.expire(members, actor=actor or self.actor, force=True, reason=reason,
                                       recovering_epoch=recovering_epoch, holder=holder).expired

    def begin_recovery(self, *, reason: str, actor: str | None = None) -> tuple[str, int]:
        """recover_begin: a new epoch, the fence floor raised; the namespace holds in 'recovering'."""
        reply = self._run("recover_begin", self._ns_keys(),
                          {"nonce": uuid.uuid4().hex[:8], "actor": actor or self.actor,
                           "reason": check_text(reason, what="reason", max_bytes=2000)})
        raise_for_reply(reply, script="recover_begin")
        return str(reply[1]), int(reply[2])

    def finish_recovery(self, epoch: str, *, voided: int, actor: str | None = None) -> None:
        """recover_finish: refused while a lease from before the recovery is still indexed."""
        reply = self._run("recover_finish", {"meta": self.keys.meta, "nslog": self.keys.nslog,
                                             "leases": self.keys.leases},
                          {"epoch": epoch, "actor": actor or self.actor, "voided": voided})
        raise_for_reply(reply, script="recover_finish")
        self.ns.forget()
        self.ns.write_witness(epoch)

    def log_event(self, event: str, fields: Mapping[str, Any]) -> None:
        """Record an operator's or the sweeper's act that no script makes (a retention policy set, a
        retention pass's deletions) in the namespace log, capped like the scripts' events."""
        entry = {"type": event, **{k: printable(str(v), 2000) for k, v in fields.items() if v not in (None, "")}}
        self.redis.xadd(self.keys.nslog, entry, maxlen=NSLOG_MAX, approximate=True)  # type: ignore[arg-type]

    def audit(self, event: str, fields: Mapping[str, Any]) -> None:
        """Record what a worker refused to act on (a forged or misrouted transport message) in the
        refusals log, ``P:refused``, capped at about REFUSED_LOG_MAX entries (anyone able to write
        the transport can make these, so they neither grow Redis without bound nor trim the
        namespace log), and count it in the stats (``<event>`` there is never trimmed)."""
        entry = {"type": event, **{k: printable(str(v), 1000) for k, v in fields.items() if v not in (None, "")}}
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(self.keys.refused, entry, maxlen=REFUSED_LOG_MAX, approximate=True)  # type: ignore[arg-type]
        pipe.hincrby(self.keys.stats, event, 1)
        pipe.execute()

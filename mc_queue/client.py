"""The Client: one typed method per Lua contract, and the reads that explain what happened."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .codec import canonical_json, digest, encode_payload
from .effects import EffectRecord
from .errors import InvalidArgument, PhaseOutOfOrder, TaskNotFound, TransitionRefused, raise_for_reply
from .failures import fingerprint, make_failure
from .keys import Keys, TaskKeys, check_queue, new_task_id, parse_attempt_id
from .models import (
    Attempt,
    ExpiredLease,
    Failure,
    FailureClass,
    Heartbeat,
    Lease,
    Manifest,
    NamespaceInfo,
    Task,
)
from .policy import Budget, Classified, Decision, RetryPolicy, classify, decide, parse_config
from .scripts import Scripts

# The default lease: a heartbeat thread renews it every third (~3.3 s) whatever the handler does,
# so a long tool call is not expired while its process lives; a vanished worker is noticed within
# one lease plus one sweep (about 11 s with the sweeper's 1 s default interval).
DEFAULT_LEASE_MS = 10_000
_HANDLER_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
_RESENDS = 3  # explicit resends of an idempotent script after a connection error or timeout

T = TypeVar("T")


def quiet_connection_kwargs() -> dict[str, Any]:
    """Skip redis-py's CLIENT SETINFO handshake (two round trips and a package-metadata lookup per new
    connection, which a forked work horse pays for every Attempt)."""
    import inspect

    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


def _default_actor() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Client:
    """A connection to one mc_queue namespace.

    Transitions run on a redis-py client whose automatic retries are off: redis-py would otherwise
    re-send a script after a timeout without saying so (it re-ran a claim 11 times here). Every
    script is idempotent (by a request id, a fence and digest, or by re-checking its condition), so
    mc_queue re-sends it itself, at most ``_RESENDS`` times, with the same request id.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "mcq",
        witness_path: str | os.PathLike[str] | None = None,
        actor: str | None = None,
        socket_timeout: float = 10.0,
    ) -> None:
        self.url = url
        self.keys = Keys(prefix)
        self.actor = actor or _default_actor()
        self.witness_path = Path(witness_path) if witness_path else None
        common: dict[str, Any] = dict(decode_responses=True, socket_timeout=socket_timeout,
                                      socket_connect_timeout=socket_timeout, health_check_interval=30,
                                      **quiet_connection_kwargs())
        self.redis: redis.Redis = redis.Redis.from_url(url, **common)
        self._w: redis.Redis = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **common)
        self._scripts = Scripts(self._w)
        self._epoch: str | None = None
        self._seq_seen = 0
        self.embedded: Any = None  # set by connect() when it started or reused the embedded server

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        self.redis.close()
        self._w.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any]) -> list[Any]:
        last: Exception | None = None
        for i in range(_RESENDS + 1):
            try:
                reply = self._scripts.call(name, keys, argv)
                return reply if isinstance(reply, list) else [reply]
            except redis.AuthenticationError:
                raise  # wrong credentials: resending cannot help
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                last = exc
                time.sleep(min(0.05 * (2**i), 1.0))
        assert last is not None
        raise last

    def _ns(self) -> str:
        """The namespace epoch, creating the namespace on first use."""
        if self._epoch is None:
            self._load_namespace()
        assert self._epoch is not None
        return self._epoch

    def _load_namespace(self) -> NamespaceInfo:
        witness = self._read_witness()
        reply = self._run("init", {"meta": self.keys.meta, "nslog": self.keys.nslog, "queues": self.keys.queues,
                                   "leases": self.keys.leases},
                          {"nonce": uuid.uuid4().hex[:8], "witness": witness or "", "actor": self.actor})
        info = NamespaceInfo(self.keys.prefix, reply[1], reply[2], int(reply[3]), int(reply[4]))
        if info.epoch != self._epoch:
            self._seq_seen = 0
        self._epoch = info.epoch
        if info.state == "ok" and info.epoch != witness:
            self._write_witness(info.epoch)
        return info

    def _ns_keys(self) -> dict[str, str]:
        return {"meta": self.keys.meta, "epochs": self.keys.epochs, "nslog": self.keys.nslog}

    def _read_witness(self) -> str | None:
        if not self.witness_path or not self.witness_path.exists():
            return None
        try:
            data = json.loads(self.witness_path.read_text())
        except (OSError, ValueError):
            return None
        value = data.get(self.keys.prefix)
        return value if isinstance(value, str) else None

    def _write_witness(self, epoch: str) -> None:
        if not self.witness_path:
            return
        try:
            data = json.loads(self.witness_path.read_text()) if self.witness_path.exists() else {}
        except (OSError, ValueError):
            data = {}
        data[self.keys.prefix] = epoch
        tmp = self.witness_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.witness_path)

    def _with_epoch(self, call: Callable[[str], list[Any]]) -> list[Any]:
        """Run a call that presents the epoch; after a recovery elsewhere, refresh once and resend."""
        reply = call(self._ns())
        if reply[0] == "E_EPOCH":
            self._epoch = None
            reply = call(self._ns())
        return reply

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

    def _note_seq(self, seq: Any) -> None:
        s = int(seq)
        if s > self._seq_seen:
            self._seq_seen = s

    # ----------------------------------------------------------------- contracts

    def enqueue(
        self,
        queue: str,
        handler: str,
        payload: Any,
        idempotency_key: str | None = None,
        *,
        executor: str | None = None,
        model: str | None = None,
        context: Mapping[str, Any] | None = None,
        base_sha: str | None = None,
        retry_policy: RetryPolicy | None = None,
        budget: Budget | None = None,
        policy_version: str | None = None,
        lease_ms: int | None = None,
        timeout_s: float | None = None,
        task_id: str | None = None,
    ) -> Task:
        """Create a Task and its first Attempt. The same idempotency key returns the same task."""
        try:
            check_queue(queue)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not handler or not isinstance(handler, str) or len(handler) > 128 or set(handler) - _HANDLER_NAME_OK:
            raise InvalidArgument(
                f"invalid handler name {handler!r}: use 1-128 letters, digits, '_', '.', ':', '-'"
            )
        if idempotency_key is not None and (
            not idempotency_key or len(idempotency_key) > 512 or " " in idempotency_key
        ):
            raise InvalidArgument("idempotency key must be 1-512 characters without spaces (or None)")
        text, payload_digest = encode_payload(payload)
        policy = retry_policy or RetryPolicy()
        manifest = Manifest(handler=handler, payload_digest=payload_digest,
                            policy_version=policy_version or policy.version,
                            executor=executor, model=model, context=dict(context or {}), base_sha=base_sha,
                            lease_ms=lease_ms, timeout_s=timeout_s)
        canonical_json(manifest.context, what="context")
        tid = task_id or new_task_id(queue)
        tk = self._task_keys(tid)
        if tk.pending != self.keys.pending(queue):
            raise InvalidArgument(f"task id {tid!r} does not belong to queue {queue!r}")

        def call(epoch: str) -> list[Any]:
            return self._run("enqueue", {
                **self._ns_keys(), "idem": self.keys.idem, "queues": self.keys.queues, "counts": self.keys.counts,
                "task": tk.task, "attempts": tk.attempts, "events": tk.events, "pending": tk.pending,
                "outbox": self.keys.outbox,
            }, {
                "task_id": tid, "queue": queue, "handler": handler, "payload": text,
                "payload_digest": payload_digest, "idem_key": idempotency_key or "",
                "manifest": manifest.model_dump_json(), "retry_policy": policy.model_dump_json(),
                "budget": (budget or Budget()).model_dump_json(),
                "epoch": epoch, "actor": self.actor,
            })

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="enqueue", task_id=tid)
        return self.get_task(str(reply[1]))

    def claim_attempt(self, task_id: str, worker_id: str, lease_ms: int = DEFAULT_LEASE_MS, *,
                      request_id: str | None = None, expect_attempt: int | None = None) -> Lease:
        """Atomically take the task's pending Attempt and a lease with a new fence.

        ``expect_attempt``: refuse unless the pending Attempt is this one (a transport message
        for Attempt N must not run Attempt N+1).
        """
        tk = self._task_keys(task_id)
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("claim", {
                **self._ns_keys(), "stats": self.keys.stats, "counts": self.keys.counts, "leases": self.keys.leases,
                "task": tk.task, "attempts": tk.attempts, "events": tk.events, "pending": tk.pending,
                "outbox": self.keys.outbox,
            }, {"worker": worker_id, "lease_ms": lease_ms, "epoch": epoch, "min_seq": self._seq_seen,
                "request_id": req, "expect_n": "" if expect_attempt is None else expect_attempt})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="claim", task_id=task_id)
        n = int(reply[1])
        self._note_seq(reply[4])
        return Lease(attempt_id=f"{task_id}/{n}", fence=int(reply[2]), expires_at_ms=int(reply[3]),
                     worker_id=worker_id, task_id=task_id, number=n)

    def renew_lease(self, attempt_id: str, fence: int, *, worker_id: str = "",
                    lease_ms: int | None = None) -> int:
        """Extend the lease; returns the new expiry (ms, Redis clock). Raises StaleFence/LeaseExpired."""
        return self.heartbeat(attempt_id, fence, worker_id=worker_id, lease_ms=lease_ms).expires_at_ms

    def heartbeat(self, attempt_id: str, fence: int, *, worker_id: str = "", lease_ms: int | None = None,
                  cost: float = 0.0, tokens: int = 0, request_id: str | None = None) -> Heartbeat:
        """Renew the lease and charge cost/tokens to the Attempt (once per request id)."""
        task_id, n, tk = self._attempt(attempt_id)
        charging = cost > 0 or tokens > 0
        reply = self._run("renew", {
            **self._ns_keys(), "leases": self.keys.leases, "task": tk.task, "attempts": tk.attempts,
            "stats": self.keys.stats,
            "events": tk.events,
        }, {"n": n, "fence": fence, "worker": worker_id, "lease_ms": "" if lease_ms is None else lease_ms,
            "epoch": self._ns(), "min_seq": self._seq_seen, "cost": repr(float(cost)), "tokens": int(tokens),
            "request_id": (request_id or uuid.uuid4().hex) if charging else ""})
        raise_for_reply(reply, script="renew", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return Heartbeat(int(reply[1]), reply[2] == "1", float(reply[3]), int(reply[4]))

    def complete_attempt(self, attempt_id: str, fence: int, result: Any = None, *, worker_id: str = "",
                         cost: float = 0.0, tokens: int = 0) -> Attempt:
        """Record success. Same fence + same result again is a no-op; a different result a conflict."""
        task_id, n, reply = self._complete(attempt_id, fence, result, worker_id=worker_id, cost=cost, tokens=tokens)
        return _attempt_from_snapshot(task_id, n, reply[2])

    def _complete(self, attempt_id: str, fence: int, result: Any, *, worker_id: str, cost: float = 0.0,
                  tokens: int = 0) -> tuple[str, int, list[Any]]:
        """complete_attempt without building the Attempt record (the worker's hot path)."""
        task_id, n, tk = self._attempt(attempt_id)
        text = canonical_json(result, what="result")
        reply = self._run("complete", {
            **self._ns_keys(), "counts": self.keys.counts, "leases": self.keys.leases, "task": tk.task,
            "stats": self.keys.stats,
            "attempts": tk.attempts, "events": tk.events,
        }, {"n": n, "fence": fence, "worker": worker_id, "result": text, "result_digest": digest(text),
            "cost": repr(float(cost)), "tokens": int(tokens), "epoch": self._ns(), "min_seq": self._seq_seen})
        raise_for_reply(reply, script="complete", task_id=task_id, attempt_id=attempt_id,
                        presented_fence=fence)
        return task_id, n, reply

    def fail_attempt(self, attempt_id: str, fence: int, failure: Failure | BaseException | Mapping[str, Any], *,
                     worker_id: str = "", cost: float = 0.0, tokens: int = 0,
                     decision: Decision | None = None) -> Attempt:
        """Record a classified failure, and apply the policy's decision in the same step.

        Without a decision the task waits in ``failed`` for a person (``retry_task``). Exceptions are
        classified with :func:`mc_queue.policy.classify`.
        """
        task_id, n, tk = self._attempt(attempt_id)
        f = _as_failure(failure)
        text = f.model_dump_json()
        d = decision
        reply = self._run("fail", {
            **self._ns_keys(), "counts": self.keys.counts, "leases": self.keys.leases, "task": tk.task,
            "stats": self.keys.stats,
            "attempts": tk.attempts, "events": tk.events, "pending": tk.pending, "attention": self.keys.attention,
            "dlq": self.keys.dlq, "outbox": self.keys.outbox,
        }, {"n": n, "fence": fence, "worker": worker_id, "failure": text, "failure_digest": digest(text),
            "fclass": f.failure_class.value, "fingerprint": f.fingerprint, "cost": repr(float(cost)),
            "tokens": int(tokens), "epoch": self._ns(), "min_seq": self._seq_seen,
            **_decision_args(d, default="")})
        raise_for_reply(reply, script="fail", task_id=task_id, attempt_id=attempt_id,
                        presented_fence=fence)
        return _attempt_from_snapshot(task_id, n, reply[2])

    def checkpoint(self, attempt_id: str, fence: int, phase: str, phase_index: int, record: Mapping[str, Any], *,
                   worker_id: str = "") -> bool:
        """Record a phase reached by a running Attempt (fenced, monotonic). False when already recorded."""
        task_id, n, tk = self._attempt(attempt_id)
        text = canonical_json(dict(record), what="checkpoint")
        reply = self._run("checkpoint", {
            **self._ns_keys(), "stats": self.keys.stats, "task": tk.task, "attempts": tk.attempts, "events": tk.events,
        }, {"n": n, "fence": fence, "worker": worker_id, "phase": phase, "phase_index": phase_index,
            "record": text, "digest": digest(text), "epoch": self._ns(), "min_seq": self._seq_seen})
        if reply[0] == "E_PHASE":
            raise PhaseOutOfOrder(
                f"checkpoint {phase!r} of {attempt_id} refused: phases are monotonic and the attempt is already "
                f"at {reply[1]!r}", task_id=task_id, attempt_id=attempt_id, script="checkpoint", code="E_PHASE")
        raise_for_reply(reply, script="checkpoint", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return bool(reply[0] == "OK")

    def effect_begin(self, attempt_id: str, fence: int, key: str, record: Mapping[str, Any], *,
                     worker_id: str = "") -> tuple[str, EffectRecord | None]:
        """Persist an effect's intent (fenced). Returns ("OK", None) to go ahead, ("DONE", record) to
        replay its receipt, or ("PENDING", record) when an earlier intent must be reconciled first."""
        task_id, n, tk = self._attempt(attempt_id)
        reply = self._run("effect_begin", {
            **self._ns_keys(), "task": tk.task, "attempts": tk.attempts, "events": tk.events, "effects": tk.effects,
            "stats": self.keys.stats,
        }, {"n": n, "fence": fence, "worker": worker_id, "key": key,
            "record": canonical_json(dict(record), what="effect record"), "epoch": self._ns(),
            "min_seq": self._seq_seen})
        raise_for_reply(reply, script="effect_begin", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        status = str(reply[0])
        return status, (EffectRecord.from_json(reply[1]) if len(reply) > 1 else None)

    def effect_done(self, attempt_id: str, fence: int | None, key: str, outcome: str, receipt: Any = None, *,
                    source: str = "perform", actor: str = "") -> EffectRecord:
        """Record a receipt ('done'), or as reconciler (fence None) 'absent' / 'unknown' with a note."""
        task_id, n, tk = self._attempt(attempt_id)
        text = canonical_json(receipt, what="receipt") if outcome == "done" else str(receipt or "")
        reply = self._run("effect_done", {
            **self._ns_keys(), "task": tk.task, "attempts": tk.attempts, "events": tk.events, "effects": tk.effects,
            "stats": self.keys.stats,
        }, {"n": n, "fence": "" if fence is None else fence, "actor": actor or self.actor, "key": key,
            "outcome": outcome, "receipt": text, "source": source, "epoch": self._ns(), "min_seq": self._seq_seen})
        if reply[0] == "E_NOEFFECT":
            raise InvalidArgument(f"no intent on file for effect {key}", task_id=task_id, attempt_id=attempt_id)
        raise_for_reply(reply, script="effect_done", task_id=task_id, attempt_id=attempt_id,
                        presented_fence=fence)
        return EffectRecord.from_json(reply[1])

    def effects(self, task_id: str) -> dict[str, EffectRecord]:
        """Every side effect of the task: key -> intent / receipt record."""
        raw = cast(dict[str, str], self.redis.hgetall(self._task_keys(task_id).effects))
        return {k: EffectRecord.from_json(v) for k, v in sorted(raw.items())}

    def due_dispatches(self, *, limit: int = 500) -> list[str]:
        """Attempt ids in the outbox whose (re)dispatch time has come (Redis clock)."""
        due = self._run("due", {"index": self.keys.outbox}, {"limit": limit})
        return [str(m) for m in due[1:]]

    def mark_dispatched(self, attempt_id: str, *, recheck_ms: int) -> bool:
        """The Attempt was handed to the transport; look again after ``recheck_ms`` if unclaimed."""
        _, n, tk = self._attempt(attempt_id)
        reply = self._run("mark_dispatched", {"outbox": self.keys.outbox, "attempts": tk.attempts},
                          {"attempt_id": attempt_id, "n": n, "recheck_ms": int(recheck_ms)})
        return bool(reply[0] == "OK")

    def expire_leases(self, *, limit: int = 500, actor: str | None = None,
                      max_batches: int = 1000) -> list[ExpiredLease]:
        """Every lease past its expiry (Redis clock) -> Attempt suspect, fence bumped. Bounded batches."""
        out: list[ExpiredLease] = []
        for _ in range(max_batches):
            due = self._run("due", {"index": self.keys.leases}, {"limit": limit})
            members = [str(m) for m in due[1:]]
            if not members:
                break
            out.extend(self._expire(members, actor or self.actor, force=False, reason="lease expired"))
            if len(members) < limit:
                break
        return out

    def void_leases(self, attempt_ids: list[str], *, actor: str | None = None, reason: str) -> list[ExpiredLease]:
        """Void live leases now (fence bumped, Attempt suspect): recovery, or an unacknowledged cancel."""
        return self._expire(attempt_ids, actor or self.actor, force=True, reason=reason)

    def _expire(self, attempt_ids: list[str], actor: str, *, force: bool, reason: str) -> list[ExpiredLease]:
        out = []
        pipe = self._w.pipeline(transaction=False)
        for aid in attempt_ids:
            _, n, tk = self._attempt(aid)
            self._scripts.call("expire", {
                "meta": self.keys.meta, "counts": self.keys.counts, "leases": self.keys.leases,
                "stats": self.keys.stats,
                "suspect": self.keys.suspect, "task": tk.task, "attempts": tk.attempts, "events": tk.events,
                "cancels": self.keys.cancels,
            }, {"n": n, "actor": actor, "force": force, "reason": reason}, client=pipe)
        for aid, reply in zip(attempt_ids, pipe.execute(), strict=True):
            if reply[0] == "OK":
                out.append(ExpiredLease(aid, old_fence=int(reply[2]), new_fence=int(reply[1])))
        return out

    def reconcile_attempt(self, attempt_id: str, *, actor: str | None = None, apply_policy: bool = False,
                          operations: Mapping[str, Callable[[str], Any]] | None = None) -> Attempt:
        """Suspect -> reconciling -> settled, from persisted state and provider truth alone.

        For every effect with an intent and no receipt, ask the provider (``operations`` maps an
        operation name to its reconcile): found -> the receipt is recorded; absent -> safe to redo;
        unknown (no reconcile, or it raised) -> cannot tell. Then one decision, with its evidence:

        - an effect is unknown: the task is blocked with an attention item (never a blind requeue);
        - the result was on file (``result_pending``) and every effect is proven: succeeded;
        - otherwise: failed, executor class. Without ``apply_policy`` the task waits for a person;
          with it, the retry policy and budget frozen in the task decide (the sweeper's way). A next
          Attempt replays the recorded receipts instead of repeating those effects.

        Re-entrant: a reconciler that died mid-way leaves the Attempt reconciling, and this picks it up.
        """
        task_id, n, tk = self._attempt(attempt_id)
        who = actor or self.actor
        reply = self._run("reconcile_begin", {"task": tk.task, "attempts": tk.attempts, "events": tk.events},
                          {"n": n, "actor": who})
        raise_for_reply(reply, script="reconcile_begin", task_id=task_id, attempt_id=attempt_id)
        findings: list[dict[str, Any]] = []
        for key, rec in self.effects(task_id).items():
            if rec.state == "intent":
                outcome, value = self._ask_provider(key, rec, operations or {})
                rec = self.effect_done(attempt_id, None, key, outcome, value, source="reconcile", actor=who)
            findings.append({"key": key, "operation": rec.operation, "state": rec.state, "receipt": rec.receipt,
                             "note": rec.note, "by_attempt": rec.receipt_attempt or rec.attempt})
        task = self.get_task(task_id)
        attempt = task.attempts[n - 1]
        pending = attempt.checkpoints.get("result_pending")
        unknown = [f["key"] for f in findings if f["state"] == "unknown"]
        mine_absent = [f["key"] for f in findings if f["state"] == "absent" and f["by_attempt"] == n]
        evidence: dict[str, Any] = {"effects": findings, "result_pending": pending is not None}
        if task.cancel_requested:
            evidence["conclusion"] = f"canceled ({task.cancel_requested}); effects found are kept as evidence"
            return self._settle(attempt_id, who, "canceled", evidence=evidence)
        phase = attempt.phase or "start"
        failure = make_failure(FailureClass.EXECUTOR, "LeaseLost",
                               f"the worker's lease expired in phase {phase} before it completed")
        if unknown:
            evidence["conclusion"] = f"cannot tell whether {', '.join(unknown)} happened: a person must look"
            why = "an effect's outcome is unknown at the provider; another attempt could duplicate it"
            stop = Decision("stop", why, attention={
                "task_id": task_id, "kind": "unknown_effect", "summary": f"{task.handler} on {task_id}: {why}",
                "tried": [{"attempt": a.number, "state": a.state.value, "hypothesis": a.hypothesis}
                          for a in task.attempts],
                "changed": [], "why_unsafe": why, "effects": findings, "failure_class": "executor"})
            return self._settle(attempt_id, who, "failed", failure=failure, evidence=evidence, decision=stop)
        if pending is not None and not mine_absent:
            result = (pending.get("data") or {}).get("result")
            evidence["conclusion"] = "the result was on file before the worker vanished and every effect is proven"
            return self._settle(attempt_id, who, "succeeded", result=result, evidence=evidence)
        evidence["conclusion"] = (f"failed (executor): the worker vanished in phase {phase}; "
                                  f"{sum(1 for f in findings if f['state'] == 'done')} effect(s) proven done will be "
                                  "replayed from their receipts, not repeated")
        decision = self.policy_decision(task, attempt, Classified(failure)) if apply_policy else None
        return self._settle(attempt_id, who, "failed", failure=failure, evidence=evidence, decision=decision)

    def _ask_provider(self, key: str, rec: EffectRecord,
                      operations: Mapping[str, Callable[[str], Any]]) -> tuple[str, Any]:
        ask = operations.get(rec.operation)
        if ask is None:
            return "unknown", f"no reconcile registered for operation {rec.operation!r}"
        try:
            found = ask(key)
        except Exception as exc:
            return "unknown", f"{type(exc).__name__}: {exc}"[:500]
        return ("done", found) if found is not None else ("absent", "the provider has no trace of it")

    def policy_decision(self, task: Task, attempt: Attempt, classified: Classified, *, cost: float = 0.0,
                        tokens: int = 0) -> Decision:
        """What the task's frozen retry policy and budget say about this failure."""
        policy = parse_config(task.retry_policy, RetryPolicy)
        budget = parse_config(task.budget, Budget)
        stamps = [t for t in (attempt.heartbeat_at, attempt.suspect_at, attempt.started_at) if t]
        elapsed = (max(stamps) - task.created_at).total_seconds() if stamps else None
        return decide(task, attempt, classified, policy, budget, cost=cost, tokens=tokens, elapsed_s=elapsed)

    def _settle(self, attempt_id: str, actor: str, outcome: str, *, result: Any = None,
                failure: Failure | None = None, evidence: Any = None, decision: Decision | None = None) -> Attempt:
        task_id, n, tk = self._attempt(attempt_id)
        d = decision
        reply = self._run("reconcile_settle", {
            "counts": self.keys.counts, "suspect": self.keys.suspect, "task": tk.task, "attempts": tk.attempts,
            "stats": self.keys.stats,
            "events": tk.events, "pending": tk.pending, "outbox": self.keys.outbox,
            "attention": self.keys.attention, "dlq": self.keys.dlq,
        }, {"n": n, "actor": actor, "outcome": outcome,
            "result": canonical_json(result) if outcome == "succeeded" else "",
            "failure": failure.model_dump_json() if failure else "",
            "fclass": failure.failure_class.value if failure else "",
            "fingerprint": failure.fingerprint if failure else "",
            "evidence": canonical_json(evidence, what="evidence"),
            **_decision_args(d, default="wait" if outcome == "failed" else "")})
        raise_for_reply(reply, script="reconcile_settle", task_id=task_id, attempt_id=attempt_id)
        return _attempt_from_snapshot(task_id, n, reply[2])

    def retry_task(self, task_id: str, reason: str, hypothesis: str | None = None, *, delay_ms: int = 0,
                   actor: str | None = None, request_id: str | None = None) -> Attempt:
        """Append Attempt N+1 (pending) with its reason and hypothesis, under Mission Control's rules."""
        if not isinstance(reason, str):
            raise InvalidArgument("reason must be a string of at least ten characters")
        tk = self._task_keys(task_id)
        req = request_id or uuid.uuid4().hex

        def call(epoch: str) -> list[Any]:
            return self._run("retry", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, "outbox": self.keys.outbox,
                "attention": self.keys.attention,
            }, {"reason": reason, "hypothesis": hypothesis or "", "actor": actor or self.actor, "request_id": req,
                "delay_ms": int(delay_ms), "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="retry", task_id=task_id)
        return _attempt_from_snapshot(task_id, int(reply[1]), reply[3])

    def cancel_task(self, task_id: str, reason: str, *, actor: str | None = None,
                    ack_timeout_ms: int = 30_000) -> str:
        """Start the cancellation protocol. Returns 'canceled' (nothing was running) or 'signaled'
        (the executor hears it at its next heartbeat; the sweeper voids its lease after the timeout)."""
        tk = self._task_keys(task_id)

        def call(epoch: str) -> list[Any]:
            return self._run("cancel", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, "outbox": self.keys.outbox, "cancels": self.keys.cancels,
            }, {"reason": reason, "actor": actor or self.actor, "timeout_ms": int(ack_timeout_ms), "epoch": epoch})

        reply = self._with_epoch(call)
        if reply[0] == "E_STATE":
            raise TransitionRefused(f"cancel of {task_id} refused: the task is {reply[1]} already",
                                    task_id=task_id, script="cancel", code="E_STATE")
        raise_for_reply(reply, script="cancel", task_id=task_id)
        return str(reply[1])

    def acknowledge_cancel(self, attempt_id: str, fence: int, *, worker_id: str = "") -> int:
        """The executor stops: it gives up its lease (the fence moves on) and waits for reconciliation."""
        task_id, n, tk = self._attempt(attempt_id)
        reply = self._run("cancel_ack", {
            **self._ns_keys(), "stats": self.keys.stats, "leases": self.keys.leases, "suspect": self.keys.suspect,
            "cancels": self.keys.cancels, "task": tk.task, "attempts": tk.attempts, "events": tk.events,
        }, {"n": n, "fence": fence, "worker": worker_id, "epoch": self._ns(), "min_seq": self._seq_seen})
        if reply[0] == "E_CANCEL":
            raise TransitionRefused(f"{attempt_id}: no cancellation was requested", attempt_id=attempt_id,
                                    task_id=task_id, script="cancel_ack", code="E_CANCEL")
        raise_for_reply(reply, script="cancel_ack", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return int(reply[1])

    def dlq(self) -> list[tuple[str, int]]:
        """Quarantined tasks: (task id, quarantined at ms), oldest first."""
        rows = cast(list[tuple[str, float]], self.redis.zrange(self.keys.dlq, 0, -1, withscores=True))
        return [(str(m), int(score)) for m, score in rows]

    def dlq_replay(self, task_id: str, reason: str, hypothesis: str | None = None, *,
                   actor: str | None = None) -> Attempt:
        """Take a quarantined task out of the DLQ as a new Attempt with its reason (a person's decision)."""
        tk = self._task_keys(task_id)

        def call(epoch: str) -> list[Any]:
            return self._run("dlq_replay", {
                **self._ns_keys(), "counts": self.keys.counts, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, "outbox": self.keys.outbox, "dlq": self.keys.dlq,
                "attention": self.keys.attention,
            }, {"reason": reason, "hypothesis": hypothesis or "", "actor": actor or self.actor, "epoch": epoch})

        reply = self._with_epoch(call)
        if reply[0] == "E_STATE":
            raise TransitionRefused(f"replay of {task_id} refused: the task is {reply[1]}, not quarantined",
                                    task_id=task_id, script="dlq_replay", code="E_STATE")
        raise_for_reply(reply, script="dlq_replay", task_id=task_id)
        return _attempt_from_snapshot(task_id, int(reply[1]), reply[2])

    def dlq_purge(self, task_id: str, *, reason: str, actor: str | None = None) -> int:
        """Delete a quarantined task and its history for good; returns how many Attempts it had."""
        tk = self._task_keys(task_id)
        reply = self._run("dlq_purge", {
            "nslog": self.keys.nslog, "counts": self.keys.counts, "idem": self.keys.idem, "dlq": self.keys.dlq,
            "attention": self.keys.attention, "task": tk.task, "attempts": tk.attempts, "events": tk.events,
            "effects": tk.effects,
        }, {"actor": actor or self.actor, "reason": reason})
        if reply[0] == "E_STATE":
            raise TransitionRefused(f"purge of {task_id} refused: the task is {reply[1]}, not quarantined",
                                    task_id=task_id, script="dlq_purge", code="E_STATE")
        raise_for_reply(reply, script="dlq_purge", task_id=task_id)
        return int(reply[1])

    def due_cancels(self, *, limit: int = 500) -> list[str]:
        """Running Attempts whose executor did not acknowledge a cancel in time."""
        due = self._run("due", {"index": self.keys.cancels}, {"limit": limit})
        return [str(m) for m in due[1:]]

    # ----------------------------------------------------------------- recovery

    def namespace(self) -> NamespaceInfo:
        """The namespace's state (ok | lost | recovering), epoch, claim sequence and fence floor."""
        return self._load_namespace()

    def recover(self, *, reason: str = "operator ran recover", actor: str | None = None,
                batch: int = 500) -> dict[str, Any]:
        """After Redis lost state: retire the epoch, raise the fence floor, void every live lease.

        Every Attempt that was running becomes suspect (its fence bumped above the new floor) and
        goes through reconciliation like any other expired lease. Safe to rerun if interrupted.
        """
        who = actor or self.actor
        begin = self._run("recover_begin", self._ns_keys(),
                          {"nonce": uuid.uuid4().hex[:8], "actor": who, "reason": reason})
        epoch, floor = str(begin[1]), int(begin[2])
        voided: list[ExpiredLease] = []
        while True:
            members = self.redis.zrange(self.keys.leases, 0, batch - 1)
            if not members:
                break
            voided.extend(self._expire([str(m) for m in members], who, force=True,
                                       reason="namespace recovery voided every lease"))
        fin = self._run("recover_finish", {"meta": self.keys.meta, "nslog": self.keys.nslog},
                        {"epoch": epoch, "actor": who, "voided": len(voided)})
        raise_for_reply(fin, script="recover_finish")
        self._epoch = None
        self._seq_seen = 0
        self._write_witness(epoch)
        return {"epoch": epoch, "fence_floor": floor, "voided_leases": [v.attempt_id for v in voided]}

    # ----------------------------------------------------------------- reads

    def get_task(self, task_id: str) -> Task:
        """The task with every Attempt and its whole event history (one round trip)."""
        tk = self._task_keys(task_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(tk.task)
        pipe.hgetall(tk.attempts)
        pipe.xrange(tk.events)
        fields, att, events = pipe.execute()
        if not fields:
            raise TaskNotFound(f"no task {task_id} in namespace {self.keys.prefix!r}", task_id=task_id)
        return Task.from_redis(fields, att, events)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per queue: task counts by state, and the queue age (oldest claimable pending Attempt)."""
        counts = cast(dict[str, str], self.redis.hgetall(self.keys.counts))
        queues = sorted(cast(set[str], self.redis.smembers(self.keys.queues)))
        out: dict[str, dict[str, Any]] = {q: {"counts": {}, "queue_age_ms": 0} for q in queues}
        for field, value in counts.items():
            queue, _, state = field.rpartition("|")
            if int(value):
                out.setdefault(queue, {"counts": {}, "queue_age_ms": 0})["counts"][state] = int(value)
        now_s, now_us = self.redis.time()
        now = int(now_s) * 1000 + int(now_us) // 1000
        pipe = self.redis.pipeline(transaction=False)
        for q in out:
            pipe.zrangebyscore(self.keys.pending(q), "-inf", now, start=0, num=1, withscores=True)
        for q, oldest in zip(out, pipe.execute(), strict=True):
            out[q]["queue_age_ms"] = max(0, now - int(oldest[0][1])) if oldest else 0
        return out

    def overview(self) -> dict[str, Any]:
        """Namespace-wide figures from the indexes (no scan of tasks): live leases, suspect or
        reconciling Attempts, attention items, quarantined tasks, dispatches due, namespace state."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.leases)
        pipe.zcard(self.keys.suspect)
        pipe.hlen(self.keys.attention)
        pipe.zcard(self.keys.dlq)
        pipe.hget(self.keys.meta, "state")
        leases, suspect, attention, dlq, state = pipe.execute()
        return {"leases_live": int(leases), "suspect": int(suspect), "attention": int(attention),
                "quarantined": int(dlq), "outbox_due": len(self.due_dispatches(limit=10_000)),
                "namespace_state": state or "missing"}

    def attention_items(self) -> list[dict[str, Any]]:
        """Open attention items (stopped or quarantined tasks), oldest task first."""
        raw = cast(dict[str, str], self.redis.hgetall(self.keys.attention))
        return [json.loads(raw[k]) for k in sorted(raw)]

    def namespace_events(self) -> list[dict[str, str]]:
        entries = cast(list[tuple[str, dict[str, str]]], self.redis.xrange(self.keys.nslog))
        return [dict(f, id=i) for i, f in entries]


def _attempt_from_snapshot(task_id: str, n: int, flat: list[Any]) -> Attempt:
    fields = {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}
    return Attempt.from_fields(task_id, n, fields)


def _decision_args(d: Decision | None, *, default: str) -> dict[str, Any]:
    return {"decision": d.action if d else default, "why": d.why if d else "",
            "next_reason": d.next_reason if d else "", "next_hypothesis": d.next_hypothesis if d else "",
            "delay_ms": int(d.delay_s * 1000) if d else 0,
            "attention": canonical_json(d.attention, what="attention") if d and d.attention else "",
            "budget": d.budget_exhausted if d else ""}


def _as_failure(failure: Failure | BaseException | Mapping[str, Any]) -> Failure:
    if isinstance(failure, Failure):
        if failure.fingerprint:
            return failure
        fp = fingerprint(failure.failure_class, failure.type, failure.message)
        return failure.model_copy(update={"fingerprint": fp})
    if isinstance(failure, BaseException):
        return classify(failure).failure
    if isinstance(failure, Mapping):
        try:
            return _as_failure(Failure.model_validate(dict(failure)))
        except Exception as exc:
            raise InvalidArgument(f"failure is not a valid Failure record: {exc}") from None
    raise InvalidArgument(f"failure must be a Failure, an exception or a mapping, got {type(failure).__name__}")

"""The lease holder's calls: claim an Attempt, renew its lease, record its phases, effects and
outcome, acknowledge a cancel. Every write but the claim is fenced: a stale holder's is refused."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..contracts.codec import (
    MAX_TOKENS,
    canonical_json,
    check_int,
    check_seconds,
    check_text,
    decimal_text,
    digest,
    model_json,
)
from ..contracts.config import Decision
from ..contracts.errors import Code, InvalidArgument, LimitKeysChanged, McqError, raise_for_reply
from ..contracts.keys import attempt_id, limit_names
from ..contracts.models import Attempt, EffectRecord, Failure, Heartbeat, Lease, Task, split_attempts
from ..store.backend import DEFAULT_LEASE_MS
from ..store.scripts import BatchCall
from .base import Role, as_failure, attempt_from_snapshot, decision_args, pairs, printable

# The fields of an effect record mc_queue writes itself (lua/includes/common.lua EFFECT_OWN_FIELDS).
EFFECT_OWN_FIELDS = frozenset({"state", "attempt", "fence", "worker", "intent_at", "key", "record_json",
                               "receipt_json", "receipt", "receipt_at", "receipt_attempt", "settled_by", "source",
                               "note"})


def check_effect_record(record: Any) -> None:
    """An intent record every reader can read: a JSON object with a non-empty ``operation`` and an
    ``identity`` (strings), and none of the fields mc_queue writes itself."""
    if not isinstance(record, Mapping):
        raise InvalidArgument(f"effect record must be a mapping, got {type(record).__name__}")
    op, ident = record.get("operation"), record.get("identity")
    if not isinstance(op, str) or not op:
        raise InvalidArgument(f"effect record needs an operation (a non-empty string), got {op!r}")
    check_text(op, what="effect operation", max_bytes=200)
    if not isinstance(ident, str):
        raise InvalidArgument(f"effect record needs an identity (a string), got {ident!r}")
    check_text(ident, what="effect identity", max_bytes=4096)
    own = sorted(EFFECT_OWN_FIELDS & set(record))
    if own:
        raise InvalidArgument(f"effect record fields {', '.join(own)} are written by mc_queue, not by the caller")



MAX_BATCH = 1000  # calls in one LeaseHolder.batch


@dataclass(frozen=True)
class Claim:
    """One claim of a batch (:meth:`LeaseHolder.claim_request`)."""

    task_id: str
    expect_attempt: int | None
    lease_ms: int | None
    request_id: str
    budget_ms: int | None = None  # the Attempt's timeout budget (the claim sets its deadline from it)
    limits: tuple[str, ...] = ()  # the task's rate limit keys, in its order (a wrong guess costs a resend)


@dataclass(frozen=True)
class Completion:
    """One completion of a batch: the Attempt, the fence it holds, its result and what it cost."""

    attempt_id: str
    fence: int
    result: Any
    cost: float = 0.0
    tokens: int = 0


@dataclass
class Batch:
    """What one :meth:`LeaseHolder.batch` did, item by item in the order asked: None (completed), a
    Heartbeat, a Lease, or the exception the single call would have raised."""

    completed: list[BaseException | None] = field(default_factory=list)
    renewed: list[Heartbeat | BaseException] = field(default_factory=list)
    claimed: list[Lease | BaseException] = field(default_factory=list)


class LeaseHolder(Role):
    """What a worker running an Attempt calls, under the lease it claimed."""

    def claim_attempt(self, task_id: str, worker_id: str, lease_ms: int | None = DEFAULT_LEASE_MS, *,
                      request_id: str | None = None, expect_attempt: int | None = None,
                      with_task: bool = False, budget_s: float | None = None,
                      limits: Sequence[str] = ()) -> Lease:
        """Atomically take the task's pending Attempt and a lease with a new fence.

        ``lease_ms=None``: the lease length frozen in the task at enqueue. ``expect_attempt``: refuse
        unless the pending Attempt is this one (a transport message for Attempt N must not run N+1).
        ``with_task``: the lease also carries the task as the claim left it (``Lease.task``: its fields
        and Attempts, no events), read by the claim itself: a worker needs no read after its claim.
        ``budget_s``: the Attempt's timeout budget: the claim records its deadline (now + budget_s on
        Redis's clock, never after the task's finish_by; ``Lease.deadline_ms``). ``limits``: the task's
        rate limit keys as its ``limits`` field names them (a worker reads them with the task before its
        claim); other ones cost one more round trip. Over a limit: :class:`OverLimit`, nothing held.
        """
        claim = self._claim_request(task_id, lease_ms, expect_attempt, request_id, budget_s, limits)
        check_text(worker_id, what="worker_id", max_bytes=200, spaces=False)
        try:
            return self._lease(self._with_epoch(
                lambda epoch: self._run("claim", *self._claim_call(claim, worker_id, with_task, epoch))),
                claim.task_id, worker_id, with_task)
        except LimitKeysChanged as exc:  # the task names other rate limits: once more with its own
            claim = dataclasses.replace(claim, limits=limit_names(exc.limits))
            return self._lease(self._with_epoch(
                lambda epoch: self._run("claim", *self._claim_call(claim, worker_id, with_task, epoch))),
                claim.task_id, worker_id, with_task)

    def _claim_request(self, task_id: str, lease_ms: int | None, expect_attempt: int | None,
                       request_id: str | None, budget_s: float | None = None,
                       limits: Sequence[str] = ()) -> Claim:
        self._task_keys(task_id)
        lease = None if lease_ms is None else self._lease_ms(lease_ms)
        if expect_attempt is not None:
            check_int(expect_attempt, what="expect_attempt", low=1, high=1_000_000)
        budget_ms = None
        if budget_s is not None:
            check_seconds(budget_s, what="budget_s", high=30 * 86_400)
            budget_ms = max(1, round(budget_s * 1000))
        names = tuple(limits)
        for name in names:
            self.keys.limit_log(name)  # ValueError for a malformed key
        return Claim(task_id, expect_attempt, lease, request_id or uuid.uuid4().hex, budget_ms, names)

    def _claim_call(self, c: Claim, worker_id: str, with_task: bool,
                    epoch: str) -> tuple[dict[str, str], dict[str, Any], list[tuple[dict[str, str], dict[str, str]]]]:
        tk = self.keys.task(c.task_id)
        return ({**self._ns_keys(), "stats": self.keys.stats, "counts": self.keys.counts, "leases": self.keys.leases,
                 "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events, "pending": tk.pending,
                 "fence": tk.fence, "lease": tk.lease, "paused": self.keys.paused, "limits": self.keys.limits,
                 **self._end_keys(tk), "slotheld": self.keys.slotheld, "slotwait": self.keys.slotwait,
                 "spent": self.keys.spent},
                {"worker": worker_id, "lease_ms": c.lease_ms, "epoch": epoch, "min_seq": self.ns.seq_seen,
                 "request_id": c.request_id, "expect_n": c.expect_attempt, "with_task": "1" if with_task else "",
                 "budget_ms": c.budget_ms},
                [({"log": self.keys.limit_log(name)}, {"limit_key": name}) for name in c.limits])

    def _lease(self, reply: list[Any], task_id: str, worker_id: str, with_task: bool) -> Lease:
        """The Lease a claim's reply grants (its error raised)."""
        raise_for_reply(reply, script="claim", task_id=task_id)
        n, fence, seq = int(reply[1]), int(reply[2]), int(reply[4])
        aid = attempt_id(task_id, n)
        self.ns.note_claim(aid, fence, seq)
        task = None
        if with_task:
            own, att = split_attempts(pairs(reply[9]), pairs(reply[10]))
            task = Task.from_redis(own, att, [], fence=str(fence),
                                   lease_pttl_ms=max(0, int(reply[3]) - int(reply[5])))
        return Lease(attempt_id=aid, fence=fence, expires_at_ms=int(reply[3]), worker_id=worker_id, task_id=task_id,
                     number=n, seq=seq, lease_ms=int(reply[6] or 0), recovered_at_ms=int(reply[7] or 0), task=task,
                     claimed_now_ms=int(reply[5]), deadline_ms=int(reply[8] or 0))

    def renew_lease(self, attempt_id: str, fence: int, *, worker_id: str = "",
                    lease_ms: int | None = None) -> int:
        """Extend the lease; returns the new expiry (ms, Redis clock). Raises StaleFence/LeaseExpired."""
        return self.heartbeat(attempt_id, fence, worker_id=worker_id, lease_ms=lease_ms).expires_at_ms

    def heartbeat(self, attempt_id: str, fence: int, *, worker_id: str = "", lease_ms: int | None = None,
                  cost: float = 0.0, tokens: int = 0, request_id: str | None = None) -> Heartbeat:
        """Renew the lease and charge cost/tokens to the Attempt (once per request id)."""
        task_id = self._attempt(attempt_id)[0]
        reply = self._run("renew", *self._renew_call(attempt_id, fence, worker_id, lease_ms, cost, tokens, request_id))
        return self._heartbeat(reply, attempt_id, task_id, fence)

    def _renew_call(self, attempt_id: str, fence: int, worker_id: str, lease_ms: int | None, cost: float,
                    tokens: int, request_id: str | None) -> tuple[dict[str, str], dict[str, Any]]:
        _, n, tk = self._attempt(attempt_id)
        charge = decimal_text(cost, what="cost")
        check_int(tokens, what="tokens", high=MAX_TOKENS)
        lease = None if lease_ms is None else self._lease_ms(lease_ms)
        charging = cost > 0 or tokens > 0
        return ({**self._ns_keys(), "leases": self.keys.leases, "task": tk.task, "attempts": tk.attempts_v1,
                 "stats": self.keys.stats, "events": tk.events, "fence": tk.fence, "lease": tk.lease},
                {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "lease_ms": lease, "cost": charge,
                 "tokens": tokens, "request_id": (request_id or uuid.uuid4().hex) if charging else ""})

    @staticmethod
    def _heartbeat(reply: list[Any], attempt_id: str, task_id: str, fence: int) -> Heartbeat:
        raise_for_reply(reply, script="renew", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return Heartbeat(int(reply[1]), reply[2] == "1", float(reply[3]), int(reply[4]))

    def complete_attempt(self, attempt_id: str, fence: int, result: Any = None, *, worker_id: str = "",
                         cost: float = 0.0, tokens: int = 0) -> Attempt:
        """Record success. Same fence + same result again is a no-op; a different result a conflict."""
        task_id, n, reply = self.complete_quietly(attempt_id, fence, result, worker_id=worker_id, cost=cost,
                                                  tokens=tokens, snapshot=True)
        return attempt_from_snapshot(task_id, n, reply[2])

    def complete_quietly(self, attempt_id: str, fence: int, result: Any, *, worker_id: str, cost: float = 0.0,
                         tokens: int = 0, snapshot: bool = False) -> tuple[str, int, list[Any]]:
        """complete_attempt without building the Attempt record (the worker's hot path): the script sends
        the Attempt's fields back only with ``snapshot``."""
        task_id, n, _ = self._attempt(attempt_id)
        reply = self._run("complete", *self._complete_call(
            Completion(attempt_id, fence, result, cost, tokens), worker_id, snapshot))
        raise_for_reply(reply, script="complete", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return task_id, n, reply

    def _complete_call(self, c: Completion, worker_id: str,
                       snapshot: bool = False) -> tuple[dict[str, str], dict[str, Any]]:
        _, n, tk = self._attempt(c.attempt_id)
        text = canonical_json(c.result, what="result")
        return ({**self._ns_keys(), "counts": self.keys.counts, "leases": self.keys.leases, "task": tk.task,
                 "stats": self.keys.stats, "attempts": tk.attempts_v1, "events": tk.events, "fence": tk.fence,
                 "lease": tk.lease, **self._end_keys(tk), **self._slot_keys()},
                {"n": n, **self._fenced_args(c.attempt_id, c.fence, worker_id), "result": text,
                 "result_digest": digest(text), "cost": decimal_text(c.cost, what="cost"),
                 "tokens": check_int(c.tokens, what="tokens", high=MAX_TOKENS), "snapshot": "1" if snapshot else ""})

    def batch(self, worker_id: str, *, complete: Sequence[Completion] = (), claim: Sequence[Claim] = (),
              renew: Sequence[tuple[str, int]] = (), with_task: bool = True) -> Batch:
        """Complete, claim and renew many Attempts in one round trip (a worker's batch mode), each one
        still its own script: fenced, leased and evented on its own, refused on its own. Every
        argument of every item is checked before anything is sent (an InvalidArgument sends nothing).
        Completions run first, then renewals, then claims (a claim may take an Attempt whose message
        came with the ones just finished). ``claim``: from :meth:`claim_request`. ``renew``: (attempt id,
        fence) pairs, renewed by the lease length each was claimed with, charging nothing. Each
        outcome is the value or the exception the single call would have raised; an Attempt claimed
        twice by one batch answers the second as the script does (DUP with the same request id, else
        refused). With ``min_replicas`` a batch WAIT did not confirm raises ReplicationUnconfirmed, whose
        ``replies`` hold each script's reply (applied on the primary only)."""
        check_text(worker_id, what="worker_id", max_bytes=200, spaces=False)
        size = len(complete) + len(claim) + len(renew)
        if size > MAX_BATCH:
            raise InvalidArgument(f"a batch holds at most {MAX_BATCH} calls, got {size}")
        epoch = self._epoch()
        calls: list[BatchCall] = []
        calls += [("complete", *self._complete_call(c, worker_id)) for c in complete]
        calls += [("renew", *self._renew_call(a, f, worker_id, None, 0.0, 0, None)) for a, f in renew]
        calls += [("claim", *self._claim_call(c, worker_id, with_task, epoch)) for c in claim]
        replies = self.backend.run_batch(calls)
        first = len(complete) + len(renew)
        stale = [i for i in range(first, len(calls)) if isinstance(replies[i], list) and replies[i][0] == Code.E_EPOCH]
        if stale:  # a recovery elsewhere retired the epoch: those claims wrote nothing; once more with the new one
            self.ns.forget()
            epoch = self._epoch()
            again = self.backend.run_batch([("claim", *self._claim_call(claim[i - first], worker_id, with_task, epoch))
                                            for i in stale])
            for i, reply in zip(stale, again, strict=True):
                replies[i] = reply
        out = Batch()
        for i, reply in enumerate(replies):
            try:
                if isinstance(reply, BaseException):
                    raise reply
                if i < len(complete):
                    c = complete[i]
                    raise_for_reply(reply, script="complete", task_id=c.attempt_id.rpartition("/")[0],
                                    attempt_id=c.attempt_id, presented_fence=c.fence)
                    out.completed.append(None)
                elif i < first:
                    aid, fence = renew[i - len(complete)]
                    out.renewed.append(self._heartbeat(reply, aid, aid.rpartition("/")[0], fence))
                else:
                    out.claimed.append(self._lease(reply, claim[i - first].task_id, worker_id, with_task))
            except (McqError, redis.RedisError) as exc:
                (out.completed if i < len(complete) else out.renewed if i < first else out.claimed).append(exc)
        return out

    def claim_request(self, task_id: str, *, lease_ms: int | None = None, expect_attempt: int | None = None,
                      budget_s: float | None = None, limits: Sequence[str] = (),
                      request_id: str | None = None) -> Claim:
        """One claim of a :meth:`batch`, its arguments checked now (as :meth:`claim_attempt` takes them;
        the lease length is the task's unless ``lease_ms``)."""
        return self._claim_request(task_id, lease_ms, expect_attempt, request_id, budget_s, limits)

    def fail_attempt(self, attempt_id: str, fence: int, failure: Failure | Mapping[str, Any], *,
                     worker_id: str = "", cost: float = 0.0, tokens: int = 0,
                     decision: Decision | None = None) -> Attempt:
        """Record a classified failure, and apply the policy's decision in the same step.

        Without a decision the task waits in ``failed`` for a person (``retry_task``). Classify an
        exception first with :func:`mc_queue.policy.classify.classify` (``classify(exc).failure``).
        """
        task_id, n, tk = self._attempt(attempt_id)
        f = as_failure(failure)
        text = model_json(f)
        reply = self._run("fail", {
            **self._ns_keys(), "counts": self.keys.counts, "leases": self.keys.leases, "task": tk.task,
            "stats": self.keys.stats, "attempts": tk.attempts_v1, "events": tk.events, "pending": tk.pending,
            "attention": self.keys.attention, "dlq": self.keys.dlq, "fence": tk.fence,
            "lease": tk.lease, **self._end_keys(tk), **self._slot_keys(),
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "failure": text,
            "failure_digest": digest(text), "fclass": f.failure_class.value, "fingerprint": f.fingerprint,
            "cost": decimal_text(cost, what="cost"), "tokens": check_int(tokens, what="tokens", high=MAX_TOKENS),
            **decision_args(decision, default="")})
        raise_for_reply(reply, script="fail", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return attempt_from_snapshot(task_id, n, reply[2])

    def checkpoint(self, attempt_id: str, fence: int, phase: str, phase_index: int, record: Mapping[str, Any], *,
                   worker_id: str = "") -> bool:
        """Record a phase reached by a running Attempt (fenced, monotonic). False when already recorded."""
        task_id, n, tk = self._attempt(attempt_id)
        check_text(phase, what="phase", max_bytes=128, spaces=False)
        check_int(phase_index, what="phase_index", high=1000)
        text = canonical_json(dict(record), what="checkpoint")
        reply = self._run("checkpoint", {
            **self._ns_keys(), "stats": self.keys.stats, "task": tk.task, "attempts": tk.attempts_v1,
            "events": tk.events, "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "phase": phase, "phase_index": phase_index,
            "record": text, "digest": digest(text)})
        raise_for_reply(reply, script="checkpoint", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return bool(reply[0] == Code.OK)

    def stamp_limit(self, attempt_id: str, fence: int, key: str, *, worker_id: str = "") -> int | None:
        """The tool gateway of rate limit ``key`` (one the task names): the Attempt is about to call its
        provider, and the units its claim took count from now (fenced; ``lua/limit_stamp.lua``). Returns
        the time stamped (ms, Redis clock), None when the key has no limit set. :class:`OverLimit` when the
        call comes more than a window after the claim and the units are taken (``due_ms``: when back)."""
        reply = self._stamp(attempt_id, fence, key, worker_id, "")
        return int(reply[1]) if reply[1] else None

    def stamp_fallback(self, attempt_id: str, fence: int, key: str, primary: str, *, worker_id: str = "") -> bool:
        """The gateway of ``key`` called in place of ``primary`` (one of its declared fallbacks; the task
        names both), whose breaker is down: as :meth:`stamp_limit`, and the switch recorded on the Attempt
        once (``fallbacks``, a ``fallback_used`` event). False, nothing written: the primary is up, call it."""
        return str(self._stamp(attempt_id, fence, key, worker_id, primary)[0]) != "NOOP"

    def stamp_skip(self, attempt_id: str, fence: int, key: str, *, worker_id: str = "") -> bool:
        """The step calling ``key`` (one the task names, whose last declared fallback is ``SKIP_STEP``) is
        skipped while its breaker is down: recorded on the Attempt once (``fallbacks``: key -> ``SKIP_STEP``, a
        ``step_skipped`` event), fenced. False, nothing written: the key is up, call it."""
        return str(self._stamp(attempt_id, fence, key, worker_id, "", skip=True)[0]) != "NOOP"

    def _stamp(self, attempt_id: str, fence: int, key: str, worker_id: str, primary: str, *,
               skip: bool = False) -> list[Any]:
        task_id, n, tk = self._attempt(attempt_id)
        try:
            log = self.keys.limit_log(key)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        reply = self._run("limit_stamp", {
            **self._ns_keys(), "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events,
            "stats": self.keys.stats, "fence": tk.fence, "lease": tk.lease, "limits": self.keys.limits, "log": log,
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "key": key, "fallback_for": primary,
            "skip": "1" if skip else ""})
        raise_for_reply(reply, script="limit_stamp", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return reply

    def effect_begin(self, attempt_id: str, fence: int, key: str, record: Mapping[str, Any], *,
                     worker_id: str = "") -> tuple[str, EffectRecord | None]:
        """Persist an effect's intent (fenced). Returns ("OK", None) to go ahead, ("DONE", record) to
        replay its receipt, or ("PENDING", record) when an earlier intent must be reconciled first."""
        task_id, n, tk = self._attempt(attempt_id)
        check_text(key, what="effect key", max_bytes=512, spaces=False)
        check_effect_record(record)
        reply = self._run("effect_begin", {
            **self._ns_keys(), "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events, "effects": tk.effects,
            "stats": self.keys.stats, "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "key": key,
            "record": canonical_json(dict(record), what="effect record")})
        raise_for_reply(reply, script="effect_begin", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        status = str(reply[0])
        return status, (EffectRecord.from_json(reply[1]) if len(reply) > 1 else None)

    def effect_done(self, attempt_id: str, fence: int | None, key: str, outcome: str, receipt: Any = None, *,
                    source: str = "perform", actor: str = "") -> EffectRecord:
        """Record a receipt ('done'), or as reconciler (fence None) 'absent' / 'unknown' with a note."""
        task_id, n, tk = self._attempt(attempt_id)
        who = actor or self.actor
        check_text(key, what="effect key", max_bytes=512, spaces=False)
        if outcome == "done":
            text = canonical_json(receipt, what="receipt")
        else:
            text = printable(str(receipt or ""), 65_536)  # a provider's words: recorded, made one line
        if fence is None:
            fenced: dict[str, Any] = {"fence": "", "worker": check_text(who, what="actor", max_bytes=200),
                                      "epoch": self._epoch(), "min_seq": self.ns.seq_seen, "proof": ""}
        else:
            fenced = self._fenced_args(attempt_id, fence, who)
        fenced["actor"] = fenced.pop("worker")
        reply = self._run("effect_done", {
            **self._ns_keys(), "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events, "effects": tk.effects,
            "stats": self.keys.stats, "fence": tk.fence, "lease": tk.lease,
        }, {"n": n, **fenced, "key": key, "outcome": outcome, "receipt": text, "source": source})
        raise_for_reply(reply, script="effect_done", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return EffectRecord.from_json(reply[1])

    def acknowledge_cancel(self, attempt_id: str, fence: int, *, worker_id: str = "",
                           request_id: str | None = None) -> int:
        """The executor stops: it gives up its lease (the fence moves on) and waits for reconciliation."""
        task_id, n, tk = self._attempt(attempt_id)
        reply = self._run("cancel_ack", {
            **self._ns_keys(), "stats": self.keys.stats, "leases": self.keys.leases, "suspect": self.keys.suspect,
            "cancels": self.keys.cancels, "task": tk.task, "attempts": tk.attempts_v1, "events": tk.events,
            "fence": tk.fence, "lease": tk.lease, **self._slot_keys(),
        }, {"n": n, **self._fenced_args(attempt_id, fence, worker_id), "request_id": request_id or uuid.uuid4().hex})
        raise_for_reply(reply, script="cancel_ack", task_id=task_id, attempt_id=attempt_id, presented_fence=fence)
        return int(reply[1])

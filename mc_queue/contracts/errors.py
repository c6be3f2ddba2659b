"""One error tree, the reply codes of the Lua scripts as one enum, and the one mapping between them.

Every exception carries the task, the attempt, the script and the reply code it came from, so a log
line says which contract refused what and why. The scripts' headers declare their codes (``Returns:``);
a test checks that every code a header names is a member of :class:`Code` and mapped here.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any


class Code(StrEnum):
    """Every first element a script's reply can have."""

    OK = "OK"                # done
    DUP = "DUP"              # done before: the same request again (idempotent replay)
    NOOP = "NOOP"            # nothing to do (re-checked condition no longer holds)
    DONE = "DONE"            # effect_begin: the receipt is on file, replay it
    PENDING = "PENDING"      # effect_begin: an intent without receipt, reconcile first
    E_BADARG = "E_BADARG"    # an argument is malformed or out of bounds: nothing was read or written
    E_NOTASK = "E_NOTASK"    # no such task
    E_NSLOST = "E_NSLOST"    # the namespace lost state (or is recovering): run `mcq recover`
    E_NONS = "E_NONS"        # no such namespace yet, and the caller presented no epoch: nothing written
    E_EPOCH = "E_EPOCH"      # the caller's epoch was retired by a recovery: reload and resend
    E_SCHEMA = "E_SCHEMA"    # the namespace was made by another mc_queue version
    E_STALE = "E_STALE"      # a fenced write with a fence that is not the current one
    E_STATE = "E_STATE"      # the attempt or task is not in a state this transition starts from
    E_EXPIRED = "E_EXPIRED"  # the fence is current but the lease ran out
    E_CLAIM = "E_CLAIM"      # the attempt is not claimable
    E_CONFLICT = "E_CONFLICT"  # the same identity with another content
    E_RETRY = "E_RETRY"      # Mission Control's retry rules refused a new attempt
    E_CANCELED = "E_CANCELED"  # a cancel was requested: acknowledge instead
    E_CANCEL = "E_CANCEL"    # cancel_ack without a cancel request
    E_PHASE = "E_PHASE"      # a checkpoint out of order
    E_NOEFFECT = "E_NOEFFECT"  # a receipt for an effect with no intent on file
    E_PURGED = "E_PURGED"    # the task (of this id or producer key) was purged
    E_OVERLOADED = "E_OVERLOADED"  # Redis memory above the enqueue high-water mark: new work refused
    E_CHANGED = "E_CHANGED"  # pack: the task changed since it was read (the sweeper reads it again)
    E_LIMITED = "E_LIMITED"  # claim: over a rate limit (or paused); offered again when the units return
    E_LIMITKEYS = "E_LIMITKEYS"  # claim: the limit logs given are not the task's limits (send them again)
    E_OPEN = "E_OPEN"        # limit_stamp: the dependency's circuit breaker is open (or half-open, no probe)
    E_FULL = "E_FULL"        # enqueue: the queue is at its cap (or the task could not start by its start_by)
    E_REJECTED = "E_REJECTED"  # claim: a full concurrency key that rejects the newest canceled the task


SUCCESS_CODES = frozenset({Code.OK, Code.DUP, Code.NOOP, Code.DONE, Code.PENDING})


class McqError(Exception):
    """Base of every mc_queue error."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        attempt_id: str | None = None,
        script: str | None = None,
        code: str | None = None,
        detail: list[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id
        self.attempt_id = attempt_id
        self.script = script
        self.code = code
        self.detail = detail or []


class InvalidArgument(McqError, ValueError):
    """Bad input: nothing was written. The message says what was wrong and what to do."""


class InvalidPayload(InvalidArgument):
    """The payload is not a JSON object mc_queue can store (refused at enqueue, nothing written)."""


class IdempotencyConflict(McqError):
    """The producer's idempotency key already names a task with a different payload or handler."""


class TaskNotFound(McqError, LookupError):
    """No task with that id in this namespace."""


class TransitionRefused(McqError):
    """A state rule refused the transition (recorded as an event where the task exists)."""


class ClaimRejected(TransitionRefused):
    """The Attempt is not claimable: another worker holds it, it is done, or it is not due yet."""


class OverLimit(ClaimRejected):
    """Not claimed: the task's rate limit has no room for its cost now, or is paused, or a concurrency key
    it names has every slot held. Nothing is held: the Attempt stays pending, due again at ``due_ms`` (Redis
    clock) when the units return, or woken when a slot does. ``supersede``: the attempt id of the key's
    oldest holder, when the key supersedes the running one (the caller cancels its task), else ''."""

    def __init__(self, message: str, *, due_ms: int = 0, supersede: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.due_ms = due_ms
        self.supersede = supersede


class SlotRejected(ClaimRejected):
    """Not claimed, and the task is canceled: a concurrency key it names has every slot held and rejects
    the newest when full (the reason is in the task's history)."""


class BreakerOpen(TransitionRefused):
    """A dependency call refused before it started: its circuit breaker is open (``until_ms``: when it
    half-opens, Redis clock), or half-open and this Attempt is not one of its probes."""

    def __init__(self, message: str, *, until_ms: int = 0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.until_ms = until_ms


class LimitKeysChanged(ClaimRejected):
    """The claim named other rate limits than the task's (``limits``: the task's own, to claim again with)."""

    def __init__(self, message: str, *, limits: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.limits = limits


class RetryRefused(TransitionRefused):
    """Mission Control's retry rules refused a new Attempt (see the message for which one)."""


class TaskPurged(TransitionRefused):
    """The task this id or producer key names was purged: it does not run again until its tombstone expires."""


class EffectNotBegun(TransitionRefused, InvalidArgument):
    """A receipt for an effect with no intent on file (``effect_begin`` must come first): refused and
    recorded as an ``effect_refused`` event on the task. An InvalidArgument too: the caller's order
    of calls was wrong, nothing was written."""


class Overloaded(McqError):
    """Redis's used memory is above the enqueue high-water mark (90% of ``maxmemory``): new work is
    refused, nothing was written, work already admitted goes on. Retry later (with the same
    idempotency key), or free memory: purge finished tasks, raise ``maxmemory``."""


class QueueFull(Overloaded):
    """The queue is at its cap (backpressure: ``mcq caps``; the lowest priorities are refused first), or the
    task could not start by its start_by at the queue's present age. Nothing was written. ``retry_after_s``:
    an estimate of when there may be room (0: a deadline that cannot be met, do not retry as is)."""

    def __init__(self, message: str, *, retry_after_s: float = 0.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class WriteRefused(McqError):
    """A fenced write (renew, complete, fail) was refused and kept as a stale_write_refused event.

    ``presented_fence`` is what the caller held; ``current_fence`` what the task holds now.
    """

    def __init__(self, message: str, *, presented_fence: int | None = None, current_fence: int | None = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.presented_fence = presented_fence
        self.current_fence = current_fence


class StaleFence(WriteRefused):
    """The presented fence is not the task's current one: ownership moved on."""


class LeaseExpired(WriteRefused):
    """The fence is current but the lease has run out (Redis clock); the sweeper will make it suspect."""


class AttemptNotRunning(WriteRefused):
    """The fence is current but the Attempt is no longer running (already settled)."""


class PhaseOutOfOrder(TransitionRefused):
    """A checkpoint for a phase at or before the Attempt's last one (phases are monotonic)."""


class CancelRequested(TransitionRefused):
    """A cancellation was requested: no new effect, checkpoint, completion or failure; acknowledge."""


class ResultConflict(McqError):
    """The Attempt was already settled with the same fence and a different result or failure."""


class NamespaceLost(McqError):
    """Redis lost acknowledged state (restart without its data, flush, older snapshot).

    Claims and other transitions are refused until ``mcq recover`` has run.
    """


class NamespaceMissing(McqError):
    """The namespace does not exist yet and the caller never loaded it (no epoch): nothing was written.
    Not a loss: the first writer creates the namespace. Maintenance on it has nothing to do."""


class ConfigurationError(McqError):
    """mc_queue cannot start as configured (no redis-server binary, bad URL, ...)."""


class OutcomeUnknown(McqError):
    """The connection failed after a script that is not safe to resend was sent: it may or may not
    have run. Read the state back before doing anything else."""


class ReplicationUnconfirmed(WriteRefused, OutcomeUnknown):
    """The write is applied on the primary, but ``WAIT`` did not confirm it on ``min_replicas``
    replicas within ``replica_timeout_ms``: a failover now could lose it. Its fate is reconciled,
    never assumed: a producer resends with the same idempotency key (the same task comes back); a
    worker does not go on with the Attempt (no side effect, no further write): its lease runs out
    and the sweeper reconciles what was done.

    A :class:`WriteRefused` for the worker's code paths (the handler's context turns it into
    ``LeaseLost``, the worker stops the Attempt without recording a decision), and an
    :class:`OutcomeUnknown` for everyone else: what was acknowledged is not yet durable.
    ``acked`` is how many replicas confirmed, ``wanted`` the policy's ``min_replicas``.
    """

    def __init__(self, message: str, *, acked: int = 0, wanted: int = 0, timeout_ms: int = 0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.acked = acked
        self.wanted = wanted
        self.timeout_ms = timeout_ms
        self.replies: list[Any] = []  # a batch's replies, each applied on the primary (ScriptRunner.run_batch)


# What a caller does after ReplicationUnconfirmed, per script (the write is on the primary only).
_UNCONFIRMED_ADVICE: dict[str, str] = {
    "enqueue": "resend it with the same idempotency key (the same task comes back, dispatched once); without a "
               "key a resend makes a second task, so read it back with get_task first",
    "claim": "do not run the Attempt: its lease runs out and the sweeper reconciles it (nothing was done)",
    "effect_begin": "do not call the provider: stop the Attempt; its lease runs out and the sweeper reconciles "
                    "the intent with the provider",
    "effect_done": "the provider did the effect; stop the Attempt: the sweeper finds the receipt, or asks the "
                   "provider by key",
    "checkpoint": "stop the Attempt: its lease runs out and the sweeper reconciles it",
    "complete": "stop here: if a failover loses the completion, the lease runs out and the sweeper settles the "
                "Attempt from its recorded result and receipts",
    "fail": "stop here: if a failover loses the failure, the lease runs out and the sweeper reconciles the Attempt",
    "cancel_ack": "stop here: if a failover loses it, the sweeper voids the lease after the cancel timeout",
}


def replication_unconfirmed(script: str, *, acked: int, wanted: int, timeout_ms: int) -> ReplicationUnconfirmed:
    """The exception for a write WAIT did not confirm on enough replicas, with what to do next."""
    advice = _UNCONFIRMED_ADVICE.get(script, "read the state back before acting on it; a sweeper pass or the "
                                             "same call again (with the same request id) reconciles it")
    return ReplicationUnconfirmed(
        f"{script}: the write is applied on the primary but only {acked} of {wanted} replica(s) confirmed it "
        f"within {timeout_ms} ms (min_replicas={wanted}); a failover now could lose it. Its fate is reconciled, "
        f"never assumed: {advice}", acked=acked, wanted=wanted, timeout_ms=timeout_ms, script=script,
        code="UNCONFIRMED")


_FENCED_SCRIPTS = frozenset({"renew", "complete", "fail", "checkpoint", "effect_begin", "effect_done", "cancel_ack",
                             "limit_stamp"})
_STATE_MESSAGES: dict[str, Callable[[str, str], str]] = {
    "cancel": lambda where, first: f"cancel of {where} refused: the task is {first} already",
    "dlq_replay": lambda where, first: f"replay of {where} refused: the task is {first}, not quarantined",
    "dlq_purge": lambda where, first: f"purge of {where} refused: the task is {first}, not quarantined",
    "recover_finish": lambda where, first: f"recovery cannot finish: {first}",
    "index_drop": lambda where, first: f"the index entry {where} is right (attempt {first}): not dropped",
    "periodic_pause": lambda where, first: f"{first}: `mcq schedule list` shows the published ones",
    "enqueue_after": lambda where, first: f"enqueue of {where} refused: {first}",
}


def raise_for_reply(
    reply: list[Any],
    *,
    script: str,
    task_id: str | None = None,
    attempt_id: str | None = None,
    presented_fence: int | None = None,
) -> None:
    """Raise the exception for an error reply from a script; return for a success code."""
    try:
        code = Code(str(reply[0]))
    except ValueError:
        if isinstance(reply[0], int) and script == "due":
            return
        raise McqError(f"{script} replied with an unknown code {reply[0]!r}", script=script) from None
    if code in SUCCESS_CODES:
        return
    detail = [str(x) for x in reply[1:] if not isinstance(x, list)]
    ctx: dict[str, Any] = dict(task_id=task_id, attempt_id=attempt_id, script=script, code=code.value, detail=detail)
    where = attempt_id or task_id or "namespace"
    first = detail[0] if detail else ""
    second = detail[1] if len(detail) > 1 else ""
    if code in (Code.E_STALE, Code.E_STATE, Code.E_EXPIRED) and script in _FENCED_SCRIPTS \
            and presented_fence is not None:
        current = int(first) if first.isdigit() else None
        fenced = dict(presented_fence=presented_fence, current_fence=current, **ctx)
        if code is Code.E_STALE:
            raise StaleFence(
                f"{script} of {where} refused: fence {presented_fence} is stale (current fence {current}); "
                "the refusal is recorded as a stale_write_refused event", **fenced)
        if code is Code.E_EXPIRED:
            raise LeaseExpired(
                f"{script} of {where} refused: the lease of fence {presented_fence} expired (Redis clock); "
                "the refusal is recorded as a stale_write_refused event", **fenced)
        raise AttemptNotRunning(f"{script} of {where} refused: the attempt is {second or '?'}, not running", **fenced)
    if code is Code.E_CLAIM:
        holder = f" (held by {second})" if second else ""
        raise ClaimRejected(f"claim of {where} rejected: {first}{holder}", **ctx)
    if code is Code.E_LIMITED:
        third = detail[2] if len(detail) > 2 else ""
        if first.startswith("concurrency key "):
            raise OverLimit(f"{script} of {where} waits for a slot: {first}"
                            + (f"; superseding {third}" if third else ""),
                            due_ms=int(second) if second.isdigit() else 0, supersede=third, **ctx)
        raise OverLimit(f"{script} of {where} deferred: {first}; units back at {second} ms (Redis clock)",
                        due_ms=int(second) if second.isdigit() else 0, **ctx)
    if code is Code.E_REJECTED:
        raise SlotRejected(f"claim of {where} rejected, the task is canceled: {first}", **ctx)
    if code is Code.E_OPEN:
        raise BreakerOpen(f"{script} of {where} refused: {first}", until_ms=int(second) if second.isdigit() else 0,
                          **ctx)
    if code is Code.E_LIMITKEYS:
        raise LimitKeysChanged(f"claim of {where} named other rate limits than the task's ({first or 'none'})",
                               limits=first, **ctx)
    if code is Code.E_CANCELED:
        raise CancelRequested(f"{script} of {where} refused: cancellation was requested ({first}); "
                              "acknowledge it instead", **ctx)
    if code is Code.E_CANCEL:
        raise TransitionRefused(f"{script} of {where} refused: no cancellation was requested", **ctx)
    if code is Code.E_PHASE:
        raise PhaseOutOfOrder(f"checkpoint of {where} refused: phases are monotonic and the attempt is already "
                              f"at {first!r}", **ctx)
    if code is Code.E_STATE:
        message = _STATE_MESSAGES.get(script)
        text = message(where, first) if message else f"{script} of {where} refused: attempt is {first}"
        raise TransitionRefused(text, **ctx)
    if code is Code.E_CONFLICT:
        if script in ("enqueue", "enqueue_after"):
            raise IdempotencyConflict(
                f"idempotency key already names task {first} with a different payload or handler; "
                "send the same payload to get that task back, or use a new key for new work", **ctx)
        if script == "effect_done":
            raise ResultConflict(f"effect_done of {where} refused: another receipt is on file for this key", **ctx)
        raise ResultConflict(
            f"{script} of {where} refused: already settled with this fence and a different "
            f"result (recorded digest {first})", **ctx)
    if code is Code.E_PURGED:
        raise TaskPurged(
            f"task {first} was purged; its id and producer key are refused until {second or 'its tombstone expires'} "
            "(ms, Redis clock): the work does not run again. Use a new key for new work", **ctx)
    if code is Code.E_CHANGED:
        raise TransitionRefused(f"{script} of {where} refused: {first or 'the task changed since it was read'}", **ctx)
    if code is Code.E_NOTASK and script == "enqueue_after":
        raise TaskNotFound(f"enqueue of {where} refused: {first}", **ctx)
    if code is Code.E_NOTASK:
        raise TaskNotFound(f"no task {task_id or where!s} in this namespace", **ctx)
    if code is Code.E_NOEFFECT:
        raise EffectNotBegun(f"effect_done of {where} refused: no intent on file for this effect ({first}); "
                             "call effect_begin first (Context.effect does both)", **ctx)
    if code is Code.E_RETRY:
        raise RetryRefused(f"retry of {where} refused: {first}", **ctx)
    if code is Code.E_NSLOST:
        raise NamespaceLost(f"{first}. Claims are refused until `mcq recover` has run.", **ctx)
    if code is Code.E_NONS:
        raise NamespaceMissing(f"{script}: {first}", **ctx)
    if code is Code.E_SCHEMA:
        raise ConfigurationError(
            f"the namespace was created by another version of mc_queue (schema {first}); drain it with that "
            "version or use a new --prefix", **ctx)
    if code is Code.E_FULL:
        after = int(second) / 1000 if second.isdigit() else 0.0
        raise QueueFull(f"{script} refused: {first}" + (f"; retry in about {after:.0f} s" if after else ""),
                        retry_after_s=after, **ctx)
    if code is Code.E_OVERLOADED:
        raise Overloaded(f"{script} refused: {first}", **ctx)
    if code is Code.E_BADARG:
        raise InvalidArgument(f"{script}: {first}", **ctx)
    raise McqError(f"{script} of {where} failed with {code.value}: {' '.join(detail)}", **ctx)  # E_EPOCH: internal

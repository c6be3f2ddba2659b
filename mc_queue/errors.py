"""One error tree, and the one mapping from script reply codes to exceptions.

Every exception carries the task, the attempt, the script and the reply code it came from, so a log
line says which contract refused what and why.
"""

from __future__ import annotations

from typing import Any


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


class RetryRefused(TransitionRefused):
    """Mission Control's retry rules refused a new Attempt (see the message for which one)."""


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


class ConfigurationError(McqError):
    """mc_queue cannot start as configured (no redis-server binary, bad URL, ...)."""


def raise_for_reply(
    reply: list[Any],
    *,
    script: str,
    task_id: str | None = None,
    attempt_id: str | None = None,
    presented_fence: int | None = None,
) -> None:
    """Raise the exception for an error reply from a script; return for OK/DUP/NOOP replies."""
    code = str(reply[0])
    if not code.startswith("E_"):
        return
    detail = [str(x) for x in reply[1:] if not isinstance(x, list)]
    ctx: dict[str, Any] = dict(task_id=task_id, attempt_id=attempt_id, script=script, code=code, detail=detail)
    where = attempt_id or task_id or "namespace"
    first = detail[0] if detail else ""
    if code == "E_CLAIM":
        holder = f" (held by {detail[1]})" if len(detail) > 1 and detail[1] else ""
        raise ClaimRejected(f"claim of {where} rejected: {first}{holder}", **ctx)
    if code in ("E_STALE", "E_STATE", "E_EXPIRED") and script in (
            "renew", "complete", "fail", "checkpoint", "effect_begin", "effect_done", "cancel_ack"
    ) and presented_fence is not None:
        current = int(first) if first.isdigit() else None
        fenced = dict(presented_fence=presented_fence, current_fence=current, **ctx)
        if code == "E_STALE":
            raise StaleFence(
                f"{script} of {where} refused: fence {presented_fence} is stale (current fence {current}); "
                "the refusal is recorded as a stale_write_refused event", **fenced)
        if code == "E_EXPIRED":
            raise LeaseExpired(
                f"{script} of {where} refused: the lease of fence {presented_fence} expired (Redis clock); "
                "the refusal is recorded as a stale_write_refused event", **fenced)
        raise AttemptNotRunning(
            f"{script} of {where} refused: the attempt is {detail[1] if len(detail) > 1 else '?'}, not running",
            **fenced)
    if code == "E_CANCELED":
        raise CancelRequested(f"{script} of {where} refused: cancellation was requested ({first}); "
                              "acknowledge it instead", **ctx)
    if code == "E_STATE":
        raise TransitionRefused(f"{script} of {where} refused: attempt is {first}", **ctx)
    if code == "E_CONFLICT":
        if script == "enqueue":
            raise IdempotencyConflict(
                f"idempotency key already names task {first} with a different payload or handler; "
                "send the same payload to get that task back, or use a new key for new work", **ctx)
        raise ResultConflict(
            f"{script} of {where} refused: already settled with this fence and a different "
            f"result (recorded digest {detail[1] if len(detail) > 1 else first})", **ctx)
    if code == "E_NOTASK":
        raise TaskNotFound(f"no task {task_id or where!s} in this namespace", **ctx)
    if code == "E_RETRY":
        raise RetryRefused(f"retry of {where} refused: {first}", **ctx)
    if code == "E_NSLOST":
        raise NamespaceLost(f"{first}. Claims are refused until `mcq recover` has run.", **ctx)
    if code == "E_BADARG":
        raise InvalidArgument(f"{script}: {first}", **ctx)
    raise McqError(f"{script} of {where} failed with {code}: {' '.join(detail)}", **ctx)

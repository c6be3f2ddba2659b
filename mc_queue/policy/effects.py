"""Idempotent side effects: orchestrator-minted keys, intent before the call, receipt after.

The key names the logical operation, never a moment: ``<operation>:<work>:<identity>``, where the
work is the task's ULID, or a digest of the namespace and the producer's idempotency key when the
task has one (a task re-sent after a loss finds its first effects), and ``<work>/<n>`` when the
Attempt owns the operation. Attempt N+1 retrying the same operation on the same content finds
Attempt N's receipt and replays it.

A provider is anything that can do the operation with the key and, later, answer "did you do
the operation with this key?" from its own records:

- ``perform(key) -> receipt``: do it, passing the key to the provider (an ``Idempotency-Key``
  header, a commit trailer ...), and return the provider's identity for what it did (JSON);
- ``reconcile(key) -> receipt | None``: the receipt if the provider has it, None if it certainly
  has not; raise :class:`EffectUnknown` (or anything else) when it cannot tell.

Register the reconcile side of every operation on the App (``app.operation(name, reconcile)``) so
the sweeper can ask the provider after the worker that started the effect has vanished.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from ..contracts.errors import InvalidArgument
from ..contracts.models import FailureClass
from .classify import NonRetryable

_OPERATION_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_IDENTITY_RE = re.compile(r"[!-~\u00a0-\ud7ff\ue000-\U0010ffff]{1,200}")

Perform = Callable[[str], Any]
Reconcile = Callable[[str], Any]


class EffectUnknown(NonRetryable):
    """The provider cannot tell whether the operation happened: no automatic decision is safe."""

    why_unsafe = ("mc_queue could not find out from the provider whether an earlier side effect of this task "
                  "happened (its lookup failed or could not tell): another automatic Attempt could do it a second "
                  "time. Check the provider for the effect's key, then retry (it will replay what is found) or "
                  "cancel")
    attention_kind = "effect_unknown"

    def __init__(self, message: str, **_: Any) -> None:
        super().__init__(message, failure_class=FailureClass.PROVIDER)


def work_id(task_id: str, producer_key: str | None = None, namespace: str = "") -> str:
    """Who the work is, across resends: ``k<digest of the namespace and the producer's idempotency
    key>`` when the task has one, else the task's ULID. A task re-sent with the same producer key after
    Redis lost the first one gets a new task id but the same work id, so its effects find the
    provider's objects of the first instead of making second ones. The namespace (the key prefix) is
    in the digest: two namespaces using the same producer key never share provider objects."""
    if producer_key:
        material = f"{namespace}\x00{producer_key}".encode("utf-8", "surrogateescape")
        return "k" + hashlib.sha256(material).hexdigest()[:25]
    return task_id.rsplit(":", 1)[1]


def mint_key(task_id: str, operation: str, identity: str, attempt: int | None = None, *,
             producer_key: str | None = None, namespace: str = "") -> str:
    """The operation key. ``identity`` is content identity (a head SHA, a PR title digest), never a time.
    The owner is the work (:func:`work_id`: the producer's key in its namespace, else the task), and
    the Attempt only when the Attempt owns the operation."""
    if not isinstance(operation, str) or not _OPERATION_RE.fullmatch(operation):
        raise InvalidArgument(f"invalid operation name {operation!r}: lowercase letters, digits, '_', '.', '-'")
    if not isinstance(identity, str) or not _IDENTITY_RE.fullmatch(identity):
        raise InvalidArgument(f"invalid content identity {identity!r}: 1-200 characters without spaces")
    owner = work_id(task_id, producer_key, namespace) + (f"/{attempt}" if attempt is not None else "")
    return f"{operation}:{owner}:{identity}"

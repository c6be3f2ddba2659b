"""Idempotent side effects: orchestrator-minted keys, intent before the call, receipt after.

The key names the logical operation, never a moment: ``<operation>:<task ulid>:<identity>``
(``<operation>:<task ulid>/<n>:<identity>`` when the Attempt owns the operation). Attempt N+1
retrying the same operation on the same content finds Attempt N's receipt and replays it.

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

import re
from collections.abc import Callable
from typing import Any

from .errors import InvalidArgument
from .models import FailureClass
from .policy import NonRetryable

_OPERATION_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_IDENTITY_RE = re.compile(r"[!-~\u00a0-\ud7ff\ue000-\U0010ffff]{1,200}")

Perform = Callable[[str], Any]
Reconcile = Callable[[str], Any]


class EffectUnknown(NonRetryable):
    """The provider cannot tell whether the operation happened: no automatic decision is safe."""

    def __init__(self, message: str, **_: Any) -> None:
        super().__init__(message, failure_class=FailureClass.PROVIDER)


def mint_key(task_id: str, operation: str, identity: str, attempt: int | None = None) -> str:
    """The operation key. ``identity`` is content identity (a head SHA, a PR title digest), never a time."""
    if not isinstance(operation, str) or not _OPERATION_RE.fullmatch(operation):
        raise InvalidArgument(f"invalid operation name {operation!r}: lowercase letters, digits, '_', '.', '-'")
    if not isinstance(identity, str) or not _IDENTITY_RE.fullmatch(identity):
        raise InvalidArgument(f"invalid content identity {identity!r}: 1-200 characters without spaces")
    owner = task_id.rsplit(":", 1)[1] + (f"/{attempt}" if attempt is not None else "")
    return f"{operation}:{owner}:{identity}"

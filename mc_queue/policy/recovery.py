"""`mcq recover`: after Redis lost state, make the namespace safe to use again.

1. ``recover_begin``: the old epoch is retired, the fence floor raised to Redis TIME in microseconds
   (above every fence that can ever have been issued), and the namespace held in ``recovering``
   (every other transition refuses meanwhile);
2. every lease in the lease index is voided (``expire`` with force): its Attempt turns suspect with
   a fence above the floor and is reconciled like any expired lease; an entry whose task is gone or
   that cannot be read is dropped and logged (``orphan_index_entry``);
3. ``recover_finish``: only when the lease index is empty the namespace is ``ok`` again.

It ends when a pass over the lease index makes no progress: then it raises
:class:`RecoveryIncomplete` naming the entries it could not void, and the namespace stays
``recovering`` (a lease from before the loss could still be honoured otherwise). Safe to rerun.
"""

from __future__ import annotations

from typing import Any

from ..client import Client
from ..contracts.errors import McqError


class RecoveryIncomplete(McqError):
    """Some lease index entries could not be voided; the namespace stays recovering. ``left`` names them."""

    def __init__(self, message: str, left: list[str]) -> None:
        super().__init__(message)
        self.left = left


def recover(client: Client, *, reason: str = "operator ran recover", actor: str | None = None,
            batch: int = 500) -> dict[str, Any]:
    """Run the recovery (see the module's docstring). Returns the new epoch, the fence floor, the
    leases voided and the index entries dropped."""
    who = actor or client.actor
    epoch, floor = client.operator.begin_recovery(reason=reason, actor=who)
    voided: list[str] = []
    dropped = 0
    while True:
        members = client.reads.task_ids_of("leases", limit=batch)
        if not members:
            break
        report = client.maintenance.expire(members, actor=who, force=True,
                                           reason="namespace recovery voided every lease",
                               recovering_epoch=epoch)
        voided.extend(e.attempt_id for e in report.expired)
        dropped += report.removed - len(report.expired)
        if report.removed == 0:
            why = "; ".join(f"{m}: {e}" for m, e in report.errors[:5]) or "no entry left the index"
            raise RecoveryIncomplete(
                f"recovery made no progress on {len(members)} lease index entries ({why}); the namespace stays "
                "recovering: look at them with `mcq show`, then run `mcq recover` again", members)
    client.operator.finish_recovery(epoch, voided=len(voided), actor=who)
    return {"epoch": epoch, "fence_floor": floor, "voided_leases": voided, "dropped_entries": dropped}

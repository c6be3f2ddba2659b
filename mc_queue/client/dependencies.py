"""The sweeper's call for tasks that wait for others: release or cancel them once their parents ended.

A task enqueued with ``after=[...]`` (``lua/enqueue_after.lua``) waits; each parent's end records, in
the same script as the end, that its dependents are owed a decision (the released index, ``lua/includes/
common.lua`` ``index_end``). :meth:`Dependencies.release_due` carries it out (``lua/release.lua``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from ..contracts.codec import check_int
from ..contracts.errors import McqError, raise_for_reply
from .base import Role


@dataclass
class Released:
    """What the released index held and what became of it: dependents made pending (to send to the
    transport), scheduled (their own due time ahead: sent once due), canceled, or still waiting for another
    parent; parents skipped (why, by id)."""

    released: list[str] = field(default_factory=list)
    scheduled: list[str] = field(default_factory=list)
    canceled: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class Dependencies(Role):
    """Releases (or cancels) the tasks whose parents ended."""

    def release_due(self, *, limit: int = 200, actor: str | None = None) -> Released:
        """Every parent in the released index (up to ``limit``): its dependents as its hash names them, handed
        to ``release.lua`` (one call per parent). A parent whose dependents changed between the read and
        the call is read again once; anything else wrong with one parent is reported and the rest go on."""
        check_int(limit, what="limit", low=1, high=10_000)
        parents = [str(p) for p in cast(list[str], self.redis.zrange(self.keys.released, 0, limit - 1))]
        out = Released()
        for parent in parents:
            for attempt in range(2):
                try:
                    self._release(parent, out, actor or self.actor)
                    break
                except McqError as exc:
                    if exc.code == "E_CHANGED" and attempt == 0:
                        continue
                    out.errors.append(f"release of {parent}'s dependents: {exc}")
                    break
        return out

    def _release(self, parent: str, out: Released, actor: str) -> None:
        tk = self._task_keys_or_none(parent)
        parent_key = tk.task if tk else self.keys.nowhere().task
        dependents = str(self.redis.hget(parent_key, "dependents") or "").split()
        items = []
        for dep in dependents:
            dk = self._task_keys_or_none(dep) or self.keys.nowhere()
            items.append(({"task": dk.task, "events": dk.events, "pending": dk.pending, "done": dk.done,
                           "held": dk.held}, {"task_id": dep}))

        def call(epoch: str) -> list[object]:
            return self._run("release", {**self._ns_keys(), "counts": self.keys.counts, "released": self.keys.released,
                                         "stats": self.keys.stats, "parent": parent_key},
                             {"epoch": epoch, "actor": actor, "parent_id": parent}, items)

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="release", task_id=parent)
        if str(reply[0]) == "NOOP":
            out.skipped[parent] = str(reply[1])
            return
        out.released += [str(x) for x in reply[1]]
        out.canceled += [str(x) for x in reply[2]]
        out.waiting += [str(x) for x in reply[3]]
        out.scheduled += [str(x) for x in reply[4]]

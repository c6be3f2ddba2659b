"""Concurrency keys (bulkheads): at most N running Attempts of the tasks that name a key (a tenant, a
repository, a workflow family), fleet-wide. A task names its keys as it names rate limits
(``enqueue(limits={"repo:acme/web": 1})``); a key's slots are set for the key or for its family
(``repo:*``: each ``repo:<name>`` gets its own N). Each claim takes a slot (``lua/claim.lua``) held
until the Attempt stops running (complete, fail, its lease expired or voided, a cancel acknowledged), and
the key's next *writer fence*: with one slot, the seed's writer lease (at most one Attempt writes a
branch, and a provider that keeps the highest fence it saw refuses an older writer).

When a key is full its ``on_full`` decides: ``wait`` parks the Attempt in line (nothing held, not due)
until a slot returns and wakes the first waiter (:meth:`Slots.wake_due`, run by the sweeper, which also
audits that no slot stays free while Attempts wait: :meth:`Slots.audit`); ``supersede`` parks it too and
the claiming worker cancels the oldest holder's task; ``reject`` cancels the new task, with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from ..contracts.codec import check_int
from ..contracts.errors import InvalidArgument, raise_for_reply
from ..contracts.keys import check_limit_name
from .base import Role

ON_FULL = ("wait", "reject", "supersede")
MAX_SLOTS = 1_000_000
SOURCES = ("operator", "app")


def check_slot_key(key: str) -> str:
    """A concurrency key ('repo:acme/web' is not one: '/' is refused; 'repo:acme.web') or a family ('repo:*')."""
    base = key[:-1] if isinstance(key, str) and key.endswith(":*") else key
    try:
        check_limit_name(base)
    except ValueError:
        raise InvalidArgument(f"invalid concurrency key {key!r}: use 1-128 letters, digits, '_', '.', ':', '-', "
                              "starting with a letter or digit, or a family '<name>:*'") from None
    return key


def family_of(key: str) -> str | None:
    """The family setting a key falls back to: 'repo:acme' -> 'repo:*' (None for a key without ':')."""
    head, sep, rest = key.partition(":")
    return f"{head}:*" if sep and rest else None


@dataclass(frozen=True)
class SlotStatus:
    """A concurrency key as it stands: its slots (``None``: none set, unlimited) and where they come from (the
    key's own setting or its family's), what it does when full, the Attempts holding a slot (attempt id,
    claimed at ms) and waiting for one, its writer fence (the last one given), and how many claims waited
    or were rejected so far."""

    key: str
    slots: int | None
    on_full: str | None
    source: str | None
    family: bool  # the setting is the family's ('repo:*'), not the key's own
    holders: list[tuple[str, int]] = field(default_factory=list)
    waiting: int = 0
    writer_fence: int = 0
    waited: int = 0
    rejected: int = 0

    @property
    def running(self) -> int:
        return len(self.holders)


class Slots(Role):
    """Set and read concurrency keys; wake the Attempts waiting for a slot (the sweeper)."""

    def set(self, key: str, slots: int, *, on_full: str = "wait", reason: str = "set by an operator",
            source: str = "operator", actor: str | None = None) -> bool:
        """Allow at most ``slots`` running Attempts of the tasks naming ``key`` (or each key of a family
        '<name>:*'); ``on_full``: wait | reject | supersede. False: it already was so, or an App's setting
        would replace an operator's."""
        check_int(slots, what="slots", low=1, high=MAX_SLOTS)
        if on_full not in ON_FULL:
            raise InvalidArgument(f"on_full must be one of {', '.join(ON_FULL)}, got {on_full!r}")
        return str(self._admin("slots", key, reason, source, actor, slots=slots, on_full=on_full)[0]) == "OK"

    def delete(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the slots of ``key`` (its waiters are woken at the sweeper's next audit). Its writer fence
        stays: a provider keeps the highest it saw."""
        return str(self._admin("unslots", key, reason, "operator", actor)[0]) == "OK"

    def _admin(self, op: str, key: str, reason: str, source: str, actor: str | None, *, slots: int | None = None,
               on_full: str = "") -> list[Any]:
        check_slot_key(key)
        return self._key_admin(op, key, key[:-1] if key.endswith(":*") else key, reason, source, SOURCES, actor,
                               limit=slots, on_full=on_full)

    def status(self, key: str) -> SlotStatus:
        """One key now: its own setting, else its family's (a key never set reads as unlimited)."""
        check_slot_key(key)
        return self.all([key])[0]

    def all(self, keys: list[str] | None = None) -> list[SlotStatus]:
        """Every key with slots set, held or waited for (or the ``keys`` given), by key: two round trips and
        a read of the holders and waiters (each is a running or a parked Attempt)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.limits)
        pipe.hgetall(self.keys.stats)
        pipe.zrange(self.keys.slotheld, 0, -1)
        pipe.zrange(self.keys.slotwait, 0, -1)
        fields, stats, held, waiting = cast(tuple[dict[str, str], dict[str, str], list[str], list[str]],
                                            pipe.execute())
        holders: dict[str, list[tuple[str, int]]] = {}
        for m in held:
            k, at, aid = m.split("\n", 2)
            holders.setdefault(k, []).append((aid, int(at)))
        waits: dict[str, int] = {}
        for m in waiting:
            k = m.partition("\n")[0]
            waits[k] = waits.get(k, 0) + 1
        names = sorted({k.rpartition("|")[0] for k in fields if k.endswith("|slots")} | set(holders) | set(waits)) \
            if keys is None else list(keys)
        out = []
        for name in names:
            own = fields.get(f"{name}|slots")
            fam = family_of(name) if not name.endswith(":*") else None
            setting = own or (fields.get(f"{fam}|slots") if fam else None)
            n, on_full, source = (setting.split(" ", 2) if setting else (None, None, None))
            out.append(SlotStatus(key=name, slots=int(n) if n else None, on_full=on_full, source=source,
                                  family=bool(setting) and not own, holders=holders.get(name, []),
                                  waiting=waits.get(name, 0), writer_fence=int(fields.get(f"{name}|wfence") or 0),
                                  waited=int(stats.get(f"slot_waited|{name}") or 0),
                                  rejected=int(stats.get(f"slot_rejected|{name}") or 0)))
        return out

    def wake_due(self, *, limit: int = 200, actor: str | None = None, audit: bool = False) -> list[str]:
        """The waiters whose slot returned (or that the audit found a free slot for), each made due now by
        ``lua/slot_wake.lua``; returns their attempt ids, for the caller to send. A waiter that left the
        line passes its wake to the next one (woken in the same call, up to ``limit`` wakes). ``audit``:
        first :meth:`audit` (a key must not keep a slot free while Attempts wait for it)."""
        check_int(limit, what="limit", low=1, high=10_000)
        if audit:
            self.audit()
        woken: list[str] = []
        tried = 0
        while tried < limit:
            members = [str(m) for m in cast(list[str], self.redis.zrange(self.keys.slotwake, 0, limit - tried - 1))]
            if not members:
                break
            for member in members:
                tried += 1
                reply = self._wake(member, actor or self.actor)
                if reply and reply[0] == "OK":
                    woken.append(str(reply[1]))
        return woken

    def _wake(self, member: str, actor: str) -> list[Any] | None:
        parts = member.split("\n")
        try:
            key, place, queue, task_id = parts
            tk = self.keys.task(task_id)
            check_limit_name(key)
            if not place.isdigit() or len(place) != 15:
                raise ValueError(place)
        except ValueError:  # not a waiter's member: dropped, so that it does not stop the wakes behind it
            self.redis.zrem(self.keys.slotwake, member)
            return None

        def call(epoch: str) -> list[Any]:
            return self._run("slot_wake", {**self._ns_keys(), "slotwait": self.keys.slotwait,
                                           "slotwake": self.keys.slotwake, "task": tk.task, "attempts": tk.attempts_v1,
                                           "events": tk.events, "pending": self.keys.pending(queue)},
                             {"key": key, "place": int(place), "queue": queue, "task_id": task_id, "actor": actor,
                              "epoch": epoch})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="slot_wake")
        return reply

    def audit(self, *, limit: int = 200) -> int:
        """Wake as many waiters of each key as it has free slots (``lua/slot_audit.lua``, ``limit`` keys a
        call, every key): a slot must not stay free while Attempts wait for it. Returns how many it woke."""
        check_int(limit, what="limit", low=1, high=1000)
        woken, after = 0, ""
        while True:
            reply = self._run("slot_audit", {"limits": self.keys.limits, "slotheld": self.keys.slotheld,
                                             "slotwait": self.keys.slotwait, "slotwake": self.keys.slotwake},
                              {"limit": limit, "after": after})
            raise_for_reply(reply, script="slot_audit")
            woken += int(reply[1])
            after = str(reply[2])
            if not after:
                return woken

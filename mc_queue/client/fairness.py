"""Fair shares across keys: a tenant with 10,000 queued tasks cannot starve 50 small ones.

A task names its fairness key at enqueue (``enqueue(..., fair_key="tenant:acme")``). Its Attempts' messages
then wait in that key's *fair lane* of their RQ queue (one per queue and priority), the RQ queue holding a
ticket in their place (``mc_queue.producer.transport.LaneQueue``); a worker that pops a ticket takes the
message ``lua/fair_pop.lua`` chooses: the head of the lane of the key whose *pass* is lowest, which then
grows by 1,000,000 / the key's weight (stride scheduling). While keys have messages queued, each is
served in proportion to its weight, within one message of it over any run of claims, whatever the depth
of another's backlog; a key that empties leaves the turns and comes back no earlier than its turn.

A key's weight is set for the key or its family (``tenant:*``: each ``tenant:<name>`` that weight) by an
operator (``mcq fair set``) or an App (``app.fair_share``); 1 by default. Priorities stay strict: a more
urgent RQ queue is emptied first, and fairness orders each one's messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from ..contracts.codec import check_int
from ..contracts.errors import raise_for_reply
from .base import Role
from .caps import Caps, KeyCapStatus
from .slots import check_slot_key, family_of

MAX_WEIGHT = 1000
SOURCES = ("operator", "app")
PRIORITY_LEVELS = range(1, 10)  # (producer.transport.PRIORITIES, which this layer may not import)


@dataclass(frozen=True)
class FairStatus:
    """A fairness key as it stands: its weight (its own setting, its family's, or 1), where that comes
    from, and its messages queued in each (queue, priority)'s fair lanes with the key's pass there."""

    key: str
    weight: int
    source: str | None  # 'operator' | 'app' | None (the default weight, 1)
    family: bool  # the weight is the family's ('tenant:*'), not the key's own
    queued: dict[str, int]  # "<queue>@p<priority>" -> messages waiting in the key's lane


class Fairness(Role):
    """Set and read fair shares; read the fair lanes' backlogs."""

    def set_weight(self, key: str, weight: int, *, reason: str = "set by an operator", source: str = "operator",
                   actor: str | None = None) -> bool:
        """Give ``key`` (or each key of a family '<name>:*') ``weight`` turns for one of a key of weight 1
        while both have messages queued (1..1000). False: already so, or an App's setting would replace an
        operator's."""
        check_int(weight, what="weight", low=1, high=MAX_WEIGHT)
        return str(self._admin("weight", key, reason, source, actor, weight)[0]) == "OK"

    def delete_weight(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the weight of ``key``: its family's applies again, else 1."""
        return str(self._admin("unweight", key, reason, "operator", actor, None)[0]) == "OK"

    def _admin(self, op: str, key: str, reason: str, source: str, actor: str | None, weight: int | None) -> list[str]:
        check_slot_key(key)
        return self._key_admin(op, key, key[:-1] if key.endswith(":*") else key, reason, source, SOURCES, actor,
                               limit=weight)

    def backlog(self, queue: str) -> dict[int, dict[str, int]]:
        """A queue's fair lanes now: priority -> key -> its messages queued (one round trip, two with lanes)."""
        pipe = self.redis.pipeline(transaction=False)
        for p in PRIORITY_LEVELS:
            pipe.zrange(self.keys.fair_turns(queue, p), 0, -1)
        turns = cast(list[list[str]], pipe.execute())
        if not any(turns):
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for p, names in zip(PRIORITY_LEVELS, turns, strict=True):
            for name in names:
                pipe.hmget(self.keys.fair_lanes(queue, p), [f"{name}|h", f"{name}|t"])
        ends = iter(cast(list[list[str | None]], pipe.execute()))
        out: dict[int, dict[str, int]] = {}
        for p, names in zip(PRIORITY_LEVELS, turns, strict=True):
            for name in names:
                h, t = next(ends)
                if h and t and int(t) >= int(h):
                    out.setdefault(p, {})[name] = int(t) - int(h) + 1
        return out

    def all(self, queues: list[str] | None = None, *, also: Iterable[str] = ()) -> list[FairStatus]:
        """Every key with a weight set or messages queued in the fair lanes of ``queues`` (every queue when
        None), and the keys ``also`` names, by key: two round trips plus one or two per queue."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.limits)
        pipe.smembers(self.keys.queues)
        fields, known = cast(tuple[dict[str, str], set[str]], pipe.execute())
        queued: dict[str, dict[str, int]] = {}
        for queue in sorted(known) if queues is None else queues:
            for p, lanes in self.backlog(queue).items():
                for name, n in lanes.items():
                    queued.setdefault(name, {})[f"{queue}@p{p}"] = n
        names = sorted({k.rpartition("|")[0] for k in fields if k.endswith("|weight")} | set(queued) | set(also))
        out = []
        for name in names:
            own = fields.get(f"{name}|weight")
            fam = family_of(name) if not name.endswith(":*") else None
            setting = own or (fields.get(f"{fam}|weight") if fam else None)
            weight, _, source = setting.partition(" ") if setting else ("1", "", "")
            out.append(FairStatus(key=name, weight=int(weight), source=source or None,
                                  family=bool(setting) and not own, queued=queued.get(name, {})))
        return out

    def status(self, key: str) -> FairStatus:
        """One key's weight as it stands (its own, its family's, or 1), without its lanes' backlog."""
        check_slot_key(key)
        return next(s for s in self.all([], also=[key]) if s.key == key)

    def with_caps(self, caps: Caps, queues: list[str] | None = None) -> list[tuple[FairStatus, KeyCapStatus | None]]:
        """Each key with a weight, messages queued, a cap or tasks not ended: its fair share and its cap (what
        ``mcq fair`` and the console's Limits page list), by key."""
        capped = {c.key: c for c in caps.keys_all()}
        return [(s, capped.get(s.key)) for s in self.all(queues, also=capped)]

    def trim(self, queue: str, *, count: int = 1000) -> int:
        """Drop the passes idle keys left in a queue's fair lanes once they say nothing (``lua/fair_trim.lua``,
        run by the sweeper: a key that never comes back keeps nothing). Returns how many were dropped."""
        check_int(count, what="count", low=1, high=10_000)
        dropped = 0
        pipe = self.redis.pipeline(transaction=False)
        for p in PRIORITY_LEVELS:
            pipe.exists(self.keys.fair_lanes(queue, p))
        for p, there in zip(PRIORITY_LEVELS, pipe.execute(), strict=True):  # (one round trip for the nine)
            if not there:
                continue
            keys = {"lanes": self.keys.fair_lanes(queue, p), "turns": self.keys.fair_turns(queue, p)}
            cursor = 0
            while True:
                reply = self._run("fair_trim", keys, {"cursor": cursor, "count": count})
                raise_for_reply(reply, script="fair_trim")
                dropped += int(reply[1])
                cursor = int(reply[2])
                if not cursor:
                    break
        return dropped

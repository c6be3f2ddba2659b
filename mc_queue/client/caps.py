"""Backpressure: a queue's cap. At most ``max_depth`` tasks of a queue that have not ended (pending,
scheduled, backoff, running, waiting); beyond it the enqueue scripts refuse new work with a retry-after
(:class:`~mc_queue.contracts.errors.QueueFull`, nothing written; ``enqueue_many`` all or nothing), shedding
the lowest priorities first (priority 1-5 may fill the cap, 6 four fifths of it, ... 9 one fifth), and refuse
a task whose ``start_by`` the queue's present age (its oldest due task's wait) already makes impossible: the
queue does not promise work it cannot deliver. Work already admitted goes on (``lua/queue_cap.lua``,
``lua/includes/admit.lua`` queue_room).

A fairness key may be capped too (:meth:`Caps.set_key`: a tenant's tasks not ended, in every queue, counted
for the tasks naming it with ``fair_key``), or each key of a family ``tenant:*``; beyond it the same
refusal, naming the key. Either may be capped by bytes too (:meth:`Caps.set_bytes`): the bytes of the payloads
of its tasks not ended, a task refused when its own payload would not fit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..contracts.codec import check_int, check_text
from ..contracts.errors import InvalidArgument, raise_for_reply
from ..contracts.keys import check_queue
from .base import Role
from .slots import check_slot_key, family_of

MAX_DEPTH = 100_000_000
MAX_BYTES = 1_000_000_000_000
DEPTH_STATES = ("pending", "scheduled", "backoff", "running", "waiting")


@dataclass(frozen=True)
class CapStatus:
    """A queue's cap and how full it is now: the tasks it holds that have not ended, and how long its
    oldest due task has waited (ms, Redis clock; 0 when none waits)."""

    queue: str
    max_depth: int | None
    source: str | None
    depth: int
    age_ms: int
    max_bytes: int | None = None  # its cap by bytes of payload (None: none)
    bytes: int = 0  # the bytes of the payloads of its tasks not ended

    def room(self, priority: int = 5) -> int | None:
        """Tasks of this priority it admits now (None: no cap)."""
        if self.max_depth is None:
            return None
        return max(0, -(-self.max_depth * min(5, 10 - priority) // 5) - self.depth)


@dataclass(frozen=True)
class KeyCapStatus:
    """A fairness key's cap (its own, its family's, or none) and its tasks not ended now."""

    key: str
    max_open: int | None
    source: str | None
    family: bool  # the cap is the family's ('tenant:*'), not the key's own
    open: int
    max_bytes: int | None = None  # its cap by bytes of payload, its own or its family's (None: none)
    bytes: int = 0  # the bytes of the payloads of its tasks not ended


class Caps(Role):
    """Set and read queue caps (what the enqueue scripts check)."""

    def set(self, queue: str, max_depth: int, *, reason: str = "set by an operator", source: str = "operator",
            actor: str | None = None) -> bool:
        """Cap ``queue`` at ``max_depth`` tasks not ended (False: it already was, or an App's cap would
        replace an operator's)."""
        self._scope(queue, key_ok=False)
        check_int(max_depth, what="max_depth", low=1, high=MAX_DEPTH)
        return str(self._admin("set", queue, reason, source, actor, max_depth)[0]) == "OK"

    def delete(self, queue: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the cap of ``queue`` (False: it had none)."""
        self._scope(queue, key_ok=False)
        return str(self._admin("delete", queue, reason, "operator", actor, None)[0]) == "OK"

    def set_key(self, key: str, max_open: int, *, reason: str = "set by an operator", source: str = "operator",
                actor: str | None = None) -> bool:
        """Cap fairness key ``key`` (or each key of a family 'tenant:*') at ``max_open`` tasks naming it that have
        not ended, in every queue (False: it already was, or an App's cap would replace an operator's)."""
        check_slot_key(key)
        check_int(max_open, what="max_open", low=1, high=MAX_DEPTH)
        return str(self._admin("set", "@" + key, reason, source, actor, max_open)[0]) == "OK"

    def delete_key(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the cap of fairness key ``key`` (False: it had none)."""
        check_slot_key(key)
        return str(self._admin("delete", "@" + key, reason, "operator", actor, None)[0]) == "OK"

    def set_bytes(self, scope: str, max_bytes: int, *, reason: str = "set by an operator", source: str = "operator",
                  actor: str | None = None) -> bool:
        """Cap the bytes of payload in the tasks not ended of ``scope``: a queue, or '@<fairness key>' (or a family
        '@tenant:*'). A task whose payload would not fit is refused (QueueFull), the lowest priorities first."""
        self._scope(scope)
        check_int(max_bytes, what="max_bytes", low=1, high=MAX_BYTES)
        return str(self._admin("set_bytes", scope, reason, source, actor, max_bytes)[0]) == "OK"

    def delete_bytes(self, scope: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the cap by bytes of ``scope`` (a queue or '@<fairness key>'; False: it had none)."""
        self._scope(scope)
        return str(self._admin("delete_bytes", scope, reason, "operator", actor, None)[0]) == "OK"

    def _scope(self, scope: str, *, key_ok: bool = True) -> None:
        """A queue's name, or (key_ok) '@<fairness key>' / '@<family>:*': InvalidArgument otherwise."""
        if key_ok and isinstance(scope, str) and scope.startswith("@"):
            check_slot_key(scope[1:])
            return
        try:
            check_queue(scope)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def keys_all(self) -> list[KeyCapStatus]:
        """Every fairness key with a cap or tasks not ended (every key's are counted, capped or not), by key."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.caps)
        pipe.hgetall(self.keys.counts)
        caps, counts = cast(tuple[dict[str, str], dict[str, str]], pipe.execute())
        open_ = {f[1:].rpartition("|")[0]: int(v) for f, v in counts.items()
                 if f.startswith("@") and f.endswith("|open")}
        names = sorted({f[1:].removesuffix("|bytes") for f in caps if f.startswith("@")} | set(open_))
        out = []
        for name in names:
            own = caps.get("@" + name)
            fam = family_of(name) if not name.endswith(":*") else None
            setting = own or (caps.get("@" + fam) if fam else None)
            depth, _, source = setting.partition(" ") if setting else ("", "", "")
            by_bytes = caps.get(f"@{name}|bytes") or (caps.get(f"@{fam}|bytes") if fam else None)
            out.append(KeyCapStatus(key=name, max_open=int(depth) if depth else None, source=source or None,
                                    family=bool(setting) and not own, open=open_.get(name, 0),
                                    max_bytes=int(by_bytes.split(" ")[0]) if by_bytes else None,
                                    bytes=int(counts.get(f"@{name}|bytes") or 0)))
        return out

    def _admin(self, op: str, queue: str, reason: str, source: str, actor: str | None,
               max_depth: int | None) -> list[Any]:
        # (the scope, a queue or '@<key>', was checked by the caller)
        check_text(reason, what="reason", max_bytes=2000, min_chars=1)
        if source not in ("operator", "app"):
            raise InvalidArgument(f"source must be operator or app, got {source!r}")
        who = actor or self.actor

        def call(epoch: str) -> list[Any]:
            return self._run("queue_cap", {**self._ns_keys(), "caps": self.keys.caps},
                             {"epoch": epoch, "actor": who, "op": op, "queue": queue, "max_depth": max_depth,
                              "source": source, "reason": reason})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="queue_cap")
        return reply

    def all(self, queues: list[str] | None = None) -> list[CapStatus]:
        """Every capped queue (or the ``queues`` given), by name: two round trips."""
        caps = cast(dict[str, str], self.redis.hgetall(self.keys.caps))
        names = sorted({q.removesuffix("|bytes") for q in caps if not q.startswith("@")}) if queues is None \
            else [check_queue(q) for q in queues]
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        for name in names:
            pipe.hmget(self.keys.counts, [f"{name}|{s}" for s in (*DEPTH_STATES, "bytes")])
            pipe.zrange(self.keys.pending(name), 0, 0, withscores=True)
        (now_s, now_us), *rest = pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000
        out = []
        for i, name in enumerate(names):
            counts, head = rest[2 * i], rest[2 * i + 1]
            setting = caps.get(name)
            depth, _, source = setting.partition(" ") if setting else ("", "", "")
            oldest = head[0][1] if head else None
            by_bytes = caps.get(f"{name}|bytes")
            out.append(CapStatus(queue=name, max_depth=int(depth) if depth else None, source=source or None,
                                 depth=sum(int(c or 0) for c in counts[:-1]),
                                 age_ms=int(now - oldest) if oldest is not None and oldest < now else 0,
                                 max_bytes=int(by_bytes.split(" ")[0]) if by_bytes else None,
                                 bytes=int(counts[-1] or 0)))
        return out

    def status(self, queue: str) -> CapStatus:
        return self.all([queue])[0]

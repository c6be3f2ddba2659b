"""Rate limits: '<limit> units per <window>' of a key ('github', 'model:openai'), fleet-wide, on Redis's
clock. A task names the keys it needs and its cost in each (``enqueue(limits=...)``); each claim of its
Attempts takes the units from every one, all or none, in the sliding window ending at the claim
(``lua/claim.lua``); an Attempt over a limit is not claimed, holds nothing, and is due again when the
units return. A pause holds every claim of a key until it ends: a provider's 429 with Retry-After, or
an operator. Changes go through ``lua/limit_admin.lua`` and are recorded in the namespace log."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from ..contracts.codec import check_int, check_seconds, check_text
from ..contracts.errors import Code, InvalidArgument, raise_for_reply
from ..contracts.keys import check_limit_name
from .base import Role

MAX_WINDOW_S = 30 * 86_400  # the longest window and the longest pause (lua/limit_admin.lua MAX_WINDOW_MS)
MAX_LIMIT = 999_999_999
SOURCES = ("operator", "app", "worker")


@dataclass(frozen=True)
class LimitStatus:
    """A rate limit as it stands now (Redis clock): its setting (None: no limit set, only a pause),
    the units in the window ending now, its pause, and how many claims it deferred so far."""

    key: str
    limit: int | None
    window_ms: int | None
    source: str | None
    used: int
    paused_until_ms: int | None
    pause_reason: str | None
    deferred: int
    now_ms: int

    @property
    def left(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)

    @property
    def paused(self) -> bool:
        return self.paused_until_ms is not None and self.paused_until_ms > self.now_ms


class Limits(Role):
    """Set, pause and read rate limits (what claims check)."""

    def set(self, key: str, limit: int, per_s: float, *, reason: str = "set by an operator",
            source: str = "operator", actor: str | None = None) -> bool:
        """Allow ``limit`` units of ``key`` per sliding window of ``per_s`` seconds (False: it already was,
        or an App's setting would replace an operator's)."""
        check_int(limit, what="limit", low=1, high=MAX_LIMIT)
        window_ms = math.ceil(check_seconds(per_s, what="per_s", high=MAX_WINDOW_S) * 1000)
        return str(self._admin("set", key, reason, source, actor, limit=limit, window_ms=window_ms)[0]) == "OK"

    def delete(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the limit of ``key`` (its log and any pause too): its tasks are no longer limited."""
        return str(self._admin("delete", key, reason, "operator", actor)[0]) == "OK"

    def pause(self, key: str, for_s: float, *, reason: str, source: str = "operator",
              actor: str | None = None) -> int:
        """Hold every claim of ``key`` for ``for_s`` seconds from now (Redis clock); returns the end (ms).
        A pause that ends earlier than one in force changes nothing (the later end holds)."""
        for_ms = math.ceil(check_seconds(for_s, what="for_s", high=MAX_WINDOW_S) * 1000)
        reply = self._admin("pause", key, reason, source, actor, for_ms=for_ms)
        return int(reply[2]) if reply[0] == Code.OK else self.status(key).paused_until_ms or 0

    def resume(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """End a pause of ``key`` now (False: it was not paused)."""
        return str(self._admin("resume", key, reason, "operator", actor)[0]) == "OK"

    def _admin(self, op: str, key: str, reason: str, source: str, actor: str | None, *, limit: int | None = None,
               window_ms: int | None = None, for_ms: int | None = None) -> list[Any]:
        try:
            log = self.keys.limit_log(key)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        check_text(reason, what="reason", max_bytes=2000, min_chars=1)
        if source not in SOURCES:
            raise InvalidArgument(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
        who = actor or self.actor

        def call(epoch: str) -> list[Any]:
            return self._run("limit_admin", {**self._ns_keys(), "limits": self.keys.limits, "log": log},
                             {"epoch": epoch, "actor": who, "op": op, "key": key, "limit": limit,
                              "window_ms": window_ms, "for_ms": for_ms, "source": source, "reason": reason})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="limit_admin")
        return reply

    def status(self, key: str) -> LimitStatus:
        """One key's limit now (a key never set reads as unlimited, unpaused)."""
        check_limit_name(key)
        found = [s for s in self.all([key]) if s.key == key]
        return found[0]

    def all(self, keys: list[str] | None = None) -> list[LimitStatus]:
        """Every rate limit set or paused (or the ``keys`` given), by key: two round trips, and the
        entries of each log's window are read to count the units in it."""
        fields = cast(dict[str, str], self.redis.hgetall(self.keys.limits))
        names = sorted({k.partition("|")[0] for k in fields}) if keys is None else list(keys)
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(self.keys.stats)
        for name in names:
            pipe.zrange(self.keys.limit_log(name), 0, -1, withscores=True)
        (now_s, now_us), stats, *logs = pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000
        out = []
        for name, log in zip(names, logs, strict=True):
            limit, window, source = (fields.get(name) or "  ").split(" ", 2)
            win = int(window) if window else None
            used = sum(int(m.rpartition(" ")[2] or 0) for m, score in log if win is not None and score > now - win)
            paused = fields.get(f"{name}|paused")
            out.append(LimitStatus(key=name, limit=int(limit) if limit else None, window_ms=win,
                                   source=source or None, used=used, paused_until_ms=int(paused) if paused else None,
                                   pause_reason=fields.get(f"{name}|why"),
                                   deferred=int(stats.get(f"limited|{name}") or 0), now_ms=now))
        return out

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
from ..contracts.keys import SKIP_STEP, check_limit_name
from .base import Role

MAX_WINDOW_S = 30 * 86_400  # the longest window and the longest pause (lua/limit_admin.lua MAX_WINDOW_MS)
MAX_LIMIT = 999_999_999
SOURCES = ("operator", "app", "worker")


@dataclass(frozen=True)
class BreakerSetting:
    """A circuit breaker (``lua/breaker_record.lua``): it opens for ``open_s`` when, over at least
    ``min_calls`` calls in the last ``window_s``, ``failure_rate`` of them failed, or ``slow_rate`` took
    ``slow_s`` or more (``slow_s`` None: not judged), or one failure fingerprint repeated ``same_failure``
    times (0: not judged); then half-open, it admits exactly ``probes`` Attempts fleet-wide, and closes
    once they all succeed (a probe that fails opens it again)."""

    failure_rate: float = 0.5
    min_calls: int = 10
    window_s: float = 60.0
    open_s: float = 30.0
    probes: int = 1
    slow_s: float | None = None
    slow_rate: float = 0.5
    same_failure: int = 0
    source: str = "operator"

    def text(self) -> str:
        """As limit_admin.lua takes it: eight whole numbers."""
        for name, value in (("failure_rate", self.failure_rate), ("slow_rate", self.slow_rate)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise InvalidArgument(f"{name} must be a share in (0, 1], got {value!r}")
        check_int(self.min_calls, what="min_calls", low=1, high=1_000_000)
        check_int(self.probes, what="probes", low=1, high=1000)
        check_int(self.same_failure, what="same_failure", low=0, high=1_000_000)
        window = math.ceil(check_seconds(self.window_s, what="window_s", high=MAX_WINDOW_S) * 1000)
        opened = math.ceil(check_seconds(self.open_s, what="open_s", high=MAX_WINDOW_S) * 1000)
        slow = 0 if self.slow_s is None else math.ceil(check_seconds(self.slow_s, what="slow_s", high=MAX_WINDOW_S)
                                                        * 1000)
        return (f"{math.ceil(self.failure_rate * 100)} {self.min_calls} {window} {opened} {self.probes} {slow} "
                f"{math.ceil(self.slow_rate * 100)} {self.same_failure}")

    @classmethod
    def parse(cls, text: str) -> BreakerSetting | None:
        parts = text.split()
        if len(parts) < 8:
            return None
        rate, calls, window, opened, probes, slow, slow_rate, same = (int(p) for p in parts[:8])
        return cls(failure_rate=rate / 100, min_calls=calls, window_s=window / 1000, open_s=opened / 1000,
                   probes=probes, slow_s=slow / 1000 if slow else None, slow_rate=slow_rate / 100, same_failure=same,
                   source=parts[8] if len(parts) > 8 else "operator")


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
    breaker: BreakerSetting | None = None
    breaker_state: str = "closed"  # closed | open | half (half-open)
    breaker_until_ms: int | None = None  # open: when it half-opens
    breaker_why: str | None = None
    breaker_deferred: int = 0  # claims its breaker deferred
    breaker_opened: int = 0  # times it opened
    fallbacks: tuple[str, ...] = ()  # its declared fallbacks, in the order they are tried

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

    def set_breaker(self, key: str, setting: BreakerSetting | None = None, *, reason: str = "set by an operator",
                    source: str = "operator", actor: str | None = None) -> bool:
        """Give ``key`` a circuit breaker (False: it already had this one, or an App's would replace an
        operator's). Tasks that name the key (``limits={key: 0}``: no units) are not claimed while it is open."""
        text = (setting or BreakerSetting()).text()
        return str(self._admin("breaker", key, reason, source, actor, breaker=text)[0]) == "OK"

    def trip(self, key: str, for_s: float, *, reason: str, actor: str | None = None) -> int:
        """Open ``key``'s circuit breaker by hand for ``for_s`` seconds (then half-open); returns when (ms)."""
        for_ms = math.ceil(check_seconds(for_s, what="for_s", high=MAX_WINDOW_S) * 1000)
        return int(self._admin("trip", key, reason, "operator", actor, for_ms=for_ms)[2])

    def reset(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """Close ``key``'s circuit breaker by hand (False: it was closed)."""
        return str(self._admin("reset", key, reason, "operator", actor)[0]) == "OK"

    def record(self, key: str, ok: bool, elapsed_ms: int, *, fingerprint: str = "", attempt_id: str,
               actor: str | None = None) -> str:
        """One call's outcome for ``key``'s circuit breaker (``lua/breaker_record.lua``, sent once: it is
        counted once); returns the breaker's state after it (closed, open, half), '' without a breaker."""
        try:
            window = self.keys.breaker_window(key)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        check_int(elapsed_ms, what="elapsed_ms", high=2**53 - 1)
        check_text(attempt_id, what="attempt_id", max_bytes=200, spaces=False)
        if fingerprint and (len(fingerprint) != 16 or set(fingerprint) - set("0123456789abcdef")):
            raise InvalidArgument(f"fingerprint must be 16 hex digits, got {fingerprint!r}")
        who = actor or self.actor

        def call(epoch: str) -> list[Any]:
            return self._run("breaker_record", {**self._ns_keys(), "limits": self.keys.limits, "stats": self.keys.stats,
                                                "window": window},
                             {"epoch": epoch, "actor": who, "key": key, "outcome": "ok" if ok else "fail",
                              "elapsed_ms": elapsed_ms, "fingerprint": fingerprint, "attempt": attempt_id})

        reply = self._with_epoch(call)
        raise_for_reply(reply, script="breaker_record")
        return str(reply[1]) if reply[0] == "OK" else ""

    def set_fallbacks(self, key: str, fallbacks: list[str], *, reason: str = "set by an operator",
                      source: str = "operator", actor: str | None = None) -> bool:
        """Declare the fallbacks of dependency ``key``, in the order they are tried (``lua/limit_admin.lua``):
        while its breaker is down, a task that names one of them too is claimed, and its handler's
        ``ctx.call(key, fn, fallback=...)`` goes to the first one that is up (``lua/limit_stamp.lua`` records
        the switch on the Attempt). The last may be :data:`SKIP_STEP`: with none up, the step is skipped
        (its tasks are claimed, the skip recorded). False: already so, or an App's setting would replace an
        operator's."""
        try:
            for fb in [key, *(fallbacks[:-1] if fallbacks[-1:] == [SKIP_STEP] else fallbacks)]:
                check_limit_name(fb)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not fallbacks or len(set(fallbacks)) != len(fallbacks) or key in fallbacks or len(fallbacks) > 8:
            raise InvalidArgument(f"fallbacks of {key}: 1-8 distinct keys other than {key} (the last may be "
                                  f"{SKIP_STEP!r}: the step can be skipped), got {fallbacks!r}")
        return str(self._admin("fallbacks", key, reason, source, actor, fallbacks=",".join(fallbacks))[0]) == "OK"

    def delete_fallbacks(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the declared fallbacks of ``key``: while its breaker is down its tasks wait again."""
        return str(self._admin("unfallbacks", key, reason, "operator", actor)[0]) == "OK"

    def _admin(self, op: str, key: str, reason: str, source: str, actor: str | None, *, limit: int | None = None,
               window_ms: int | None = None, for_ms: int | None = None, breaker: str = "",
               fallbacks: str = "") -> list[Any]:
        try:
            self.keys.limit_log(key)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        return self._key_admin(op, key, key, reason, source, SOURCES, actor, limit=limit, window_ms=window_ms,
                               for_ms=for_ms, breaker=breaker, fallbacks=fallbacks)

    def status(self, key: str) -> LimitStatus:
        """One key's limit now (a key never set reads as unlimited, unpaused)."""
        check_limit_name(key)
        found = [s for s in self.all([key]) if s.key == key]
        return found[0]

    def all(self, keys: list[str] | None = None) -> list[LimitStatus]:
        """Every rate limit set or paused (or the ``keys`` given), by key: two round trips, and the
        entries of each log's window are read to count the units in it."""
        fields = cast(dict[str, str], self.redis.hgetall(self.keys.limits))
        # (units taken; a concurrency key's: mc_queue.client.slots; a spend ceiling's: mc_queue.client.spend; a
        # fair share's: mc_queue.client.fairness)
        own = ("|next", "|used", "|slots", "|wfence", "|spend", "|snext", "|fallbacks", "|weight")
        names = sorted({k.partition("|")[0] for k in fields if not k.endswith(own)}) \
            if keys is None else list(keys)
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
            bstate = (fields.get(f"{name}|bstate") or "closed").split()
            until = int(bstate[1]) if bstate[0] == "open" else None
            state = "half" if bstate[0] == "open" and until is not None and until <= now else bstate[0]
            out.append(LimitStatus(key=name, limit=int(limit) if limit else None, window_ms=win,
                                   source=source or None, used=used, paused_until_ms=int(paused) if paused else None,
                                   pause_reason=fields.get(f"{name}|why"),
                                   deferred=int(stats.get(f"limited|{name}") or 0), now_ms=now,
                                   breaker=BreakerSetting.parse(fields.get(f"{name}|breaker") or ""),
                                   breaker_state=state, breaker_until_ms=until if state == "open" else None,
                                   breaker_why=fields.get(f"{name}|bwhy") if state != "closed" else None,
                                   breaker_deferred=int(stats.get(f"breaker_deferred|{name}") or 0),
                                   breaker_opened=int(stats.get(f"breaker_opened|{name}") or 0),
                                   fallbacks=tuple((fields.get(f"{name}|fallbacks") or "").partition(" ")[0]
                                                   .split(",")) if fields.get(f"{name}|fallbacks") else ()))
        return out

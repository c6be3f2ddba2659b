"""Spend ceilings (denial of wallet): at most so much cost and/or so many tokens per window spent by the
Attempts of the tasks that name a key (a tenant, a queue's own key, a model provider), fleet-wide, beside
each task's own budget. A task names its keys as it names rate limits (``enqueue(limits={"tenant:acme":
0})``); a ceiling is set for the key or for its family (``tenant:*``: each ``tenant:<name>`` its own).

Admission is at claim (``lua/claim.lua``), on Redis's clock: an Attempt is claimed only when what the key's
Attempts spent in the window ending now, plus what its running Attempts reserved, plus this Attempt's
estimate stays within the ceiling. The estimate is what the task's budget has left (``Budget.max_cost``,
``max_tokens`` less what its earlier Attempts were charged); a task without a budget is admitted only
while something is left, and counts what it spends once it stops. Claimed, the Attempt reserves its
estimate; when it stops running (complete, fail, its lease expired or voided, a cancel acknowledged) the
reservation is replaced by what it was charged, in the window's bucket of that moment (sixty buckets a
window; a bucket counts while any of it is in the window, so the ceiling errs toward refusing). Over the
ceiling ``on_over`` decides: ``wait`` defers the Attempt (nothing held; due when enough leaves the window,
or rechecked while reservations block) and ``reject`` cancels the task, with its reason. A retry storm is
capped by the ceiling and the breaker together: each retry reserves what the budget has left."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from ..contracts.codec import check_int, check_seconds
from ..contracts.errors import InvalidArgument
from .base import Role
from .slots import check_slot_key, family_of

ON_OVER = ("wait", "reject")
SOURCES = ("operator", "app")
MAX_WINDOW_S = 30 * 86_400
MAX_COST = 999_999.999  # the cost ceiling is kept in thousandths, at most 999,999,999
MAX_TOKENS = 999_999_999_999_999


@dataclass(frozen=True)
class SpendStatus:
    """A spend ceiling as it stands now (Redis clock): its ceilings (``None``: that one is not capped; both
    None: no ceiling set), window, ``on_over``, where it comes from (the key's own setting or its family's),
    what the key's Attempts spent in the window ending now, what its running Attempts reserved (and how
    many they are), and how many claims it deferred or rejected so far."""

    key: str
    cost: float | None
    tokens: int | None
    window_s: float | None
    on_over: str | None
    source: str | None
    family: bool
    spent_cost: float = 0.0
    spent_tokens: int = 0
    reserved_cost: float = 0.0
    reserved_tokens: int = 0
    running: int = 0
    deferred: int = 0
    rejected: int = 0


def check_ceiling(key: str, cost: float | None, tokens: int | None, per_s: float,
                  on_over: str) -> tuple[int | None, int]:
    """A spend ceiling's arguments checked (InvalidArgument says what is wrong): the cost in thousandths (None:
    not capped) and the window in ms."""
    check_slot_key(key)
    if cost is None and tokens is None:
        raise InvalidArgument("a spend ceiling needs cost=, tokens= or both")
    milli: int | None = None
    if cost is not None:
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) \
                or not 0 < cost <= MAX_COST:
            raise InvalidArgument(f"cost must be a number above 0 and at most {MAX_COST:,}, got {cost!r}")
        milli = max(1, round(cost * 1000))
    if tokens is not None:
        check_int(tokens, what="tokens", low=1, high=MAX_TOKENS)
    window_ms = math.ceil(check_seconds(per_s, what="per_s", high=MAX_WINDOW_S) * 1000)
    if on_over not in ON_OVER:
        raise InvalidArgument(f"on_over must be one of {', '.join(ON_OVER)}, got {on_over!r}")
    return milli, window_ms


def _pair(text: str) -> tuple[int, int]:
    cost, _, tokens = text.partition(" ")
    return (int(cost), int(tokens)) if cost.isdigit() and tokens.isdigit() else (0, 0)


class Spend(Role):
    """Set and read spend ceilings."""

    def set(self, key: str, *, cost: float | None = None, tokens: int | None = None, per_s: float,
            on_over: str = "wait", reason: str = "set by an operator", source: str = "operator",
            actor: str | None = None) -> bool:
        """Cap what the Attempts of the tasks naming ``key`` (or each key of a family '<name>:*') may spend in
        any ``per_s`` seconds: ``cost`` (in the unit the workers charge, to a thousandth) and/or ``tokens``.
        ``on_over``: wait | reject. False: it already was so, or an App's setting would replace an operator's."""
        milli, window_ms = check_ceiling(key, cost, tokens, per_s, on_over)
        return str(self._admin("spend", key, reason, source, actor, limit=milli, tokens=tokens, window_ms=window_ms,
                               on_over=on_over)[0]) == "OK"

    def delete(self, key: str, *, reason: str, actor: str | None = None) -> bool:
        """Remove the spend ceiling of ``key`` (its deferred Attempts are claimed when next due)."""
        return str(self._admin("unspend", key, reason, "operator", actor)[0]) == "OK"

    def _admin(self, op: str, key: str, reason: str, source: str, actor: str | None, *, limit: int | None = None,
               tokens: int | None = None, window_ms: int | None = None, on_over: str = "") -> list[Any]:
        check_slot_key(key)
        return self._key_admin(op, key, key[:-1] if key.endswith(":*") else key, reason, source, SOURCES, actor,
                               limit=limit, tokens=tokens, window_ms=window_ms, on_full=on_over)

    def status(self, key: str) -> SpendStatus:
        """One key now: its own ceiling, else its family's (a key never set reads as uncapped)."""
        check_slot_key(key)
        return self.all([key])[0]

    def all(self, keys: list[str] | None = None) -> list[SpendStatus]:
        """Every key with a ceiling set, spent or reserved for (or the ``keys`` given), by key: one round trip
        (the ledger is read whole: a bucket per sixtieth of each window, a reservation per running Attempt)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.limits)
        pipe.hgetall(self.keys.stats)
        pipe.zrange(self.keys.spent, 0, -1)
        pipe.time()
        fields, stats, ledger, now = cast(tuple[dict[str, str], dict[str, str], list[str], tuple[int, int]],
                                          pipe.execute())
        ts = now[0] * 1000 + now[1] // 1000
        settings = {k[:-6]: v for k, v in fields.items() if k.endswith("|spend")}
        entries: dict[str, list[list[str]]] = {}
        for m in ledger:
            parts = m.split("\n")
            entries.setdefault(parts[0], []).append(parts[1:])
        names = sorted(set(settings) | set(entries)) if keys is None else list(keys)
        out = []
        for name in names:
            own = settings.get(name)
            fam = family_of(name) if not name.endswith(":*") else None
            setting = own or (settings.get(fam) if fam else None)
            parts = setting.split(" ") if setting else []
            cap_c, cap_t, win = (int(parts[0]), int(parts[1]), int(parts[2])) if len(parts) >= 5 else (0, 0, 0)
            spent, held, running = [0, 0], [0, 0], 0
            for e in entries.get(name, []):
                if len(e) == 3 and e[0] == "~":  # a running Attempt's reservation
                    c, t = _pair(e[2])
                    held[0], held[1], running = held[0] + c, held[1] + t, running + 1
                elif len(e) == 3 and e[0].isdigit() and e[1].isdigit():
                    if not win or int(e[0]) + int(e[1]) > ts - win:  # (no ceiling now: every bucket kept)
                        c, t = _pair(e[2])
                        spent[0], spent[1] = spent[0] + c, spent[1] + t
            out.append(SpendStatus(
                key=name, cost=cap_c / 1000 if cap_c else None, tokens=cap_t or None,
                window_s=win / 1000 if setting else None, on_over=parts[3] if setting else None,
                source=parts[4] if setting else None, family=bool(setting) and not own,
                spent_cost=spent[0] / 1000, spent_tokens=spent[1], reserved_cost=held[0] / 1000,
                reserved_tokens=held[1], running=running, deferred=int(stats.get(f"spend_deferred|{name}") or 0),
                rejected=int(stats.get(f"spend_rejected|{name}") or 0)))
        return out

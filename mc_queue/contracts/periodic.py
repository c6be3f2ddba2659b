"""PeriodicSchedule schedules: what one is (a cron expression or a fixed interval, the task it makes, and what
to do when ticks overlap or were missed), and which ticks fall due when.

A tick is a moment in milliseconds since the epoch, on Redis's clock (the sweeper asks Redis for the
time). Each tick of a schedule makes at most one task, whose producer key is ``periodic:<name>:<tick>``
and whose task id is chosen once, when the tick is decided (lua/periodic_decide.lua): any number of
sweepers agree on every tick (see :mod:`mc_queue.client.periodic`).

Policies, as Temporal Schedules name them (mc_queue's names):

- ``overlap``: what a tick does while the task of the previous tick has not ended. ``skip`` (the
  default): the tick is skipped and counted; ``queue``: the task is made anyway and waits its turn;
  ``cancel``: the previous task is canceled (the cancellation protocol) and the new one made.
- ``catch_up``: what the ticks missed while no sweeper ran do (a tick is missed once it is more
  than ``late_s`` old when a sweeper first sees it). ``none``: all skipped; ``last`` (the default):
  only the newest of them runs; ``all``: every one within ``catch_up_window_s`` runs, in order, older
  ones are skipped. A tick seen in time always runs (subject to ``overlap``).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .codec import canonical_json
from .errors import InvalidArgument
from .keys import check_queue

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HANDLER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
MIN_EVERY_S = 0.1
MAX_EVERY_S = 366 * 86_400.0
DEFAULT_LATE_S = 60.0
MAX_COUNTED = 100_000  # missed ticks counted per plan (a longer outage is caught up over several passes)
BULK_RUN = 1000  # ticks run per plan at most (catch_up='all' with a long window)

Overlap = Literal["skip", "queue", "cancel"]
CatchUp = Literal["none", "last", "all"]


class PeriodicSchedule(BaseModel):
    """One periodic schedule (validated when built). Exactly one of ``cron`` (five fields, Debian
    cron's rules, in ``tz``) and ``every_s`` (ticks at ``anchor_ms + k * every_s``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    handler: str
    queue: str
    payload: dict[str, Any] = Field(default_factory=dict)
    cron: str | None = None
    every_s: float | None = Field(default=None, ge=MIN_EVERY_S, le=MAX_EVERY_S)
    anchor_ms: int = Field(default=0, ge=0, le=253402300799999)
    tz: str = "UTC"
    overlap: Overlap = "skip"
    catch_up: CatchUp = "last"
    catch_up_window_s: float = Field(default=86_400.0, gt=0, le=3650 * 86_400)
    late_s: float = Field(default=DEFAULT_LATE_S, gt=0, le=86_400)
    app: str = ""  # the App that declared it (publishing replaces that App's schedules only)
    # What the task is made with (the handler's, frozen when the App published the schedule)
    retry_policy: dict[str, Any] = Field(default_factory=dict)
    budget: dict[str, Any] = Field(default_factory=dict)
    lease_ms: int | None = None
    timeout_s: float | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("a schedule's name is 1-64 of letters, digits, '_', '.', '-', starting with a letter "
                             "or digit")
        return v

    @field_validator("handler")
    @classmethod
    def _handler(cls, v: str) -> str:
        if not _HANDLER_RE.fullmatch(v):
            raise ValueError("a handler's name is 1-128 of letters, digits, '_', '.', ':', '-'")
        return v

    @field_validator("queue")
    @classmethod
    def _queue(cls, v: str) -> str:
        return check_queue(v)

    @field_validator("payload")
    @classmethod
    def _payload(cls, v: dict[str, Any]) -> dict[str, Any]:
        canonical_json(v, what="payload")
        return v

    @field_validator("tz")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {v!r} (an IANA name such as 'UTC' or 'Europe/Paris')") from exc
        return v

    @model_validator(mode="after")
    def _one_rule(self) -> PeriodicSchedule:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError("give exactly one of cron (a cron expression) and every_s (seconds)")
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime(2000, 1, 1, tzinfo=ZoneInfo(self.tz)))
            except CronSimError as exc:
                raise ValueError(f"cron {self.cron!r}: {exc}") from exc
            if "\n" in self.cron or len(self.cron) > 200:
                raise ValueError("cron must be one line of at most 200 characters")
        return self

    @property
    def rule(self) -> str:
        """The rule in words: ``cron '0 2 * * *' (Europe/Paris)`` or ``every 3600s``."""
        if self.cron is not None:
            return f"cron '{self.cron}'" + ("" if self.tz == "UTC" else f" ({self.tz})")
        return f"every {self.every_s:g}s"

    def ticks(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """The ticks strictly after ``after_ms`` and at most ``until_ms``, oldest first, at most ``limit``."""
        out: list[int] = []
        if until_ms <= after_ms or limit <= 0:
            return out
        if self.every_s is not None:
            step = max(1, round(self.every_s * 1000))
            k = max(0, math.floor((after_ms - self.anchor_ms) / step) + 1)
            t = self.anchor_ms + k * step
            while t <= until_ms and len(out) < limit:
                if t > after_ms:
                    out.append(t)
                t += step
            return out
        assert self.cron is not None
        it = CronSim(self.cron, datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(ZoneInfo(self.tz)))
        while len(out) < limit:
            try:
                t = int(next(it).timestamp() * 1000)
            except StopIteration:
                break
            if t > until_ms:
                break
            if t > after_ms:
                out.append(t)
        return out

    def next_tick(self, after_ms: int) -> int | None:
        """The first tick after ``after_ms`` (None: the cron expression matches nothing in 50 years)."""
        found = self.ticks(after_ms, after_ms + 50 * 366 * 86_400_000, 1)
        return found[0] if found else None

    def count_ticks(self, after_ms: int, until_ms: int, cap: int) -> tuple[int, int | None]:
        """How many ticks fall in (after_ms, until_ms], counted up to ``cap``, and the last one counted."""
        if until_ms <= after_ms:
            return 0, None
        if self.every_s is not None:
            step = max(1, round(self.every_s * 1000))
            first = max(0, math.floor((after_ms - self.anchor_ms) / step) + 1)
            last = math.floor((until_ms - self.anchor_ms) / step)
            if last < first:
                return 0, None
            n = min(last - first + 1, cap)
            return n, self.anchor_ms + (first + n - 1) * step
        found = self.ticks(after_ms, until_ms, cap)
        return len(found), (found[-1] if found else None)

    def plan(self, cursor_ms: int, now_ms: int) -> list[tuple[int, int, str]]:
        """What the ticks after ``cursor_ms`` up to ``now_ms`` come to: (tick, how many ticks the entry
        stands for, '' to run or 'missed' to skip), oldest first. Missed ticks that will not run are one
        entry however many they are (counted up to MAX_COUNTED per plan: a longer outage is caught up
        over several passes), and at most BULK_RUN ticks run per plan."""
        late_ms = int(self.late_s * 1000)
        horizon = now_ms - max(late_ms, int(self.catch_up_window_s * 1000) if self.catch_up == "all" else 0)
        out: list[tuple[int, int, str]] = []
        old_n, old_last = self.count_ticks(cursor_ms, horizon, MAX_COUNTED)
        if old_n == MAX_COUNTED:
            assert old_last is not None
            return [(old_last, old_n, "missed")]  # more than this: this much now, the rest next pass
        recent = self.ticks(max(cursor_ms, horizon), now_ms, 10 * BULK_RUN)
        if len(recent) > BULK_RUN:  # ('all' with a long window): the oldest are skipped too
            extra = recent[:-BULK_RUN]
            old_n, old_last, recent = old_n + len(extra), extra[-1], recent[-BULK_RUN:]
        if old_n and old_last is not None:
            if self.catch_up == "last" and not recent:  # the newest missed tick runs, the others are skipped
                if old_n > 1:  # (a cursor a millisecond before a tick stands for every tick before it)
                    out.append((old_last - 1, old_n - 1, "missed"))
                out.append((old_last, 1, ""))
            else:
                out.append((old_last, old_n, "missed"))
        for t in recent:
            out.append((t, 1, "" if now_ms - t <= late_ms or self.catch_up == "all" else "missed"))
        return out


def periodic_from_json(text: str) -> PeriodicSchedule:
    """A schedule as Redis holds it (InvalidArgument when it is not one)."""
    try:
        return PeriodicSchedule.model_validate_json(text)
    except ValueError as exc:
        raise InvalidArgument(f"not a periodic schedule: {exc}") from None


def tick_key(name: str, tick_ms: int) -> str:
    """The producer key of the task a tick makes: the same for every sweeper that decides it."""
    return f"periodic:{name}:{tick_ms}"

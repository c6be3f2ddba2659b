"""What the commands share: their Client (``Ctx``), the root group's one-line usage errors, and the
checked types of ids, numbers, durations, reasons and ``--app``."""

from __future__ import annotations

import math
import sys
from typing import Any

import click

from ..client import Client
from ..client.connect import connect
from ..contracts.errors import ConfigurationError, McqError
from ..contracts.keys import parse_attempt_id, parse_task_id
from ..store.urls import redacted
from .errors import one_line


class Ctx:
    def __init__(self, redis_url: str | None, prefix: str | None, home: str | None, again: str = "mcq") -> None:
        self.redis_url, self.prefix, self.home = redis_url, prefix, home
        self.again = again  # how to run mcq again as this one was run (its path, the global options typed)
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        """For commands that write: the embedded default is started when it does not run."""
        return self._connect(start_embedded=True)

    @property
    def reader(self) -> Client:
        """For commands that only read: never starts the embedded server (NoEmbeddedServer, exit 4)."""
        return self._connect(start_embedded=False)

    def _connect(self, *, start_embedded: bool) -> Client:
        if self._client is None:
            try:
                self._client = connect(self.redis_url, prefix=self.prefix, home=self.home,
                                       start_embedded=start_embedded)
            except McqError:
                raise
            except ValueError as exc:  # what redis-py's URL parser raises (a port out of range, a bad parameter)
                raise ConfigurationError(f"bad Redis URL {redacted(self.redis_url or '')!r}: {exc}") from None
        return self._client


class McqGroup(click.Group):
    """mcq's root: every usage error of every command, however deep, is shown as one line."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise one_line(exc) from None


class Finite(click.FloatRange):
    """A number within the option's range, and finite: click's FloatRange lets ``nan`` through (every
    comparison with it is false) and ``1e400`` is ``inf``."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


class TaskIdType(click.ParamType[str]):
    """A task id, checked before anything connects: a malformed one says what an id looks like and
    where ids are found."""

    name = "task id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            parse_task_id(value)
        except ValueError:
            self.fail(f"invalid task id {value!r}: a task id is <queue>:<26-character ULID>, e.g. "
                      "agents:01M8SE9342NZ6XKW84V2J6Q1TB, as `mcq enqueue` prints it; `mcq tasks` lists them "
                      "(`mcq tasks --state failed`, `mcq dlq list`)", param, ctx)
        return value


class AttemptIdType(click.ParamType[str]):
    name = "attempt id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            parse_attempt_id(value)
        except ValueError:
            self.fail(f"invalid attempt id {value!r}: an attempt id is <task id>/<attempt number>, e.g. "
                      "agents:01M8SE9342NZ6XKW84V2J6Q1TB/2; `mcq show TASK` lists a task's Attempts", param, ctx)
        return value


TASK_ID = TaskIdType()
ATTEMPT_ID = AttemptIdType()


def load_app(spec: str) -> Any:
    """Import ``package.module:attr`` (an operator's argument, never a name found in Redis)."""
    import importlib
    import os

    from ..producer.app import App

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected 'package.module:app'", param_hint="--app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}", param_hint="--app") from None
    except Exception as exc:  # the app's own module failed while it was imported
        raise click.BadParameter(f"importing {module_name!r} raised {type(exc).__name__}: {exc}",
                                 param_hint="--app") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec!r} is not an mc_queue.App", param_hint="--app")
    return app


_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_MAX_DURATION_MS = 36_500 * 86_400_000


def duration_ms(text: str | None, param: str) -> int | None:
    """'90s', '15m', '2h', '7d', '500ms' (or bare seconds) -> milliseconds."""
    if text is None:
        return None
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration: use e.g. 90s, 15m, 2h, 7d", param_hint=param)
    ms = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    if not ms <= _MAX_DURATION_MS:  # (also inf: 400 nines are a float's infinity)
        raise click.BadParameter(f"{text[:40]!r}{'...' if len(text) > 40 else ''} is longer than 100 years",
                                 param_hint=param)
    return int(ms)


def check_reason(reason: str) -> None:
    if len(reason.strip()) < 10:
        raise click.BadParameter("a reason of at least ten characters is needed", param_hint="--reason")


def redis_now_ms(obj: Ctx) -> int:
    """Redis's clock (one clock: ages are measured against the times Redis recorded)."""
    return obj.client.backend.redis_time_ms()

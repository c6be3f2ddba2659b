"""Loads the Lua scripts of ``lua/`` and runs them: one entry per script, resends decided by its header.

A script's header is its contract: ``-- KEYS[i] name`` and ``-- ARGV[i] name`` lines, its replies and
whether a resend is safe (``-- Idempotent: yes | by request id | no``). Callers pass keys and
arguments by name; a name missing or extra is a programming error raised here, before anything
reaches Redis, so the header and the code cannot drift apart silently.

:class:`ScriptRunner` runs scripts on a redis-py connection whose own retries are off (redis-py
would re-send a command after a timeout without saying so: a claim ran 11 times here). After a
connection error or a timeout it re-sends a script only when the script's header says a resend is
safe; otherwise it raises :class:`~mc_queue.errors.OutcomeUnknown`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import redis
from redis.commands.core import Script

from .errors import OutcomeUnknown

_HEADER_RE = re.compile(r"^--\s+(KEYS|ARGV)\[(\d+)\]\s+(\w+)")
_IDEMPOTENT_RE = re.compile(r"^--\s+Idempotent:\s*(\S+)", re.M)
_INCLUDE_RE = re.compile(r"^--@include\s+(\w+)\s*$", re.M)
RESENDS = 3  # resends of an idempotent script after a connection error or a timeout


def lua_dir() -> Path:
    """The ``lua/`` folder: inside the installed package, else beside it in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "claim.lua").is_file():
            return candidate
    raise FileNotFoundError(f"mc_queue's lua/ scripts are missing (looked in {here / 'lua'} and {here.parent / 'lua'})")


@dataclass(frozen=True)
class ScriptSpec:
    name: str
    source: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    idempotent: bool  # the header says a resend is safe


def parse_header(name: str, text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    found: dict[str, dict[int, str]] = {"KEYS": {}, "ARGV": {}}
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        m = _HEADER_RE.match(line)
        if m:
            found[m.group(1)][int(m.group(2))] = m.group(3)
    out = []
    for kind in ("KEYS", "ARGV"):
        idx = found[kind]
        if sorted(idx) != list(range(1, len(idx) + 1)):
            raise ValueError(f"{name}.lua: {kind} in the header are not numbered 1..{len(idx)}")
        out.append(tuple(idx[i] for i in range(1, len(idx) + 1)))
    return out[0], out[1]


def parse_idempotent(name: str, text: str) -> bool:
    """``Idempotent: yes ...`` or ``Idempotent: by ...`` -> True; ``Idempotent: no ...`` -> False."""
    m = _IDEMPOTENT_RE.search(text)
    if not m:
        raise ValueError(f"{name}.lua: the header has no 'Idempotent:' line")
    word = m.group(1).lower()
    if word not in ("yes", "by", "no"):
        raise ValueError(f"{name}.lua: 'Idempotent:' must start with yes, by or no, not {word!r}")
    return word != "no"


def load_specs(directory: Path | None = None) -> dict[str, ScriptSpec]:
    directory = directory or lua_dir()
    includes = {p.stem: p.read_text() for p in (directory / "includes").glob("*.lua")}
    specs = {}
    for path in sorted(directory.glob("*.lua")):
        text = path.read_text()
        keys, argv = parse_header(path.stem, text)

        def include(m: re.Match[str]) -> str:
            return includes[m.group(1)]

        specs[path.stem] = ScriptSpec(path.stem, _INCLUDE_RE.sub(include, text), keys, argv,
                                      parse_idempotent(path.stem, text))
    return specs


_SPECS: dict[str, ScriptSpec] | None = None


def specs() -> dict[str, ScriptSpec]:
    global _SPECS
    if _SPECS is None:
        _SPECS = load_specs()
    return _SPECS


class Observer(Protocol):
    """Sees every script call the runner makes (tests use it to check transitions against the table)."""

    def before(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any]) -> Any: ...

    def after(self, token: Any, reply: Any) -> None: ...


class ScriptRunner:
    """The scripts bound to one redis-py client (EVALSHA, loading the script on NOSCRIPT)."""

    def __init__(self, client: redis.Redis, *, resends: int = RESENDS,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._client = client
        self._resends = resends
        self._sleep = sleep
        self._scripts: dict[str, tuple[ScriptSpec, Script]] = {
            name: (spec, Script(client, spec.source)) for name, spec in specs().items()
        }
        self.observers: list[Observer] = []

    def spec(self, name: str) -> ScriptSpec:
        return self._scripts[name][0]

    def _args(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
        spec = self._scripts[name][0]
        if set(keys) != set(spec.keys) or set(argv) != set(spec.argv):
            raise TypeError(
                f"{name}.lua expects KEYS {spec.keys} and ARGV {spec.argv}; "
                f"got KEYS {tuple(keys)} and ARGV {tuple(argv)}"
            )
        return [keys[k] for k in spec.keys], [_arg(argv[a]) for a in spec.argv]

    def call(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any], client: Any = None) -> Any:
        """One send, no resend (``client`` may be a pipeline)."""
        k, a = self._args(name, keys, argv)
        return self._scripts[name][1](keys=k, args=a, client=client or self._client)

    def run(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any]) -> list[Any]:
        """Run a script; after a connection error or timeout, resend it only if its header says that is safe."""
        tokens = [o.before(name, keys, argv) for o in self.observers]
        attempts = (self._resends if self.spec(name).idempotent else 0) + 1
        last: Exception | None = None
        for i in range(attempts):
            try:
                reply = self.call(name, keys, argv)
                out = reply if isinstance(reply, list) else [reply]
                for o, t in zip(self.observers, tokens, strict=True):
                    o.after(t, out)
                return out
            except redis.AuthenticationError:
                raise  # wrong credentials: resending cannot help
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                last = exc
                if i + 1 < attempts:
                    self._sleep(min(0.05 * (2**i), 1.0))
        assert last is not None
        if not self.spec(name).idempotent:
            raise OutcomeUnknown(f"{name}: the connection failed after the script was sent ({last}); it is not "
                                 "safe to resend, so it may or may not have run: read the state back",
                                 script=name) from last
        raise last

    def run_many(self, name: str, calls: Sequence[tuple[Mapping[str, str], Mapping[str, Any]]]) -> list[Any]:
        """Many calls of one idempotent script in one pipeline; a reply that is an error comes back as
        the exception object, so one bad entry does not hide the others."""
        assert self.spec(name).idempotent, f"{name} is not idempotent: run it alone"
        tokens = [[o.before(name, k, a) for o in self.observers] for k, a in calls]
        for i in range(self._resends + 1):
            pipe = self._client.pipeline(transaction=False)
            for k, a in calls:
                self.call(name, k, a, client=pipe)
            try:
                replies = pipe.execute(raise_on_error=False)
                break
            except (redis.ConnectionError, redis.TimeoutError):
                if i == self._resends:
                    raise
                self._sleep(min(0.05 * (2**i), 1.0))
        for toks, reply in zip(tokens, replies, strict=True):
            for o, t in zip(self.observers, toks, strict=True):
                o.after(t, reply)
        return list(replies)


def _arg(value: Any) -> str | int | bytes:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, str, bytes)):
        return value
    return str(value)

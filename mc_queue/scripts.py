"""Loads the Lua scripts of ``lua/``, one typed entry per script.

A script's header is its contract: ``-- KEYS[i] name`` and ``-- ARGV[i] name`` lines. Callers pass
keys and arguments by name; a name missing or extra is a programming error raised here, before
anything reaches Redis, so the header and the code cannot drift apart silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.commands.core import Script

_HEADER_RE = re.compile(r"^--\s+(KEYS|ARGV)\[(\d+)\]\s+(\w+)")
_INCLUDE_RE = re.compile(r"^--@include\s+(\w+)\s*$", re.M)


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


def load_specs(directory: Path | None = None) -> dict[str, ScriptSpec]:
    directory = directory or lua_dir()
    includes = {p.stem: p.read_text() for p in (directory / "includes").glob("*.lua")}
    specs = {}
    for path in sorted(directory.glob("*.lua")):
        text = path.read_text()
        keys, argv = parse_header(path.stem, text)

        def include(m: re.Match[str]) -> str:
            return includes[m.group(1)]

        specs[path.stem] = ScriptSpec(path.stem, _INCLUDE_RE.sub(include, text), keys, argv)
    return specs


_SPECS: dict[str, ScriptSpec] | None = None


def specs() -> dict[str, ScriptSpec]:
    global _SPECS
    if _SPECS is None:
        _SPECS = load_specs()
    return _SPECS


class Scripts:
    """The scripts bound to one redis-py client (EVALSHA, loading the script on NOSCRIPT)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._scripts: dict[str, tuple[ScriptSpec, Script]] = {
            name: (spec, Script(client, spec.source)) for name, spec in specs().items()
        }

    def call(self, name: str, keys: Mapping[str, str], argv: Mapping[str, Any], client: Any = None) -> Any:
        spec, script = self._scripts[name]
        if set(keys) != set(spec.keys) or set(argv) != set(spec.argv):
            raise TypeError(
                f"{name}.lua expects KEYS {spec.keys} and ARGV {spec.argv}; "
                f"got KEYS {tuple(keys)} and ARGV {tuple(argv)}"
            )
        return script(
            keys=[keys[k] for k in spec.keys],
            args=[_arg(argv[a]) for a in spec.argv],
            client=client or self._client,
        )


def _arg(value: Any) -> str | int:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, str)):
        return value
    return str(value)

"""Small readers shared by the fault tests: raw Redis views of a namespace, server counters."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from mc_queue.contracts.history import history
from mc_queue.contracts.keys import Keys
from mc_queue.testing import RedisServer


def evalsha_calls(r: redis.Redis) -> int:
    """How many EVALSHA commands the server has executed (INFO commandstats)."""
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def meta(r: redis.Redis, prefix: str) -> dict[str, str]:
    return r.hgetall(Keys(prefix).meta)  # type: ignore[return-value]


def task_events(r: redis.Redis, prefix: str, task_id: str) -> list[dict[str, str]]:
    tk = Keys(prefix).task(task_id)
    return [dict(f, id=i) for i, f in history(r.hgetall(tk.task), r.lrange(tk.events, 0, -1), r.hgetall(tk.attempts))]


def events_of(r: redis.Redis, prefix: str, task_id: str, typ: str) -> list[dict[str, str]]:
    return [e for e in task_events(r, prefix, task_id) if e.get("type") == typ]


def attempt_fields(r: redis.Redis, prefix: str, task_id: str, n: int) -> dict[str, str]:
    tk = Keys(prefix).task(task_id)
    pre = f"{n}."
    return {k[len(pre):]: v for k, v in r.hgetall(tk.attempts).items() if k.startswith(pre)}


def dump_namespace(r: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key of the namespace with its full value, type-aware (for before/after comparisons)."""
    out: dict[str, Any] = {}
    tag = Keys(prefix).tag
    for key in sorted(r.scan_iter(match=f"{_glob_escape(tag)}:*", count=1000)):
        typ = r.type(key)
        if typ == "hash":
            out[key] = ("hash", r.hgetall(key))
        elif typ == "zset":
            out[key] = ("zset", r.zrange(key, 0, -1, withscores=True))
        elif typ == "set":
            out[key] = ("set", sorted(r.smembers(key)))
        elif typ == "stream":
            out[key] = ("stream", r.xrange(key))
        elif typ == "string":
            out[key] = ("string", r.get(key))
        elif typ == "list":
            out[key] = ("list", r.lrange(key, 0, -1))
        else:
            out[key] = (typ, None)
    return out


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def copy_data(server: RedisServer, dest: Path) -> Path:
    """Copy a stopped server's data (AOF folder, RDB) to ``dest`` (the log stays)."""
    dest.mkdir(parents=True, exist_ok=True)
    for child in server.dir.iterdir():
        if child.name == "redis.log":
            continue
        target = dest / child.name
        if child.is_dir():
            shutil.copytree(child, target)
        else:
            shutil.copy2(child, target)
    return dest


def restore_data(server: RedisServer, src: Path) -> None:
    """Replace a stopped server's data with a copy made by ``copy_data``."""
    for child in server.dir.iterdir():
        if child.name == "redis.log":
            continue
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    for child in src.iterdir():
        target = server.dir / child.name
        if child.is_dir():
            shutil.copytree(child, target)
        else:
            shutil.copy2(child, target)


class SendRecorder:
    """Wraps a Client's script caller: records every script mc_queue itself sends and what came back.

    This is what mc_queue "reports" it sent; the server's INFO commandstats and the proxy count
    what actually arrived.
    """

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[str, str]] = []
        self.runner = client.runner
        self._orig: Callable[..., Any] = self.runner.call
        self.runner.call = self._call

    def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        try:
            reply = self._orig(name, *args, **kw)
        except Exception as exc:
            self.calls.append((name, type(exc).__name__))
            raise
        code = reply[0] if isinstance(reply, list) and reply else str(reply)
        self.calls.append((name, str(code)))
        return reply

    def sends(self, name: str) -> list[str]:
        return [outcome for n, outcome in self.calls if n == name]

    def restore(self) -> None:
        self.runner.call = self._orig

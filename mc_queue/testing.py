"""Helpers for testing code built on mc_queue against a real redis-server.

``RedisServer`` runs a private redis-server on a free loopback port with its data in a folder of
its own; it can be stopped, killed and restarted with or without its data, which is what fault
tests need. It never touches the machine's shared Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from .embedded import find_redis_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process owned by a test session."""

    def __init__(self, directory: str | os.PathLike[str], *, port: int | None = None, appendonly: bool = True,
                 appendfsync: str = "always", extra: list[str] | None = None, password: str | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra = list(extra or [])
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        args = [
            find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
            "--save", "", "--daemonize", "no", "--logfile", str(self.dir / "redis.log"),
            "--enable-debug-command", "local",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra

    def start(self, timeout: float = 15.0) -> RedisServer:
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.dir / 'redis.log'}")
            try:
                c = self.client()
                c.ping()
                # Wait until the AOF (if any) is loaded.
                while c.info("persistence").get("loading"):
                    time.sleep(0.02)
                c.close()
                return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start within {timeout}s")

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, decode_responses=True, **kw)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self, *, keep_data: bool = True, sig: int = signal.SIGKILL) -> RedisServer:
        """Stop (SIGKILL by default) and start again on the same port and folder.

        ``keep_data=False`` wipes the folder first: Redis comes back empty, as after a restart
        without persistence or a lost disk.
        """
        self.stop(sig)
        if not keep_data:
            for child in self.dir.iterdir():
                if child.name != "redis.log":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        return self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(signal.SIGKILL)


def unique_prefix(stem: str = "t") -> str:
    """A namespace prefix no other test uses: tests share a server, never FLUSHALL it."""
    return f"{stem}-{uuid.uuid4().hex[:10]}"

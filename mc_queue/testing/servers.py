"""Helpers for testing code built on mc_queue against a real redis-server.

``RedisServer`` runs a private redis-server on a free loopback port with its data in a folder of
its own; it can be stopped, killed and restarted with or without its data, which is what fault
tests need. ``FailoverCluster`` adds a replica and redis-sentinels, for failovers on demand. They
never touch the machine's shared Redis.
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
from typing import Any, cast

import redis

from ..store.embedded import find_redis_server
from .proxy import TcpProxy


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
        # surrogateescape: a packed task's chunks and a long value's mark are bytes that are not UTF-8
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, decode_responses=True,
                           **{"encoding_errors": "surrogateescape", **kw})

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


# ---------------------------------------------------------------------- replication and Sentinel


class SentinelServer:
    """One redis-sentinel process (``redis-server <conf> --sentinel``) monitoring ``service``."""

    def __init__(self, directory: str | os.PathLike[str], master: tuple[str, int], *, service: str = "mcq",
                 quorum: int = 2, down_after_ms: int = 1000, failover_timeout_ms: int = 5000,
                 port: int | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.service = service
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text("\n".join([
            f"port {self.port}", "bind 127.0.0.1", "daemonize no", f"dir {self.dir}",
            f"logfile {self.dir / 'sentinel.log'}",
            f"sentinel monitor {service} {master[0]} {master[1]} {quorum}",
            f"sentinel down-after-milliseconds {service} {down_after_ms}",
            f"sentinel failover-timeout {service} {failover_timeout_ms}",
            f"sentinel parallel-syncs {service} 1", "",
        ]))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> SentinelServer:
        self.proc = subprocess.Popen([find_redis_server(), str(self.conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-sentinel exited with {self.proc.returncode}; see {self.dir}/sentinel.log")
            try:
                c = self.client()
                c.ping()
                c.close()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-sentinel on port {self.port} did not start within {timeout}s")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=2,
                           encoding_errors="surrogateescape")

    def master(self) -> dict[str, Any]:
        c = self.client()
        try:
            return cast(dict[str, Any], c.execute_command("SENTINEL", "MASTER", self.service))  # type: ignore[no-untyped-call]
        finally:
            c.close()

    def master_address(self) -> tuple[str, int] | None:
        c = self.client()
        try:
            addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)  # type: ignore[no-untyped-call]
        finally:
            c.close()
        return (str(addr[0]), int(addr[1])) if addr else None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


class FailoverCluster:
    """A primary (AOF, ``appendfsync always``) and one replica whose replication link runs through a
    :class:`TcpProxy`, watched by ``sentinels`` redis-sentinel processes (quorum ``quorum``, a
    short ``down_after_ms`` and ``failover_timeout_ms``, so a failover takes a few seconds).

    ``lag()`` holds the replication stream back, ``catch_up()`` lets it flow, ``kill_primary()``
    SIGKILLs the primary and cuts the proxy (what was held back is lost, as with a replica that lagged
    behind a dead primary), ``wait_failover()`` waits until the sentinels name the replica as the
    primary, ``restart_old_primary()`` starts the old primary again on its own data (the sentinels
    turn it into a replica of the new one). ``url()`` is the ``redis+sentinel://`` URL of the service.
    """

    def __init__(self, directory: str | os.PathLike[str], *, service: str = "mcq", sentinels: int = 3,
                 quorum: int = 2, down_after_ms: int = 1000, failover_timeout_ms: int = 5000,
                 appendfsync: str = "always") -> None:
        self.dir = Path(directory)
        self.service = service
        fast = ["--repl-diskless-sync-delay", "0"]  # a full sync starts at once (default: waits 5 s)
        self.primary = RedisServer(self.dir / "primary", appendfsync=appendfsync, extra=fast)
        # The sentinels know the primary by the proxy's address too: they repoint a replica whose master
        # address differs from theirs (+fix-slave-config) straight to the primary, past the proxy. Only
        # the replication connection (it sends REPLCONF) is held back; the sentinels' and clients' flow.
        self.proxy = TcpProxy(("127.0.0.1", self.primary.port), hold_only=b"REPLCONF")
        self.replica = RedisServer(self.dir / "replica", appendfsync=appendfsync,
                                   extra=[*fast, "--replicaof", "127.0.0.1", str(self.proxy.port)])
        self.sentinels = [SentinelServer(self.dir / f"sentinel{i}", ("127.0.0.1", self.proxy.port), service=service,
                                         quorum=quorum, down_after_ms=down_after_ms,
                                         failover_timeout_ms=failover_timeout_ms) for i in range(sentinels)]
        self.old_primary: RedisServer | None = None

    def start(self, timeout: float = 30.0) -> FailoverCluster:
        self.primary.start()
        self.proxy.start()
        self.replica.start()
        deadline = time.monotonic() + timeout
        self._wait(lambda: self.replica_info().get("master_link_status") == "up", deadline, "the replica to sync")
        for s in self.sentinels:
            s.start()
        want_others = len(self.sentinels) - 1

        def ready() -> bool:
            for s in self.sentinels:
                m = s.master()
                if int(m.get("num-slaves", 0)) < 1 or int(m.get("num-other-sentinels", 0)) < want_others:
                    return False
            return True

        self._wait(ready, deadline, "the sentinels to see the replica and each other")
        return self

    @staticmethod
    def _wait(cond: Any, deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"timed out waiting for {what}")

    def url(self, **params: Any) -> str:
        from ..store.urls import sentinel_url

        return sentinel_url([("127.0.0.1", s.port) for s in self.sentinels], self.service, **params)

    def replica_info(self) -> dict[str, Any]:
        c = self.replica.client(socket_timeout=2)
        try:
            return c.info("replication")
        finally:
            c.close()

    def primary_info(self) -> dict[str, Any]:
        c = self.primary.client(socket_timeout=2)
        try:
            return c.info("replication")
        finally:
            c.close()

    def lag(self) -> None:
        """Hold the replication stream back (the replica falls behind from now on)."""
        self.proxy.pause()

    def catch_up(self, timeout: float = 10.0) -> None:
        """Let the stream flow and wait until the replica acknowledged the primary's offset."""
        self.proxy.resume()
        target = int(self.primary_info()["master_repl_offset"])
        self._wait(lambda: int(self.replica_info().get("master_repl_offset", 0)) >= target,
                   time.monotonic() + timeout, "the replica to catch up")

    def kill_primary(self) -> None:
        """SIGKILL the primary and cut every connection through the proxy (the replication link among
        them): what the replica had not received is gone."""
        self.primary.kill()
        self.proxy.cut()

    def promoted_address(self) -> tuple[str, int]:
        """The address the sentinels give for the replica once it is promoted."""
        return ("127.0.0.1", self.replica.port)

    def wait_failover(self, timeout: float = 30.0) -> tuple[str, int]:
        """Wait until every sentinel names the replica as the primary, and it says so."""
        want = self.promoted_address()

        def switched() -> bool:
            named = [s.master_address() for s in self.sentinels]
            return all(a == want for a in named) and self.replica_info().get("role") == "master"

        self._wait(switched, time.monotonic() + timeout, "the sentinels to promote the replica")
        return want

    def planned_failover(self, timeout: float = 30.0) -> tuple[str, int]:
        """``SENTINEL FAILOVER``: the replica is promoted while the primary is alive; the sentinels turn
        the old primary into a replica of the new one some seconds later (until then it takes writes).
        Returns once every sentinel names the replica as the primary."""
        c: Any = self.sentinels[0].client()  # execute_command's typing differs between redis-py releases
        try:
            c.execute_command("SENTINEL", "FAILOVER", self.service)
        finally:
            c.close()
        return self.wait_failover(timeout)

    def wait_demoted(self, timeout: float = 60.0) -> None:
        """After a planned failover: wait until the old primary replicates from the new one, in sync."""
        master_port = self.promoted_address()[1]

        def demoted() -> bool:
            info = self.primary_info()
            return bool(info.get("role") == "slave" and info.get("master_port") == master_port
                        and info.get("master_link_status") == "up")

        self._wait(demoted, time.monotonic() + timeout, "the old primary to turn into a replica of the new one")

    def restart_old_primary(self, timeout: float = 30.0) -> RedisServer:
        """Start the killed primary again on its own data; wait until the sentinels made it a replica
        of the new primary and it is in sync."""
        old = self.old_primary = self.primary
        old.start()
        master_port = self.promoted_address()[1]  # the address the old primary replicates from

        def synced() -> bool:
            c = old.client(socket_timeout=2)
            try:
                info = c.info("replication")
            finally:
                c.close()
            return bool(info.get("role") == "slave" and info.get("master_port") == master_port
                        and info.get("master_link_status") == "up")

        self._wait(synced, time.monotonic() + timeout, "the old primary to rejoin as a replica of the new one")
        return old

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        self.proxy.close()
        for r in (self.replica, self.primary):
            r.kill()

    def __enter__(self) -> FailoverCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RepeatableFailoverCluster(FailoverCluster):
    """A :class:`FailoverCluster` whose failover can be repeated: ``lag()``, ``kill_primary()``,
    ``wait_failover()``, ``restart_old_primary()`` again and again, each time on the node that holds
    the role now.

    Each node sits behind a :class:`TcpProxy` of its own (``hold_only=b"REPLCONF"``) and
    announces the proxy's address as its own (``replica-announce-ip`` / ``replica-announce-port``),
    so the sentinels, the clients of the ``redis+sentinel://`` URL and the replication link of
    whichever node is the replica reach a node through its proxy, whatever its role: after a
    failover the sentinels name the promoted node by its proxy's address and point the restarted old
    primary at it, so its replication link goes through the new primary's proxy and ``lag()`` holds
    it back as before.

    ``primary`` / ``proxy`` always name the node that is the primary now and its proxy, ``replica`` /
    ``replica_proxy`` the other node: ``restart_old_primary()`` swaps them once the old primary
    replicates from the new one. ``kill_primary()`` also resumes the dead primary's proxy after cutting
    it (what was held back is thrown away), so that it relays again when that node is the primary
    next. ``failovers`` counts the completed role swaps.
    """

    def __init__(self, directory: str | os.PathLike[str], **kw: Any) -> None:
        super().__init__(directory, **kw)
        self.replica_proxy = TcpProxy(("127.0.0.1", self.replica.port), hold_only=b"REPLCONF")
        for node, proxy in ((self.primary, self.proxy), (self.replica, self.replica_proxy)):
            node.extra += ["--replica-announce-ip", "127.0.0.1", "--replica-announce-port", str(proxy.port)]
        self.failovers = 0

    def start(self, timeout: float = 30.0) -> RepeatableFailoverCluster:
        self.replica_proxy.start()
        super().start(timeout)
        return self

    @property
    def primary_address(self) -> tuple[str, int]:
        """The address the sentinels give for the primary now (its proxy's)."""
        return ("127.0.0.1", self.proxy.port)

    def kill_primary(self) -> None:
        super().kill_primary()
        self.proxy.resume()  # the cut threw the held bytes away; relay again when this node is primary next

    def promoted_address(self) -> tuple[str, int]:
        """The replica is named by its proxy's address."""
        return ("127.0.0.1", self.replica_proxy.port)

    def restart_old_primary(self, timeout: float = 30.0) -> RedisServer:
        """Start the killed primary again on its own data; wait until the sentinels made it a replica
        of the new primary (through the new primary's proxy) and it is in sync; then swap the roles."""
        old = super().restart_old_primary(timeout)
        self.primary, self.replica = self.replica, old
        self.proxy, self.replica_proxy = self.replica_proxy, self.proxy
        self.failovers += 1
        return old

    def stop(self) -> None:
        super().stop()
        self.replica_proxy.close()

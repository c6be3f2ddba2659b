"""Per-Attempt workspaces under one root, and the crash cleanup that never leaves the root.

Each Attempt gets a fresh directory ``<root>/task-<ulid>-<n>``. When a worker starts, stale
``task-*`` workspaces of its root (left by a crash) are removed before it polls for work. The
boundary is checked on the real path, symlinks are never followed: a ``task-*`` entry that is a
symlink is refused and reported, never deleted through, and ``shutil.rmtree`` removes links found
inside a workspace without following them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .keys import parse_attempt_id

_NAME_RE = re.compile(r"task-[0-9A-Z]{26}-[0-9]+")


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


class WorkspaceRoot:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.is_symlink():
            raise WorkspaceError(f"workspace root {path} is a symlink: give the real directory")
        self.root = path.resolve(strict=True)

    def name_for(self, attempt_id: str) -> str:
        task_id, n = parse_attempt_id(attempt_id)
        return f"task-{task_id.rsplit(':', 1)[1]}-{n}"

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
        shutil.rmtree(path)

    def cleanup_stale(self, keep: set[str] | Callable[[], set[str]] | None = None) -> CleanupReport:
        """Remove every ``task-*`` workspace of this root except those named in ``keep``. Call before
        polling. ``keep`` may be a function: it is asked again right before each removal, so a
        workspace another worker created meanwhile for a live Attempt is not taken from under it."""
        report = CleanupReport()
        current: Callable[[], set[str]] = keep if callable(keep) else (lambda: keep or set())
        with os.scandir(self.root) as entries:
            for entry in entries:
                if not entry.name.startswith("task-") or entry.name in current():
                    continue
                if entry.is_symlink():
                    report.refused.append((entry.name, "a symlink: never followed, never deleted through"))
                    continue
                if not entry.is_dir(follow_symlinks=False):
                    report.refused.append((entry.name, "not a directory"))
                    continue
                if not _NAME_RE.fullmatch(entry.name):
                    report.refused.append((entry.name, "not a workspace name mc_queue makes"))
                    continue
                path = Path(entry.path)
                if not self._inside(path):
                    report.refused.append((entry.name, "resolves outside the root"))
                    continue
                shutil.rmtree(path, onerror=_gone_is_fine)  # another worker may be removing it too
                report.removed.append(entry.name)
        return report

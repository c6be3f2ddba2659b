"""A git remote as a provider: commit and push with ``--force-with-lease``, reconcile by ``ls-remote``.

- The push names the value it expects the remote branch to have (``--force-with-lease=
  refs/heads/B:<expected>``, empty for "must not exist"), so the remote itself refuses a stale or
  duplicate push. That value is a fence only if it was read *before* the intent was recorded and is
  recorded with it (``ctx.effect(..., assume={"remote_head": expected})``): a worker frozen between
  its intent and its push then resumes with the old value, and the remote refuses it once a
  replacement has moved the branch. Read at call time, it would be the replacement's commit, and the
  zombie's push would land over it.
- Every commit carries a trailer ``Mcq-Operation-Key: <key>``; reconciliation lists the remote
  branch (``git ls-remote``), fetches its tip and looks for the trailer in its recent history.

- A writer fence (``writer=(key, fence)``: a concurrency key's, ``ctx.attempt.slots[key]``) rides the same
  push, atomically: the remote keeps the highest writer fence it accepted for the key in
  ``refs/mcq/writers/<key>`` (a commit whose message holds it), and a push whose fence is older is refused
  before anything moves; the writer ref is pushed with its own lease, so of two concurrent writers one
  lands and the other reads again. Once a newer writer has pushed, an older one cannot: the seed's writer
  lease, enforced at the provider.

The branch is part of the operation's content identity: use :func:`identity` to build it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..contracts.models import FailureClass
from ..policy.classify import register_failure_class

TRAILER = "Mcq-Operation-Key"
WRITER_PREFIX = "mcq writer fence"  # the writer ref's commit message: "<prefix> <key> <fence>"


class GitError(RuntimeError):
    """A git command failed; ``stderr`` says why (a refused push says 'stale info' or 'rejected')."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(f"{message}: {stderr.strip()[-500:]}")
        self.stderr = stderr


def identity(branch: str, content: str) -> str:
    """Content identity of a push: the branch and a digest of what is pushed (never a time)."""
    return f"{branch}@{content}"


def writer_ref(writer_key: str) -> str:
    """The ref holding the highest writer fence the remote accepted for a concurrency key (its characters
    other than letters, digits, '_' and '-' spelled %XX: a ref name may hold no ':' and no '..')."""
    return "refs/mcq/writers/" + "".join(c if c.isascii() and (c.isalnum() or c in "_-") else f"%{ord(c):02X}"
                                         for c in writer_key)


def branch_of(key: str) -> str:
    ident = key.split(":", 2)[2]
    return ident.rsplit("@", 1)[0]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": env.get("GIT_AUTHOR_NAME", "mc_queue"),
                "GIT_AUTHOR_EMAIL": env.get("GIT_AUTHOR_EMAIL", "mc_queue@localhost"),
                "GIT_COMMITTER_NAME": env.get("GIT_COMMITTER_NAME", "mc_queue"),
                "GIT_COMMITTER_EMAIL": env.get("GIT_COMMITTER_EMAIL", "mc_queue@localhost")})
    return env


class StaleWriter(GitError):
    """A push refused because the remote accepted a newer writer of the key (a higher writer fence)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "")


class GitTimeout(GitError, TimeoutError):
    """A git command ran out of time. A push may still have landed: reconcile with find(), never resend."""


def git(*args: str, cwd: str | Path | None = None, timeout: float = 60.0) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env=_env())
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise GitTimeout(f"git {' '.join(args[:2])} timed out after {timeout:g}s", err) from exc
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args[:2])} failed ({proc.returncode})", proc.stderr)
    return proc.stdout


class GitRemote:
    def __init__(self, url: str, *, push_timeout: float = 30.0, scan_depth: int = 20) -> None:
        self.url = url
        self.push_timeout = push_timeout
        self.scan_depth = scan_depth

    def remote_head(self, branch: str) -> str | None:
        out = git("ls-remote", self.url, f"refs/heads/{branch}")
        return out.split()[0] if out.strip() else None

    def prepare(self, workdir: Path, base: str) -> None:
        """A fresh clone of ``base`` in ``workdir`` (an Attempt's workspace)."""
        git("clone", "--quiet", "--branch", base, self.url, str(workdir))

    def expected_head(self, branch: str) -> str:
        """What the remote branch holds now ('' when it does not exist): read it before the effect's
        intent, record it with the intent, and push with exactly that (``expected=``)."""
        return self.remote_head(branch) or ""

    def writer_fence(self, writer_key: str) -> tuple[str, int]:
        """The writer ref of ``writer_key`` on the remote: its commit ('' when none) and the fence it holds."""
        ref = writer_ref(writer_key)
        out = git("ls-remote", self.url, ref)
        sha = out.split()[0] if out.strip() else ""
        if not sha:
            return "", 0
        with tempfile.TemporaryDirectory(prefix="mcq-git-") as tmp:
            git("init", "--quiet", "--bare", tmp)
            git("fetch", "--quiet", "--depth=1", self.url, ref, cwd=tmp)
            msg = git("log", "-1", "--format=%B", "FETCH_HEAD", cwd=tmp).strip()
        parts = msg.split()
        return sha, int(parts[-1]) if parts and parts[-1].isdigit() else 0

    def commit_and_push(self, key: str, workdir: Path, *, branch: str, message: str,
                        files: dict[str, str], expected: str, timeout: float | None = None,
                        writer: tuple[str, int] | None = None) -> dict[str, Any]:
        """Write ``files``, commit with the key's trailer, push with a lease on ``expected`` (the
        remote head recorded in the intent; '' for "the branch must not exist"). Returns the receipt
        ``{"sha", "branch", "key", "expected"}``. A push whose client timed out may still have landed:
        never call this again for the same key; reconcile with :meth:`find`. ``timeout``: the push's
        (``ctx.time_for(...)``: what is left of the Attempt's timeout budget), else ``push_timeout``.
        ``writer``: (concurrency key, writer fence): :class:`StaleWriter` when the remote holds a newer
        writer of the key; otherwise the push and the key's writer ref move together or not at all."""
        for rel, text in files.items():
            path = workdir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git("add", "--all", cwd=workdir)
        git("commit", "--quiet", "-m", f"{message}\n\n{TRAILER}: {key}", cwd=workdir)
        sha = git("rev-parse", "HEAD", cwd=workdir).strip()
        extra: list[str] = []
        if writer is not None:
            wkey, fence = writer
            held_sha, held = self.writer_fence(wkey)
            if held > fence:
                raise StaleWriter(f"writer {wkey} fence {fence} refused: the remote accepted fence {held} (a newer "
                                  "writer of the key); nothing pushed")
            tree = git("hash-object", "-t", "tree", "-w", "/dev/null", cwd=workdir).strip()  # the empty tree
            mark = git("commit-tree", tree, "-m", f"{WRITER_PREFIX} {wkey} {fence}", cwd=workdir).strip()
            ref = writer_ref(wkey)
            extra = ["--atomic", f"--force-with-lease={ref}:{held_sha}", f"{mark}:{ref}"]
        git("push", "--quiet", f"--force-with-lease=refs/heads/{branch}:{expected}", *extra[:2], self.url,
            f"HEAD:refs/heads/{branch}", *extra[2:], cwd=workdir,
            timeout=self.push_timeout if timeout is None else timeout)
        return {"sha": sha, "branch": branch, "key": key, "expected": expected,
                **({"writer": list(writer)} if writer is not None else {})}

    def find(self, key: str) -> dict[str, Any] | None:
        """The receipt of the commit pushed with ``key`` if the remote has it, else None."""
        branch = branch_of(key)
        head = self.remote_head(branch)
        if head is None:
            return None
        with tempfile.TemporaryDirectory(prefix="mcq-git-") as tmp:
            git("init", "--quiet", "--bare", tmp)
            git("fetch", "--quiet", f"--depth={self.scan_depth}", self.url, f"refs/heads/{branch}", cwd=tmp)
            log = git("log", f"-{self.scan_depth}", "--format=%H%x00%B%x01", "FETCH_HEAD", cwd=tmp)
        for entry in log.split("\x01"):
            sha, _, body = entry.strip().partition("\x00")
            if f"{TRAILER}: {key}" in body:
                return {"sha": sha, "branch": branch, "key": key}
        return None


# A refused or failed push means the repository's state disagrees: a repository failure (the policy
# retries it only with a changed hypothesis). A timeout is the provider's (retried after a backoff).
register_failure_class(GitError, FailureClass.REPOSITORY)
register_failure_class(GitTimeout, FailureClass.PROVIDER)

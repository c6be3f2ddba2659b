"""A fleet of real mc_queue processes, and the provider environment they run the example app in.

Shared by ``mcq demo`` (``factory_demo``) and the chaos run (``bench/chaos.py``):

- ``Fleet``: worker and sweeper processes started as ``python -m mc_queue ... worker`` / ``sweeper``,
  each in its own session with its own log file, by name. It signals them, pauses (SIGSTOP) and
  resumes (SIGCONT) them, kills them (SIGKILL, recorded as a kill), notices the ones that exited on
  their own (``reap``: recorded, and restarted when the fleet was built with ``restart=True``) and
  stops them all. Workers and the sweeper may reach Redis by different URLs (the chaos run sends
  the workers through a TCP proxy, the sweeper straight).
- ``provider_env``: a bare git remote, a local pull-request API (``ForgeServer``, one pull request
  per head branch as GitHub) and the environment that points the example app
  (``mc_queue.examples.agents:app``) at them.

This module starts processes of the command line, so it sits in the top layer beside the demos.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from ..testing.forge import ForgeServer, bare_git_remote

APP = "mc_queue.examples.agents:app"
"""The example agent app (push a commit, open a pull request) the fleet runs by default."""

Role = Literal["worker", "sweeper"]


class UnexpectedExit(TypedDict):
    """A process that exited without being killed through the fleet (``Fleet.reap`` records it)."""

    process: str
    exit_code: int | None
    last_fault: str
    last_log_line: str
    log_tail: list[str]


class Fleet:
    """Worker processes and sweeper processes of one namespace, by name.

    ``worker_url`` is the Redis URL the workers use, ``sweeper_url`` the sweeper's (default: the
    same). Processes get their names from the caller, or ``{worker_prefix}{n}`` / ``{sweeper_prefix}{n}``
    with one counter for both. Each writes its output to ``log_dir / f"{name}.log"``.

    ``paused`` maps every process stopped with ``pause`` to the monotonic time it was stopped;
    ``killed`` holds every process killed with ``kill``; ``unexpected_exits`` every process that
    ``reap`` found dead without such a kill.
    """

    def __init__(self, prefix: str, worker_url: str, env: Mapping[str, str], log_dir: Path, *,
                 sweeper_url: str | None = None, app: str = APP, worker_prefix: str = "w",
                 sweeper_prefix: str = "sweeper", restart: bool = False, restart_after_s: float = 1.0,
                 sweeper_interval_s: float = 0.5) -> None:
        self.prefix = prefix
        self.worker_url = worker_url
        self.sweeper_url = sweeper_url or worker_url
        self.env = dict(env)
        self.log_dir = log_dir
        self.app = app
        self.worker_prefix = worker_prefix
        self.sweeper_prefix = sweeper_prefix
        self.restart = restart
        self.restart_after_s = restart_after_s
        self.sweeper_interval_s = sweeper_interval_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.roles: dict[str, Role] = {}
        self.paused: dict[str, float] = {}  # name -> monotonic time of SIGSTOP
        self.killed: set[str] = set()
        self.retired: set[str] = set()  # dead and accounted for by reap
        self.generation = 0
        self.unexpected_exits: list[UnexpectedExit] = []
        self.restart_at: list[tuple[float, Role]] = []  # (monotonic time, role) of restarts due

    # ------------------------------------------------------------------ starting

    def _start(self, name: str, role: Role, url: str, args: list[str]) -> str:
        with open(self.log_dir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", self.prefix, *args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.roles[name] = role
        return name

    def _next_name(self, prefix: str) -> str:
        self.generation += 1
        return f"{prefix}{self.generation}"

    def worker(self, name: str | None = None) -> str:
        """Start a worker process (``--kind simple``); returns its name, which is its worker id."""
        name = name or self._next_name(self.worker_prefix)
        return self._start(name, "worker", self.worker_url,
                           ["worker", "--app", self.app, "--kind", "simple", "--name", name])

    def sweeper(self, name: str | None = None) -> str:
        """Start a sweeper process; returns its name."""
        name = name or self._next_name(self.sweeper_prefix)
        return self._start(name, "sweeper", self.sweeper_url,
                           ["sweeper", "--app", self.app, "--interval", str(self.sweeper_interval_s)])

    # ------------------------------------------------------------------ looking

    def alive(self, name: str) -> bool:
        """Running, and neither paused nor killed through the fleet."""
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None and name not in self.paused and name not in self.killed

    def live_workers(self) -> list[str]:
        return [n for n, role in self.roles.items() if role == "worker" and self.alive(n)]

    def process_of(self, worker_id: str, pid: int | None = None) -> str | None:
        """The name of the fleet's process that ``worker_id`` (or ``pid``) is: a worker process that
        reconnected registers as ``<name>.r<round>`` (``mcq worker``'s loop), still the same process."""
        for name, proc in self.procs.items():
            if proc.pid == pid or name == worker_id or re.fullmatch(re.escape(name) + r"\.r\d+", worker_id):
                return name
        return None

    # ------------------------------------------------------------------ faults

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to the process's session, if it is still running."""
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)

    def kill(self, name: str) -> None:
        """SIGKILL, recorded as the fleet's own kill (``reap`` does not count it as unexpected)."""
        self.killed.add(name)
        self.signal(name, signal.SIGKILL)

    def pause(self, name: str) -> None:
        """SIGSTOP; ``resume_due`` sends the SIGCONT."""
        self.signal(name, signal.SIGSTOP)
        self.paused[name] = time.monotonic()

    def adopt_pause(self, name: str) -> None:
        """A process that stopped itself (a fail point): ``resume_due`` resumes it like a paused one."""
        if name in self.procs:
            self.paused.setdefault(name, time.monotonic())

    def resume_due(self, after_s: float, *, all_now: bool = False) -> None:
        """SIGCONT every process paused for ``after_s`` seconds or more (every paused one if ``all_now``)."""
        now = time.monotonic()
        for name, since in list(self.paused.items()):
            if all_now or now - since >= after_s:
                self.signal(name, signal.SIGCONT)
                del self.paused[name]

    def reap(self, last_fault: str) -> None:
        """Record every process that exited without the fleet killing it (with ``last_fault``, what was
        injected last, and its log's tail); with ``restart``, start a new process of its role (new name)
        ``restart_after_s`` later. Call it regularly: restarts happen in these calls."""
        now = time.monotonic()
        for when, role in list(self.restart_at):
            if now >= when:
                self.restart_at.remove((when, role))
                self.sweeper() if role == "sweeper" else self.worker()
        for name, proc in list(self.procs.items()):
            if name in self.retired or proc.poll() is None:
                continue
            self.retired.add(name)
            if name in self.killed:
                continue
            tail = (self.log_dir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-15:]
            self.unexpected_exits.append({"process": name, "exit_code": proc.returncode, "last_fault": last_fault,
                                          "last_log_line": tail[-1][:200] if tail else "", "log_tail": tail})
            if self.restart:
                self.restart_at.append((now + self.restart_after_s, self.roles[name]))

    def stop_all(self) -> None:
        """Resume the paused, SIGTERM everyone, SIGKILL whoever is still there after 10 s."""
        self.resume_due(0, all_now=True)
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# ---------------------------------------------------------------------- the providers


@dataclass
class ProviderEnv:
    """The providers the example app talks to, and the environment of the processes that run it."""

    remote: Path  # a bare git repository whose main branch holds one commit
    forge: ForgeServer  # the pull-request API, started
    env: dict[str, str]  # os.environ plus MCQ_GIT_REMOTE, MCQ_FORGE_URL, MCQ_FORGE_TIMEOUT, MCQ_HOME and extras

    def stop(self) -> None:
        self.forge.stop()


def provider_env(root: Path, *, forge_timeout_s: float = 1.5, extra: Mapping[str, str] | None = None,
                 export: bool = True, enforce_fence: bool = True, one_pr_per_head: bool = True) -> ProviderEnv:
    """Make the example app's providers under ``root`` (a scratch directory the caller owns and removes):

    - a bare git remote, ``root / "remote.git"`` (``mc_queue.testing.bare_git_remote``);
    - a started ``ForgeServer`` that refuses a creation with a fence lower than one already seen for
      its Idempotency-Key (``enforce_fence``) and, with ``one_pr_per_head``, a second pull request
      for the same head branch (GitHub's rule); either alone stops a zombie's late call;
    - the environment for worker and sweeper processes: this process's, plus ``MCQ_GIT_REMOTE``,
      ``MCQ_FORGE_URL``, ``MCQ_FORGE_TIMEOUT`` (``forge_timeout_s``), ``MCQ_HOME`` (``root / "home"``)
      and ``extra``.

    With ``export`` (default) the first three also go into this process's ``os.environ``, so the app
    is configured the same here (where it enqueues) as in the processes. Stop it with ``stop()``.
    """
    remote = bare_git_remote(root)
    forge = ForgeServer(one_pr_per_head=one_pr_per_head, enforce_fence=enforce_fence).start()
    provider = {"MCQ_GIT_REMOTE": str(remote), "MCQ_FORGE_URL": forge.url, "MCQ_FORGE_TIMEOUT": f"{forge_timeout_s:g}"}
    env = {**os.environ, **provider, "MCQ_HOME": str(root / "home"), **(extra or {})}
    if export:
        os.environ.update(provider)
    return ProviderEnv(remote, forge, env)

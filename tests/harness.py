"""The worker harness the tests share: one test's namespace and the real `mcq` processes it runs.

``WorkerHarness`` builds what every worker test needs, once: a client and an RQ connection for the
namespace, a private ``MCQ_HOME``, the command line of ``python -m mc_queue ... worker`` and of any
other ``mcq`` command, processes run in the foreground or started in their own session (teardown
ends them and their work horses by group id), their logs, SIGSTOP/SIGCONT, teardown. ``Harness`` is
the one for the test apps ``tests.apps.basic`` and ``tests.apps.faulty``; ``harness_fixture`` makes
a module's per-test fixture of a harness class (``h = harness_fixture(Harness)``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

import mc_queue
from mc_queue import Sweeper, Task, TaskState
from mc_queue.contracts.models import Event
from mc_queue.producer.app import App
from mc_queue.producer.dispatch import AppClient
from mc_queue.producer.transport import rq_connection, rq_queue_name
from mc_queue.testing import RedisServer
from tests.apps import basic, faulty

REPO = Path(__file__).resolve().parents[1]
BASIC = "tests.apps.basic:app"
FAULTY = "tests.apps.faulty:app"
SETTLED = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.BLOCKED, TaskState.QUARANTINED,
                     TaskState.CANCELED})


def redis_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(interval)


def events(task: Task, typ: str, **match: Any) -> list[Event]:
    """The task's events of type ``typ`` whose fields (``attempt``: the Attempt number) match."""
    out = []
    for e in task.events:
        if e.type != typ:
            continue
        if all((e.attempt if k == "attempt" else e.fields.get(k)) == v for k, v in match.items()):
            out.append(e)
    return out


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of a process (T = stopped), or '' when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


class WorkerHarness:
    """One test's namespace: a client, an RQ connection, AppClients, and `mcq` processes with a private
    ``MCQ_HOME`` (``env`` adds variables to their environment)."""

    def __init__(self, server: RedisServer, prefix: str, home: Path, env: dict[str, str] | None = None) -> None:
        self.server = server
        self.prefix = prefix
        self.home = home
        home.mkdir(parents=True, exist_ok=True, mode=0o700)  # a home others may write to is refused
        self.extra_env = dict(env or {})
        self.client = mc_queue.connect(server.url, prefix=prefix)
        self.rq = rq_connection(self.client)
        self.apps: list[AppClient] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopped: set[int] = set()  # pids this test SIGSTOPped (SIGCONTed again at teardown)

    def app_client(self, app: App) -> AppClient:
        """An AppClient on the harness's client, closed at teardown."""
        ac = AppClient(app, self.client)
        self.apps.append(ac)
        return ac

    # -- processes

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
        env.update(self.extra_env)
        env["MCQ_HOME"] = str(self.home)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def mcq_cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mc_queue", "--redis-url", self.server.url, "--prefix", self.prefix, *args]

    def worker_cmd(self, kind: str, app: str, *extra: str, burst: bool = True) -> list[str]:
        return self.mcq_cmd("worker", "--app", app, *(["--burst"] if burst else []), "--kind", kind, *extra)

    def run(self, cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A process in the foreground, its output captured."""
        return subprocess.run(cmd, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=timeout)

    def mcq(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.mcq_cmd(*args))

    def spawn(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        """A process in the background, in its own session, its output in ``worker-<n>.log`` under home."""
        with open(self.home / f"worker-{len(self.procs) + 1}.log", "wb") as log:
            p = subprocess.Popen(cmd, cwd=REPO, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def worker_log(self, p: subprocess.Popen[bytes]) -> str:
        i = self.procs.index(p) + 1
        return (self.home / f"worker-{i}.log").read_text(errors="replace")[-3000:]

    def sigstop(self, *pids: int) -> None:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            self.stopped.add(pid)
        for pid in pids:
            wait_for(lambda pid=pid: proc_state(pid) in ("T", "t"), 5, f"pid {pid} to stop", interval=0.005)

    def sigcont(self, *pids: int) -> None:
        """SIGCONT these pids (all this test stopped when none is named) that still run."""
        for pid in sorted(pids or self.stopped):
            self.stopped.discard(pid)
            if proc_state(pid):
                os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        self.sigcont()
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)
        for ac in self.apps:
            ac.close()
        self.client.close()
        self.rq.close()


class Harness(WorkerHarness):
    """The harness of the test apps: AppClients for ``basic`` and ``faulty``, a sweeper, burst workers
    (``basic`` by default) that must exit 0, and ``drive`` (sweep, run a worker, until settled)."""

    def __init__(self, server: RedisServer, prefix: str, home: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(server, prefix, home, env)
        self.basic = self.app_client(basic.app)
        self.faulty = self.app_client(faulty.app)
        self.sweeper = Sweeper(self.client)

    def run_worker(self, kind: str = "fork", app: str = BASIC, *extra: str,
                   timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """One burst worker: runs what its queues hold now, then exits."""
        out = self.run(self.worker_cmd(kind, app, *extra), timeout)
        assert out.returncode == 0, f"burst worker ({kind}) exited {out.returncode}:\n{out.stderr[-3000:]}"
        return out

    def start_worker(self, kind: str = "fork", app: str = BASIC, *extra: str) -> subprocess.Popen[bytes]:
        """A burst worker in the background."""
        return self.spawn(self.worker_cmd(kind, app, *extra))

    # -- records

    def task(self, task_id: str) -> Task:
        return self.client.reads.get_task(task_id)

    def raw_attempt(self, task_id: str, n: int) -> dict[str, str]:
        pre = f"{n}."
        raw = self.client.redis.hgetall(self.client.keys.task(task_id).attempts)
        return {k[len(pre):]: v for k, v in raw.items() if k.startswith(pre)}

    def rq_queue(self, queue: str = "jobs") -> Queue:
        return Queue(rq_queue_name(self.prefix, queue), connection=self.rq, serializer=JSONSerializer)

    def enqueue_undispatched(self, app_client: AppClient, handler: str, payload: Any) -> Task:
        """A task as AppClient.enqueue makes it, but not yet sent to RQ (the sweeper's dispatch walk sends it)."""
        spec = app_client.app.spec(handler)
        return self.client.producer.enqueue(spec.queue, handler, payload, retry_policy=spec.retry, budget=spec.budget,
                                   lease_ms=spec.lease_ms, timeout_s=spec.timeout_s)

    # -- driving

    def drive(self, task_id: str, kind: str = "fork", app: str = BASIC, *extra: str,
              until: Callable[[Task], bool] = lambda t: t.state in SETTLED, timeout: float = 40,
              observe: Callable[[Task], None] | None = None) -> Task:
        """Sweep once, run one burst worker, repeat, until ``until(task)`` (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            task = self.task(task_id)
            if observe is not None:
                observe(task)
            if until(task):
                return task
            assert time.monotonic() < deadline, (
                f"task {task_id} not done after {timeout}s: state {task.state}, attempts "
                f"{[(a.number, a.state.value) for a in task.attempts]}, events {[e.type for e in task.events]}")
            report = self.sweeper.run_once()
            assert not report.errors, report.errors
            self.run_worker(kind, app, *extra)

    def more_sweeps_and_workers(self, app: str = BASIC, sweeps: int = 3) -> None:
        """What should change nothing once a task is settled: sweeps and workers of both kinds."""
        for _ in range(sweeps):
            assert not self.sweeper.run_once().errors
            time.sleep(0.1)
        self.run_worker("fork", app)
        self.run_worker("simple", app)
        assert not self.sweeper.run_once().errors


H = TypeVar("H", bound=WorkerHarness)


def harness_fixture(cls: Callable[[RedisServer, str, Path], H]) -> Any:
    """The fixture of one test's harness of ``cls`` on the session's redis-server, closed after the test."""

    @pytest.fixture
    def fixture(redis_server: RedisServer, prefix: str, tmp_path: Path) -> Iterator[H]:
        harness = cls(redis_server, prefix, tmp_path / "home")
        yield harness
        harness.close()

    return fixture


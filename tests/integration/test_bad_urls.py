"""Issue 15: malformed Redis URLs through the shipped CLI (a subprocess): one clear error, exit 2, no
traceback, never the password; a db the server does not have is said so on connect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mc_queue.testing import RedisServer, unique_prefix

REPO = Path(__file__).resolve().parents[2]
SECRET = "Hq7SECRETx"


def mcq(url: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", unique_prefix(), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("url", "says"), [
    ("redis://127.0.0.1:99999/0", "port must be a whole number from 1 to 65535, not '99999'"),
    ("redis://127.0.0.1:PORT/0?socket_timeout=abc", "socket_timeout must be seconds in (0, 3600], not 'abc'"),
    ("redis://127.0.0.1:PORT/0?foo=1", "unknown parameter 'foo'"),
    ("redis://127.0.0.1:PORT/x", "db must be a whole number"),
    ("redis://:Hq7SECRETx#1@127.0.0.1:PORT/0", "must be percent-encoded (%2F, %3F, %23, %40)"),
    ("redis://u:Hq7SECRETx/1@127.0.0.1:PORT/0", "must be percent-encoded"),
    ("redis://u:Hq7SECRETx@127.0.0.1:99999/0", "port must be a whole number"),
    ("redis+sentinel://:Hq7SECRETx?x@127.0.0.1:PORT/m", "must be percent-encoded"),
    ("redis+sentinel://127.0.0.1:1,[::1]:99999/m", "the port of sentinel ::1 must be a whole number from 1 to 65535"),
    ("redis+sentinel://127.0.0.1:1/m/99999999999", "db must be a whole number from 0 to"),
])
def test_every_malformed_url_part_is_one_clear_error_from_the_cli(redis_server: RedisServer, tmp_path: Path,
                                                                  url: str, says: str) -> None:
    url = url.replace("PORT", str(redis_server.port))
    out = mcq(url, "status", home=tmp_path / "home")
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and says in out.stderr, out.stderr
    assert out.stderr.startswith("mcq: bad Redis URL "), out.stderr
    assert SECRET not in out.stderr + out.stdout


def test_every_malformed_url_part_is_one_clear_error_a_db_the_server_does_not_have(redis_server: RedisServer,
                                                                                    tmp_path: Path) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{redis_server.port}/99999"
    out = mcq(url, "status", home=tmp_path / "home")
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and "db 99999 does not exist" in out.stderr, out.stderr
    assert "CONFIG GET databases" in out.stderr and SECRET not in out.stderr

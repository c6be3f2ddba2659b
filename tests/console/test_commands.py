"""`mcq dashboard` and the end of `mcq demo` as a person runs them (real processes), and the wheel
that carries the console's templates and static files."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx

import mc_queue
from mc_queue.testing import RedisServer, free_port, unique_prefix

from .conftest import REPO


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _read_until(fd: int, pattern: str, timeout: float, seen: list[str]) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, "".join(seen))
        if m:
            return m
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen.append(chunk.decode(errors="replace"))
    raise AssertionError(f"{pattern!r} not printed within {timeout}s:\n{''.join(seen)[-3000:]}")


def test_mcq_dashboard_serves_the_namespace_with_its_rules(redis_server: RedisServer) -> None:
    prefix = unique_prefix("dash")
    with mc_queue.connect(redis_server.url, prefix=prefix) as q:
        tid = q.producer.enqueue("jobs", "h", {"n": 1}).id
    port = free_port()
    token = "dashboard-token-from-the-environment"
    proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                             "dashboard", "--port", str(port), "--read-only"], cwd=REPO,
                            env=_env(MCQ_DASHBOARD_TOKEN=token), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        _read_until(proc.stderr.fileno(), r"MCQ_DASHBOARD_TOKEN", 20, seen)
        assert f"at http://127.0.0.1:{port}/ (read-only)" in "".join(seen)
        assert token not in "".join(seen)  # a token from the environment is not printed
        base = f"http://127.0.0.1:{port}"
        bearer = {"Authorization": f"Bearer {token}"}
        # every request needs the token, from this machine too (a proxy here would relay anyone from 127.0.0.1)
        assert httpx.get(f"{base}/tasks/{tid}", timeout=10).status_code == 401
        r = httpx.get(f"{base}/tasks/{tid}", headers=bearer, timeout=10)
        assert r.status_code == 200 and tid in r.text and 'method="post"' not in r.text
        assert httpx.get(f"{base}/", headers={"X-Forwarded-For": "198.51.100.4"}, timeout=10).status_code == 401
        assert httpx.get(f"{base}/", headers={"X-Forwarded-For": "198.51.100.4", **bearer},
                         timeout=10).status_code == 200
        assert httpx.post(f"{base}/actions/cancel", data={"task_id": tid, "reason": "x" * 20},
                          timeout=10).status_code == 401
        refused = httpx.post(f"{base}/actions/cancel", data={"task_id": tid, "reason": "x" * 20}, headers=bearer,
                             timeout=10)
        assert refused.status_code == 403 and "read-only" in refused.text
    finally:
        proc.terminate()
        proc.wait(10)
    bad = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                          "dashboard", "--port", str(port)], cwd=REPO, env=_env(MCQ_DASHBOARD_TOKEN="short"),
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "MCQ_DASHBOARD_TOKEN must have at least 16 characters" in bad.stderr


def test_mcq_dashboard_trust_loopback_is_the_operators_choice(redis_server: RedisServer) -> None:
    prefix = unique_prefix("dash")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                             "dashboard", "--port", str(port), "--trust-loopback"], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        _read_until(proc.stderr.fileno(), rf"at http://127\.0\.0\.1:{port}/", 20, seen)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                r = httpx.get(f"{base}/", timeout=10)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert r.status_code == 200  # loopback trusted: a local request needs nothing
        assert httpx.get(f"{base}/", headers={"X-Forwarded-For": "198.51.100.4"}, timeout=10).status_code == 401
    finally:
        proc.terminate()
        proc.wait(10)


def test_mcq_demo_at_a_terminal_keeps_the_console_open_until_enter(tmp_path: Path) -> None:
    master, slave = pty.openpty()  # the demo's standard input is a terminal, as for a person
    proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "--home", str(tmp_path / "home"), "demo",
                             "--contracts"], cwd=REPO, env=_env(COLUMNS="100"), stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(slave)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        m = _read_until(proc.stdout.fileno(), r"in the console: (http://127\.0\.0\.1:\d+/)(\S*)\s", 90, seen)
        url, rest = m.group(1), m.group(2)
        assert rest.startswith("?token="), f"the demo's console address carries no token: {m.group(0)!r}"
        assert "press Enter" in "".join(seen)
        with httpx.Client(timeout=10) as browser:  # the address as printed, then the cookie it set
            page = browser.get(url + rest, follow_redirects=True)
            assert page.status_code == 200 and "Namespace" in page.text and "demo" in page.text
            assert browser.get(url + "tasks").status_code == 200
        assert httpx.get(url, timeout=10).status_code == 401  # without the token: refused
        assert proc.poll() is None  # still serving, waiting for Enter
        os.write(master, b"\n")
        assert proc.wait(30) == 0, "".join(seen)[-3000:]
        try:
            httpx.get(url, timeout=2)
        except httpx.HTTPError:
            pass  # gone with the demo
        else:
            raise AssertionError("the console still answers after Enter")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)


def test_the_wheel_carries_the_console_s_templates_and_static_files(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    names = set(zipfile.ZipFile(next(tmp_path.glob("mc_queue-*.whl"))).namelist())
    shipped = REPO / "mc_queue" / "console"
    for path in [*shipped.glob("templates/*.html"), *shipped.glob("static/*")]:
        assert f"mc_queue/ops/console/{path.relative_to(shipped)}" in names, path

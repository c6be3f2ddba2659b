"""Issue 15's findings about the command line, each through `mcq` as a subprocess against a real
redis-server (the session's, an embedded one under a temporary MCQ_HOME, or a Sentinel group)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, make_failure
from mc_queue.store.embedded import stop_server
from mc_queue.testing import FailoverCluster, RedisServer
from tests.integration.test_cli import APP, mcq

ROOT = Path(__file__).resolve().parents[2]
REASON = "a reason that is long enough"


def keys_of(server: RedisServer, prefix: str) -> list[str]:
    """The namespace's keys, less the two a first read may leave (the namespace log and its meta)."""
    return sorted(k for k in server.client().scan_iter(match=f"{{{prefix}}}*") if not k.endswith((":meta", ":nslog")))


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    text = out.stderr.strip()
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(text.splitlines()) == 1, out.stderr
    return text


# ------------------------------------------------------------------ 1. bad numbers and bad URLs

BAD_NUMBERS = [
    *[(["cancel", "q:01ARZ3NDEKTSV4RRFFQ69G5FAV", "--reason", REASON, "--ack-timeout", v], "--ack-timeout")
      for v in ("nan", "inf", "1e400", "-1")],
    *[(["status", "--watch", v], "--watch") for v in ("nan", "-1", "0")],
    *[(["sweeper", "--interval", v], "--interval") for v in ("-5", "0", "nan", "0.001", "inf")],
    (["worker", *APP, "--burst", "--grace", "nan"], "--grace"),
    (["tasks", "purge", "--queue", "q", "--state", "succeeded", "--older-than", "1d", "--reason", REASON,
      "--keep-key-for", "nan", "--yes"], "--keep-key-for"),
    (["dlq", "purge", "q:01ARZ3NDEKTSV4RRFFQ69G5FAV", "--reason", REASON, "--keep-key-for", "nan", "--yes"],
     "--keep-key-for"),
    (["tasks", "--older-than", "9" * 400], "--older-than"),
    (["retention", "set", "q", "--done", "9" * 400 + "d", "--reason", REASON], "--done"),
]


@pytest.mark.parametrize("args,option", BAD_NUMBERS, ids=[" ".join(a)[:60] for a, _ in BAD_NUMBERS])
def test_bad_numbers_are_exit_2_in_one_line_and_write_nothing(redis_server: RedisServer, prefix: str,
                                                              args: list[str], option: str) -> None:
    """nan, inf, 1e400, negative and zero waits: one line naming the option, exit 2, nothing written
    (the sweeper's --interval -5 busy-looped at ~1,000 passes a second)."""
    before = keys_of(redis_server, prefix)
    try:
        out = mcq(redis_server, prefix, *args)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mcq {' '.join(args)} did not refuse its input: it ran on")
    assert out.returncode == 2, (out.returncode, out.stdout[-500:], out.stderr[-3000:])
    assert option in one_line(out)
    assert keys_of(redis_server, prefix) == before


def _bad_urls(port: int) -> list[str]:
    return ["redis://127.0.0.1:99999/0", f"redis://127.0.0.1:{port}/99999",
            f"redis://127.0.0.1:{port}/0?socket_timeout=abc", "redis+sentinel://127.0.0.1:99999/mcq"]


@pytest.mark.parametrize("which", range(4))
def test_bad_url_parts_are_exit_2_with_the_message(redis_server: RedisServer, prefix: str, which: int) -> None:
    """A port out of range, a database the server does not have, a parameter that is not a number:
    one line saying the URL is bad, exit 2 (a traceback with exit 1 before)."""
    url = _bad_urls(redis_server.port)[which]
    for args in (["status"], ["enqueue", "h", *APP, "--payload", "{}"]):
        out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix, *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (url, args, out.stderr[-3000:])
        assert "URL" in one_line(out), out.stderr
    assert keys_of(redis_server, prefix) == []


# ------------------------------------------------------------------ 2. recover on a healthy namespace


def test_recover_on_an_ok_namespace_needs_yes(redis_server: RedisServer, prefix: str) -> None:
    """`mcq recover` voids every live lease: on a namespace that is ok it says what it would do and
    asks for --yes, and changes nothing; with --yes it runs."""
    task_id = mcq(redis_server, prefix, "enqueue", "h", *APP, "--payload", "{}").stdout.strip()
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    lease = q.leases.claim_attempt(task_id, "w1", 60_000)
    epoch = q.reads.namespace().epoch
    out = mcq(redis_server, prefix, "recover")
    assert out.returncode == 2, out.stderr
    assert "--yes" in one_line(out) and "1 live lease" in out.stderr
    task = q.reads.get_task(task_id)
    assert task.fence == lease.fence and task.latest is not None and task.latest.state.value == "running"
    q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1")  # the lease is still the worker's
    assert q.reads.namespace().epoch == epoch
    done = mcq(redis_server, prefix, "recover", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["voided_leases"] == [lease.attempt_id]
    q.close()


# ------------------------------------------------------------------ 3. reads never start the embedded server


def _embedded(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "mc_queue", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def _server_left(home: Path) -> list[str]:
    """What of an embedded server is there: its socket, a live process named in its pid file, or any
    process whose command line names the home."""
    left = [str(p) for p in (home / "redis.sock",) if p.exists()]
    try:
        pid = int((home / "redis.pid").read_text())
        os.kill(pid, 0)
        left.append(f"pid {pid}")
    except (OSError, ValueError):
        pass
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(home) in cmd and "redis" in cmd:
                left.append(cmd)
    return left


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "home"
    yield path
    stop_server(path)  # whatever a failing run left behind


READS = [["show", "agents:01ARZ3NDEKTSV4RRFFQ69G5FAV"], ["status"], ["status", "--json"], ["namespace"], ["tasks"],
         ["attention"], ["dlq", "list"], ["dlq", "show", "agents:01ARZ3NDEKTSV4RRFFQ69G5FAV"], ["workers"],
         ["server", "status"], ["retention", "show"], ["health", "worker"]]


@pytest.mark.parametrize("after_a_run", [False, True], ids=["never-started", "after-the-demo-stopped-it"])
def test_read_commands_do_not_start_the_embedded_server(home: Path, after_a_run: bool) -> None:
    """With no URL and no embedded server running, a read says so (exit 4) and leaves nothing
    running: `mcq show` after the demo had stopped its server started it again and left it running."""
    if after_a_run:  # what `mcq demo` leaves: a home with data, its server stopped
        started = _embedded(home, "enqueue", "h", *APP, "--payload", "{}")
        assert started.returncode == 0, started.stderr
        assert _embedded(home, "server", "stop").returncode == 0
        assert _server_left(home) == []
    for args in READS:
        out = _embedded(home, *args)
        assert out.returncode == 4, (args, out.stdout[-500:], out.stderr[-2000:])
        assert "no embedded server is running" in one_line(out), (args, out.stderr)
        assert _server_left(home) == [], args
    if not after_a_run:
        assert not home.exists() or sorted(p.name for p in home.iterdir()) == [], "a read wrote into the home"


def test_server_start_then_reads_work_and_stop_ends_it(home: Path) -> None:
    """The way back to the data a read refused to start a server for: `mcq server start`."""
    out = _embedded(home, "server", "start")
    assert out.returncode == 0 and "redis.sock" in out.stdout, out.stderr
    assert _embedded(home, "server", "status").returncode == 0
    assert _embedded(home, "status").returncode == 0
    assert _embedded(home, "server", "stop").returncode == 0
    assert _server_left(home) == []


# ------------------------------------------------------------------ 4. enqueue, and a task id typed wrong


def test_enqueue_prints_the_task_id_and_how_to_follow_it(redis_server: RedisServer, prefix: str) -> None:
    out = mcq(redis_server, prefix, "enqueue", "h", *APP, "--payload", "{}")
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    assert re.fullmatch(r"q:[0-9A-Z]{26}", task_id), out.stdout  # stdout: the id alone, for scripts
    assert f"show {task_id}" in out.stderr, out.stderr


@pytest.mark.parametrize("typed", ["TASK", "agents:01m8se9342", "01ARZ3NDEKTSV4RRFFQ69G5FAV"])
def test_show_of_a_malformed_task_id_says_what_one_looks_like(redis_server: RedisServer, prefix: str,
                                                              typed: str) -> None:
    """`mcq show TASK` typed literally: what a task id looks like and where to find one."""
    out = mcq(redis_server, prefix, "show", typed)
    assert out.returncode == 2, out.stderr
    line = one_line(out)
    assert "<queue>:<26-character ULID>" in line and "mcq tasks" in line, line


# ------------------------------------------------------------------ 5. whole ids at 80 columns


def test_dlq_list_at_80_columns_prints_whole_ids(redis_server: RedisServer, prefix: str) -> None:
    """`mcq dlq list` cut the ids `mcq dlq replay` needs: at 80 columns each is printed whole, on one line."""
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    ids = []
    for queue in ("agents", "a-queue-with-a-rather-long-name-of-forty-two"):
        task = q.producer.enqueue(queue, "h", {})
        lease = q.leases.claim_attempt(task.id, "w1", 60_000)
        q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.INTERNAL, "Bug", "boom"),
                       worker_id="w1", decision=Decision("quarantine", "the test quarantines it", attention={
                           "task_id": task.id, "summary": "internal failure in the handler: KeyError 'x' raised "
                           "while preparing the workspace", "why_unsafe": "the same failure fingerprint came back "
                           "three times; another attempt would repeat it"}))
        ids.append(task.id)
    q.close()
    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                          "dlq", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for task_id in ids:
        assert any(task_id in line for line in lines), out.stdout
    assert max(len(line) for line in lines) <= 80, out.stdout


# ------------------------------------------------------------------ 6. a pool's names, a pool on Sentinel


def _workers(url: str, prefix: str) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix, "workers",
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def _start_worker(url: str, prefix: str, tmp: Path, *args: str) -> subprocess.Popen[str]:
    home = tmp / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    return subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix, "worker",
                             *APP, "--log-level", "INFO", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _wait_for_workers(url: str, prefix: str, n: int, proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = [r for r in _workers(url, prefix) if r["healthy"]]
        if len(rows) >= n:
            return rows
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.3)
    raise AssertionError(f"{n} worker(s) did not register within 30 s")


def _stop(proc: subprocess.Popen[str]) -> tuple[int, float, str]:
    """SIGTERM the worker (or pool); how it exited, how long it took, what it said."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, time.monotonic() - started, err


def test_pool_workers_are_named_after_name(redis_server: RedisServer, prefix: str, tmp_path: Path) -> None:
    """`mcq worker --pool 2 --name X`: X-1 and X-2 (--name was ignored with --pool)."""
    proc = _start_worker(redis_server.url, prefix, tmp_path, "--pool", "2", "--name", "builder")
    try:
        rows = _wait_for_workers(redis_server.url, prefix, 2, proc)
        assert sorted(r["worker"] for r in rows) == ["builder-1", "builder-2"], rows
    finally:
        code, _, err = _stop(proc)
    assert code == 0, err[-3000:]


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[FailoverCluster]:
    with FailoverCluster(tmp_path / "cluster", down_after_ms=3000, failover_timeout_ms=10000) as fc:
        yield fc


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool", [2, None], ids=["pool", "single"])
def test_an_idle_worker_on_a_sentinel_url_stops_as_fast_as_on_a_plain_one(
        sentinels: FailoverCluster, prefix: str, tmp_path: Path, pool: int | None) -> None:
    """An idle pool on a Sentinel URL took 15 s to stop and its workers died with "Wrong number of
    response items from pipeline execution" (0.2-1.3 s on a plain URL): redis-py's Sentinel-managed
    connection does not drop a connection whose blocking read a stop signal interrupted, so the
    unread BLPOP reply was read by the next command (RQ's register_death pipeline)."""
    extra = ("--pool", str(pool)) if pool else ()
    url = sentinels.url()
    proc = _start_worker(url, prefix, tmp_path, *extra)
    _wait_for_workers(url, prefix, pool or 1, proc)
    time.sleep(1.0)  # idle in its blocking dequeue
    code, took, err = _stop(proc)
    assert "Wrong number of response items" not in err, err[-3000:]
    assert code == 0, err[-3000:]
    assert took < 5.0, f"stopping took {took:.1f}s"


# ------------------------------------------------------------------ 4. the README's five-minute example

# The example as the README shows it, run as written.
EXAMPLE_SOURCE = ROOT / "README.md"


def five_minute_example(markdown: str) -> tuple[str, str, str]:
    """The section "## In five minutes": the file its python block names (first line ``# name.py``),
    that block, and its first sh block."""
    section = re.split(r"^## In five minutes *$", markdown, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0]
    python = re.search(r"```python\n(.*?)```", section, re.S)
    shell = re.search(r"```sh\n(.*?)```", section, re.S)
    assert python and shell, "the section has no python or no sh block"
    name = re.match(r"# (\S+\.py)\n", python.group(1))
    assert name, "the python block does not start with '# <file>.py'"
    return name.group(1), python.group(1), shell.group(1)


def run_five_minute_example(source: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    """Write the example's file into ``folder`` (a fresh folder beside this checkout's .venv, as a
    reader's checkout), run its shell block there with bash, line by line as typed (-e: the first
    command that fails ends it)."""
    name, code, script = five_minute_example(source.read_text())
    folder.mkdir()
    (folder / name).write_text(code)
    (folder / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_") and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    try:
        return subprocess.run(["bash", "-e", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=180)
    finally:  # whatever a failing run left: its providers and its embedded server
        mcq_exe = str(ROOT / ".venv" / "bin" / "mcq")
        subprocess.run([mcq_exe, "providers", "stop"], cwd=folder, env=env, capture_output=True, timeout=60)
        stop_server(folder / ".mcq")


def test_the_five_minute_example_runs_as_written(tmp_path: Path) -> None:
    """The README's example, literally, on a fresh folder: its forge did not resolve (the task ended
    blocked after two tracebacks), enqueue printed nothing and `mcq show TASK` was refused."""
    out = run_five_minute_example(EXAMPLE_SOURCE, tmp_path / "checkout")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert re.search(r"^task \S+:[0-9A-Z]{26}$", out.stdout, re.M), out.stdout[-3000:]
    assert re.search(r"^  state: succeeded$", out.stdout, re.M), out.stdout[-3000:]
    assert "open-pr:" in out.stdout and "attempt_succeeded" in out.stdout
    assert _server_left(tmp_path / "checkout" / ".mcq") == []

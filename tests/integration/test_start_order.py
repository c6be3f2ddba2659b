"""Issue 15, "a fresh deployment is dead on arrival": every process of a deployment may start first, in
any order, on a Redis that has never held the namespace.

`docker compose up` starts the worker and the sweeper together once Redis is healthy, before any
producer ran. A sweeper pass on a namespace that does not exist yet must decide nothing and write
nothing that marks it lost; the worker's and the producer's first calls then create it, and the
first task runs. Real processes: `mcq sweeper` and `mcq worker` as the compose file starts them
(the shipped CLI), the session's redis-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mc_queue
from mc_queue.contracts.keys import Keys
from mc_queue.ops.sweeper import Sweeper
from mc_queue.testing import RedisServer, unique_prefix

REPO = Path(__file__).resolve().parents[2]
BASIC = "tests.apps.basic:app"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _namespace_keys(server: RedisServer, prefix: str) -> list[str]:
    r = server.client()
    try:
        return sorted(k.decode() if isinstance(k, bytes) else k for k in r.scan_iter(match=Keys(prefix).tag + "*"))
    finally:
        r.close()


def test_a_sweeper_pass_on_a_namespace_that_never_existed_marks_nothing_lost(redis_server: RedisServer) -> None:
    prefix = unique_prefix()
    client = mc_queue.Client(redis_server.url, prefix=prefix)  # Client() alone opens nothing
    try:
        report = Sweeper(client).run_once()
        assert report.namespace == "missing", report.as_dict()
        assert not report.errors, report.errors
        # Nothing of the namespace but the sweeper's own liveness record (its passes count for metrics).
        assert _namespace_keys(redis_server, prefix) == [Keys(prefix).sweeper]
        info = client.reads.namespace()
        assert info.state == "missing" and info.usable, info
        # The maintenance scripts a sweeper runs, called by a client that never opened the namespace,
        # create nothing either (a script that finds no meta and was given no epoch is no evidence of a loss).
        assert client.maintenance.pack_due(limit=10, min_age_ms=0) == 0
        assert client.maintenance.trim_idempotency(limit=10) == 0
        assert client.reads.namespace().state == "missing"
        # The first writer creates it, ok.
        task = client.producer.enqueue("jobs", "noop", {"n": 1})
        assert client.reads.namespace().state == "ok"
        assert client.reads.get_task(task.id).state.value == "pending"
    finally:
        client.close()


def test_worker_and_sweeper_started_together_before_any_producer_run_the_first_task(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """The compose file's start order: redis healthy, then worker and sweeper at once, producer later."""
    prefix, home = unique_prefix(), tmp_path / "home"
    home.mkdir(mode=0o700)
    base = [sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix]
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("sweeper", "worker")}
    procs = {
        "sweeper": subprocess.Popen([*base, "sweeper", "--app", BASIC, "--interval", "0.1"], cwd=REPO,
                                    env=_env(home), stdout=logs["sweeper"], stderr=subprocess.STDOUT,
                                    start_new_session=True),
        "worker": subprocess.Popen([*base, "worker", "--app", BASIC, "--kind", "simple", "--name", f"w-{prefix}"],
                                   cwd=REPO, env=_env(home), stdout=logs["worker"], stderr=subprocess.STDOUT,
                                   start_new_session=True),
    }
    try:
        time.sleep(3.0)  # many sweeper passes, the worker up and polling: nobody has enqueued anything
        ns = subprocess.run([*base, "namespace"], cwd=REPO, env=_env(home), capture_output=True, text=True,
                            timeout=60)
        assert ns.returncode == 0, ns.stdout + ns.stderr
        assert "lost" not in ns.stdout, ns.stdout
        out = subprocess.run([*base, "enqueue", "noop", "--app", BASIC, "--payload", '{"n": 1}', "--json"],
                             cwd=REPO, env=_env(home), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        client = mc_queue.connect(redis_server.url, prefix=prefix)
        try:
            task_id = json.loads(out.stdout)["task"]["id"]
            deadline = time.monotonic() + 60
            while client.reads.get_task(task_id).state.value != "succeeded":
                assert time.monotonic() < deadline, client.reads.get_task(task_id).state
                time.sleep(0.1)
            assert client.reads.namespace().state == "ok"
            assert [e for e in client.reads.namespace_events() if e["type"] == "state_loss_detected"] == []
        finally:
            client.close()
        for name in ("sweeper", "worker"):
            assert procs[name].poll() is None, f"{name} exited {procs[name].returncode}: " + \
                (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=45)
            except subprocess.TimeoutExpired:
                p.kill()
        for fh in logs.values():
            fh.close()


@pytest.mark.parametrize("first", ["sweeper", "metrics-scrape", "status"])
def test_any_process_may_start_first(redis_server: RedisServer, first: str) -> None:
    """Reads and maintenance before any writer leave the namespace missing, never lost."""
    prefix = unique_prefix()
    client = mc_queue.Client(redis_server.url, prefix=prefix)
    try:
        if first == "sweeper":
            for _ in range(3):
                Sweeper(client).run_once()
        elif first == "metrics-scrape":
            from prometheus_client import generate_latest
            from prometheus_client.core import CollectorRegistry

            from mc_queue.ops.metrics import NamespaceCollector
            reg = CollectorRegistry()
            reg.register(NamespaceCollector(client))
            generate_latest(reg)
        else:
            client.reads.status()
            client.reads.overview()
        assert client.reads.namespace().state == "missing"
        sender = mc_queue.connect(redis_server.url, prefix=prefix)
        try:
            sender.producer.enqueue("jobs", "noop", {"n": 2})
            assert sender.reads.namespace().state == "ok"
        finally:
            sender.close()
    finally:
        client.close()

"""RQ's own records (`rq info`, rq-dashboard) say nothing mc_queue contradicts (issue 15): mc_queue is the
only source of truth, so RQ's failed registry must not call "failed" a job whose Attempt mc_queue
settled, and RQ's started registry must not call it "executing". RQ keeps a failed job 7 days
(``failure_ttl``); the sweeper's tidying (every ``tidy_every_s``) removes such entries and their job.

Real worker processes (``mcq worker``), a real redis-server, the real ``rq info`` CLI."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rq import Worker
from rq.serializers import JSONSerializer

import mc_queue
from mc_queue import reconcile_attempt
from mc_queue.ops.sweeper import Sweeper
from mc_queue.producer.transport import forget_orphans, job_id, rq_connection, rq_queue
from mc_queue.testing import RedisServer, unique_prefix
from mc_queue.worker.jobs import McqJob
from tests.apps import lifecycle_app

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.lifecycle_app:app"
RQ = Path(sys.executable).with_name("rq")


def rq_info(url: str, queue: str) -> dict[str, int]:
    """What the real `rq info` prints for one queue: queued, executing, finished, failed."""
    out = subprocess.run([str(RQ), "info", "--url", url, "--raw", "--only-queues", queue],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(rf"^queue {re.escape(queue)} (\d+), (\d+) executing, (\d+) finished, (\d+) failed$", out.stdout,
                  re.M)
    assert m, out.stdout
    return dict(zip(("queued", "executing", "finished", "failed"), map(int, m.groups()), strict=True))


def worker_argv(url: str, prefix: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix, "worker", "--app", APP,
            "--kind", "fork", *extra]


def run_burst(url: str, prefix: str, tmp: Path) -> None:
    out = subprocess.run(worker_argv(url, prefix, "--burst"), cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "MCQ_HOME": str(tmp / "home")})
    assert out.returncode == 0, out.stderr[-3000:]


def wait_for(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def setup(redis_server: RedisServer) -> tuple[mc_queue.Client, str]:
    prefix = unique_prefix("rqreg")
    return mc_queue.connect(redis_server.url, prefix=prefix), prefix


def test_rq_info_shows_no_failed_job_for_a_task_that_succeeded(
        redis_server: RedisServer, setup: tuple[mc_queue.Client, str], tmp_path: Path) -> None:
    """A work horse that dies after its Attempt's completion was recorded (the failover's case: RQ's own
    bookkeeping of the job is what is lost) makes RQ move the job to its failed registry for 7 days. RQ's
    worker does it here with its own code (``Worker.handle_job_failure``, as ``monitor_work_horse`` calls
    it for a horse that terminated unexpectedly), on the job a real worker ran."""
    client, prefix = setup
    producer = lifecycle_app.app.connect(redis_server.url, prefix=prefix)
    task = producer.enqueue("sleeps", {"seconds": 0})
    producer.close()
    rq = rq_connection(client)
    queue = rq_queue(rq, prefix, "jobs")
    qname = queue.name
    job = McqJob.fetch(job_id(prefix, f"{task.id}/1"), connection=rq, serializer=JSONSerializer)
    run_burst(redis_server.url, prefix, tmp_path)
    assert client.reads.get_task(task.id).state.value == "succeeded"
    assert rq_info(redis_server.url, qname) == {"queued": 0, "executing": 0, "finished": 0, "failed": 0}

    Worker([queue], connection=rq, serializer=JSONSerializer, job_class=McqJob).handle_job_failure(
        job, queue, exc_string="Work-horse terminated unexpectedly; waitpid returned 9 (signal 9); ")
    assert rq_info(redis_server.url, qname)["failed"] == 1  # what the operator saw: "1 failed"

    report = Sweeper(client).run_once()  # its first pass tidies RQ
    assert job.id in report.tidied
    assert rq_info(redis_server.url, qname) == {"queued": 0, "executing": 0, "finished": 0, "failed": 0}
    assert not rq.exists(job.key)  # the job RQ kept 7 days is gone too
    assert client.reads.get_task(task.id).state.value == "succeeded"
    rq.close()
    client.close()


def test_rq_shows_no_executing_or_abandoned_job_for_an_attempt_mc_queue_settled(
        redis_server: RedisServer, setup: tuple[mc_queue.Client, str], tmp_path: Path) -> None:
    """A worker killed in the middle of an Attempt leaves RQ's job "executing" (its started registry),
    and RQ's registry cleanup turns it into a failed one (AbandonedJobError, 7 days) once its heartbeat
    runs out, whatever mc_queue decided. Here attempt 1 is settled outside the sweeper's own
    reconciliation (as ``mcq recover`` settles Attempts) and its retry succeeds: RQ then says nothing of
    attempt 1, neither executing nor failed."""
    client, prefix = setup
    producer = lifecycle_app.app.connect(redis_server.url, prefix=prefix)
    report, gate = tmp_path / "report", tmp_path / "gate"
    task = producer.enqueue("holds-workspace", {"report": str(report), "gate": str(gate), "max_wait_s": 60})
    producer.close()
    rq = rq_connection(client)
    queue = rq_queue(rq, prefix, "jobs")
    first = job_id(prefix, f"{task.id}/1")
    horses: list[int] = []
    worker = subprocess.Popen(worker_argv(redis_server.url, prefix), cwd=ROOT,
                              env={**os.environ, "MCQ_HOME": str(tmp_path / "home")},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for("the horse runs attempt 1", report.exists)
        horses = [int(p) for p in Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()]
        assert horses, "no work horse"
        assert forget_orphans(rq, queue) == []  # a running Attempt's job is RQ's to run: kept
        assert rq_info(redis_server.url, queue.name)["executing"] == 1
    finally:
        for pid in [worker.pid, *horses]:  # the worker and its horse (RQ puts it in a process group of its own)
            os.kill(pid, signal.SIGKILL)
        worker.wait(10)
    gate.touch()  # attempt 2 will not wait
    assert rq_info(redis_server.url, queue.name)["executing"] == 1  # RQ still says so

    wait_for("the lease runs out", lambda: bool(client.maintenance.expire_leases()), 10)
    reconcile_attempt(client, f"{task.id}/1", apply_policy=True)  # settled: failed, a retry decided
    assert [a.state.value for a in client.reads.get_task(task.id).attempts] == ["failed", "pending"]

    sweeper = Sweeper(client)
    tidied = sweeper.run_once().tidied  # its first pass tidies RQ
    assert first in tidied and not rq.exists(McqJob.key_for(first))
    wait_for("the retry is sent", lambda: bool(client.reads.get_task(task.id).attempts[1].dispatches)
             or bool(sweeper.run_once().dispatched), 10)
    run_burst(redis_server.url, prefix, tmp_path)
    assert client.reads.get_task(task.id).state.value == "succeeded"
    # RQ's own cleanup of its started registry (what `rq info` and every worker's maintenance run) finds
    # nothing to call abandoned, even long after the execution's heartbeat ran out:
    queue.started_job_registry.cleanup(timestamp=time.time() + 7 * 86400)
    assert rq_info(redis_server.url, queue.name) == {"queued": 0, "executing": 0, "finished": 0, "failed": 0}
    rq.close()
    client.close()


# Redis commands only RQ's bookkeeping sends (no mc_queue script uses them): per Attempt, what bare RQ 3.0
# sends (bench/bench_workers.py, a simple worker: 27 round trips and 63 commands per job) and the most a
# lean mc_queue worker may (issue 17: 8 round trips per Attempt on a simple worker).
RQ_ONLY = ("watch", "smembers", "zrange", "zremrangebyscore", "expire", "exists", "lmove")
BARE_RQ_PER_JOB = {"watch": 1, "smembers": 1, "zrange": 2, "zremrangebyscore": 2, "expire": 13, "exists": 1,
                   "lmove": 1}
LEAN_MAX_PER_ATTEMPT = {"watch": 0.1, "smembers": 0.1, "zrange": 0.1, "zremrangebyscore": 0.1, "expire": 8,
                        "exists": 0.5, "lmove": 1.1}


@pytest.mark.parametrize("kind", ["simple", "fork"])
def test_a_drain_leaves_rq_what_rq_leaves_with_a_fraction_of_its_bookkeeping(tmp_path: Path, kind: str) -> None:
    """mc_queue's workers skip RQ's redundant per-job writes and read-backs (worker heartbeat thrice a job,
    the job's status and executions read back to delete it, dependents watched, `rq suspend` asked before
    every job), and RQ is left exactly as RQ leaves it: no job hash, execution or registry entry, the
    worker's job count and working time counted, `rq info` all zeros. Commands counted by Redis itself,
    a drain of N tasks minus an empty drain."""
    n = 12 if kind == "fork" else 30
    with RedisServer(tmp_path / "redis") as server:
        admin = server.client()

        def drain(tasks: int) -> dict[str, int]:
            prefix = unique_prefix("lean")
            producer = lifecycle_app.app.connect(server.url, prefix=prefix)
            ids = [producer.enqueue("sleeps", {"seconds": 0}).id for _ in range(tasks)]
            producer.close()
            admin.config_resetstat()
            argv = [sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, "worker",
                    "--app", APP, "--kind", kind, "--burst"]
            out = subprocess.run(argv,
                                 cwd=ROOT, capture_output=True, text=True, timeout=180,
                                 env={**os.environ, "MCQ_HOME": str(tmp_path / "home")})
            assert out.returncode == 0, out.stderr[-3000:]
            stats = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in admin.info("commandstats").items()}
            client = mc_queue.connect(server.url, prefix=prefix)
            assert all(client.reads.get_task(t).state.value == "succeeded" for t in ids)
            qname = rq_queue(rq_connection(client), prefix, "jobs").name
            assert rq_info(server.url, qname) == {"queued": 0, "executing": 0, "finished": 0, "failed": 0}
            client.close()
            return stats

        empty, full = drain(0), drain(n)
        per = {c: (full.get(c, 0) - empty.get(c, 0)) / n for c in RQ_ONLY}
        assert all(per[c] <= LEAN_MAX_PER_ATTEMPT[c] for c in RQ_ONLY), (per, BARE_RQ_PER_JOB)
        # Nothing of any job is left in RQ: no job hash, no execution, no execution index, no registry entry.
        leftovers = [k for k in admin.scan_iter("rq:*")
                     if k.startswith(("rq:job:", "rq:execution", "rq:wip:", "rq:finished:", "rq:failed:"))]
        assert leftovers == []
        # The worker's own record counts what it ran (RQ keeps a dead worker's hash a minute).
        workers = [k for k in admin.scan_iter("rq:worker:*") if admin.type(k) == "hash"]
        counts = sorted(int(admin.hget(k, "successful_job_count") or 0) for k in workers)
        assert counts == [0, n] and all(float(admin.hget(k, "total_working_time") or 0) >= 0 for k in workers)
        admin.close()

"""The outbox never floods RQ, and RQ's registries never name a job it no longer holds.

The sweeper re-sends an Attempt whose dispatch was not claimed in time. It used to push the same
job id again at every recheck (RQ appends it to the queue's list each time: 15 entries for 3 tasks
after 5 minutes, `rq info` wrong), and a worker killed mid-job left registry entries that made
`rq requeue --all` crash. Counted where RQ's users see it: the queue's list, RQ's registries, and
the `rq` command line itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

import mc_queue
from mc_queue import TaskState
from mc_queue.contracts import failpoints
from mc_queue.ops.sweeper import Sweeper
from mc_queue.producer.transport import job_id, rq_queue_name
from mc_queue.testing import RedisServer
from tests.apps import basic
from tests.harness import BASIC, REPO, WorkerHarness, events, harness_fixture, proc_state, wait_for

RQ = str(Path(sys.executable).with_name("rq"))


class World(WorkerHarness):
    def __init__(self, server: RedisServer, prefix: str, home: Path) -> None:
        super().__init__(server, prefix, home)
        self.app = self.app_client(basic.app)
        self.queue = Queue(rq_queue_name(prefix, "jobs"), connection=self.rq, serializer=JSONSerializer)

    def due_now(self, task: mc_queue.Task) -> None:
        """Move the outbox's recheck of the task's Attempt to now (as if the 60 s had passed)."""
        self.client.schedule.mark_dispatched(task.attempts[-1].id, recheck_ms=1)

    def sweeper(self, recheck_ms: int = 1) -> Sweeper:
        return Sweeper(self.client, app=basic.app, recheck_ms=recheck_ms, tidy_every_s=0)

    def listed(self) -> list[str]:
        return [j.decode() for j in self.rq.lrange(self.queue.key, 0, -1)]

    def rq_cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([RQ, *args, "-u", self.server.url, "-S", "json"], capture_output=True, text=True,
                              timeout=60, cwd=REPO)

    def worker(self) -> subprocess.Popen[bytes]:
        """A burst worker of the basic app; the handler runs in its process (simple), so a kill ends it."""
        return self.spawn(self.worker_cmd("simple", BASIC))


w = harness_fixture(World)


def test_unclaimed_dispatches_are_rechecked_not_pushed_again(w: World) -> None:
    tasks = [w.app.enqueue("noop", {"i": i}) for i in range(3)]
    ids = sorted(job_id(w.prefix, t.attempts[0].id) for t in tasks)
    for t in tasks:
        w.due_now(t)
    sweeper = w.sweeper()
    rechecked = 0
    for _ in range(10):  # ten rechecks, as ten minutes of the default 60 s recheck would be
        time.sleep(0.01)
        report = sweeper.run_once()
        assert not report.errors and not report.dispatched, report.as_dict()
        rechecked += len(report.rechecked)
    assert rechecked >= 10
    assert sorted(w.listed()) == ids, "one list entry per waiting Attempt"
    assert w.queue.count == 3
    info = w.rq_cli("info", "--only-queues", "--raw", w.queue.name)
    assert info.returncode == 0 and f"queue {w.queue.name} 3" in info.stdout, info.stdout + info.stderr


def test_a_lost_message_is_sent_again_exactly_once(w: World) -> None:
    task = w.app.enqueue("noop", {})
    jid = job_id(w.prefix, task.attempts[0].id)
    w.rq.lrem(w.queue.key, 0, jid)  # RQ lost the list entry (a restart without persistence, a bad LREM)
    w.due_now(task)
    sweeper = w.sweeper()
    time.sleep(0.01)
    first = sweeper.run_once()
    assert first.dispatched == [task.attempts[0].id], first.as_dict()
    for _ in range(3):
        time.sleep(0.01)
        assert not sweeper.run_once().dispatched
    assert w.listed() == [jid]


def test_a_delivery_that_never_reached_its_claim_is_sent_again(w: World) -> None:
    """A worker took the job (RQ marked it started, its started-registry entry live for the job timeout
    + 60 s) and then never claimed: its connection was cut between RQ's start and the claim, or it
    froze or died there (found by the chaos run: the task waited 11 minutes). The outbox must not
    trust that entry past a claim's grace: within it the job is left alone (a claim may be on its
    way), after it the job is sent again; the frozen worker, resumed, is refused by the claim."""
    points = w.home / "points"
    points.mkdir()
    w.extra_env[failpoints.ENV] = str(points)
    failpoints.arm(points, "attempt.before_claim", "stop")
    task = w.app.enqueue("noop", {})
    aid = task.attempts[0].id
    jid = job_id(w.prefix, aid)
    frozen = w.worker()
    wait_for(lambda: proc_state(frozen.pid) == "T", 30, "the worker to freeze before its claim")
    w.stopped.add(frozen.pid)
    job = Job.fetch(jid, connection=w.rq, serializer=JSONSerializer)
    assert job.get_status() == "started" and jid in w.queue.started_job_registry.get_job_ids()
    assert w.client.reads.get_task(task.id).attempts[0].state.value == "pending"
    sweeper = Sweeper(w.client, app=basic.app, recheck_ms=1, tidy_every_s=0, claim_grace_ms=1500)
    w.due_now(task)
    time.sleep(0.01)
    first = sweeper.run_once()
    assert first.rechecked == [aid] and not first.dispatched, first.as_dict()
    time.sleep(1.6)
    w.due_now(task)
    time.sleep(0.01)
    second = sweeper.run_once()
    assert second.dispatched == [aid], second.as_dict()
    assert w.listed() == [jid]
    assert w.worker().wait(60) == 0
    assert w.client.reads.get_task(task.id).state is TaskState.SUCCEEDED
    w.sigcont(frozen.pid)
    frozen.wait(60)
    done = w.client.reads.get_task(task.id)
    assert done.state is TaskState.SUCCEEDED and len(done.attempts) == 1
    assert len(events(done, "attempt_claimed")) == 1, [e.type for e in done.events]
    assert len(events(done, "claim_refused", attempt=1)) == 1, "the resumed worker's claim was refused"
    assert "Traceback" not in w.worker_log(frozen), w.worker_log(frozen)
    registries = {name: getattr(w.queue, f"{name}_job_registry").get_job_ids()
                  for name in ("failed", "started", "finished", "canceled", "deferred", "scheduled")}
    assert all(not ids for ids in registries.values()), registries
    assert not w.listed() and not Job.exists(jid, connection=w.rq)


def test_a_killed_worker_leaves_no_job_in_rqs_registries(w: World) -> None:
    """A worker SIGKILLed mid-Attempt; RQ's own maintenance moves its job to the failed registry
    (abandoned); the sweeper reconciles the Attempt, Attempt 2 succeeds. RQ then holds nothing for
    the task, and `rq requeue --all` has nothing to requeue."""
    task = w.app.enqueue("long-first", {"seconds": 30})
    proc = w.worker()  # the handler runs in this process: the kill ends it
    try:
        deadline = time.monotonic() + 30
        while w.client.reads.get_task(task.id).attempts[0].state.value != "running":
            assert time.monotonic() < deadline, "the worker never claimed"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    w.queue.started_job_registry.cleanup(timestamp=time.time() + 86_400)  # what a restarted RQ worker does
    first = job_id(w.prefix, task.attempts[0].id)
    assert first in w.queue.failed_job_registry.get_job_ids(), "RQ recorded the abandoned job"
    sweeper = w.sweeper()
    deadline = time.monotonic() + 30
    while True:
        report = sweeper.run_once()
        assert not report.errors, report.as_dict()
        current = w.client.reads.get_task(task.id)
        if current.state is TaskState.SUCCEEDED:
            break
        assert time.monotonic() < deadline, [e.type for e in current.events]
        if w.queue.count:  # Attempt 2 waits in RQ: a burst worker runs it
            w.worker().wait(60)
        time.sleep(0.1)
    registries = {name: getattr(w.queue, f"{name}_job_registry").get_job_ids()
                  for name in ("failed", "started", "finished", "canceled", "deferred", "scheduled")}
    assert all(not ids for ids in registries.values()), registries
    assert not Job.exists(first, connection=w.rq)
    out = w.rq_cli("requeue", "--all", "--queue", w.queue.name)
    assert out.returncode == 0, out.stderr


def test_registry_entries_naming_no_job_are_tidied(w: World) -> None:
    """An entry in the failed registry whose job is gone (left by versions before this fix, or by a
    job deleted after it was recorded) makes `rq requeue --all` crash; the sweeper's tidy removes it."""
    task = w.app.enqueue("noop", {})
    jid = job_id(w.prefix, task.attempts[0].id)
    w.rq.zadd(w.queue.failed_job_registry.key, {jid: time.time() + 3600})
    w.rq.delete(Job.key_for(jid))
    broken = w.rq_cli("requeue", "--all", "--queue", w.queue.name)
    assert broken.returncode != 0 and "NoSuchJobError" in broken.stderr + broken.stdout, "the control"
    report = w.sweeper(recheck_ms=60_000).run_once()  # (its dispatch is not due for a recheck)
    assert jid in report.tidied, report.as_dict()
    assert w.queue.failed_job_registry.get_job_ids() == []
    fixed = w.rq_cli("requeue", "--all", "--queue", w.queue.name)
    assert fixed.returncode == 0, fixed.stderr

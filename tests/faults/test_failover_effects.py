"""Issue 15, "tasks without a producer key do their side effects twice after a failover": a failover to
a lagging replica (min_replicas=0) takes the effect records of tasks that pushed and opened their pull
requests during the lag; after the loss is reported and `mcq recover` ran, those tasks run again. The
effect keys are built from the task id, which survived: the worker asks the provider before each first
call of a task created before the recovery, finds the effect, and does not repeat it.

Real processes throughout: a primary, a lagging replica behind a TCP proxy and three redis-sentinel
processes (`mc_queue.testing.FailoverCluster`); `mcq worker` and `mcq sweeper` processes of the
example app (`mc_queue.examples.agents`: a push with `--force-with-lease` to a bare git remote, a pull
request at a local forge that has no one-PR-per-branch rule); `mcq recover` as an operator types it.
Counted where the user sees it: commits per operation key on the remote, pull requests per key.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import mc_queue
from mc_queue.contracts.keys import Keys
from mc_queue.demo.fleet import Fleet, provider_env
from mc_queue.providers.git import TRAILER, git
from mc_queue.testing import FailoverCluster

pytestmark = pytest.mark.timeout(240)
TASKS = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FailoverCluster]:
    with FailoverCluster(tmp_path / "cluster", down_after_ms=3000, failover_timeout_ms=10000) as fc:
        yield fc


def _wait(cond: object, timeout: float, what: str, fleet: Fleet | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if fleet is not None:
            fleet.reap(what)
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.2)


def test_tasks_without_a_producer_key_do_no_side_effect_twice_after_a_lossy_failover(
        cluster: FailoverCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mc_queue.examples.agents import app

    prefix, state = "fx0", tmp_path / "state"
    monkeypatch.setenv("MCQ_STATE_DIR", str(state))  # this process's watermark too (the producer's)
    prov = provider_env(tmp_path / "prov", extra={"MCQ_STATE_DIR": str(state)}, forge_timeout_s=3,
                        one_pr_per_head=False)
    url = cluster.url(min_replicas=0)  # acknowledged on the primary alone: a failover can lose it
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(prefix, url, prov.env, logs, sweeper_interval_s=0.5, restart=True)
    producer = app.connect(url, prefix=prefix)
    direct = cluster.replica.client()  # the replica: the new primary after the failover
    try:
        tasks = [producer.enqueue("fix-issue", {"repository": "example/app", "issue": i, "think_s": 0.5,
                                                "instruction": f"fix issue {i}"}).id  # no producer key
                 for i in range(TASKS)]
        cluster.catch_up()  # the tasks themselves are on the replica; what the workers do next is not
        cluster.lag()
        for _ in range(2):
            fleet.worker()
        fleet.sweeper()
        _wait(lambda: len(prov.forge.pulls) >= TASKS, 90, "every task to push and open its pull request", fleet)
        cluster.kill_primary()
        cluster.wait_failover()
        cluster.restart_old_primary()
        # The effect records are gone from the new primary; the tasks are there.
        assert all(direct.exists(Keys(prefix).task(t).task) for t in tasks)
        assert not any(direct.hlen(Keys(prefix).task(t).effects) for t in tasks)
        _wait(lambda: direct.hget(Keys(prefix).meta, "state") == "lost", 60, "the loss to be reported", fleet)
        rec = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix, "recover",
                              "--reason", "a failover lost acknowledged writes"], env=prov.env, capture_output=True,
                             text=True, timeout=120)
        assert rec.returncode == 0, rec.stdout + rec.stderr
        ops = mc_queue.Client(url, prefix=prefix, track_replication="off")
        try:
            _wait(lambda: all(ops.reads.get_task(t).state.value == "succeeded" for t in tasks), 120,
                  "every task to succeed after the recovery", fleet)
            replayed = sum(1 for t in tasks for fx in ops.reads.effects(t).values() if fx.source == "reconcile")
        finally:
            ops.close()
        # At the providers: one commit per operation key, one pull request per task.
        log = git("log", "--all", "--format=%B", cwd=prov.remote)
        commits = Counter(line.split(":", 1)[1].strip() for line in log.splitlines() if line.startswith(f"{TRAILER}:"))
        assert len(commits) == TASKS and set(commits.values()) == {1}, commits
        assert len(prov.forge.pulls) == TASKS and prov.forge.duplicates() == {}, prov.forge.count_by_key()
        assert replayed == 2 * TASKS  # each push and each pull request found at the provider, not made again
    finally:
        fleet.stop_all()
        producer.close()
        direct.close()
        prov.stop()

"""A work horse that dies is noticed by its worker at once, and a pool's SimpleWorker by its pool (issue 17):
the lease of the Attempt it ran is voided through the fenced expire script, and the Attempt reconciled,
without waiting for the lease to run out or for a sweeper. No sweeper runs in these tests: only the
worker (or the pool) can have done it.

The void is by holder: a worker voids only a lease it holds, never another worker's (the process that
died may have run a duplicate message, refused while someone else runs the Attempt).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import mc_queue
from mc_queue.contracts.models import AttemptState
from mc_queue.worker.attempt import Runtime, horse_died
from mc_queue.worker.workspace import WorkspaceRoot
from tests.apps.basic import app as basic_app
from tests.harness import BASIC, Harness, events, harness_fixture, wait_for

h = harness_fixture(Harness)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _settled(h: Harness, task_id: str) -> mc_queue.Task | None:
    """The task once its Attempt 1 is neither running nor waiting for reconciliation, else None."""
    t = h.task(task_id)
    return t if t.attempts[0].state not in (AttemptState.RUNNING, AttemptState.SUSPECT, AttemptState.RECONCILING) \
        else None


def test_a_killed_work_horse_has_its_lease_voided_and_its_attempt_reconciled_at_once(h: Harness) -> None:
    task = h.basic.enqueue("long-first", {"seconds": 60})
    worker = h.start_worker("fork", BASIC, "--name", "w-horse")
    wait_for(lambda: events(h.task(task.id), "attempt_claimed"), 20, "the worker to claim Attempt 1")
    horse = wait_for(lambda: _children(worker.pid), 10, "the work horse")[0]
    killed_at = time.monotonic()
    os.kill(horse, signal.SIGKILL)

    final = wait_for(lambda: _settled(h, task.id), 10, "Attempt 1 voided and reconciled by its worker")
    took = time.monotonic() - killed_at
    voided = events(final, "lease_expired", attempt=1)
    assert len(voided) == 1, [e.type for e in final.events]
    assert voided[0].fields["actor"] == "w-horse" and "died (signal 9)" in voided[0].fields["reason"]
    assert took < 5, f"took {took:.1f} s"  # the lease (1.5 s) ran out meanwhile, but no sweeper runs here
    worker.kill()
    worker.wait(10)


def test_a_worker_voids_only_a_lease_it_holds(h: Harness, tmp_path: Path) -> None:
    """Both sides of the holder check, through what the worker calls when its horse dies."""
    task = h.client.producer.enqueue("jobs", "long", {"seconds": 1})
    lease = h.client.leases.claim_attempt(task.id, "holder-1", 60_000)
    workspaces = WorkspaceRoot(tmp_path / "ws", namespace=h.prefix)
    other = Runtime(app=basic_app, client=h.client, worker_id="holder-2", workspaces=workspaces)
    assert horse_died(other, lease.attempt_id, 4242, 9) is False  # another worker's lease: left alone
    after = h.task(task.id)
    assert after.attempts[0].state is AttemptState.RUNNING and after.fence == lease.fence
    assert not events(after, "lease_expired")

    mine = Runtime(app=basic_app, client=h.client, worker_id="holder-1", workspaces=workspaces)
    assert horse_died(mine, lease.attempt_id, 4242, 9) is True
    final = h.task(task.id)
    assert final.attempts[0].state not in (AttemptState.RUNNING, AttemptState.SUSPECT)
    assert final.fence > lease.fence
    assert events(final, "lease_expired", attempt=1)[0].fields["actor"] == "holder-1"


def test_a_killed_pool_worker_has_its_leases_voided_by_the_pool(h: Harness) -> None:
    """A pool of SimpleWorkers runs each Attempt in the pool worker's own process: when one is killed, the
    pool's watch sees it at once and voids what it held, by holder, then reconciles."""
    task = h.basic.enqueue("long-first", {"seconds": 60})
    pool = h.start_worker("simple", BASIC, "--pool", "2", "--name", "w-pool")
    claimed = wait_for(lambda: events(h.task(task.id), "attempt_claimed"), 20, "a pool worker to claim Attempt 1")
    holder = claimed[0].fields["worker"]
    assert holder.startswith("w-pool-")
    # (a burst pool's idle worker may have ended already: whichever are left are killed)
    children = wait_for(lambda: _children(pool.pid), 10, "the pool's workers")
    killed_at = time.monotonic()
    for child in children:  # an idle one holds nothing: voiding by holder leaves it nothing to do
        os.kill(child, signal.SIGKILL)

    final = wait_for(lambda: _settled(h, task.id), 15, "Attempt 1 voided and reconciled by the pool")
    took = time.monotonic() - killed_at
    voided = events(final, "lease_expired", attempt=1)
    assert len(voided) == 1 and voided[0].fields["actor"] == holder, [e.fields for e in voided]
    assert f"worker {holder}" in voided[0].fields["reason"] and "ended (signal 9)" in voided[0].fields["reason"]
    assert took < 8, f"took {took:.1f} s"  # the lease is 1.5 s, but no sweeper runs here: the pool did it
    pool.kill()
    pool.wait(10)


def _sleep_forever() -> None:
    time.sleep(3600)


def test_the_pools_watch_alone_sees_a_worker_die_and_leaves_the_live_one_alone(h: Harness) -> None:
    """The watch thread, with RQ's pool loop not running at all (so nothing else can notice): a worker
    started after the watch began is watched (the wake pipe), its death is handled within a second,
    once, and the worker that lives on is not handled."""
    import multiprocessing
    import threading

    from rq.worker import SimpleWorker

    from mc_queue.worker.pool import McqWorkerPool

    class Sleepers(McqWorkerPool):
        def get_worker_process(self, name: str, burst: bool, _sleep: float = 0,
                               logging_level: str = "INFO") -> multiprocessing.process.BaseProcess:
            return multiprocessing.get_context("fork").Process(target=_sleep_forever, name=name, daemon=True)

    pool = Sleepers(["jobs"], base="w-watch", connection=h.client.redis, num_workers=2, worker_class=SimpleWorker)
    watch = threading.Thread(target=pool.watch, daemon=True)
    watch.start()
    try:
        pool.start_worker()
        pool.start_worker()
        first, second = pool.worker_dict["w-watch-1"], pool.worker_dict["w-watch-2"]
        time.sleep(0.2)
        assert pool.voided_for == set()
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: first.pid in pool.voided_for, 1.0, "the watch to see worker 1 die")
        time.sleep(0.2)
        assert pool.voided_for == {first.pid} and second.process.is_alive()
        assert first.process.exitcode == -signal.SIGKILL
    finally:
        pool.ended.set()
        pool.wake()
        watch.join(5)
        for d in pool.worker_dict.values():
            d.process.kill()
            d.process.join(5)
    assert not watch.is_alive()

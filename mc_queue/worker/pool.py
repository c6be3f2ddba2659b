"""RQ's WorkerPool as ``mcq worker --pool N`` runs it: workers named ``<base>-1`` .. ``<base>-N``, and a
SimpleWorker that dies has its leases voided within milliseconds rather than at the pool's next check.

RQ's pool looks at its workers once a second (``check_workers``, then ``time.sleep(1)``) and joins each
live one for 0.1 s on the way. A SimpleWorker runs its Attempts in its own process, so its death ends
them: waiting for that second (and then for the lease) is time in which nothing happens. A thread of
the pool's process waits on the workers' process sentinels (``multiprocessing.connection.wait``: the
kernel closes a child's sentinel as it exits) and voids what the dead worker held as soon as it is
closed, by holder (:func:`mc_queue.worker.runner.worker_died`: expire.lua leaves a lease another worker
holds alone, and worker names are never reused, so a reused pid cannot void anyone else's lease).
RQ's own loop still reaps, counts and respawns, at its pace; a worker already handled by the thread is
not voided for again.

The thread forks nothing, and a new worker is forked only while it is not handling a death (one lock),
so no child starts with a lock of that work held. A fork worker's Attempts run in work horses that may
outlive it and are voided by that worker itself (``handle_work_horse_killed``): its pool has no thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from multiprocessing.connection import wait
from typing import Any

from rq.worker import SimpleWorker
from rq.worker_pool import WorkerData, WorkerPool

from .runner import worker_died

log = logging.getLogger("mc_queue.worker")

__all__ = ["McqWorkerPool"]


class McqWorkerPool(WorkerPool):
    """RQ's WorkerPool with named workers and a death watch (module docstring). ``base`` names them."""

    def __init__(self, *args: Any, base: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base = base
        self.spawned = 0
        self.exit_codes: list[int | None] = []  # of the workers that ended, for the pool's own exit code
        self.voided_for: set[int] = set()  # pids whose death was handled (by the watch or the loop)
        self.lock = threading.Lock()  # a death handled, or a worker forked: never both at once
        self.watching = issubclass(self.worker_class, SimpleWorker)
        self.wake_r, self.wake_w = os.pipe()  # a new worker to watch, or the end
        os.set_blocking(self.wake_w, False)  # a wake never blocks: one byte waiting is enough to wake the watch
        self.ended = threading.Event()

    # -- RQ's pool, overridden through its public methods

    def start(self, burst: bool = False, logging_level: str = "INFO") -> None:
        watch = threading.Thread(target=self.watch, name="mcq-pool-watch", daemon=True) if self.watching else None
        if watch is not None:
            watch.start()
        try:
            super().start(burst=burst, logging_level=logging_level)
        finally:
            self.ended.set()
            self.wake()
            if watch is not None:
                watch.join(5)
            os.close(self.wake_r)
            os.close(self.wake_w)

    def start_worker(self, count: int | None = None, burst: bool = True, _sleep: float = 0,
                     logging_level: str = "INFO") -> None:
        # RQ names its workers by uuid and has no option for it. A respawned worker takes the next number,
        # since RQ may still hold a dead one's name.
        with self.lock:
            self.spawned += 1
            name = f"{self.base}-{self.spawned}"
            process = self.get_worker_process(name, burst=burst, _sleep=_sleep, logging_level=logging_level)
            process.start()
            self.worker_dict[name] = WorkerData(name=name, pid=process.pid or 0, process=process)
        self.wake()

    def handle_dead_worker(self, worker_data: WorkerData) -> None:
        self.exit_codes.append(worker_data.process.exitcode)
        super().handle_dead_worker(worker_data)
        if self.watching:
            self.died(worker_data)

    # -- the death watch

    def wake(self) -> None:
        """Have the watch look at the workers again (a full pipe already will)."""
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass

    def died(self, data: WorkerData) -> None:
        """Void what a dead SimpleWorker held, once (the watch and RQ's loop may both see it)."""
        with self.lock:
            if data.pid in self.voided_for:
                return
            self.voided_for.add(data.pid)
            # RQ's loop may be reaping it this instant: its waitpid took the status, and the returncode it
            # stores comes a moment later (ours, meanwhile, found no child): wait for it, briefly.
            code, deadline = data.process.exitcode, time.monotonic() + 0.5
            while code is None and time.monotonic() < deadline:
                time.sleep(0.005)
                code = data.process.exitcode
            worker_died(data.name, data.pid, code)

    def watch(self) -> None:
        while not self.ended.is_set():
            by_sentinel = {d.process.sentinel: d for d in list(self.worker_dict.values())
                           if d.pid not in self.voided_for}  # a dead one stays listed until RQ's loop reaps it
            try:
                ready = wait([self.wake_r, *by_sentinel], timeout=5)
            except OSError:  # a sentinel closed by RQ's reaping in between: look again
                continue
            for r in ready:
                if r == self.wake_r:
                    os.read(self.wake_r, 64)
                elif r in by_sentinel:
                    data = by_sentinel[r]
                    data.process.join(1)  # the sentinel closes as the process exits: it is reaped at once
                    try:
                        self.died(data)
                    except Exception:  # never let the watch end: RQ's loop and the leases still hold
                        log.exception("voiding the leases of pool worker %s failed", data.name)

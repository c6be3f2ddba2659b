"""A stop request (SIGTERM) to a worker waiting for work stops it now, whatever state RQ recorded last; one
holding an Attempt finishes it first. Before, a worker whose recorded state still said busy while it waited
for work was told to stop "after its job", in a wait that never looks at that request: a drained worker
ignored SIGTERM for good (found alive in a smoke run of bench_priority.py, its first SIGTERM and a second
both ignored). Against the session's real redis-server, on a real worker object (no process)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
from rq.exceptions import StopRequested
from rq.worker import WorkerStatus

import mc_queue
from mc_queue.worker.runner import make_worker
from tests.apps import basic


def test_a_worker_waiting_for_work_stops_now_whatever_its_recorded_state(q: mc_queue.Client,
                                                                         tmp_path: object) -> None:
    w = make_worker(basic.app, q, ["jobs"], kind="simple", name="stop-test", workspace_root=str(tmp_path),
                    home=str(tmp_path))
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        w._dequeuing = True  # (in its dequeue, as RQ's loop puts it)
        w._state = WorkerStatus.BUSY  # (a state left from its last job)
        with pytest.raises(StopRequested):
            w.request_stop(signal.SIGTERM, None)
        assert w.stop_signal == signal.SIGTERM
        # the other side: an Attempt admitted (being run) is finished first, nothing raised now
        w2 = make_worker(basic.app, q, ["jobs"], kind="simple", name="stop-test-2", workspace_root=str(tmp_path),
                         home=str(tmp_path))
        w2._dequeuing = False
        w2._state = WorkerStatus.BUSY
        w2._admitted = SimpleNamespace(attempt_id="jobs:x/1")  # type: ignore[assignment]
        w2.request_stop(signal.SIGTERM, None)
        assert w2._stop_requested
        if w2._grace is not None:
            w2._grace.cancel()
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])

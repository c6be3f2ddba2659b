"""Bare RQ's worker classes for the benchmarks' baseline, leaving as promptly as mc_queue's workers leave.

RQ 3.0 runs its command channel's thread with ``sleep_time=60``; leaving, it sends UNSUBSCRIBE and then
stops that thread, and redis-py 8.2's ``PubSubWorkerThread.stop()`` joins it with no timeout. When the
thread reads the UNSUBSCRIBE reply before ``stop()`` clears its running flag, its next ``get_message``
waits up to 60 s for a subscription that never comes, so a drained ``rq worker --burst`` process lingered
a minute (seen here as 60 s stalls of bench_workers' smoke run on a loaded machine, one drain in a few).
mc_queue's own worker wakes that thread every ``PUBSUB_WAKE_S`` (``mc_queue.worker.runner``); these
classes do the same and nothing else, so both sides of a comparison pay the same for it and a drain ends
when its work does.
"""

from __future__ import annotations

from typing import Any

from rq.worker import SimpleWorker as _RQSimpleWorker
from rq.worker import Worker as _RQWorker

from mc_queue.worker.runner import PUBSUB_WAKE_S


def _subscribe(worker: Any) -> None:
    worker.pubsub = worker.connection.pubsub()
    worker.pubsub.subscribe(**{worker.pubsub_channel_name: worker.handle_payload})
    worker.pubsub_thread = worker.pubsub.run_in_thread(
        sleep_time=PUBSUB_WAKE_S, daemon=True, exception_handler=worker._pubsub_exception_handler)


class Worker(_RQWorker):
    """``rq.Worker`` (a work horse forked per job)."""

    def subscribe(self) -> None:
        _subscribe(self)


class SimpleWorker(_RQSimpleWorker):
    """``rq.SimpleWorker`` (jobs run in the worker process)."""

    def subscribe(self) -> None:
        _subscribe(self)

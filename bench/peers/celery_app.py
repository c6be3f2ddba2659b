"""Celery app of bench/bench_peers.py: Redis broker, no result backend, results ignored.

    celery -A bench.peers.celery_app worker --pool=solo --concurrency=1

reads the broker URL from ``BENCH_PEERS_URL``; the benchmark sends ``bench.noop`` by name.
"""

from __future__ import annotations

import os

from celery import Celery

from bench.peers import noop as _noop

app = Celery("bench_peers", broker=os.environ.get("BENCH_PEERS_URL", "redis://127.0.0.1:1/0"))
app.conf.update(task_ignore_result=True, result_backend=None, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)


@app.task(name="bench.noop")
def noop() -> None:
    _noop()

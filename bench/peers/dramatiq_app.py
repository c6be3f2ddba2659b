"""Dramatiq app of bench/bench_peers.py: a RedisBroker (default middleware, no results).

    dramatiq bench.peers.dramatiq_app --processes 1 --threads 1

reads the broker URL from ``BENCH_PEERS_URL``; the benchmark enqueues messages for actor ``noop`` on
queue ``default``.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers import noop as _noop

broker = RedisBroker(url=os.environ.get("BENCH_PEERS_URL", "redis://127.0.0.1:1/0"))
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="noop", queue_name="default", max_retries=0)
def noop() -> None:
    _noop()

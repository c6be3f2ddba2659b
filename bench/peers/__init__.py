"""No-op jobs of the peer task queues for bench/bench_peers.py (RQ, Celery, Dramatiq).

Every peer's job calls :func:`noop`: with ``BENCH_PEERS_DONE`` set to a file path, it appends one
fixed-width line (its wall-clock time) to that file with ``O_APPEND`` and ``os.write``, so RQ's forked
work horses (which leave by ``os._exit``) lose nothing. The benchmark counts finished jobs from the
file's size, which costs the Redis server nothing (a completion counter kept in Redis would add a
connection and an INCR per job, per work horse for RQ's fork worker, to the figures measured).
"""

from __future__ import annotations

import os
import time

LINE = 18  # len(f"{time.time():017.6f}\n")


def noop() -> None:
    path = os.environ.get("BENCH_PEERS_DONE")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{time.time():017.6f}\n".encode())
    finally:
        os.close(fd)

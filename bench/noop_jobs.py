"""No-op jobs for bench/bench_workers.py.

RQ imports :func:`noop` by name (``bench.noop_jobs.noop``) in ``rq worker`` processes started with
cwd = the repository root; ``bench.noop_app``'s handler calls the same :func:`stamp`, so both systems
do exactly the same (almost nothing) per job.

With ``MCQ_BENCH_STAMP_DIR`` set, each call appends its wall-clock time to a file per process
(``os.write``, so RQ's forked work horses, which leave by ``os._exit``, lose nothing). The benchmark
uses the stamps for the steady-state rate (first job to last job, worker start and exit excluded)
and to check that every job ran exactly once. Without it, nothing happens at all.
"""

from __future__ import annotations

import os
import time

_DIR = os.environ.get("MCQ_BENCH_STAMP_DIR")
_state: dict[str, int | None] = {"pid": None, "fd": None}


def stamp() -> None:
    if not _DIR:
        return
    pid = os.getpid()
    if _state["pid"] != pid:
        _state["pid"] = pid
        _state["fd"] = os.open(os.path.join(_DIR, f"{pid}.stamps"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    fd = _state["fd"]
    assert fd is not None
    os.write(fd, f"{time.time():.6f}\n".encode())


def noop() -> None:
    """Does nothing but the optional stamp: the benchmark measures the queue, not the job."""
    stamp()

"""The jobs of bench/bench_recovery.py: an mc_queue App whose handler opens a pull request and then
hangs, and a plain RQ job that hangs.

Workers load the App with ``mcq worker --app bench.recovery_app:app`` (cwd = the repository root) and
the sweeper with ``mcq sweeper --app bench.recovery_app:app`` (for the ``open-pr`` reconcile); RQ
workers import :func:`rq_hang` by name (``bench.recovery_app.rq_hang``).

``MCQ_BENCH_FORGE`` is the base URL of the :class:`mc_queue.testing.ForgeServer` the benchmark
runs; it must be set before this module is imported (the benchmark sets it for every process).

Everything runs with mc_queue's defaults: the App's lease (``DEFAULT_LEASE_MS``, 10 s, renewed every
third by the worker's heartbeat thread; ``MCQ_BENCH_LEASE_MS``, set by ``--lease-ms``, for a quick run),
its retry policy (executor failures retry after a jittered backoff) and budget.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mc_queue import App, Context
from mc_queue.client import DEFAULT_LEASE_MS
from mc_queue.providers import HttpPullRequests

QUEUE = "recovery"
HANDLER = "bench.open-pr-then-hang"
RQ_FUNC = "bench.recovery_app.rq_hang"

FORGE_URL = os.environ.get("MCQ_BENCH_FORGE", "http://127.0.0.1:9")  # port 9 (discard): fails loudly if unset

app = App(name="bench-recovery", lease_ms=int(os.environ.get("MCQ_BENCH_LEASE_MS") or DEFAULT_LEASE_MS))
prs = HttpPullRequests(FORGE_URL)
app.operation("open-pr", prs.find_pr)


def write_pid(path: str) -> None:
    """Write this process's pid to ``path`` atomically (a reader never sees a partial file)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, target)


@app.handler(HANDLER, queue=QUEUE)
def open_pr_then_hang(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Open one pull request for ``head`` (at most once per task, through ctx.effect); on Attempt 1,
    then write the pid file and sleep ``sleep_s`` (the benchmark SIGKILLs the worker meanwhile).
    A later Attempt replays the recorded receipt and returns at once."""

    def perform(key: str) -> dict[str, Any]:
        return prs.open_pr(key, repo=payload.get("repo", "bench/recovery"), head=payload["head"], base="main",
                           title=f"fix {payload['head']}")

    receipt = ctx.effect("open-pr", payload["head"], perform)
    if ctx.attempt.number == 1:
        write_pid(payload["pid_file"])  # the effect is done and its receipt recorded
        time.sleep(float(payload.get("sleep_s", 3600)))
    return {"pull_request": receipt["number"], "key": receipt["key"], "attempt": ctx.attempt.number}


def rq_hang(pid_file: str, sleep_s: float = 3600) -> None:
    """A plain RQ job: write the pid of the process running it, then sleep (it gets SIGKILLed)."""
    write_pid(pid_file)
    time.sleep(float(sleep_s))

"""An mc_queue App with one no-op handler, for bench/bench_workers.py.

Workers load it with ``mcq worker --app bench.noop_app:app`` (cwd = the repository root).
"""

from __future__ import annotations

from typing import Any

from bench.noop_jobs import stamp
from mc_queue import App, Context

QUEUE = "bench"
HANDLER = "bench.noop"

app = App(name="bench")


@app.handler(HANDLER, queue=QUEUE)
def noop(ctx: Context, payload: dict[str, Any]) -> None:
    """Does nothing but the optional stamp (the same as bench.noop_jobs.noop)."""
    stamp()

"""The App of bench/bench_limits.py: a handler that calls a counting HTTP provider once per Attempt.

Workers load it with ``mcq worker --app bench.controls_app:app`` (cwd = the repository root), with
``MCQ_BENCH_PROVIDER`` (the provider's URL) in their environment. ``MCQ_BENCH_CLOCK_SKEW_S`` moves this
process's wall clock (``time.time``) by that many seconds: a host whose clock is off, which must change
nothing (every limit decision is taken on Redis's clock).
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from mc_queue import App, Context

QUEUE = "controls"
KEY = "api"

_skew = float(os.environ.get("MCQ_BENCH_CLOCK_SKEW_S", "0") or 0)
if _skew:
    _real_time = time.time
    time.time = lambda: _real_time() + _skew  # this process's host clock is off by _skew seconds

app = App(name="bench-controls", default_queue=QUEUE, lease_ms=5000, timeout_s=60)
_http: httpx.Client | None = None


def provider() -> httpx.Client:
    global _http
    if _http is None:
        _http = httpx.Client(base_url=os.environ["MCQ_BENCH_PROVIDER"], timeout=10.0)
    return _http


@app.handler("call", limits={KEY: 1})
def call(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """One request to the provider (through the limit's gateway: its units count from the call)."""
    http = provider()  # (made before the gateway: a first client's setup is not part of the call)
    ctx.calling(KEY)
    resp = http.post("/call", json={"task": ctx.task.id, "attempt": ctx.attempt.number})
    resp.raise_for_status()
    return {"status": resp.status_code}

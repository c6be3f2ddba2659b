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

from mc_queue import App, Backoff, Budget, Context, RetryPolicy

QUEUE = "controls"
KEY = "api"

_skew = float(os.environ.get("MCQ_BENCH_CLOCK_SKEW_S", "0") or 0)
if _skew:
    _real_time = time.time
    time.time = lambda: _real_time() + _skew  # this process's host clock is off by _skew seconds

app = App(name="bench-controls", default_queue=QUEUE, lease_ms=5000, timeout_s=60,
          retry=RetryPolicy(backoff=Backoff(base_s=0.2, max_s=2.0)), budget=Budget(max_attempts=100,
                                                                                    max_same_fingerprint=100))
# bench_breakers.py: the provider's breaker (opens at half of >= 5 calls failing in 5 s, for 2 s, then 2 probes)
app.breaker(KEY, failure_rate=0.5, min_calls=5, window_s=5.0, open_s=2.0, probes=2)
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


@app.handler("dep", needs=[KEY])
def dep(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """One request through the breaker's gateway (ctx.call records its outcome): a 503 fails it."""
    http = provider()

    def post() -> httpx.Response:  # raises on a 5xx: what the breaker counts is what fn raises
        return http.post("/call", json={"task": ctx.task.id, "attempt": ctx.attempt.number}).raise_for_status()

    return {"status": ctx.call(KEY, post).status_code}


@app.handler("free")
def free(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Needs no dependency: ``work_ms`` of work."""
    time.sleep(float(payload.get("work_ms", 0)) / 1000)
    return {}

"""Handlers the worker tests run in real RQ worker processes (`mcq worker --app tests.apps.basic:app`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import mc_queue
from mc_queue import App, Backoff, Context, RetryPolicy

app = App(name="test-basic", default_queue="jobs",
          retry=RetryPolicy(backoff=Backoff(base_s=0.2, max_s=1.0)), lease_ms=3000)


@app.handler("noop")
def noop(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "attempt": ctx.attempt.number}


@app.handler("flaky-capacity")
def flaky_capacity(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    if ctx.attempt.number <= int(payload.get("fail_times", 2)):
        raise mc_queue.CapacityError("provider is at capacity (429)")
    return {"ok": True, "attempt": ctx.attempt.number}


@app.handler("auth-fails")
def auth_fails(ctx: Context, payload: dict[str, Any]) -> None:
    raise mc_queue.AuthorizationError("token revoked for repository example/app")


@app.handler("validation-fails")
def validation_fails(ctx: Context, payload: dict[str, Any]) -> None:
    raise mc_queue.ValidationFailure("test_parser fails: expected 3, got 4",
                                     hypothesis=f"pin the parser dependency (try {ctx.attempt.number})")


@app.handler("long", lease_ms=1500, timeout_s=60)
def long_runner(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    # Never yields to mc_queue: a blocking tool call far longer than the lease.
    time.sleep(float(payload["seconds"]))
    return {"slept": payload["seconds"]}


@app.handler("long-first", lease_ms=1500, timeout_s=60)
def long_first(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Attempt 1 runs for payload["seconds"] (long enough to be killed mid-way); later ones at once."""
    if ctx.attempt.number == 1:
        time.sleep(float(payload["seconds"]))
    return {"attempt": ctx.attempt.number}


@app.handler("sleepy", lease_ms=60_000, timeout_s=120)
def sleepy(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Sleeps payload["seconds"] under a long lease (a batch worker's chunk keeps several such leases)."""
    time.sleep(float(payload["seconds"]))
    return {"slept": payload["seconds"], "n": payload.get("n")}


@app.handler("hangs", lease_ms=1500, timeout_s=2)
def hangs(ctx: Context, payload: dict[str, Any]) -> None:
    time.sleep(30)


@app.handler("records-pid", lease_ms=1500, timeout_s=60)
def records_pid(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Writes its pid, then works in small steps, each behind ctx.heartbeat(); reports what it saw."""
    Path(payload["pidfile"]).write_text(str(os.getpid()))
    seen = []
    for _ in range(int(payload.get("steps", 20))):
        time.sleep(float(payload.get("step_s", 0.2)))
        ctx.heartbeat()
        seen.append("step")
    return {"steps": len(seen)}


@app.handler("checkpoints")
def checkpoints(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    scope = {"repository": payload["repo"], "base": payload["base"], "branch": "main", "generation": 1}
    reused = ctx.reusable_checkpoint("source_capture_done", scope=scope)
    ctx.checkpoint("workspace_prepared", {"path": str(ctx.workspace)}, scope=scope)
    if reused is None:
        ctx.checkpoint("source_capture_done", {"files": ["a.py"], "by": ctx.attempt.number}, scope=scope)
    if ctx.attempt.number == 1 and payload.get("fail_first"):
        raise mc_queue.ProviderError("CI provider timed out")
    return {"reused": reused, "workspace_exists": ctx.workspace.is_dir()}


@app.handler("crashes")
def crashes(ctx: Context, payload: dict[str, Any]) -> None:
    raise KeyError("bug in the handler")


@app.handler("own-phases")
def own_phases(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Phases of its own, no list declared (issue 15: `ctx.checkpoint("started")` quarantined the task)."""
    ctx.checkpoint("started", {"n": 1})
    ctx.checkpoint("pushed", {"n": 2})
    return {"ok": True}


@app.handler("declared-phases", phases=("prepare", "push"))
def declared_phases(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    ctx.checkpoint("prepare")
    ctx.checkpoint("started")  # not declared: a configuration failure, said as such
    return {"ok": True}

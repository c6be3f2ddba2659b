"""Handlers for the worker fault tests (`mcq worker --app tests.apps.faulty:app`).

Each handler leaves its own evidence in files named by its payload (never log text), so a test can
tell what the handler saw even when mc_queue refused to record it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import mc_queue
from mc_queue import App, Backoff, Context, RetryPolicy

app = App(name="test-faulty", default_queue="jobs",
          retry=RetryPolicy(backoff=Backoff(base_s=0.2, max_s=1.0)), lease_ms=3000)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@app.handler("records-pid-report", lease_ms=1500, timeout_s=60)
def records_pid_report(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Like basic's records-pid, but per Attempt (``<dir>/pid-<n>``), and it reports what it saw.

    Attempt 1 runs ``steps`` steps; later Attempts run 2. Each step sleeps ``step_s`` and then calls
    ctx.heartbeat(). When the lease is lost it reports which call raised, then tries what a careless
    handler would do next: a checkpoint through the Context, and a checkpoint and a completion
    written directly with its old fence. It writes ``<dir>/report-<n>`` and re-raises LeaseLost.
    """
    d = Path(payload["dir"])
    n = ctx.attempt.number
    (d / f"pid-{n}").write_text(str(os.getpid()))
    steps = int(payload.get("steps", 25)) if n == 1 else 2
    report: dict[str, Any] = {"attempt": n, "fence": ctx.fence, "worker": ctx.worker_id, "steps_done": 0}
    try:
        for i in range(steps):
            time.sleep(float(payload.get("step_s", 0.2)))
            ctx.heartbeat()
            report["steps_done"] = i + 1
    except mc_queue.LeaseLost as exc:
        report["heartbeat_raised"] = type(exc).__name__
        report["lease_lost_flag"] = ctx.lease_lost
        try:
            ctx.checkpoint("workspace_prepared", {"after": "lease lost"})
            report["context_checkpoint"] = "accepted"
        except mc_queue.McqError as exc2:
            report["context_checkpoint"] = type(exc2).__name__
        try:
            ctx.client.leases.checkpoint(ctx.attempt_id, ctx.fence, "workspace_prepared", 1,
                                  {"phase": "workspace_prepared", "data": "after lease lost"},
                                  worker_id=ctx.worker_id)
            report["raw_checkpoint"] = "accepted"
        except mc_queue.McqError as exc2:
            report["raw_checkpoint"] = type(exc2).__name__
        try:
            ctx.client.leases.complete_attempt(ctx.attempt_id, ctx.fence, {"stale": True}, worker_id=ctx.worker_id)
            report["raw_complete"] = "accepted"
        except mc_queue.McqError as exc2:
            report["raw_complete"] = type(exc2).__name__
        _write_json(d / f"report-{n}", report)
        raise
    _write_json(d / f"report-{n}", report)
    return {"steps": report["steps_done"], "attempt": n}


@app.handler("checkpoints-scoped", lease_ms=3000)
def checkpoints_scoped(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """basic's "checkpoints", with the scope of Attempt n taken from ``payload["scopes"][n-1]``
    (the last one for later Attempts); Attempt 1 fails with a provider error."""
    scopes = payload["scopes"]
    scope = dict(scopes[min(ctx.attempt.number, len(scopes)) - 1])
    reused = ctx.reusable_checkpoint("source_capture_done", scope=scope)
    ctx.checkpoint("workspace_prepared", {"path": str(ctx.workspace)}, scope=scope)
    if reused is None:
        ctx.checkpoint("source_capture_done", {"files": ["a.py"], "by": ctx.attempt.number}, scope=scope)
    if ctx.attempt.number == 1:
        raise mc_queue.ProviderError("CI provider timed out")
    return {"reused": reused}


@app.handler("checkpoint-order", lease_ms=3000)
def checkpoint_order(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Tries the checkpoints ``payload["steps"]`` ([phase, data] pairs) in order; records each outcome."""
    outcomes = []
    for phase, data in payload["steps"]:
        try:
            ctx.checkpoint(phase, data)
            outcomes.append([phase, "ok"])
        except mc_queue.PhaseOutOfOrder:
            outcomes.append([phase, "PhaseOutOfOrder"])
    return {"outcomes": outcomes}


def touch_marker(*args: Any, **kwargs: Any) -> None:
    """Not a handler: the RQ callback an attacker would name. If it ever runs it leaves a file
    ``$MCQ_HOME/pwned-<job id>`` (the tests check it never appears)."""
    job = args[0] if args else None
    name = getattr(job, "id", "unknown")
    Path(os.environ.get("MCQ_HOME", "/tmp"), f"pwned-{name}").write_text("callback ran")

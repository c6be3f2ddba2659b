"""Handlers for the worker lifecycle, transport and workspace tests (`mcq worker --app tests.apps.lifecycle_app:app`).

Each handler leaves its evidence in files named by its payload (never log text):

- ``sleeps``: writes its pid to ``pidfile``, then sleeps ``seconds`` in small steps (heartbeating);
- ``holds-workspace``: creates its workspace, writes a marker in it and the workspace's path to
  ``report``, waits (heartbeating) until ``gate`` exists, then says whether the marker survived;
- ``slow-effect``: opens a pull request at ``MCQ_TEST_FORGE`` through ``ctx.effect`` with a client
  timeout far longer than its RQ job timeout (2 s): a stalled provider leaves the effect in flight;
- ``only-here``: a handler no other test app registers (on the queue the basic app serves too).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mc_queue import App, Backoff, Context, RetryPolicy
from mc_queue.providers import HttpPullRequests

app = App(name="test-lifecycle", default_queue="jobs",
          retry=RetryPolicy(backoff=Backoff(base_s=0.05, max_s=0.2)), lease_ms=1500, timeout_s=120)


def _forge(timeout: float) -> HttpPullRequests:
    url = os.environ.get("MCQ_TEST_FORGE")
    if not url:
        raise RuntimeError("MCQ_TEST_FORGE is not set (the ForgeServer URL)")
    return HttpPullRequests(url, timeout=timeout)


def reconcile_pr(key: str) -> dict[str, Any] | None:
    prs = _forge(5.0)
    try:
        return prs.find_pr(key)
    finally:
        prs.close()


app.operation("open-pr", reconcile_pr)


def _write(path: str | Path, text: str) -> None:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, p)


@app.handler("sleeps")
def sleeps(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    if payload.get("pidfile"):
        _write(f"{payload['pidfile']}.{ctx.attempt.number}", str(os.getpid()))
    deadline = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < deadline:
        time.sleep(0.05)
        ctx.heartbeat()
    return {"slept": payload["seconds"], "attempt": ctx.attempt.number}


@app.handler("holds-workspace")
def holds_workspace(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    ws = ctx.workspace
    marker = ws / "work-in-progress.txt"
    marker.write_text("mine")
    _write(payload["report"], str(ws))
    deadline = time.monotonic() + float(payload.get("max_wait_s", 20))
    while not Path(payload["gate"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
        ctx.heartbeat()
    return {"intact": marker.exists() and marker.read_text() == "mine", "workspace": str(ws)}


@app.handler("slow-effect", timeout_s=2)
def slow_effect(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    prs = _forge(30.0)  # far longer than the RQ job timeout: the call is still in flight when it fires

    def perform(key: str) -> dict[str, Any]:
        return prs.open_pr(key, repo="example/app", head=payload["head"], base="main", title="fix",
                           fence=ctx.fence)

    try:
        receipt = ctx.effect("open-pr", payload["head"], perform)
    finally:
        prs.close()
    return {"pull_request": receipt["number"], "attempt": ctx.attempt.number}


@app.handler("only-here")
def only_here(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"ran_by": "test-lifecycle", "attempt": ctx.attempt.number}

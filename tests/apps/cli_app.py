"""The App the CLI tests enqueue through (`mcq enqueue HANDLER --app tests.apps.cli_app:app`)."""

from __future__ import annotations

from typing import Any

from mc_queue import App, Backoff, Budget, Context, RetryPolicy

app = App(name="test-cli", default_queue="q")


@app.handler("fix-issue", queue="fixes")
def fix_issue(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"fixed": payload.get("issue")}


@app.handler("h")
def h(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True}


@app.handler("slow-and-careful", queue="careful", lease_ms=20_000, timeout_s=900,
             retry=RetryPolicy(version="careful-v2", backoff=Backoff(base_s=5, max_s=60)),
             budget=Budget(max_attempts=2))
def slow_and_careful(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True}

"""Handlers for the reliability-control tests (issue 19), run by real worker processes
(``mcq worker --app tests.apps.controls_app:app``).

``MCQ_TEST_FORGE``: base URL of a :class:`mc_queue.testing.ForgeServer`, the provider the handlers call
(it counts what reaches it).
"""

from __future__ import annotations

import time
from typing import Any

from mc_queue import App, Backoff, Budget, Context, RetryPolicy
from tests.apps.effects_app import forge, reconcile_pr

app = App(name="test-controls", default_queue="controls",
          retry=RetryPolicy(backoff=Backoff(base_s=0.05, max_s=0.2)), lease_ms=1500, timeout_s=60)


app.operation("open-pr", reconcile_pr)


@app.handler("budgeted", timeout_s=3, budget=Budget(max_attempts=1))
def budgeted(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Works ``sleep_s``, then opens a pull request that may take up to ``needs_s``: refused before it
    starts when less than that is left of the 3 s timeout budget."""
    time.sleep(float(payload.get("sleep_s", 0)))
    left = ctx.remaining_s
    needs = float(payload["needs_s"])
    prs = forge()
    try:
        pr = ctx.effect("open-pr", str(payload["id"]),
                        lambda key: prs.open_pr(key, repo="acme/app", head=f"b-{payload['id']}", base="main",
                                                title="t", fence=ctx.fence, timeout=ctx.time_for("open-pr", needs)),
                        needs_s=needs)
    finally:
        prs.close()
    return {"left_s": left, "deadline_ms": ctx.deadline_ms, "pull_request": pr["number"]}

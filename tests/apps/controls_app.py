"""Handlers for the reliability-control tests (issue 19), run by real worker processes
(``mcq worker --app tests.apps.controls_app:app``).

``MCQ_TEST_FORGE``: base URL of a :class:`mc_queue.testing.ForgeServer`, the provider the handlers call
(it counts what reaches it).
"""

from __future__ import annotations

import os
import time
from typing import Any

from mc_queue import App, Backoff, Budget, Context, RateLimited, RetryPolicy
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


# ------------------------------------------------------------------------------ rate limits

app.limit("api", 3, per_s=1.0)


@app.handler("limited", limits={"api": 1})
def limited(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Calls the provider once (one unit of 'api'): the forge counts what reaches it."""
    prs = forge()
    try:
        pr = ctx.effect("open-pr", str(payload["id"]),
                        lambda key: prs.open_pr(key, repo="acme/app", head=f"l-{payload['id']}", base="main",
                                                title="t", fence=ctx.fence))
    finally:
        prs.close()
    return {"pull_request": pr["number"], "at": ctx.now_ms()}


@app.handler("throttled", limits={"api": 1}, budget=Budget(max_attempts=5))
def throttled(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """The provider answers 429 with Retry-After to the first Attempt: the key is paused fleet-wide."""
    if ctx.attempt.number == 1:
        raise RateLimited("api", "429 from the provider", retry_after=float(payload["retry_after"]))
    return {"attempt": ctx.attempt.number, "at": ctx.now_ms()}


# ------------------------------------------------------------------------------ circuit breakers

app.breaker("forge", failure_rate=0.5, min_calls=3, window_s=10.0, open_s=1.0, probes=1)


@app.handler("needs-forge", needs=["forge"], budget=Budget(max_attempts=30, max_same_fingerprint=30))
def needs_forge(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Opens a pull request through the forge's breaker (ctx.call records each outcome)."""
    prs = forge()
    try:
        pr = ctx.effect("open-pr", str(payload["id"]), lambda key: ctx.call(
            "forge", lambda: prs.open_pr(key, repo="acme/app", head=f"n-{payload['id']}", base="main", title="t",
                                         fence=ctx.fence)))
    finally:
        prs.close()
    return {"pull_request": pr["number"], "probe": ctx.attempt.number}


@app.handler("independent")
def independent(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Needs nothing: runs whatever the breakers do."""
    return {"n": payload.get("n")}


# ------------------------------------------------------------------------------ concurrency keys (bulkheads)

app.concurrency("repo:*", 1)  # a writer lease per repository: waiters line up
app.concurrency("push:*", 1, on_full="supersede")  # the newest push to a branch cancels the one running


@app.handler("write-branch", budget=Budget(max_attempts=5))
def write_branch(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Holds the writer lease of ``payload['key']`` for ``hold_s`` (a cancel stops it: ``ctx.check``), then
    opens a pull request that carries the lease's writer fence (the forge refuses an older writer)."""
    key = str(payload["key"])
    started = ctx.now_ms()
    until = time.monotonic() + float(payload.get("hold_s", 0))
    while time.monotonic() < until:
        ctx.check()
        time.sleep(0.02)
    writer = ctx.attempt.slots[key]
    prs = forge()
    try:
        pr = ctx.effect("open-pr", str(payload["id"]),
                        lambda k: prs.open_pr(k, repo="acme/app", head=f"w-{payload['id']}", base="main",
                                              title="t", fence=ctx.fence, writer=(key, writer)))
    finally:
        prs.close()
    return {"pull_request": pr["number"], "writer": writer, "started": started, "ended": ctx.now_ms()}


# An adapter that cannot be stopped mid-run (a coding agent's run without cancel): a superseding key waits for it.
app.handler("write-branch-uncancelable", budget=Budget(max_attempts=5), can_cancel=False)(write_branch)


# ------------------------------------------------------------------------------ health probes

def _gate_probe() -> bool:
    """The 'gate' dependency is usable while the file MCQ_TEST_GATE names exists."""
    path = os.environ.get("MCQ_TEST_GATE", "")
    if not path or not os.path.exists(path):
        raise ConnectionError(f"gate {path or '(unset)'} is closed")
    return True


app.probe("gate", _gate_probe, every_s=0.2, timeout_s=1.0)


@app.handler("needs-gate", needs=["gate"])
def needs_gate(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Needs the 'gate' dependency: claimed only by a worker whose probe of it passes."""
    return {"n": payload.get("n"), "worker": ctx.worker_id}


# ------------------------------------------------------------------------------ spend ceilings

app.spend_ceiling("tenant:*", cost=1.0, per_s=3.0)  # each tenant spends at most 1.0 in any 3 s


@app.handler("spend", budget=Budget(max_cost=0.25, max_attempts=1))
def spend(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Works a little, then is charged its whole budget (0.25): four such Attempts fill a window."""
    time.sleep(float(payload.get("work_s", 0.1)))
    ctx.charge(cost=0.25, tokens=10)
    return {"n": payload.get("n"), "worker": ctx.worker_id}


# ------------------------------------------------------------------------------ declared fallbacks

app.breaker("model:big", failure_rate=0.5, min_calls=2, window_s=10.0, open_s=30.0, probes=1)
app.fallback("model:big", "model:small", quality="a smaller model: shorter patches, more review",
             cost="a tenth", latency="about the same", autonomy="draft pull requests only",
             params={"model": "small-2026-11"})


@app.handler("ask-model", needs=["model:big"])
def ask_model(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Asks the big model, or, while its breaker is open, the declared fallback (the App names it for this
    handler's tasks): the answer says which model version answered."""
    return ctx.call("model:big", lambda: {"model": "big-2026-10"},
                    fallback=lambda fb: {"model": str(fb.params["model"]), "autonomy": fb.autonomy})


# ------------------------------------------------------------------------------ an optional step

app.optional("model:review", quality="the pull request is opened without an AI review")


@app.handler("open-pr-reviewed", needs=["model:review"])
def open_pr_reviewed(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Asks the review model for a review; while its breaker is open the App's declaration lets the step be
    skipped (no other model stands in): the result says so."""
    review = ctx.call("model:review", lambda: {"review": "looks good"},
                      fallback=lambda fb: {"review": None, "skipped": fb.quality})
    return {"n": payload.get("n"), **review}

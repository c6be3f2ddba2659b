"""Handlers whose side effects go to real providers, for the effect and recovery fault tests.

Run by real worker processes (``mcq worker --app tests.apps.effects_app:app``) and imported by the
test process too (the sweeper reconciles with the operations registered here).

Providers come from the environment, read at call time (the test process switches them per test):

- ``MCQ_TEST_FORGE``: base URL of a :class:`mc_queue.testing.ForgeServer` (HttpPullRequests);
- ``MCQ_TEST_GIT_REMOTE``: path of a bare git repository (GitRemote);
- ``MCQ_TEST_GIT_PUSH_TIMEOUT``: GitRemote's push timeout in seconds (default 30).

Fault points are payload options, so the product code stays as it is:

- ``kill_at`` (on Attempt ``kill_attempt``, default 1): the process running the handler SIGKILLs
  itself at ``before_intent``, ``after_intent`` (intent recorded, provider not called),
  ``after_call`` (provider did it, receipt not recorded), ``after_receipt`` or ``before_complete``
  (the worker recorded ``result_pending`` and is about to complete: the Runtime's
  ``Client.complete_attempt`` (and the worker's ``complete_quietly``) are replaced in this process by one
  that kills it);
- ``kill_at="freeze_before_call"``: the process stops itself (SIGSTOP) after the intent, before the
  provider call (a zombie in the making; the test resumes it); ``late_read`` / ``no_fence`` switch the
  provider fence off, as controls;
- ``pidfile``: ``<pidfile>.<attempt>`` gets the pid of the process running the handler;
- ``gate``: Attempt 1 waits (heartbeating) until this file exists before its effect.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from mc_queue import App, Backoff, CancelRequested, Context, LeaseLost, RetryPolicy
from mc_queue.contracts.codec import digest
from mc_queue.providers import GitRemote, HttpPullRequests
from mc_queue.providers import git as gitmod

app = App(name="test-effects", default_queue="effects",
          retry=RetryPolicy(backoff=Backoff(base_s=0.05, max_s=0.2)), lease_ms=1500, timeout_s=60)

KILL_POINTS = ("before_intent", "after_intent", "after_call", "after_receipt", "before_complete")
FREEZE_POINTS = ("freeze_before_call",)


# --------------------------------------------------------------------------- providers from the environment


def forge(timeout: float = 5.0) -> HttpPullRequests:
    url = os.environ.get("MCQ_TEST_FORGE")
    if not url:
        raise RuntimeError("MCQ_TEST_FORGE is not set (the ForgeServer URL)")
    return HttpPullRequests(url, timeout=timeout)


def remote() -> GitRemote:
    url = os.environ.get("MCQ_TEST_GIT_REMOTE")
    if not url:
        raise RuntimeError("MCQ_TEST_GIT_REMOTE is not set (a bare repository)")
    return GitRemote(url, push_timeout=float(os.environ.get("MCQ_TEST_GIT_PUSH_TIMEOUT", "30")))


def reconcile_pr(key: str) -> dict[str, Any] | None:
    prs = forge()
    try:
        return prs.find_pr(key)
    finally:
        prs.close()


def reconcile_push(key: str) -> dict[str, Any] | None:
    return remote().find(key)


app.operation("open-pr", reconcile_pr)
app.operation("git-push", reconcile_push)


# --------------------------------------------------------------------------- fault helpers


def die() -> None:
    """The process running the handler vanishes (no cleanup, no record)."""
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached


def freeze() -> None:
    """The process running the handler stops itself (SIGSTOP) between its intent and its provider
    call: its heartbeats stop with it, its lease runs out, a replacement does the work. The test
    sends SIGCONT afterwards and counts what reached the provider."""
    os.kill(os.getpid(), signal.SIGSTOP)


def _write_pid(ctx: Context, payload: dict[str, Any]) -> None:
    if payload.get("pidfile"):
        path = Path(f"{payload['pidfile']}.{ctx.attempt.number}")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, path)


def _kill_point(ctx: Context, payload: dict[str, Any]) -> str | None:
    if ctx.attempt.number != int(payload.get("kill_attempt", 1)):
        return None
    point = payload.get("kill_at")
    assert point is None or point in KILL_POINTS + FREEZE_POINTS, point
    return point


def _arm_kill_before_complete(ctx: Context) -> None:
    """Replace this process's completion calls: the worker dies after result_pending, before completing."""
    client = ctx.client

    def complete_attempt(*args: Any, **kwargs: Any) -> Any:
        die()

    client.leases.complete_attempt = complete_attempt  # type: ignore[method-assign]
    client.leases.complete_quietly = complete_attempt  # type: ignore[method-assign]


# --------------------------------------------------------------------------- handlers


@app.handler("open-pr")
def open_pr(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Open one pull request for ``head`` through ctx.effect (key: open-pr:<task>:<head>)."""
    _write_pid(ctx, payload)
    point = _kill_point(ctx, payload)
    if payload.get("gate") and ctx.attempt.number == 1:
        deadline = time.monotonic() + 30
        while not Path(payload["gate"]).exists():
            assert time.monotonic() < deadline, "gate never opened"
            ctx.heartbeat()
            time.sleep(0.02)
    if point == "before_intent":
        die()
    prs = forge(timeout=float(payload.get("http_timeout", 5.0)))

    def perform(key: str) -> dict[str, Any]:
        if point == "after_intent":
            die()
        if point == "freeze_before_call":
            freeze()
        receipt = prs.open_pr(key, repo=payload.get("repo", "example/app"), head=payload["head"], base="main",
                              title=payload.get("title", f"fix {payload['head']}"),
                              fence=None if payload.get("no_fence") else ctx.fence)
        if point == "after_call":
            die()
        return receipt

    receipt = ctx.effect("open-pr", payload["head"], perform)
    if point == "after_receipt":
        die()
    if point == "before_complete":
        _arm_kill_before_complete(ctx)
    return {"pull_request": receipt["number"], "key": receipt["key"], "attempt": ctx.attempt.number}


@app.handler("git-push")
def git_push(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Commit one file and push it to ``branch`` through ctx.effect (key trailer in the commit)."""
    _write_pid(ctx, payload)
    branch, content = payload["branch"], payload["content"]
    git_remote = remote()
    workdir = ctx.workspace / "repo"
    point = _kill_point(ctx, payload)
    expected = git_remote.expected_head(branch)  # read before the intent, recorded with it

    def perform(key: str) -> dict[str, Any]:
        if point == "freeze_before_call":
            freeze()
        git_remote.prepare(workdir, "main")
        # late_read (a control): read the lease value at call time, as before the fix
        lease = git_remote.expected_head(branch) if payload.get("late_read") else expected
        return git_remote.commit_and_push(key, workdir, branch=branch, message=f"fix on {branch}",
                                          files={"fix.txt": content + f"\n(attempt {ctx.attempt.number})"},
                                          expected=lease)

    receipt = ctx.effect("git-push", gitmod.identity(branch, digest(content)[:16]), perform,
                         assume={"remote_head": expected})
    return {"sha": receipt["sha"], "branch": receipt["branch"], "attempt": ctx.attempt.number}


@app.handler("poison")
def poison(ctx: Context, payload: dict[str, Any]) -> None:
    """The process running it dies every time (a poison message)."""
    _write_pid(ctx, payload)
    os._exit(17)


@app.handler("heartbeats", lease_ms=4000)
def heartbeats(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Works in small steps, each behind ctx.heartbeat() (which raises CancelRequested once asked).
    ``seen``: a file that gets what the handler was told when its heartbeat refused to go on."""
    _write_pid(ctx, payload)
    steps = 0
    for _ in range(int(payload.get("steps", 100))):
        time.sleep(float(payload.get("step_s", 0.05)))
        try:
            ctx.heartbeat()
        except (CancelRequested, LeaseLost) as exc:
            if payload.get("seen"):  # what the handler itself was told, for the test to read
                Path(payload["seen"]).write_text(f"{type(exc).__name__} after {steps} steps")
            raise
        steps += 1
    return {"steps": steps}

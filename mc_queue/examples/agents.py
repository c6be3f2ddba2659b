"""An agent-factory style App: each task commits a change to a git remote and opens a pull request.

Configuration comes from the environment (the same for workers and the sweeper):

- ``MCQ_GIT_REMOTE``: the git remote to push to (a URL or a path to a bare repository);
- ``MCQ_FORGE_URL``: the HTTP pull-request API (``mc_queue.providers.http`` protocol);
- ``MCQ_GIT_PUSH_TIMEOUT``, ``MCQ_FORGE_TIMEOUT``: client timeouts in seconds.

Run it with ``mcq worker --app mc_queue.examples.agents:app`` and ``mcq sweeper --app
mc_queue.examples.agents:app`` (``workers/example.py`` re-exports it). ``mcq demo`` runs it. To try it
by hand against local providers: ``eval "$(mcq providers start)"`` exports the first three (a bare git
remote and a pull-request API served in the background until ``mcq providers stop``).
Both side effects go through ``ctx.effect``: a worker killed anywhere, a push or a pull request that
timed out after the provider accepted it, never makes a second commit or a second pull request.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from mc_queue import App, Context
from mc_queue.providers import GitRemote, HttpPullRequests
from mc_queue.providers.git import identity

app = App(name="agents", default_queue="agents")


def git_remote() -> GitRemote:
    return GitRemote(os.environ["MCQ_GIT_REMOTE"], push_timeout=float(os.environ.get("MCQ_GIT_PUSH_TIMEOUT", "30")))


def forge() -> HttpPullRequests:
    return HttpPullRequests(os.environ["MCQ_FORGE_URL"], timeout=float(os.environ.get("MCQ_FORGE_TIMEOUT", "10")))


# How the sweeper asks the providers about an effect whose worker vanished.
app.operation("push", lambda key: git_remote().find(key))
app.operation("open-pr", lambda key: forge().find_pr(key))


@app.handler("fix-issue", lease_ms=10_000, timeout_s=600)
def fix_issue(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    repo, issue, base = payload["repository"], int(payload["issue"]), payload.get("base", "main")
    branch = f"mcq/issue-{issue}-{ctx.work_id.lower()}"  # one branch per piece of work, stable across resends
    change = f"# Issue {issue}\n\n{payload.get('instruction', 'fix it')}\n"
    content_id = hashlib.sha256(change.encode()).hexdigest()[:12]
    scope = {"repository": repo, "base": base, "branch": branch, "generation": 1}
    remote = git_remote()
    workdir = ctx.workspace / "repo"
    remote.prepare(workdir, base)
    ctx.checkpoint("workspace_prepared", {"base": base}, scope=scope)

    # What the push may assume is read before its intent and recorded with it: a worker frozen
    # between the intent and the push resumes with this value, and the remote refuses it once a
    # replacement moved the branch (--force-with-lease is a fence only with a value read this early).
    expected = remote.expected_head(branch)

    # Each provider call gets its own timeout, refused before it starts when the Attempt's timeout budget
    # (the handler's timeout_s, from the claim, on Redis's clock) has less than that left.
    def push(key: str) -> dict[str, Any]:
        return remote.commit_and_push(key, workdir, branch=branch, message=f"Fix issue {issue}",
                                      files={f"fixes/issue-{issue}.md": change}, expected=expected,
                                      timeout=ctx.time_for("push", remote.push_timeout))

    pushed = ctx.effect("push", identity(branch, content_id), push, assume={"remote_head": expected},
                        needs_s=remote.push_timeout)
    ctx.checkpoint("commit_done", {"sha": pushed["sha"]}, scope=scope)
    time.sleep(float(payload.get("think_s", 0)))  # the agent reviews its change before asking for review
    prs = forge()
    try:
        pr = ctx.effect("open-pr", pushed["sha"],
                        lambda key: prs.open_pr(key, repo=repo, head=branch, base=base, title=f"Fix issue {issue}",
                                                fence=ctx.fence, timeout=ctx.time_for("open-pr", prs.timeout)),
                        needs_s=prs.timeout)
    finally:
        prs.close()
    return {"branch": branch, "sha": pushed["sha"], "pull_request": pr["number"], "url": pr["url"]}

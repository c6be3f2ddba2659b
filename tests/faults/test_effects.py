"""Side effects under worker death, against real providers and real `mcq worker` processes.

The handlers (tests/apps/effects_app.py) open pull requests at a real local HTTP forge
(:class:`mc_queue.testing.ForgeServer`, which ignores Idempotency-Key like many real APIs) and push
to a real bare git repository, always through ``ctx.effect``. Workers are subprocesses; the sweeper
runs in the test process with the same App, so it reconciles with the same providers.

Every assertion reads records: the task's Attempts and events, ``client.reads.effects(task)``, the forge's
own count of pull requests per operation key, and the bare repository's refs and history.

This module also holds the harness the other effect fault tests (test_whiteboard, test_cancel,
test_provider_fence) use, built on tests/harness.py's WorkerHarness.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from mc_queue import Sweeper, Task, TaskState
from mc_queue.contracts.errors import TaskNotFound
from mc_queue.contracts.models import AttemptState, FailureClass
from mc_queue.ops.render import print_task
from mc_queue.policy.effects import mint_key
from mc_queue.producer.transport import rq_queue_name
from mc_queue.providers.git import TRAILER, GitError, git
from mc_queue.testing import ForgeServer, RedisServer
from tests.apps import effects_app
from tests.harness import SETTLED, WorkerHarness, events

APP = "tests.apps.effects_app:app"
FINAL = SETTLED


# --------------------------------------------------------------------------- harness (shared)


def timeline(task: Task) -> str:
    """The task rendered as an operator sees it (`mcq show`), for assertion messages."""
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    print_task(task, Console(file=buf, width=200, force_terminal=False))
    return buf.getvalue()


class Harness(WorkerHarness):
    """One test's namespace: a client, an AppClient of the effects app, its sweeper, worker processes."""

    def __init__(self, server: RedisServer, prefix: str, home: Path, env: dict[str, str]) -> None:
        super().__init__(server, prefix, home, env)
        self.app = self.app_client(effects_app.app)
        self.sweeper = Sweeper(self.client, app=effects_app.app)

    def run_worker(self, kind: str = "simple", *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """One burst worker, in the foreground. Its exit code is not asserted: handlers may kill it."""
        return self.run(self.worker_cmd(kind, APP, *extra), timeout)

    def start_worker(self, kind: str = "simple", *extra: str) -> subprocess.Popen[bytes]:
        """A burst worker in the background."""
        return self.spawn(self.worker_cmd(kind, APP, *extra))

    def run_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = self.mcq(*args)
        if check:
            assert out.returncode == 0, f"mcq {' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}"
        return out

    # -- records

    def task(self, task_id: str) -> Task:
        return self.client.reads.get_task(task_id)

    def rq_queue(self, queue: str = "effects") -> Queue:
        return Queue(rq_queue_name(self.prefix, queue), connection=self.rq, serializer=JSONSerializer)

    def queued(self) -> int:
        return int(self.rq.llen(self.rq_queue().key))

    def sweep_until(self, cond: Callable[[Task], Any], task_id: str, timeout: float, what: str) -> Task:
        """Sweeper passes (no worker) until ``cond(task)``; the message carries the timeline."""
        deadline = time.monotonic() + timeout
        while True:
            self.sweeper.run_once()
            task = self.task(task_id)
            if cond(task):
                return task
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}\n{timeline(task)}"
            time.sleep(0.05)

    def drive(self, task_id: str, kind: str = "simple", timeout: float = 40.0,
              until: Callable[[Task], bool] = lambda t: t.state in FINAL) -> Task:
        """Sweeper passes, and a burst worker whenever RQ holds a job, until the task is final."""
        deadline = time.monotonic() + timeout
        while True:
            self.sweeper.run_once()
            task = self.task(task_id)
            if until(task):
                return task
            assert time.monotonic() < deadline, (
                f"task {task_id} not final after {timeout}s (state {task.state.value})\n{timeline(task)}")
            if self.queued():
                self.run_worker(kind)
            else:
                time.sleep(0.05)


@pytest.fixture
def forge(monkeypatch: pytest.MonkeyPatch) -> Iterator[ForgeServer]:
    """A real local pull-request API; the effects app (workers and this process) talks to it."""
    server = ForgeServer().start()
    monkeypatch.setenv("MCQ_TEST_FORGE", server.url)
    yield server
    server.stop()


def make_harness(server: RedisServer, prefix: str, tmp_path: Path, forge: ForgeServer,
                 **env: str) -> Harness:
    return Harness(server, prefix, tmp_path / "home", {"MCQ_TEST_FORGE": forge.url, **env})


@pytest.fixture
def h(redis_server: RedisServer, prefix: str, tmp_path: Path, forge: ForgeServer) -> Iterator[Harness]:
    harness = make_harness(redis_server, prefix, tmp_path, forge)
    yield harness
    harness.close()


def explain(task: Task) -> str:
    return "\n" + timeline(task)


# --------------------------------------------------------------------------- 1. a worker killed at each point


@pytest.mark.parametrize("kind", ["simple", "fork"])
@pytest.mark.parametrize("point", effects_app.KILL_POINTS)
def test_worker_killed_at_each_point_leaves_exactly_one_pull_request(h: Harness, forge: ForgeServer, point: str,
                                                                      kind: str) -> None:
    head = "c0ffee" + point.replace("_", "")[:10]
    task = h.app.enqueue("open-pr", {"head": head, "kill_at": point})
    key = mint_key(task.id, "open-pr", head)

    first = h.run_worker(kind)
    after_kill = h.task(task.id)
    if kind == "simple":
        # The worker process itself died without a word: Attempt 1 still holds its lease as far as the
        # records go, until it runs out and the sweeper reconciles it.
        assert after_kill.attempts[0].state is AttemptState.RUNNING, (first.stderr[-2000:], explain(after_kill))
        assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    else:
        # Its work horse died: the worker saw it at once, voided the lease and reconciled Attempt 1 (no sweeper).
        assert after_kill.attempts[0].settled_by == "reconcile", (first.stderr[-2000:], explain(after_kill))
        assert "died (signal 9)" in events(after_kill, "lease_expired", attempt=1)[0].fields["reason"]

    final = h.drive(task.id, kind)
    why = explain(final)
    assert final.state is TaskState.SUCCEEDED, why
    # Exactly one pull request for the logical operation: no duplicate, none lost.
    assert forge.count_by_key() == {key: 1}, why
    fx = h.client.reads.effects(task.id)
    assert list(fx) == [key], why
    rec = fx[key]
    assert rec.state == "done" and rec.receipt["number"] == forge.pulls[0]["number"], why
    assert final.result["pull_request"] == rec.receipt["number"] and final.result["key"] == key, why

    a1 = final.attempts[0]
    assert len(events(final, "lease_expired", attempt=1)) == 1, why
    assert len(events(final, "attempt_reconciled", attempt=1)) == 1, why

    if point == "before_complete":
        # The result was on file (result_pending) and the effect proven: settled succeeded, no new Attempt.
        assert len(final.attempts) == 1, why
        assert a1.state is AttemptState.SUCCEEDED and a1.settled_by == "reconcile", why
        assert "result_pending" in a1.checkpoints, why
        assert final.result == {"pull_request": 1, "key": key, "attempt": 1}, why
        assert events(final, "attempt_reconciled", attempt=1)[0].fields["outcome"] == "succeeded", why
        assert not events(final, "attempt_created", attempt=2), why
        assert not events(final, "attempt_succeeded"), why  # nobody completed: the reconciler settled it
        assert rec.source == "perform" and rec.receipt_attempt == 1, why
        return

    # Every other point: Attempt 1 settles failed (executor) by reconciliation; Attempt 2 finishes.
    assert a1.state is AttemptState.FAILED and a1.settled_by == "reconcile", why
    assert a1.failure is not None and a1.failure.failure_class is FailureClass.EXECUTOR, why
    assert len(final.attempts) == 2 and final.attempts[1].state is AttemptState.SUCCEEDED, why
    assert final.result["attempt"] == 2, why
    intents = [e.attempt for e in events(final, "effect_intent")]
    if point == "before_intent":
        assert intents == [2], why
        assert rec.source == "perform" and rec.receipt_attempt == 2, why
        assert not events(final, "effect_replayed"), why
    elif point == "after_intent":
        # The provider certainly has nothing: recorded absent, then performed once by Attempt 2.
        absent = events(final, "effect_absent", attempt=1, key=key)
        assert len(absent) == 1 and absent[0].fields["source"] == "reconcile", why
        assert intents == [1, 2], why
        assert rec.source == "perform" and rec.receipt_attempt == 2, why
        assert not events(final, "effect_replayed"), why
    elif point == "after_call":
        # The provider did it, the worker never said so: the reconciler found it by key.
        found = events(final, "effect_receipt", attempt=1, key=key)
        assert len(found) == 1 and found[0].fields["source"] == "reconcile", why
        assert intents == [1], why
        assert rec.source == "reconcile" and rec.receipt_attempt == 1, why
        assert len(events(final, "effect_replayed", attempt=2, key=key)) == 1, why
    elif point == "after_receipt":
        assert intents == [1], why
        assert rec.source == "perform" and rec.receipt_attempt == 1, why
        assert len(events(final, "effect_replayed", attempt=2, key=key)) == 1, why


# --------------------------------------------------------------------------- 2. git: accepted, then timed out


def _git_env_remote(tmp_path: Path, hook_sleep: float) -> tuple[Path, Path]:
    """A bare repo with ``main``, and a post-receive hook that logs every push, then sleeps."""
    bare = tmp_path / "remote.git"
    git("init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    seed = tmp_path / "seed"
    git("init", "--quiet", "--initial-branch=main", str(seed))
    (seed / "README").write_text("seed\n")
    git("add", "README", cwd=seed)
    git("commit", "--quiet", "-m", "seed", cwd=seed)
    git("push", "--quiet", str(bare), "main:refs/heads/main", cwd=seed)
    log = tmp_path / "pushes.log"
    hook = bare / "hooks" / "post-receive"
    hook.write_text(f"#!/bin/sh\ncat >> '{log}'\nsleep {hook_sleep}\n")
    hook.chmod(0o755)
    return bare, log


def test_git_push_accepted_then_timed_out_is_found_and_never_pushed_again(
        redis_server: RedisServer, prefix: str, tmp_path: Path, forge: ForgeServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bare, pushes = _git_env_remote(tmp_path, hook_sleep=4)
    env = {"MCQ_TEST_GIT_REMOTE": str(bare), "MCQ_TEST_GIT_PUSH_TIMEOUT": "1.0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    h = make_harness(redis_server, prefix, tmp_path, forge, **env)
    try:
        branch = "mcq/fix-parser"
        task = h.app.enqueue("git-push", {"branch": branch, "content": "parser fixed\n"})
        final = h.drive(task.id, "simple", timeout=60)
        why = explain(final)
        fx = h.client.reads.effects(task.id)
        assert len(fx) == 1, why
        key, rec = next(iter(fx.items()))
        head = git("rev-parse", f"refs/heads/{branch}", cwd=bare).strip()

        # The push landed once (the remote's own log of received updates), whatever the outcome.
        landed = [line for line in pushes.read_text().splitlines() if line.endswith(f"refs/heads/{branch}")]
        assert len(landed) == 1, (landed, why)
        history = git("log", "--format=%H%x00%B%x01", f"main..refs/heads/{branch}", cwd=bare)
        commits = [c for c in history.split("\x01") if c.strip()]
        assert len(commits) == 1 and f"{TRAILER}: {key}" in commits[0], (commits, why)

        # A resend of that same push (expecting the branch not to exist, as the first push did) is
        # refused by the remote itself: --force-with-lease. Nothing lands.
        clone = tmp_path / "resend"
        git("clone", "--quiet", "--branch", "main", str(bare), str(clone))
        (clone / "fix.txt").write_text("parser fixed\n")
        git("add", "--all", cwd=clone)
        git("commit", "--quiet", "-m", f"fix on {branch}\n\n{TRAILER}: {key}", cwd=clone)
        with pytest.raises(GitError) as refused:
            git("push", "--quiet", f"--force-with-lease=refs/heads/{branch}:", str(bare),
                f"HEAD:refs/heads/{branch}", cwd=clone, timeout=30)
        assert "stale info" in refused.value.stderr, refused.value.stderr
        assert git("rev-parse", f"refs/heads/{branch}", cwd=bare).strip() == head
        assert [line for line in pushes.read_text().splitlines() if line.endswith(f"refs/heads/{branch}")] == landed

        # The worker's push client did time out after the remote accepted ("accepted, then timed out").
        a1 = final.attempts[0]
        assert a1.failure is not None and "timed out" in a1.failure.message, why

        # The push whose client timed out was found at the provider by reconciliation (GitRemote.find,
        # by its key trailer), its receipt recorded, and the task went on without pushing again.
        assert len(events(final, "effect_intent", key=key)) == 1, why  # performed once, never again
        assert rec.state == "done" and rec.source == "reconcile", (
            f"the push landed ({head[:12]}) but its effect is {rec.state!r} (source {rec.source}); "
            f"task {final.state.value}: a push that timed out was never reconciled{why}")
        assert rec.receipt == {"sha": head, "branch": branch, "key": key}, why
        assert final.state is TaskState.SUCCEEDED, why
        assert final.result["sha"] == head, why
    finally:
        h.close()


# --------------------------------------------------------------------------- 3. poison: quarantine, replay, purge


def test_poison_handler_is_quarantined_after_three_deaths_then_replayed_and_purged(h: Harness) -> None:
    a = h.app.enqueue("poison", {"n": "a"})
    b = h.app.enqueue("poison", {"n": "b"})
    for tid in (a.id, b.id):
        # fork: each Attempt runs in a horse that dies; the worker itself survives and takes the next.
        h.drive(tid, "fork", timeout=60)
    for tid in (a.id, b.id):
        t = h.task(tid)
        why = explain(t)
        assert t.state is TaskState.QUARANTINED, why
        assert [x.state for x in t.attempts] == [AttemptState.FAILED] * 3, why
        fps = {x.failure.fingerprint for x in t.attempts if x.failure}
        assert len(fps) == 1 and all(x.settled_by == "reconcile" for x in t.attempts), why
        assert len(events(t, "task_quarantined")) == 1, why
    items = {i["task_id"]: i for i in h.client.reads.attention_items()}
    assert items[a.id]["kind"] == "poison" and items[b.id]["kind"] == "poison", items

    listed = json.loads(h.run_cli("dlq", "list", "--json").stdout)
    assert {r["task_id"] for r in listed} == {a.id, b.id}, listed

    # Replay: a person's decision, with a reason, makes Attempt 4 pending (never a blind repeat).
    reason = "the handler was fixed in release 1.2.3"
    out = h.run_cli("dlq", "replay", a.id, "--reason", reason)
    assert f"{a.id}/4 pending" in out.stdout
    t = h.task(a.id)
    assert t.state is TaskState.PENDING and len(t.attempts) == 4, explain(t)
    assert t.attempts[3].state is AttemptState.PENDING and t.attempts[3].reason == reason, explain(t)
    assert events(t, "dlq_replayed", attempt=4)[0].fields["reason"] == reason
    assert a.id not in {i["task_id"] for i in h.client.reads.attention_items()}
    report = h.sweeper.run_once()
    assert f"{a.id}/4" in report.dispatched, report

    # Purge: gone for good, with a line in the namespace log.
    h.run_cli("dlq", "purge", b.id, "--reason", "the operator read it all", "--yes")
    with pytest.raises(TaskNotFound):
        h.task(b.id)
    assert h.client.reads.effects(b.id) == {}
    purged = [e for e in h.client.reads.namespace_events() if e.get("type") == "task_purged"]
    assert [e["task"] for e in purged] == [b.id] and purged[0]["reason"] == "the operator read it all"
    listed = json.loads(h.run_cli("dlq", "list", "--json").stdout)
    assert listed == [], listed
    # Purge refuses a task that is not quarantined (the replayed one is pending).
    refused = h.run_cli("dlq", "purge", a.id, "--reason", "the operator read it all", "--yes", check=False)
    assert refused.returncode == 1 and h.task(a.id).state is TaskState.PENDING


# --------------------------------------------------------------------------- 4. an effect nobody can tell


def test_effect_whose_reconcile_cannot_tell_blocks_the_task_for_a_person(h: Harness, forge: ForgeServer) -> None:
    head = "deadbeef01"
    task = h.app.enqueue("open-pr", {"head": head, "kill_at": "after_call"})
    key = mint_key(task.id, "open-pr", head)
    h.run_worker("simple")
    assert forge.count_by_key() == {key: 1}
    forge.lookups_unavailable(1000)  # the provider cannot answer "did you do it?"

    final = h.sweep_until(lambda t: t.state in FINAL, task.id, 15, "the suspect Attempt to be settled")
    why = explain(final)
    assert final.state is TaskState.BLOCKED, why
    assert [a.state for a in final.attempts] == [AttemptState.FAILED], why
    fx = h.client.reads.effects(task.id)
    assert fx[key].state == "unknown" and fx[key].source == "reconcile", (fx, why)
    assert len(events(final, "effect_unknown", attempt=1, key=key)) == 1, why
    items = [i for i in h.client.reads.attention_items() if i["task_id"] == task.id]
    assert len(items) == 1 and items[0]["kind"] == "unknown_effect", items
    assert key in json.dumps(items[0]["effects"])

    # Never retried blindly: more passes change nothing, nothing is dispatched, no second PR.
    before = len(final.events)
    for _ in range(5):
        report = h.sweeper.run_once()
        assert not report.dispatched and not report.reconciled, report
        time.sleep(0.05)
    again = h.task(task.id)
    assert again.state is TaskState.BLOCKED and len(again.attempts) == 1 and len(again.events) == before
    assert h.queued() == 0
    assert forge.count_by_key() == {key: 1}


def test_an_effect_still_unknown_at_the_next_attempt_is_explained_as_mc_queue_s_own_stop(
        h: Harness, forge: ForgeServer) -> None:
    """Issue 15: `mcq attention` said "the handler declared this provider failure non-retryable" when
    mc_queue itself raised EffectUnknown (the provider still could not tell at Attempt 2)."""
    head = "deadbeef02"
    task = h.app.enqueue("open-pr", {"head": head, "kill_at": "after_call"})
    key = mint_key(task.id, "open-pr", head)
    h.run_worker("simple")
    forge.lookups_unavailable(1000)
    h.sweep_until(lambda t: t.state in FINAL, task.id, 15, "the suspect Attempt to be settled")
    h.client.operator.retry_task(task.id, "the operator asks Attempt 2 to look again",
                                 "the forge answers lookups again")
    h.sweeper.run_once()  # dispatch Attempt 2
    h.run_worker("simple")
    final = h.sweep_until(lambda t: t.state in FINAL and len(t.attempts) == 2, task.id, 15, "Attempt 2 to stop")
    assert final.state is TaskState.BLOCKED, explain(final)
    f = final.attempts[1].failure
    assert f is not None and f.type == "EffectUnknown", explain(final)
    out = h.mcq("attention", "--json")
    assert out.returncode == 0, out.stderr
    item = next(i for i in json.loads(out.stdout) if i["task_id"] == task.id)
    assert item["kind"] == "effect_unknown", item
    assert "handler declared" not in item["why_unsafe"] and "mc_queue could not find out" in item["why_unsafe"]
    assert forge.count_by_key() == {key: 1}  # never a second pull request

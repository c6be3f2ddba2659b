"""The fence reaches the provider: a worker frozen between its intent and its call cannot land its call.

A real `mcq worker` process records the intent of its effect, then stops itself (SIGSTOP) before
calling the provider. Its lease runs out, the sweeper reconciles (the provider has nothing), a
replacement Attempt in another worker process makes the call, the task succeeds. Then the frozen
worker is resumed: its late call goes through the shipped provider (`GitRemote.commit_and_push`,
`HttpPullRequests.open_pr`) and must be refused by the provider itself. Outcomes are counted at the
provider: the bare repository's history and the forge's pull requests.

Each test has a control that switches the provider fence off (the remote head read at call time; a
forge that ignores `Mcq-Fence`) and shows the duplicate the fence prevents, so the test can fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from mc_queue import TaskState
from mc_queue.contracts.codec import digest
from mc_queue.policy.effects import mint_key
from mc_queue.providers import git as gitmod
from mc_queue.providers.git import TRAILER, git
from mc_queue.testing import ForgeServer, RedisServer, bare_git_remote
from tests.harness import WorkerHarness, proc_state, wait_for

from .test_effects import Harness, explain, make_harness


def _zombie_run(h: Harness, task_id: str, pidfile: Path) -> int:
    """Attempt 1 freezes between intent and call; Attempt 2 finishes in another worker process.
    Returns the frozen worker's pid (still stopped)."""
    h.start_worker("simple")
    pid_path = Path(f"{pidfile}.1")
    wait_for(pid_path.exists, 30, "the first worker to start the handler")
    pid = int(pid_path.read_text())
    wait_for(lambda: proc_state(pid) in ("T", "t"), 30, "the worker to freeze between intent and call")
    h.stopped.add(pid)
    frozen = h.task(task_id)
    assert [e.type for e in frozen.events].count("effect_intent") == 1, explain(frozen)
    final = h.drive(task_id, until=lambda t: t.state is TaskState.SUCCEEDED, timeout=60)
    assert [a.number for a in final.attempts] == [1, 2], explain(final)
    assert final.attempts[0].state.value == "failed", explain(final)
    return pid


def _resume(h: Harness, pid: int) -> None:
    """SIGCONT; the zombie makes its late call, is refused by Redis on its next write, and exits."""
    h.sigcont(pid)
    wait_for(lambda: proc_state(pid) in ("", "Z"), 60, "the resumed worker to finish")
    for p in h.procs:
        p.wait(30)


def _commits_with_key(remote: Path, branch: str, key: str) -> list[str]:
    log = git("log", "--format=%H%x00%B%x01", f"refs/heads/{branch}", cwd=remote)
    return [e.strip().split("\x00")[0] for e in log.split("\x01") if f"{TRAILER}: {key}" in e]


def _reflog_updates(remote: Path, branch: str) -> int:
    """How many times the remote's branch moved (its reflog: every accepted push is a line)."""
    out = git("reflog", "show", "--format=%H", f"refs/heads/{branch}", cwd=remote)
    return len(out.split())


@pytest.mark.parametrize("late_read", [False, True], ids=["fenced", "control-head-read-at-call-time"])
def test_a_zombie_push_is_refused_by_the_remote(redis_server: RedisServer, prefix: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, late_read: bool) -> None:
    remote = bare_git_remote(tmp_path / "git")
    git("config", "core.logAllRefUpdates", "always", cwd=remote)  # a bare repository keeps no reflog otherwise
    monkeypatch.setenv("MCQ_TEST_GIT_REMOTE", str(remote))
    with ForgeServer() as forge:
        monkeypatch.setenv("MCQ_TEST_FORGE", forge.url)
        h = make_harness(redis_server, prefix, tmp_path, forge, MCQ_TEST_GIT_REMOTE=str(remote))
        try:
            branch, content = "fix/zombie", "the fix"
            task = h.app.enqueue("git-push", {"branch": branch, "content": content,
                                              "kill_at": "freeze_before_call", "pidfile": str(tmp_path / "pid"),
                                              "late_read": late_read})
            pid = _zombie_run(h, task.id, tmp_path / "pid")
            key = mint_key(task.id, "git-push", gitmod.identity(branch, digest(content)[:16]))
            receipt = h.client.reads.effects(task.id)[key].receipt
            _resume(h, pid)
            after = h.task(task.id)
        finally:
            h.close()
    tip = git("rev-parse", f"refs/heads/{branch}", cwd=remote).strip()
    commits = _commits_with_key(remote, branch, key)
    refused = [e for e in after.events if e.type == "stale_write_refused" and e.attempt == 1]
    if not late_read:
        # One commit for the key, one update of the branch, the tip is the recorded receipt, and the
        # zombie's next write to Redis was refused too.
        assert commits == [receipt["sha"]] and tip == receipt["sha"], explain(after)
        assert _reflog_updates(remote, branch) == 1
        assert refused, explain(after)
        assert after.state is TaskState.SUCCEEDED and after.result["sha"] == tip
    else:
        # The control: a lease value read at call time is the replacement's commit, and the zombie's
        # force-push lands over it: the branch moved twice and the recorded receipt's commit is no
        # longer on it. This is what the fence above prevents.
        assert _reflog_updates(remote, branch) == 2 and tip != receipt["sha"], (commits, tip, receipt)
        assert receipt["sha"] not in commits


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control-forge-ignores-fence"])
def test_a_zombie_pull_request_is_refused_by_a_fence_checking_forge(redis_server: RedisServer, prefix: str,
                                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    fenced: bool) -> None:
    """No one-PR-per-head rule and no Idempotency-Key dedup at this forge: only the fence stands."""
    with ForgeServer(enforce_fence=fenced, one_pr_per_head=False) as forge:
        monkeypatch.setenv("MCQ_TEST_FORGE", forge.url)
        h = make_harness(redis_server, prefix, tmp_path, forge)
        try:
            task = h.app.enqueue("open-pr", {"head": "feedbeef", "kill_at": "freeze_before_call",
                                              "pidfile": str(tmp_path / "pid")})
            pid = _zombie_run(h, task.id, tmp_path / "pid")
            key = mint_key(task.id, "open-pr", "feedbeef")
            assert forge.count_by_key() == {key: 1}
            _resume(h, pid)
            after = h.task(task.id)
            counts, fenced_out = forge.count_by_key(), forge.fenced_out
        finally:
            h.close()
    if fenced:
        assert counts == {key: 1} and fenced_out == 1, (counts, explain(after))
        assert after.state is TaskState.SUCCEEDED and after.result["pull_request"] == 1
    else:
        assert counts == {key: 2}, "the control: without the fence the zombie's late call makes a second PR"


@pytest.mark.parametrize("operation", ["open-pr", "git-push"])
def test_a_resend_after_a_loss_finds_the_first_tasks_effects(redis_server: RedisServer, prefix: str,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            operation: str) -> None:
    """The first task's effect is made; Redis then loses the task (its keys and its producer key) and
    the producer re-sends with the same idempotency key: the new task's effect key is the first's, the
    provider is asked before the call, and the first effect's receipt is taken. Counted at the
    provider; neither provider here deduplicates by key on its own."""
    remote = bare_git_remote(tmp_path / "git")
    monkeypatch.setenv("MCQ_TEST_GIT_REMOTE", str(remote))
    with ForgeServer() as forge:
        monkeypatch.setenv("MCQ_TEST_FORGE", forge.url)
        h = make_harness(redis_server, prefix, tmp_path, forge, MCQ_TEST_GIT_REMOTE=str(remote))
        payload = {"head": "cafe01"} if operation == "open-pr" else {"branch": "fix/resent", "content": "x"}
        try:
            first = h.app.enqueue(operation, payload, idempotency_key="issue-7")
            done = h.drive(first.id)
            assert done.state is TaskState.SUCCEEDED, explain(done)
            for k in h.client.redis.scan_iter(match=f"{h.client.keys.task(first.id).task}*"):
                h.client.redis.delete(k)
            h.client.redis.hdel(h.client.keys.idem, "issue-7")
            again = h.app.enqueue(operation, payload, idempotency_key="issue-7")
            assert again.id != first.id
            redone = h.drive(again.id)
        finally:
            h.close()
    assert redone.state is TaskState.SUCCEEDED, explain(redone)
    assert redone.result == done.result, "the re-sent task took another receipt"
    if operation == "open-pr":
        assert len(forge.pulls) == 1, "the re-sent task made a second pull request"
    else:
        assert len(git("rev-list", "refs/heads/fix/resent", "^refs/heads/main", cwd=remote).split()) == 1
    events = [e for e in redone.events if e.type == "effect_receipt"]
    assert len(events) == 1 and events[0].fields.get("source") == "reconcile", explain(redone)


@pytest.mark.parametrize("operation", ["push", "open-pr"])
def test_the_example_app_survives_a_zombie_between_intent_and_call(redis_server: RedisServer, prefix: str,
                                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   operation: str) -> None:
    """What ships, end to end: the example app (mc_queue/examples/agents.py) in a real `mcq worker`,
    frozen by the fail point ``effect.before_call`` on one operation; the sweeper reconciles, a
    replacement worker finishes the task, the zombie resumes and makes its call. The forge checks
    fences and has no one-PR-per-head rule, so the fence alone has to hold. Counted at the providers:
    one commit per push key on the remote, one pull request per key, the branch tip is the receipt."""
    import mc_queue
    from mc_queue.contracts import failpoints
    from mc_queue.examples import agents
    from mc_queue.ops.sweeper import Sweeper

    remote = bare_git_remote(tmp_path / "git")
    points = tmp_path / "failpoints"
    points.mkdir()
    with ForgeServer(enforce_fence=True, one_pr_per_head=False) as forge:
        env = {"MCQ_GIT_REMOTE": str(remote), "MCQ_FORGE_URL": forge.url, "MCQ_FAILPOINTS_DIR": str(points),
               "MCQ_FORGE_TIMEOUT": "5"}
        for k in ("MCQ_GIT_REMOTE", "MCQ_FORGE_URL"):
            monkeypatch.setenv(k, env[k])
        w = WorkerHarness(redis_server, prefix, tmp_path / "home", env)  # teardown SIGKILLs the zombie if left
        producer = w.app_client(agents.app)
        client: mc_queue.Client = producer.client
        sweeper = Sweeper(client, app=agents.app)

        def worker() -> subprocess.Popen[bytes]:
            return w.spawn(w.worker_cmd("simple", "mc_queue.examples.agents:app"))

        failpoints.arm(points, "effect.before_call", operation=operation)
        task = producer.enqueue("fix-issue", {"repository": "example/app", "issue": 7, "instruction": "fix 7"})
        zombie = worker()
        try:
            record = wait_for(lambda: failpoints.fired(points), 60, "the worker to reach the fail point")[0]
            wait_for(lambda: proc_state(record["pid"]) in ("T", "t"), 10, "the worker to freeze")
            assert record["attempt"] == task.attempts[0].id

            def settle() -> bool:
                sweeper.run_once()
                current = client.reads.get_task(task.id)
                if current.state is TaskState.SUCCEEDED:
                    return True
                if client.redis.llen(f"rq:queue:mcq:{prefix}:agents"):
                    worker().wait(120)
                return False

            wait_for(settle, 90, "a replacement to finish the task", interval=0.3)
            done = client.reads.get_task(task.id)
            os.killpg(zombie.pid, signal.SIGCONT)
            zombie.wait(60)
            after = client.reads.get_task(task.id)
        finally:
            w.close()
    assert [a.number for a in done.attempts] == [1, 2], explain(done)
    assert after.state is TaskState.SUCCEEDED and after.result == done.result, explain(after)
    branch = done.result["branch"]
    log = git("log", "--all", "--format=%B", cwd=remote)
    push_keys = [line.split(":", 1)[1].strip() for line in log.splitlines() if line.startswith(f"{TRAILER}:")]
    assert len(push_keys) == len(set(push_keys)) == 1, push_keys
    assert git("rev-parse", f"refs/heads/{branch}", cwd=remote).strip() == done.result["sha"]
    assert forge.count_by_key() == {k: 1 for k in forge.count_by_key()} and len(forge.pulls) == 1
    if operation == "open-pr":
        assert forge.fenced_out == 1, "the zombie's late pull request reached the forge and was refused there"


def test_the_git_remote_refuses_an_older_writer_of_a_key_and_moves_nothing(tmp_path: Path) -> None:
    """A concurrency key's writer fence rides the push (``writer=``): the remote keeps the highest it accepted
    in ``refs/mcq/writers/<key>`` and an older writer's push is refused before anything moves (the branch and
    the writer ref push atomically). Both sides: the same and a newer fence push; an older one is refused."""
    remote = bare_git_remote(tmp_path / "git")
    provider = gitmod.GitRemote(str(remote))
    wkey = "repo:acme.web"

    def push(n: int, fence: int | None, branch: str = "fix/w") -> dict[str, object]:
        work = tmp_path / f"w{n}"
        provider.prepare(work, "main")
        return provider.commit_and_push(f"k:{n}", work, branch=branch, message=f"change {n}",
                                        files={"f.txt": f"v{n}"}, expected=provider.expected_head(branch),
                                        writer=None if fence is None else (wkey, fence))

    assert provider.writer_fence(wkey) == ("", 0)
    first = push(1, 5)
    assert first["writer"] == [wkey, 5] and provider.writer_fence(wkey)[1] == 5
    push(2, 5)  # the same writer again (its next push)
    newer = push(3, 7)
    assert provider.writer_fence(wkey)[1] == 7
    refs_before = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=remote)
    with pytest.raises(gitmod.StaleWriter, match="fence 6 refused: the remote accepted fence 7"):
        push(4, 6)  # a superseded writer, late: refused, nothing moved
    assert git("for-each-ref", "--format=%(refname) %(objectname)", cwd=remote) == refs_before
    assert git("rev-parse", "refs/heads/fix/w", cwd=remote).strip() == newer["sha"]
    assert gitmod.writer_ref(wkey) == "refs/mcq/writers/repo%3Aacme%2Eweb"
    # a push without a writer fence is unchanged (no writer ref involved)
    other = push(5, None, branch="fix/other")
    assert "writer" not in other and provider.writer_fence(wkey)[1] == 7


def test_of_two_concurrent_writers_with_the_same_view_one_lands_and_the_other_is_refused(tmp_path: Path) -> None:
    """Both read the writer ref before either pushed: the writer ref's own lease lets one push through; the
    other is refused by the remote (it reads again and finds the newer fence, or pushes after it)."""
    remote = bare_git_remote(tmp_path / "git")
    provider = gitmod.GitRemote(str(remote))
    wkey = "repo:race"
    works = []
    for n in (1, 2):
        work = tmp_path / f"w{n}"
        provider.prepare(work, "main")
        works.append(work)
    real = provider.writer_fence
    seen = real(wkey)  # both see "no writer yet"
    provider.writer_fence = lambda k: seen  # type: ignore[method-assign]
    provider.commit_and_push("k:1", works[0], branch="b1", message="one", files={"a": "1"}, expected="",
                             writer=(wkey, 3))
    with pytest.raises(gitmod.GitError):  # its lease on the writer ref (still 'absent') fails: nothing moves
        provider.commit_and_push("k:2", works[1], branch="b2", message="two", files={"a": "2"}, expected="",
                                 writer=(wkey, 4))
    provider.writer_fence = real  # type: ignore[method-assign]
    assert real(wkey)[1] == 3 and provider.remote_head("b2") is None

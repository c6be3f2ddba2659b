"""The RQ worker layer against the session's real redis-server, with real `mcq worker` processes.

RQ carries Attempts; mc_queue's scripts decide. Every assertion reads mc_queue's records (tasks,
Attempts, task events, the namespace stream, attention items), never log text. Workers are
subprocesses (`python -m mc_queue ... worker --app tests.apps.basic:app --burst --kind ...`) with a
private MCQ_HOME; the sweeper runs in the test process, one `run_once()` at a time.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from rq import Callback
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

import mc_queue
from mc_queue import Context, LeaseLost, Sweeper, Task, TaskState
from mc_queue.contracts.config import RetryPolicy
from mc_queue.contracts.keys import new_ulid
from mc_queue.contracts.models import AttemptState, FailureClass
from mc_queue.ops.sweeper import SweepReport
from mc_queue.producer.transport import ENTRY, job_id, rq_queue_name
from mc_queue.testing import RedisServer
from mc_queue.worker.workspace import WorkspaceError, WorkspaceRoot
from tests.apps import basic
from tests.harness import BASIC, FAULTY, Harness, events, harness_fixture, redis_ms, wait_for

h = harness_fixture(Harness)


# --------------------------------------------------------------------------- 1. retries with backoff


def test_flaky_capacity_retries_with_jittered_backoff_and_attempts_stay_immutable(h: Harness) -> None:
    spec = basic.app.spec("flaky-capacity")
    backoff = spec.retry.backoff
    task = h.basic.enqueue("flaky-capacity", {"fail_times": 2})
    assert RetryPolicy.model_validate_json(task.retry_policy or "") == spec.retry  # frozen at enqueue

    snapshots: dict[int, tuple[dict[str, Any], dict[str, str]]] = {}

    def observe(t: Task) -> None:
        for a in t.attempts:
            if not a.terminal:
                continue
            now = (a.model_dump(), h.raw_attempt(t.id, a.number))
            if a.number in snapshots:
                assert now == snapshots[a.number], f"attempt {a.number} changed after it was terminal"
            else:
                snapshots[a.number] = now

    final = h.drive(task.id, "fork", until=lambda t: t.state is TaskState.SUCCEEDED, observe=observe)
    assert [a.state for a in final.attempts] == [AttemptState.FAILED, AttemptState.FAILED, AttemptState.SUCCEEDED]
    assert final.result == {"ok": True, "attempt": 3}
    first = final.attempts[0]
    assert first.previous is None and first.reason == "first dispatch"
    for a in final.attempts[:2]:
        assert a.failure is not None and a.failure.failure_class is FailureClass.CAPACITY
    assert final.attempts[0].failure.fingerprint == final.attempts[1].failure.fingerprint  # type: ignore[union-attr]

    created = {int(e.attempt or 0): e for e in events(final, "attempt_created")}
    for a in final.attempts[1:]:
        prev = final.attempts[a.number - 2]
        assert a.previous == prev.id
        assert a.reason and "capacity" in a.reason and f"attempt {prev.number}" in a.reason
        assert a.created_at is not None and a.due_at is not None and a.started_at is not None
        assert a.created_at == prev.ended_at  # decided in the same step as the failure
        delay = (a.due_at - a.created_at).total_seconds()
        # Full jitter: 0 <= delay <= Backoff.upper_bound(failures so far).
        assert 0.0 <= delay <= backoff.upper_bound(prev.number), (a.number, delay)
        assert int(created[a.number].fields["delay_ms"]) == round(delay * 1000)
        assert created[a.number].fields["retry_of"] == str(prev.number)
        assert a.started_at >= a.due_at, "an Attempt was claimed before its backoff was over"
    assert [e.fields["decision"] for e in events(final, "attempt_failed")] == ["retry", "retry"]
    assert [int(e.attempt or 0) for e in events(final, "attempt_claimed")] == [1, 2, 3]
    assert len(events(final, "attempt_succeeded")) == 1
    assert events(final, "claim_refused") == []

    # Once terminal, never changed again: more sweeps and workers of both kinds.
    assert sorted(snapshots) == [1, 2, 3]
    h.more_sweeps_and_workers()
    after = h.task(task.id)
    observe(after)
    assert len(after.attempts) == 3 and after.state is TaskState.SUCCEEDED
    assert [e.type for e in after.events] == [e.type for e in final.events]


# --------------------------------------------------------------------------- 2. stop, attention, quarantine


def _attention(h: Harness, task_id: str) -> list[dict[str, Any]]:
    return [i for i in h.client.reads.attention_items() if i["task_id"] == task_id]


def test_authorization_failure_is_never_retried_and_asks_for_attention(h: Harness) -> None:
    task = h.basic.enqueue("auth-fails", {})
    final = h.drive(task.id, "fork")
    h.more_sweeps_and_workers()
    final = h.task(task.id)
    assert final.state is TaskState.BLOCKED
    assert len(final.attempts) == 1
    a = final.attempts[0]
    assert a.state is AttemptState.FAILED and a.failure is not None
    assert a.failure.failure_class is FailureClass.AUTHORIZATION
    assert [e.fields["decision"] for e in events(final, "attempt_failed")] == ["stop"]
    assert len(events(final, "attempt_created")) == 1 and len(events(final, "attempt_claimed")) == 1
    assert len(events(final, "attention_raised")) == 1
    assert h.client.redis.zscore(h.client.keys.outbox, f"{task.id}/2") is None

    items = _attention(h, task.id)
    assert len(items) == 1
    item = items[0]
    assert item["kind"] == "authorization" and item["failure_class"] == "authorization"
    assert [(r["attempt"], r["failure_class"]) for r in item["tried"]] == [(1, "authorization")]
    assert item["why_unsafe"] and item["fingerprint"] == a.failure.fingerprint

    out = h.mcq("attention", "--json")
    assert out.returncode == 0, out.stderr
    listed = [i for i in json.loads(out.stdout) if i["task_id"] == task.id]
    assert listed == [item]


def test_validation_failure_twice_with_same_fingerprint_stops_after_two_attempts(h: Harness) -> None:
    task = h.basic.enqueue("validation-fails", {})
    h.drive(task.id, "simple")
    h.more_sweeps_and_workers()
    final = h.task(task.id)
    assert final.state is TaskState.BLOCKED
    assert [a.state for a in final.attempts] == [AttemptState.FAILED, AttemptState.FAILED]
    f1, f2 = (a.failure for a in final.attempts)
    assert f1 is not None and f2 is not None
    assert f1.failure_class is f2.failure_class is FailureClass.VALIDATION
    assert f1.fingerprint == f2.fingerprint
    second = final.attempts[1]
    # Retried once, and only with the handler's changed hypothesis, never blindly.
    assert second.previous == final.attempts[0].id
    assert second.hypothesis == "pin the parser dependency (try 1)"
    assert second.reason and "validation" in second.reason
    assert [e.fields["decision"] for e in events(final, "attempt_failed")] == ["retry", "stop"]
    assert len(events(final, "attempt_claimed")) == 2

    items = _attention(h, task.id)
    assert len(items) == 1
    item = items[0]
    assert item["kind"] == "validation" and item["fingerprint"] == f1.fingerprint
    assert [(r["attempt"], r["fingerprint"]) for r in item["tried"]] == [(1, f1.fingerprint), (2, f1.fingerprint)]
    assert item["why_unsafe"] and item["changed"]


def test_internal_failure_quarantines_the_task(h: Harness) -> None:
    task = h.basic.enqueue("crashes", {})
    h.drive(task.id, "fork")
    h.more_sweeps_and_workers()
    final = h.task(task.id)
    assert final.state is TaskState.QUARANTINED
    assert len(final.attempts) == 1
    f = final.attempts[0].failure
    assert f is not None and f.failure_class is FailureClass.INTERNAL and f.type == "KeyError"
    assert h.client.redis.zscore(h.client.keys.dlq, task.id) is not None
    assert len(events(final, "task_quarantined")) == 1
    items = _attention(h, task.id)
    assert len(items) == 1 and items[0]["kind"] == "quarantined" and items[0]["why_unsafe"]


# --------------------------------------------------------------------------- 4. long handler keeps its lease


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_handler_running_for_several_lease_lengths_keeps_its_lease(h: Harness, kind: str) -> None:
    spec = basic.app.spec("long")
    seconds = 6
    assert seconds * 1000 >= 4 * spec.lease_ms  # the handler never yields for four lease lengths
    task = h.basic.enqueue("long", {"seconds": seconds})

    stop = threading.Event()
    reports: list[SweepReport] = []
    crashes: list[BaseException] = []
    sweeper_client = mc_queue.connect(h.server.url, prefix=h.prefix)

    def sweep_loop() -> None:
        sw = Sweeper(sweeper_client, actor="concurrent-sweeper")
        try:
            while not stop.is_set():
                reports.append(sw.run_once())
                stop.wait(0.3)
        except BaseException as exc:  # reported below, not lost in the thread
            crashes.append(exc)

    t = threading.Thread(target=sweep_loop, daemon=True)
    t.start()
    try:
        h.run_worker(kind, timeout=60)
    finally:
        stop.set()
        t.join(10)
        sweeper_client.close()
    assert not crashes, crashes
    assert len(reports) >= 10, f"the concurrent sweeper ran only {len(reports)} passes"
    assert not any(r.expired or r.reconciled or r.errors for r in reports), [r.as_dict() for r in reports]

    final = h.task(task.id)
    assert final.state is TaskState.SUCCEEDED and final.result == {"slept": seconds}
    assert len(final.attempts) == 1
    a = final.attempts[0]
    assert a.lease_ms == spec.lease_ms
    assert a.elapsed_ms is not None and a.elapsed_ms >= seconds * 1000 > 3 * spec.lease_ms
    for typ in ("lease_expired", "stale_write_refused", "claim_refused", "attempt_reconciled"):
        assert events(final, typ) == [], typ
    assert len(events(final, "attempt_claimed")) == 1 and len(events(final, "attempt_succeeded")) == 1


# --------------------------------------------------------------------------- 7. foreign RQ jobs


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_foreign_rq_job_is_refused_never_imported(h: Harness, kind: str) -> None:
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    try:
        foreign = h.rq_queue().enqueue_call(func="os.system", args=(f"touch {marker}",),
                                            on_failure=Callback("tests.apps.faulty.touch_marker"),
                                            on_success=Callback("tests.apps.faulty.touch_marker"))
        legit = h.basic.enqueue("noop", {})  # queued behind the foreign job: the worker keeps serving
        h.run_worker(kind)
        assert not marker.exists(), "a foreign RQ job ran os.system"
    finally:
        marker.unlink(missing_ok=True)
    assert list(h.home.glob("pwned-*")) == [], "a callback named by a foreign job ran"
    assert h.task(legit.id).state is TaskState.SUCCEEDED
    refused = [e for e in h.client.reads.refusals() if e["type"] == "transport_job_refused"]
    assert [(e["job_id"], e["func_name"]) for e in refused] == [(foreign.id, "os.system")], (
        "the refusal of a foreign job must be recorded in the namespace stream")


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_transport_messages_a_worker_must_not_act_on_are_refused_and_recorded(h: Harness, kind: str) -> None:
    """A pickled job RQ cannot decode as JSON, an entry-function job for another namespace, one with a
    malformed attempt id (a trailing newline), and one with the wrong arguments: none runs, each is
    recorded in the namespace log, and the worker goes on serving."""
    import pickle

    legit_task = h.enqueue_undispatched(h.basic, "noop", {"i": 1})
    aid = legit_task.attempts[0].id
    q = h.rq_queue()
    pickled = q.enqueue_call(func=ENTRY, args=(h.prefix, aid, 3000), job_id="mcq-pickled-1")
    h.rq.hset(f"rq:job:{pickled.id}", "data", pickle.dumps(("os.system", None, ("true",), {})))
    foreign = q.enqueue_call(func=ENTRY, args=("another-namespace", aid, 3000), job_id="mcq-foreign-prefix")
    newline = q.enqueue_call(func=ENTRY, args=(h.prefix, aid + "\n", 3000), job_id="mcq-newline-id")
    arity = q.enqueue_call(func=ENTRY, args=(h.prefix,), job_id="mcq-wrong-args")
    legit = h.basic.enqueue("noop", {"i": 2})
    h.run_worker(kind)
    assert h.task(legit.id).state is TaskState.SUCCEEDED
    assert h.task(legit_task.id).state is TaskState.PENDING  # no message ran it
    refused = [e for e in h.client.reads.refusals() if e["type"] == "transport_job_refused"]
    by_job = {e["job_id"]: e["reason"] for e in refused}
    assert "cannot be decoded" in by_job.get(pickled.id, ""), [dict(e) for e in refused]
    assert "another-namespace" in by_job[foreign.id], refused
    assert "invalid attempt id" in by_job[newline.id], refused
    assert "arguments" in by_job[arity.id], refused
    assert len(refused) == 4, refused
    assert {e["attempt"] for e in refused if e["job_id"] == foreign.id} == {aid}


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_callbacks_named_by_a_job_are_never_run(h: Harness, kind: str) -> None:
    """A job that does name mc_queue's entry, with success callbacks naming os.system or a function
    that would leave a file: refused before it runs (mc_queue never sets a callback), the task
    untouched; neither callback runs. A proper message then runs the Attempt once."""
    tasks = {}
    for cb in ("os.system", "tests.apps.faulty.touch_marker"):
        task = h.enqueue_undispatched(h.basic, "noop", {"cb": cb})
        aid = task.attempts[0].id
        h.rq_queue().enqueue_call(func=ENTRY, args=(h.prefix, aid, 3000), job_id=job_id(h.prefix, aid),
                                  result_ttl=0, failure_ttl=3600, on_success=Callback(cb))
        tasks[cb] = task
    h.run_worker(kind)
    for task in tasks.values():
        after = h.task(task.id)
        assert after.state is TaskState.PENDING and events(after, "attempt_claimed") == []
    assert list(h.home.glob("pwned-*")) == [], "a success callback named in Redis ran"
    refused = [e for e in h.client.reads.refusals() if e["type"] == "transport_job_refused"]
    assert sorted(e["attempt"] for e in refused) == sorted(t.attempts[0].id for t in tasks.values())
    assert all("success_callback_name" in e["reason"] for e in refused), refused
    for task in tasks.values():
        h.basic.dispatch(task, task.attempts[0])
    h.run_worker(kind)
    for task in tasks.values():
        final = h.task(task.id)
        assert final.state is TaskState.SUCCEEDED and len(final.attempts) == 1
    assert list(h.home.glob("pwned-*")) == []
    failed = FailedJobRegistry(rq_queue_name(h.prefix, "jobs"), connection=h.rq, serializer=JSONSerializer)
    assert failed.get_job_ids() == []


# --------------------------------------------------------------------------- 8. workspaces and checkpoints


def test_cleanup_stale_removes_stale_refuses_symlinks_keeps_named(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ws = WorkspaceRoot(root, namespace="ns-one")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "precious.txt").write_text("keep me")
    (outside / "deep" / "also.txt").write_text("keep me too")

    stale = root / ws.name_for(f"q:{new_ulid()}/1")
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "f.txt").write_text("x")
    (stale / "link-out").symlink_to(outside, target_is_directory=True)  # a link inside a stale workspace
    link = root / ws.name_for(f"q:{new_ulid()}/2")
    link.symlink_to(outside, target_is_directory=True)
    kept = root / ws.name_for(f"q:{new_ulid()}/3")
    kept.mkdir()
    (kept / "f.txt").write_text("live")
    odd = root / "task-not-a-workspace"
    odd.mkdir()
    other = root / "cache"
    other.mkdir()

    report = ws.cleanup_stale(keep={kept.name})

    assert report.removed == [stale.name]
    assert not stale.exists() and not stale.is_symlink()
    assert sorted(name for name, _ in report.refused) == sorted([link.name, odd.name])
    assert link.is_symlink(), "the task-* symlink itself must not be deleted"
    assert (outside / "precious.txt").read_text() == "keep me"
    assert (outside / "deep" / "also.txt").read_text() == "keep me too"
    assert sorted(p.name for p in outside.iterdir()) == ["deep", "precious.txt"]
    assert (kept / "f.txt").read_text() == "live"
    assert odd.is_dir() and other.is_dir()
    with pytest.raises(WorkspaceError):
        ws.remove(link)
    assert (outside / "precious.txt").exists()

    # The same root again with nothing kept: the kept one goes now, the symlink is still refused.
    again = ws.cleanup_stale()
    assert again.removed == [kept.name]
    assert link.name in dict(again.refused) and (outside / "precious.txt").exists()


def test_worker_cleans_stale_workspaces_before_polling_but_keeps_a_live_leases(h: Harness) -> None:
    root = h.home / "wsroot"
    ws = WorkspaceRoot(root, namespace=h.prefix,
                       epoch=h.client.backend.open_namespace().epoch)  # as the worker names them
    stale = root / ws.name_for(f"jobs:{new_ulid()}/1")
    stale.mkdir()
    (stale / "left-by-a-crash.txt").write_text("x")

    task = h.enqueue_undispatched(h.basic, "noop", {})
    lease = h.client.leases.claim_attempt(task.id, "holder-elsewhere", lease_ms=1500, expect_attempt=1)
    live = root / ws.name_for(lease.attempt_id)
    live.mkdir()
    (live / "work.txt").write_text("in progress")

    h.run_worker("fork", BASIC, "--workspace-root", str(root))  # the queue is empty: cleanup alone
    assert not stale.exists(), "a stale workspace survived a worker start"
    assert (live / "work.txt").read_text() == "in progress", "a workspace with a live lease was removed"

    # The other side: once the lease expired and the sweeper made the Attempt suspect, it is stale.
    wait_for(lambda: redis_ms(h.client.redis) > lease.expires_at_ms, 5, "the lease to pass")
    report = h.sweeper.run_once()
    assert report.expired == [lease.attempt_id]
    h.run_worker("simple", BASIC, "--workspace-root", str(root))
    assert not live.exists(), "the workspace of an expired lease survived a worker start"


CKPT_SCOPE = {"repository": "example/app", "base": "abc123", "branch": "main", "generation": 1}


@pytest.mark.parametrize("app,handler,payload,reused", [
    pytest.param(BASIC, "checkpoints", {"repo": "example/app", "base": "abc123", "fail_first": True}, True,
                 id="basic-identical-scope"),
    pytest.param(FAULTY, "checkpoints-scoped", {"scopes": [CKPT_SCOPE, CKPT_SCOPE]}, True, id="identical-scope"),
    pytest.param(FAULTY, "checkpoints-scoped", {"scopes": [CKPT_SCOPE, {**CKPT_SCOPE, "base": "def456"}]}, False,
                 id="different-base"),
    pytest.param(FAULTY, "checkpoints-scoped",
                 {"scopes": [CKPT_SCOPE, {**CKPT_SCOPE, "repository": "example/fork"}]}, False,
                 id="different-repository"),
])
def test_checkpoint_reused_by_the_next_attempt_only_with_identical_scope(
        h: Harness, app: str, handler: str, payload: dict[str, Any], reused: bool) -> None:
    app_client = h.basic if app == BASIC else h.faulty
    task = app_client.enqueue(handler, payload)
    final = h.drive(task.id, "simple", app, until=lambda t: t.state is TaskState.SUCCEEDED)
    assert [a.state for a in final.attempts] == [AttemptState.FAILED, AttemptState.SUCCEEDED]
    first, second = final.attempts
    assert first.failure is not None and first.failure.failure_class is FailureClass.PROVIDER
    assert set(first.checkpoints) == {"workspace_prepared", "source_capture_done"}
    captured = first.checkpoints["source_capture_done"]
    assert captured["data"] == {"files": ["a.py"], "by": 1}
    assert second.previous == first.id
    if reused:
        assert final.result is not None and final.result["reused"] == {"files": ["a.py"], "by": 1}
        assert set(second.checkpoints) == {"workspace_prepared"}
        assert second.checkpoints["workspace_prepared"]["scope_digest"] == captured["scope_digest"]
    else:
        assert final.result is not None and final.result["reused"] is None
        own = second.checkpoints["source_capture_done"]
        assert own["data"] == {"files": ["a.py"], "by": 2}
        assert own["scope_digest"] != captured["scope_digest"]
    # Attempt 1's checkpoint is read, never rewritten, by Attempt 2.
    assert h.task(task.id).attempts[0] == first


def test_checkpoint_for_an_earlier_phase_is_refused(h: Harness) -> None:
    steps = [["workspace_prepared", 1], ["source_capture_done", 2], ["workspace_prepared", 3],
             ["source_capture_done", 99], ["source_capture_done", 2], ["commit_done", 4]]
    task = h.faulty.enqueue("checkpoint-order", {"steps": steps})
    final = h.drive(task.id, "simple", FAULTY)
    assert final.state is TaskState.SUCCEEDED, final.attempts[0].failure
    assert final.result == {"outcomes": [
        ["workspace_prepared", "ok"], ["source_capture_done", "ok"],
        ["workspace_prepared", "PhaseOutOfOrder"],  # before the last phase
        ["source_capture_done", "PhaseOutOfOrder"],  # the last phase again, with other data
        ["source_capture_done", "ok"],  # the same record again: an idempotent replay
        ["commit_done", "ok"]]}
    a = final.attempts[0]
    assert a.phase == "commit_done"
    assert a.checkpoints["workspace_prepared"]["data"] == 1
    assert a.checkpoints["source_capture_done"]["data"] == 2
    assert [e.fields["phase"] for e in events(final, "checkpoint_recorded")] == [
        "workspace_prepared", "source_capture_done", "commit_done"]
    refused = events(final, "checkpoint_refused")
    assert [(e.fields["phase"], e.fields["last_phase"]) for e in refused] == [
        ("workspace_prepared", "source_capture_done"), ("source_capture_done", "source_capture_done")]


def test_a_phase_name_of_the_handler_s_own_is_recorded_not_quarantined(h: Harness) -> None:
    """Issue 15: a handler that declares no phases names them freely, in the order it reaches them."""
    task = h.basic.enqueue("own-phases", {})
    final = h.drive(task.id, "simple")
    assert final.state is TaskState.SUCCEEDED, final.attempts[0].failure
    a = final.attempts[0]
    assert a.phase == "pushed" and a.checkpoints["started"]["data"] == {"n": 1}
    assert [e.fields["phase"] for e in events(final, "checkpoint_recorded")] == ["started", "pushed"]


def test_a_phase_outside_the_declared_list_stops_the_task_and_says_how_to_declare_it(h: Harness) -> None:
    task = h.basic.enqueue("declared-phases", {})
    h.drive(task.id, "simple")
    final = h.task(task.id)
    assert final.state is TaskState.BLOCKED, final.state  # configuration: stopped for a person, not quarantined
    f = final.attempts[0].failure
    assert f is not None and f.failure_class is FailureClass.CONFIGURATION
    assert "'started' is not one of them" in f.message and "phases=" in f.message
    assert h.client.redis.zscore(h.client.keys.dlq, task.id) is None


def test_checkpoint_with_a_stale_fence_is_refused_and_audited(h: Harness, tmp_path: Path) -> None:
    spec = basic.app.spec("checkpoints")
    task = h.enqueue_undispatched(h.basic, "checkpoints", {"repo": "example/app", "base": "abc123"})
    lease = h.client.leases.claim_attempt(task.id, "w-stale", lease_ms=1000, expect_attempt=1)
    task = h.task(task.id)
    ctx = Context(h.client, spec, task, task.attempts[0], lease.fence, "w-stale", tmp_path)
    ctx.checkpoint("workspace_prepared", {"n": 1}, scope=CKPT_SCOPE)  # the live fence: accepted

    wait_for(lambda: redis_ms(h.client.redis) > lease.expires_at_ms, 5, "the lease to pass")
    assert [e.attempt_id for e in h.client.maintenance.expire_leases()] == [lease.attempt_id]
    with pytest.raises(LeaseLost):
        ctx.checkpoint("source_capture_done", {"n": 2}, scope=CKPT_SCOPE)
    assert ctx.lease_lost
    with pytest.raises(LeaseLost):  # refused locally from now on: no write, no second event
        ctx.checkpoint("commit_done", {"n": 3}, scope=CKPT_SCOPE)

    after = h.task(task.id)
    a = after.attempts[0]
    assert a.state is AttemptState.SUSPECT and a.phase == "workspace_prepared"
    assert set(a.checkpoints) == {"workspace_prepared"}
    stale = events(after, "stale_write_refused")
    assert len(stale) == 1
    f = stale[0].fields
    assert (f["op"], f["refusal"], f["worker"]) == ("checkpoint", "stale_fence", "w-stale")
    assert int(f["presented_fence"]) == lease.fence and int(f["current_fence"]) == lease.fence + 1
    assert [e.fields["phase"] for e in events(after, "checkpoint_recorded")] == ["workspace_prepared"]


def test_mcq_workers_lists_live_workers_with_their_health_and_leases(h: Harness, tmp_path: Path) -> None:
    """A non-burst worker holding a long task shows up busy and healthy, with its lease."""
    pidfile = tmp_path / "pid"
    task = h.basic.enqueue("records-pid", {"pidfile": str(pidfile), "steps": 200, "step_s": 0.1})
    h.spawn(h.worker_cmd("simple", BASIC, "--name", "probe-w1", burst=False))  # teardown ends it
    deadline = time.monotonic() + 30
    while not pidfile.exists():
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.05)
    out = h.mcq("workers", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["worker"]: r for r in json.loads(out.stdout)}
    assert rows["probe-w1"]["healthy"] is True and rows["probe-w1"]["state"] == "busy"
    assert [le["attempt"] for le in rows["probe-w1"]["leases"]] == [f"{task.id}/1"]


def test_a_stopped_task_names_the_effects_left_without_a_receipt(redis_server: RedisServer, prefix: str,
                                                                tmp_path: Path) -> None:
    """The provider refuses mid-effect with an authorization error: the task stops (no retry), and its
    attention item lists the effect whose intent has no receipt, so a person knows what to check."""
    from mc_queue.worker.attempt import run_attempt
    from mc_queue.worker.runner import _install_runtime as install
    from mc_queue.worker.runner import configure

    app = mc_queue.App(name="auth-mid-effect")

    @app.handler("push-then-401")
    def handler(ctx: Context, payload: dict[str, Any]) -> None:
        def perform(key: str) -> None:
            raise mc_queue.AuthorizationError("token revoked while pushing")

        ctx.effect("push", "abc123", perform, reconcile=lambda key: None)

    q = mc_queue.connect(redis_server.url, prefix=prefix)
    task = q.producer.enqueue("default", "push-then-401", {}, retry_policy=app.retry, budget=app.budget)
    configure(app, q, tmp_path / "ws")
    install("in-process")
    outcome = run_attempt(prefix, f"{task.id}/1", 10_000)
    assert outcome["decision"] == "stop", outcome
    item = next(i for i in q.reads.attention_items() if i["task_id"] == task.id)
    key = mc_queue.mint_key(task.id, "push", "abc123")
    assert item["pending_effects"] == [key] and key in item["why_unsafe"]
    assert q.reads.get_task(task.id).state is TaskState.BLOCKED

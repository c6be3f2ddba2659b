"""Issue 10, failures you can read: the failure record keeps a bounded traceback, and `mcq show`,
`mcq status`, `mcq attention`, `mcq workers` and `mcq namespace` say what happened in plain words,
in at most 80 columns whatever the terminal claims."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import mc_queue
from mc_queue import Context, TaskState
from mc_queue.contracts.codec import model_json
from mc_queue.contracts.failures import TRACEBACK_MAX_BYTES, TRACEBACK_MAX_FRAMES, make_failure
from mc_queue.contracts.models import Event, FailureClass
from mc_queue.ops.render import describe_event, state_text
from mc_queue.testing import RedisServer

app = mc_queue.App(name="readable-failures")
LONG_WORD = "x" * 150  # no space to wrap at: it must be folded, not cut


def _parse(text: str) -> int:
    return int(text)  # a frame of its own in the traceback


@app.handler("boom")
def boom(ctx: Context, payload: dict[str, Any]) -> None:
    _parse(payload["number"])


@app.handler("deep")
def deep(ctx: Context, payload: dict[str, Any]) -> None:
    def down(n: int) -> int:
        if n == 0:
            raise ValueError("bottom " + "y" * 30_000)  # a last line far above the byte cap
        return down(n - 1) + 1

    down(200)


@app.handler("forbidden")
def forbidden(ctx: Context, payload: dict[str, Any]) -> None:
    raise mc_queue.AuthorizationError("token revoked for repository example/app")


@app.handler("ok")
def ok(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"answer": 42, "note": LONG_WORD}


@pytest.fixture
def run(redis_server: RedisServer, prefix: str, tmp_path: Path) -> Iterator[Any]:
    """Run a task's first Attempt in this process, as a worker would."""
    from mc_queue.worker.attempt import run_attempt, set_runtime
    from mc_queue.worker.runner import _install_runtime, configure

    q = mc_queue.connect(redis_server.url, prefix=prefix)
    configure(app, q, tmp_path / "ws")
    _install_runtime("in-process")

    def go(handler: str, payload: dict[str, Any]) -> mc_queue.Task:
        task = q.producer.enqueue("default", handler, payload, retry_policy=app.retry, budget=app.budget)
        run_attempt(prefix, f"{task.id}/1", 10_000)
        return q.reads.get_task(task.id)

    try:
        yield go
    finally:
        set_runtime(None)
        q.close()


def mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "LINES": "50"}  # a wide terminal: the 80 columns are ours
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          capture_output=True, text=True, timeout=60, env=env)


def assert_fits(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr
    wide = [line for line in out.stdout.splitlines() if len(line) > 80]
    assert not wide, f"{len(wide)} line(s) wider than 80 columns:\n" + "\n".join(wide)


def test_a_raising_handler_keeps_its_traceback_and_mcq_show_prints_it(
        run: Any, redis_server: RedisServer, prefix: str) -> None:
    task = run("boom", {"number": "seven", "blob": "z" * 2000, "word": LONG_WORD})
    failure = task.attempts[0].failure
    assert failure is not None and failure.type == "ValueError"
    assert failure.message == "invalid literal for int() with base 10: 'seven'"
    tb = failure.traceback or ""
    assert tb.startswith("Traceback (most recent call last):"), tb
    assert "in _parse" in tb and "in boom" in tb and tb.rstrip().endswith(failure.message)

    out = mcq(redis_server, prefix, "show", task.id)
    assert_fits(out)
    text = out.stdout
    assert f"task {task.id}" in text
    assert "failure: internal / ValueError" in text
    assert "invalid literal for int() with base 10: 'seven'" in text
    flat = " ".join(text.split())  # a long checkout path wraps "in _parse" onto the next line
    assert "traceback:" in text and "Traceback (most recent call last):" in text and "in _parse" in flat
    assert "return int(text)" in text  # the source line of the newest frame, indented under the failure
    assert "payload: (" in text and "bytes)" in text and "more characters not shown" in text
    for label in ("created: ", "started: ", "finished: "):
        assert label in text, label
    assert task.created_at.strftime("%Y-%m-%dT%H:%M:%S") in text  # ISO-8601 UTC
    assert "(ran " in text and "(took " in text
    assert "result: none" in text


def test_mcq_show_prints_the_result_and_folds_long_values(run: Any, redis_server: RedisServer, prefix: str) -> None:
    task = run("ok", {"word": LONG_WORD})
    assert task.state is TaskState.SUCCEEDED
    out = mcq(redis_server, prefix, "show", task.id)
    assert_fits(out)
    assert '"answer": 42' in out.stdout and "result: (" in out.stdout
    joined = "".join(line.strip() for line in out.stdout.splitlines())
    assert LONG_WORD in joined  # wrapped over lines, nothing cut
    assert "attempt_succeeded" in out.stdout


def test_the_traceback_is_bounded(run: Any) -> None:
    task = run("deep", {})
    tb = task.attempts[0].failure.traceback  # type: ignore[union-attr]
    assert tb is not None
    assert len(tb.encode()) <= TRACEBACK_MAX_BYTES
    assert tb.count('  File "') <= TRACEBACK_MAX_FRAMES
    assert tb.startswith(f"[{len(tb)}") is False and "oldest lines cut" in tb.splitlines()[0]
    assert tb.rstrip().endswith("y" * 100)  # the newest line is the one kept

    def recurse(n: int) -> int:
        return recurse(n + 1) + 1

    try:
        recurse(0)
    except RecursionError as exc:
        failure = mc_queue.policy.classify.classify(exc).failure
    assert failure.traceback is not None and len(failure.traceback.encode()) <= TRACEBACK_MAX_BYTES
    assert failure.traceback.count('  File "') <= TRACEBACK_MAX_FRAMES
    assert failure.traceback.rstrip().endswith("maximum recursion depth exceeded")


def test_the_worst_failure_record_fits_the_scripts_bounds(q: mc_queue.Client) -> None:
    """The largest failure mc_queue builds (a 2000-character message of astral characters, a capped
    traceback of control characters, both escaped in ASCII JSON) is accepted by fail.lua."""
    failure = make_failure(FailureClass.PROVIDER, "Timeout", "\U0001F600" * 5000, traceback="\x01" * 50_000)
    assert len((failure.traceback or "").encode()) <= TRACEBACK_MAX_BYTES
    assert len(model_json(failure)) > 65536  # above the old bound
    task = q.producer.enqueue("default", "h", {})
    lease = q.leases.claim_attempt(task.id, "w")
    q.leases.fail_attempt(f"{task.id}/1", lease.fence, failure, worker_id="w")
    stored = q.reads.get_task(task.id).attempts[0].failure
    assert stored is not None and stored.traceback == failure.traceback
    old = make_failure(FailureClass.PROVIDER, "Timeout", "old record")
    assert old.traceback is None and "traceback" in model_json(old)


def test_attention_in_plain_words_names_the_command_that_works(
        run: Any, redis_server: RedisServer, prefix: str) -> None:
    quarantined = run("boom", {"number": "x"})
    blocked = run("forbidden", {})
    assert quarantined.state is TaskState.QUARANTINED and blocked.state is TaskState.BLOCKED
    out = mcq(redis_server, prefix, "attention")
    assert_fits(out)
    text = out.stdout
    assert "{'" not in text and "None" not in text and "hypothesis=" not in text
    assert "attempts: 1/" in text
    blocks = text.split("\n\n")
    q_block = next(b for b in blocks if quarantined.id in b)
    b_block = next(b for b in blocks if blocked.id in b)
    assert f"mcq dlq replay {quarantined.id} --reason" in q_block.replace("\n    ", " ")
    assert f"mcq retry {quarantined.id}" not in q_block
    assert f"mcq retry {blocked.id} --reason" in b_block.replace("\n    ", " ")

    for args in (["status"], ["workers"], ["namespace"], ["show", blocked.id]):
        assert_fits(mcq(redis_server, prefix, *args))


def test_backoff_reads_as_due_once_its_wait_is_over(run: Any) -> None:
    from mc_queue.contracts.models import Attempt, AttemptState

    task = run("ok", {})
    now = datetime.now(UTC)
    waiting = Attempt(id=f"{task.id}/2", task_id=task.id, number=2, state=AttemptState.PENDING,
                      due_at=now - timedelta(seconds=12))
    backoff = task.model_copy(update={"state": TaskState.BACKOFF, "attempts": [*task.attempts, waiting]})
    assert state_text(backoff, now) == "backoff (due since 12.0s, waiting for a worker)"
    assert state_text(backoff, now - timedelta(seconds=20)) == "backoff (due in 8.0s)"


def test_a_voided_lease_reads_as_voided_never_negative_overdue() -> None:
    at = datetime.now(UTC)
    voided = Event(id="1-0", type="lease_expired", at=at, fields={
        "worker": "w", "fence": "3", "new_fence": "4", "overdue_ms": "0", "left_ms": "1200", "reason": "recover"})
    assert "voided with 1200 ms left (recover)" in describe_event(voided)
    legacy = Event(id="1-0", type="lease_expired", at=at, fields={
        "worker": "w", "fence": "3", "new_fence": "4", "overdue_ms": "-800"})
    assert "voided with 800 ms left" in describe_event(legacy) and "-" not in describe_event(legacy).split(":")[0]
    expired = Event(id="1-0", type="lease_expired", at=at, fields={
        "worker": "w", "fence": "3", "new_fence": "4", "overdue_ms": "250", "left_ms": ""})
    assert "expired (250 ms overdue)" in describe_event(expired)

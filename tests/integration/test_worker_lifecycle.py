"""`mcq worker` as a process: signals, exit codes, logs, and RQ's job timeout.

Real worker processes (`python -m mc_queue ... worker`), real signals, the session's redis-server and
a real local HTTP provider. Assertions read the records in Redis, the processes' exit codes, and, for
the logging test only, what the worker wrote to stderr.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mc_queue import Sweeper, TaskState
from mc_queue.contracts.models import AttemptState, FailureClass
from mc_queue.policy.effects import mint_key
from mc_queue.testing import ForgeServer, RedisServer, free_port, unique_prefix
from tests.apps import lifecycle_app
from tests.harness import BASIC, REPO, Harness, events, harness_fixture, proc_state, redis_ms, wait_for

LIFECYCLE = "tests.apps.lifecycle_app:app"
EXIT_FORCED = 5


class LifecycleHarness(Harness):
    """The worker harness, with the lifecycle app, non-burst workers and the forge in the environment."""

    def __init__(self, server: RedisServer, prefix: str, home: Path, forge_url: str | None = None) -> None:
        super().__init__(server, prefix, home, {"MCQ_TEST_FORGE": forge_url} if forge_url else None)
        self.lifecycle = self.app_client(lifecycle_app.app)

    def serve(self, kind: str, *extra: str, app: str = LIFECYCLE) -> tuple[subprocess.Popen[bytes], str]:
        """A long-running (non-burst) worker; returns the process and its name."""
        name = f"lc-{kind}-{len(self.procs)}-{self.prefix}"
        return self.spawn(self.worker_cmd(kind, app, "--name", name, *extra, burst=False)), name

    def rq_state(self, name: str) -> str:
        return (self.rq.hget(f"rq:worker:{name}", "state") or b"").decode()


h = harness_fixture(LifecycleHarness)


def exit_code(h: LifecycleHarness, p: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker was still running {timeout}s after the signal:\n{h.worker_log(p)}")


# --------------------------------------------------------------------------- C.1 signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_a_signal_stops_an_idle_worker(h: LifecycleHarness, kind: str, sig: signal.Signals) -> None:
    p, name = h.serve(kind)
    wait_for(lambda: h.rq_state(name) == "idle", 20, "the worker to wait for work")
    time.sleep(0.3)  # well inside its blocking dequeue
    os.kill(p.pid, sig)
    assert exit_code(h, p, 8) == 0, h.worker_log(p)
    assert "reconnecting" not in h.worker_log(p)
    assert h.rq.hget(f"rq:worker:{name}", "death"), "the worker did not register its death with RQ"


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_sigterm_to_a_busy_worker_finishes_its_attempt_then_stops(h: LifecycleHarness, tmp_path: Path,
                                                                  kind: str) -> None:
    pidfile = tmp_path / "pid"
    first = h.lifecycle.enqueue("sleeps", {"seconds": 2, "pidfile": str(pidfile)})
    second = h.lifecycle.enqueue("sleeps", {"seconds": 0.1})
    p, _ = h.serve(kind)
    wait_for(lambda: Path(f"{pidfile}.1").exists(), 20, "the handler to start")
    os.kill(p.pid, signal.SIGTERM)
    assert exit_code(h, p, 15) == 0, h.worker_log(p)
    done = h.task(first.id)
    assert done.state is TaskState.SUCCEEDED and done.result == {"slept": 2, "attempt": 1}
    assert len(done.attempts) == 1 and not events(done, "lease_expired")
    waiting = h.task(second.id)
    assert waiting.state is TaskState.PENDING and not events(waiting, "attempt_claimed"), (
        "a worker asked to stop took another Attempt")


@pytest.mark.parametrize("how", ["grace-over", "second-signal"])
@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_a_worker_stopped_before_its_attempt_finished_leaves_it_to_the_lease_and_reconciliation(
        h: LifecycleHarness, tmp_path: Path, kind: str, how: str) -> None:
    pidfile = tmp_path / "pid"
    task = h.lifecycle.enqueue("sleeps", {"seconds": 60, "pidfile": str(pidfile)})
    p, _ = h.serve(kind, "--grace", "1" if how == "grace-over" else "60")
    wait_for(lambda: Path(f"{pidfile}.1").exists(), 20, "the handler to start")
    handler_pid = int(Path(f"{pidfile}.1").read_text())
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGTERM)
    if how == "second-signal":
        time.sleep(1.5)  # RQ ignores a repeat within one second (a pool's duplicate)
        assert p.poll() is None, "the first SIGTERM did not wait for the Attempt"
        os.kill(p.pid, signal.SIGTERM)
    assert exit_code(h, p, 10) == EXIT_FORCED, h.worker_log(p)
    took = time.monotonic() - t0
    assert took < 6, f"stopping took {took:.1f}s"
    if how == "grace-over":
        assert took >= 1.0, "the worker did not wait for its grace period"
    wait_for(lambda: proc_state(handler_pid) in ("", "Z"), 5, "the process running the handler to end")

    stopped = h.task(task.id)
    a1 = stopped.attempts[0]
    assert a1.state is AttemptState.RUNNING, "the Attempt of a stopped worker was settled by the worker"
    assert not events(stopped, "attempt_failed") and a1.failure is None

    # Its lease runs out; the sweeper makes it suspect and reconciles it (no effect: executor, retry).
    assert a1.lease_expires_at is not None
    wait_for(lambda: redis_ms(h.client.redis) > a1.lease_expires_at.timestamp() * 1000 + 50, 10, "the lease to end")
    sweeper = Sweeper(h.client, app=lifecycle_app.app)
    wait_for(lambda: (sweeper.run_once(), events(h.task(task.id), "attempt_reconciled"))[1], 10,
             "the sweeper to reconcile the Attempt")
    after = h.task(task.id)
    assert len(events(after, "lease_expired")) == 1
    assert after.attempts[0].state is AttemptState.FAILED and after.attempts[0].settled_by == "reconcile"
    assert after.attempts[0].failure is not None
    assert after.attempts[0].failure.failure_class is FailureClass.EXECUTOR
    assert len(after.attempts) == 2 and after.attempts[1].state is AttemptState.PENDING


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_grace_0_stops_a_busy_worker_at_once(h: LifecycleHarness, tmp_path: Path, kind: str) -> None:
    """Issue 15 (compose): `--grace 0` never stopped a busy worker (the timer fired before RQ's force-stop
    handler was in place, and the worker kept waiting for the Attempt)."""
    pidfile = tmp_path / "pid"
    h.lifecycle.enqueue("sleeps", {"seconds": 60, "pidfile": str(pidfile)})
    p, _ = h.serve(kind, "--grace", "0")
    wait_for(lambda: Path(f"{pidfile}.1").exists(), 20, "the handler to start")
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGTERM)
    assert exit_code(h, p, 15) == EXIT_FORCED, h.worker_log(p)
    assert time.monotonic() - t0 < 8


def test_a_pool_stopped_before_its_attempt_finished_exits_5_as_one_worker_does(h: LifecycleHarness,
                                                                              tmp_path: Path) -> None:
    """Issue 15: `mcq worker --pool N` exited 0 even when a worker of it stopped mid-Attempt."""
    pidfile = tmp_path / "pid"
    h.lifecycle.enqueue("sleeps", {"seconds": 60, "pidfile": str(pidfile)})
    p, _ = h.serve("simple", "--pool", "2", "--grace", "1")
    wait_for(lambda: Path(f"{pidfile}.1").exists(), 30, "the handler to start")
    os.kill(p.pid, signal.SIGTERM)
    assert exit_code(h, p, 30) == EXIT_FORCED, h.worker_log(p)


# --------------------------------------------------------------------------- C.2 exit codes


def test_a_burst_worker_that_cannot_reach_redis_exits_4(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}, "MCQ_HOME": str(home)}
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", unique_prefix(),
                          "worker", "--app", BASIC, "--burst", "--kind", "simple"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, (out.returncode, out.stderr[-2000:])
    assert "cannot reach Redis" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_a_burst_worker_whose_redis_goes_away_mid_run_exits_4(own_redis: RedisServer, tmp_path: Path,
                                                              kind: str) -> None:
    h = LifecycleHarness(own_redis, unique_prefix(), tmp_path / "home")
    try:
        pidfile = tmp_path / "pid"
        h.lifecycle.enqueue("sleeps", {"seconds": 5, "pidfile": str(pidfile)})
        h.lifecycle.enqueue("sleeps", {"seconds": 0.1})
        p = h.start_worker(kind, LIFECYCLE)
        wait_for(lambda: Path(f"{pidfile}.1").exists(), 20, "the handler to start")
        own_redis.stop(signal.SIGKILL)
        assert exit_code(h, p, 30) == 4, h.worker_log(p)
        assert "cannot reach Redis" in h.worker_log(p)
    finally:
        own_redis.start()
        h.close()


def test_the_worker_help_documents_its_exit_codes() -> None:
    out = subprocess.run([sys.executable, "-m", "mc_queue", "worker", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for code, words in (("0", "stop"), ("2", "bad input"), ("3", "recover"), ("4", "Redis"), ("5", "lease")):
        assert re.search(rf"\b{code}\b[^0-9]*{words}", text), (code, words, out.stdout)
    assert "--grace" in out.stdout


# --------------------------------------------------------------------------- C.3 logs


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_a_failed_attempt_is_logged_with_class_fingerprint_and_traceback_never_as_job_ok(
        h: LifecycleHarness, kind: str) -> None:
    failing = h.basic.enqueue("validation-fails", {})
    poison = h.basic.enqueue("crashes", {})  # internal: quarantined
    fine = h.basic.enqueue("noop", {})
    out = h.run_worker(kind, BASIC, "--log-level", "INFO")
    log = out.stderr
    assert "Job OK" not in log and "Successfully completed" not in log, log[-3000:]

    f = h.task(failing.id).attempts[0].failure
    assert f is not None and f.failure_class is FailureClass.VALIDATION
    line = next((ln for ln in log.splitlines() if failing.attempts[0].id in ln and " WARNING " in ln), None)
    assert line is not None, log[-3000:]
    assert "validation" in line and f.fingerprint in line and "ValidationFailure" in line, line
    assert "Traceback (most recent call last)" in log and "test_parser fails" in log

    assert h.task(poison.id).state is TaskState.QUARANTINED
    q = h.task(poison.id).attempts[0].failure
    assert q is not None
    qline = next((ln for ln in log.splitlines() if poison.attempts[0].id in ln and " ERROR " in ln), None)
    assert qline is not None and "quarantine" in qline and q.fingerprint in qline, log[-3000:]

    assert h.task(fine.id).state is TaskState.SUCCEEDED
    assert any(fine.attempts[0].id in ln and "succeeded" in ln for ln in log.splitlines()), log[-3000:]


# --------------------------------------------------------------------------- C.4 RQ's job timeout


@pytest.fixture
def forge(monkeypatch: pytest.MonkeyPatch) -> Iterator[ForgeServer]:
    server = ForgeServer().start()
    monkeypatch.setenv("MCQ_TEST_FORGE", server.url)  # the sweeper in this process reconciles with it
    yield server
    server.stop()


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_a_job_timeout_with_an_effect_in_flight_is_reconciled_not_failed(redis_server: RedisServer, tmp_path: Path,
                                                                        forge: ForgeServer, kind: str) -> None:
    h = LifecycleHarness(redis_server, unique_prefix(), tmp_path / "home", forge.url)
    try:
        forge.stall_next(1, seconds=8)  # the pull request is created, the answer held past the job timeout
        task = h.lifecycle.enqueue("slow-effect", {"head": "cafe01"})
        key = mint_key(task.id, "open-pr", "cafe01")
        t0 = time.monotonic()
        h.run_worker(kind, LIFECYCLE, timeout=60)
        assert time.monotonic() - t0 < 15, "the job timeout did not end the handler"

        timed_out = h.task(task.id)
        a1 = timed_out.attempts[0]
        assert a1.state is AttemptState.SUSPECT, (a1.state, [e.type for e in timed_out.events])
        assert not events(timed_out, "attempt_failed"), "the timeout went straight to fail.lua"
        voided = events(timed_out, "lease_expired")
        assert len(voided) == 1 and "timeout" in voided[0].fields["reason"], voided
        assert h.client.reads.effects(task.id)[key].state == "intent"  # in flight when the timeout fired

        sweeper = Sweeper(h.client, app=lifecycle_app.app)
        sweeper.run_once()
        reconciled = h.task(task.id)
        rec = events(reconciled, "attempt_reconciled")
        assert len(rec) == 1 and rec[0].attempt == 1, [e.type for e in reconciled.events]
        assert h.client.reads.effects(task.id)[key].state == "done"  # found at the provider
        assert reconciled.attempts[0].state is AttemptState.FAILED
        assert reconciled.attempts[0].settled_by == "reconcile"

        final = h.drive(task.id, kind, LIFECYCLE, until=lambda t: t.state is TaskState.SUCCEEDED)
        assert final.result == {"pull_request": 1, "attempt": 2}
        assert forge.count_by_key() == {key: 1}, "the effect was repeated"
        assert h.client.reads.effects(task.id)[key].source == "reconcile"  # Attempt 2 replayed the receipt found
    finally:
        h.close()

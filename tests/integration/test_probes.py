"""Health probes gate claim (issue 19): a worker runs its App's probes on a thread of its own and, while the
probe of a dependency fails, claims no Attempt of a task that needs it (nothing held, the task stays
pending and is sent again); a probe that passes again lets them through. Each change is recorded.
Unit cases of mc_queue.worker.probes.Probes, then a real worker process, sweeper and file-backed probe."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import mc_queue
from mc_queue import Sweeper, TaskState
from mc_queue.contracts.errors import InvalidArgument
from mc_queue.ops.metrics import NamespaceCollector
from mc_queue.producer.app import App, ProbeSpec
from mc_queue.worker.probes import Probes
from mc_queue.worker.runner import live_workers
from tests.apps import controls_app
from tests.harness import Harness, wait_for
from tests.integration.test_metrics_alerts import scrape, v

APP = "tests.apps.controls_app:app"


def probes(**checks: Any) -> tuple[Probes, list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    specs = {k: ProbeSpec(k, fn, every_s=0.05, timeout_s=0.2) for k, fn in checks.items()}
    return Probes(specs, record=lambda e, f: seen.append((e, f)), worker_id="w1"), seen


def test_a_failing_probe_refuses_the_tasks_that_need_its_key_and_no_other() -> None:
    state = {"up": False}

    def forge() -> bool:
        if not state["up"]:
            raise ConnectionError("connection refused")
        return True

    p, seen = probes(forge=forge, model=lambda: True)
    assert p.refusal(("forge",)) is None  # never probed yet: not refused
    p.run_once()
    got = p.refusal(("model", "forge"))
    assert got is not None and got[1] == 0.05  # sent again after the probe's interval
    assert "dependency forge fails its health probe on worker w1 (ConnectionError: connection refused)" in got[0]
    assert p.refusal(("model",)) is None and p.refusal(()) is None
    assert seen == [("probe_failed", {"key": "forge", "worker": "w1", "reason": "ConnectionError: connection refused"})]
    p.run_once()  # not due again yet, and no change: nothing more recorded
    assert len(seen) == 1
    state["up"] = True
    p.run_once(now=time.monotonic() + 1)
    assert p.refusal(("forge",)) is None
    assert seen[-1] == ("probe_passed", {"key": "forge", "worker": "w1", "reason": "passes again"})


def test_a_probe_that_hangs_or_says_no_fails() -> None:
    release = threading.Event()
    p, _ = probes(slow=lambda: release.wait(5), no=lambda: False)
    started = time.monotonic()
    p.run_once()
    assert time.monotonic() - started < 2  # bounded by its timeout, not the check's 5 s
    assert p.failing() == {"slow": "no answer within 0.2 s", "no": "the probe said no"}
    release.set()


def test_a_probe_declaration_is_checked() -> None:
    app = App(name="t")
    for key, check, kw in (("bad key", lambda: True, {}), ("ok", "not callable", {}),
                           ("ok", lambda: True, {"every_s": 0}), ("ok", lambda: True, {"timeout_s": -1})):
        with pytest.raises(InvalidArgument):
            app.probe(key, check, **kw)  # type: ignore[arg-type]
    assert app.probes == {}


def gate_closed(h: Harness, tmp_path: Path) -> tuple[Path, Any]:
    """A worker of the controls app whose probe of 'gate' fails (until the returned file exists), running;
    and an App client."""
    gate = tmp_path / "gate-open"
    h.extra_env["MCQ_TEST_GATE"] = str(gate)  # absent: the gate's probe fails
    ac = h.app_client(controls_app.app)
    h.spawn(h.worker_cmd("simple", APP, burst=False))
    wait_for(lambda: any(r.get("type") == "probe_failed" for r in h.client.reads.refusals()), 30,
             "the worker's first probe of the gate to fail")
    return gate, ac


def test_a_worker_whose_probe_fails_claims_nothing_that_needs_it_until_it_passes(
        controls: Harness, tmp_path: Path) -> None:
    h = controls
    sweeper = Sweeper(h.client, recheck_ms=300, claim_grace_ms=200)
    gate, ac = gate_closed(h, tmp_path)
    gated = ac.enqueue("needs-gate", {"n": 1}).id
    free = ac.enqueue("independent", {"n": 2}).id
    wait_for(lambda: h.client.reads.get_task(free).state is TaskState.SUCCEEDED, 30, "the task that needs nothing")
    refused = wait_for(lambda: [r for r in h.client.reads.refusals()
                                if "fails its health probe" in r.get("reason", "")],
                       30, "the gated task's message to be refused")
    assert gated in refused[0].get("attempt", "")
    for _ in range(5):  # sent again and again: still not claimed while the probe fails
        sweeper.run_once()
        time.sleep(0.35)
    t = h.client.reads.get_task(gated)
    assert t.state is TaskState.PENDING and t.attempts[0].fence is None and len(t.attempts) == 1
    # published beside the worker's liveness key: `mcq workers --json` and the metrics show it
    def published(state: str) -> list[dict[str, Any]]:
        return [r for r in live_workers(h.client) if r["probes"].get("gate", "").startswith(state)]

    (row,) = wait_for(lambda: published("failing"), 10, "the failing probe to be published")
    assert "gate " in row["probes"]["gate"] and "is closed" in row["probes"]["gate"]
    shown = json.loads(h.mcq("workers", "--json").stdout)
    assert any(w["probes"].get("gate", "").startswith("failing") for w in shown), shown
    assert "probes: gate failing ConnectionError: gate" in h.mcq("workers").stdout
    m, _ = scrape(NamespaceCollector(h.client))
    assert v(m, "mcq_probe_failing", worker=row["worker"], key="gate") == 1
    gate.touch()  # the dependency is back: the next probe passes
    wait_for(lambda: any(r.get("type") == "probe_passed" for r in h.client.reads.refusals()), 30,
             "the probe to pass again")

    def done() -> bool:
        sweeper.run_once()
        return h.client.reads.get_task(gated).state is TaskState.SUCCEEDED

    wait_for(done, 30, "the gated task to run once the probe passes", interval=0.3)
    wait_for(lambda: published("ok"), 10, "the passing probe to be published")
    m, _ = scrape(NamespaceCollector(h.client))
    assert v(m, "mcq_probe_failing", worker=row["worker"], key="gate") == 0


def test_a_message_a_probe_refused_is_sent_again_after_the_probe_s_interval_not_the_recheck(
        q: mc_queue.Client) -> None:
    """The refusing worker asks for the Attempt to be sent again once its probe may have changed its mind
    (``resend_soon``): the sweeper's dispatch walk sends it then, not a whole recheck (60 s) after its
    dispatch; a dispatch after that makes the request moot. Both sides of each boundary."""
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    aid = f"{t.id}/1"
    assert q.schedule.mark_dispatched(aid, recheck_ms=60_000)
    walk = lambda: q.schedule.dispatch_walk("jobs", recheck_ms=60_000)[0]  # noqa: E731
    assert walk() == []  # dispatched just now: not before its recheck
    before = q.redis.hget(q.keys.task(t.id).task, "1.dispatches")
    assert q.schedule.resend_soon(aid, in_ms=300)
    assert walk() == []  # not yet
    time.sleep(0.35)
    assert walk() == [aid]  # its probe's interval is over: sent again now
    assert q.redis.hget(q.keys.task(t.id).task, "1.dispatches") == before  # a request, not a dispatch
    assert q.schedule.mark_dispatched(aid, recheck_ms=60_000)  # sent again: the request is spent
    assert walk() == []
    lease = q.leases.claim_attempt(t.id, "w1", 60_000)
    assert not q.schedule.resend_soon(aid, in_ms=300)  # claimed meanwhile: nothing to send, nothing written
    assert lease.fence > 0


def test_mark_dispatched_takes_a_dispatch_or_a_resend_never_both_nor_neither(q: mc_queue.Client) -> None:
    """The script's two calls say which they are: a dispatch (recheck_ms) or a resend (resend_ms); both or
    neither is refused before anything is written."""
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    aid, tk = f"{t.id}/1", q.keys.task(t.id)
    keys = {**q.backend.ns_keys(), "outbox": q.keys.outbox, "task": tk.task, "attempts": tk.attempts_v1}
    before = q.redis.hgetall(tk.task)
    for recheck, resend in ((1000, 300), ("", "")):
        reply = q.runner.call("mark_dispatched", keys, {"member": aid, "recheck_ms": recheck, "actor": "t",
                                                        "epoch": q.backend.ns.epoch, "resend_ms": resend})
        assert reply[0] == "E_BADARG" and "exactly one" in reply[1]
    assert q.redis.hgetall(tk.task) == before


def test_through_a_worker_a_refused_task_runs_soon_after_its_probe_passes_with_the_default_recheck(
        controls: Harness, tmp_path: Path) -> None:
    h = controls
    sweeper = Sweeper(h.client)  # the default recheck: 60 s
    gate, ac = gate_closed(h, tmp_path)
    gated = ac.enqueue("needs-gate", {"n": 1}).id
    wait_for(lambda: [r for r in h.client.reads.refusals() if "fails its health probe" in r.get("reason", "")],
             30, "the gated task's message to be refused")
    gate.touch()
    started = time.monotonic()

    def done() -> bool:
        sweeper.run_once()
        return h.client.reads.get_task(gated).state is TaskState.SUCCEEDED

    wait_for(done, 20, "the gated task to run once the probe passes", interval=0.2)
    assert time.monotonic() - started < 15  # the probe's interval (0.2 s), not the 60 s recheck


def test_mcq_health_worker_probes_is_a_readiness_check(controls: Harness, tmp_path: Path) -> None:
    h = controls
    gate, _ = gate_closed(h, tmp_path)
    wait_for(lambda: [r for r in live_workers(h.client) if r["probes"].get("gate", "").startswith("failing")],
             10, "the failing probe to be published")
    alive = h.mcq("health", "worker")
    assert alive.returncode == 0, alive.stderr  # alive: its probe's dependency is down, not the worker
    ready = h.mcq("health", "worker", "--probes")
    assert ready.returncode == 1 and "whose probes pass; probes: " in ready.stderr, ready.stderr
    assert "gate failing ConnectionError: gate" in ready.stderr, ready.stderr
    gate.touch()
    wait_for(lambda: h.mcq("health", "worker", "--probes").returncode == 0, 30, "the worker to be ready")

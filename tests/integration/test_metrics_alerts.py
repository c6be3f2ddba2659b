"""Metrics an alerting Prometheus can use (issue 10): counters from 0, state gauges for empty states,
finished Attempts and the duration / wait histograms recorded by the scripts, Redis down answered with
HTTP 200 and mcq_redis_up 0, sweeper liveness, live workers, and the example alert rules."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rq import Worker

import mc_queue
from mc_queue import FailureClass, make_failure, reconcile_attempt
from mc_queue.contracts.models import TaskState
from mc_queue.ops.metrics import (
    ACTIONS,
    BUCKETS_S,
    BUDGETS,
    OUTCOMES,
    RECONCILED,
    REFUSALS,
    NamespaceCollector,
    serve,
)
from mc_queue.ops.sweeper import Sweeper
from mc_queue.producer.transport import rq_connection, rq_queue_name
from mc_queue.store.scripts import lua_dir
from mc_queue.testing import RedisServer, free_port, unique_prefix
from mc_queue.worker.runner import live_workers
from tests.apps import lifecycle_app

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "ops" / "alerts.yml"
LE = [*(repr(float(b)) for b in BUCKETS_S), "+Inf"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Every sample (name, labels) -> value, and every family's type, read by prometheus-client's parser."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[s.name, frozenset(s.labels.items())] = s.value
    return samples, types


def scrape(collector: NamespaceCollector) -> tuple[Samples, dict[str, str]]:
    registry = CollectorRegistry()
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def v(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def app_with(*handlers: str, queue: str = "jobs") -> mc_queue.App:
    app = mc_queue.App(name="metrics-test", default_queue=queue)
    for h in handlers:
        app.handler(h)(lambda ctx, payload: None)
    return app


def counter_keys(samples: Samples, types: dict[str, str]) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """The samples of counters and histograms (what rate() and increase() read)."""
    out = set()
    for name, labels in samples:
        family = re.sub(r"(_total|_bucket|_count|_sum)$", "", name)
        if types.get(family) in ("counter", "histogram"):
            out.add((name, labels))
    return out


def test_every_counter_is_exported_at_zero_before_its_first_event_and_empty_states_read_zero(
        q: mc_queue.Client) -> None:
    a = q.producer.enqueue("jobs", "h", {"n": 1})
    collector = NamespaceCollector(q, app=app_with("h"))
    before, types = scrape(collector)

    # the state gauges: every task state of every known queue, 0 when empty
    for state in TaskState:
        assert v(before, "mcq_tasks", queue="jobs", state=state.value) == (1 if state is TaskState.PENDING else 0)
    assert v(before, "mcq_queue_depth", queue="jobs") == 1 and v(before, "mcq_workers_live", queue="jobs") == 0
    # every counter of a known kind, at 0
    assert v(before, "mcq_claims_refused_total") == 0 and v(before, "mcq_stale_writes_refused_total") == 0
    for kind in REFUSALS:
        assert v(before, "mcq_refusals_total", kind=kind) == 0
    for kind in ("expired", "voided"):
        assert v(before, "mcq_leases_expired_total", kind=kind) == 0
    for outcome in RECONCILED:
        assert v(before, "mcq_reconciliations_total", outcome=outcome) == 0
    for action in ACTIONS:
        for fclass in FailureClass:
            assert v(before, "mcq_decisions_total", action=action, failure_class=fclass.value) == 0
    for budget in BUDGETS:
        assert v(before, "mcq_budget_exhaustions_total", budget=budget) == 0
    for outcome in OUTCOMES:
        assert v(before, "mcq_attempts_finished_total", queue="jobs", handler="h", outcome=outcome) == 0
    for hist in ("mcq_attempt_duration_seconds", "mcq_queue_wait_seconds"):
        assert v(before, f"{hist}_count", queue="jobs", handler="h") == 0
        assert v(before, f"{hist}_bucket", queue="jobs", handler="h", le="+Inf") == 0
    assert v(before, "mcq_sweeper_passes_total") == 0 and v(before, "mcq_redis_up") == 1

    # the first event of each kind moves its series from 0 to 1: increase() over the two scrapes is 1
    lease = q.leases.claim_attempt(a.id, "w1", lease_ms=100)
    with pytest.raises(mc_queue.ClaimRejected):
        q.leases.claim_attempt(a.id, "w2")
    deadline = time.monotonic() + 5
    while not q.maintenance.expire_leases():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    reconcile_attempt(q, lease.attempt_id, apply_policy=True)
    after, _ = scrape(collector)
    assert v(after, "mcq_claims_refused_total") == 1 and v(after, "mcq_refusals_total", kind="claim_refused") == 1
    assert v(after, "mcq_leases_expired_total", kind="expired") == 1
    assert v(after, "mcq_reconciliations_total", outcome="failed") == 1
    assert v(after, "mcq_decisions_total", action="retry", failure_class="executor") == 1
    assert v(after, "mcq_attempts_finished_total", queue="jobs", handler="h", outcome="failed") == 1
    assert v(after, "mcq_queue_wait_seconds_count", queue="jobs", handler="h") == 1
    assert v(after, "mcq_tasks", queue="jobs", state="running") == 0
    # no counter or histogram series appeared with the events: each was there, at 0, before them
    assert counter_keys(after, types) == counter_keys(before, types)


def _histogram(samples: Samples, name: str, **labels: str) -> tuple[list[float], float, float]:
    buckets = [v(samples, f"{name}_bucket", le=le, **labels) for le in LE]
    return buckets, v(samples, f"{name}_count", **labels), v(samples, f"{name}_sum", **labels)


def _expected(values_ms: list[int]) -> list[float]:
    return [float(sum(1 for ms in values_ms if ms <= b * 1000)) for b in BUCKETS_S] + [float(len(values_ms))]


def _ms(dt: Any) -> int:
    return round(dt.timestamp() * 1000)


def test_finished_attempts_and_the_duration_and_wait_histograms_follow_real_transitions(
        q: mc_queue.Client) -> None:
    failure = make_failure(FailureClass.PROVIDER, "RateLimited", "429")
    t1 = q.producer.enqueue("jobs", "h", {"n": 1})
    time.sleep(0.6)  # a wait above the 0.5 s bucket
    l1 = q.leases.claim_attempt(t1.id, "w")
    time.sleep(0.2)  # a duration above the 0.1 s bucket
    q.leases.complete_attempt(l1.attempt_id, l1.fence, {"ok": True}, worker_id="w")
    t2 = q.producer.enqueue("jobs", "h", {"n": 2})
    l2 = q.leases.claim_attempt(t2.id, "w")
    q.leases.fail_attempt(l2.attempt_id, l2.fence, failure, worker_id="w")
    t3 = q.producer.enqueue("jobs", "h", {"n": 3})  # lease runs out: reconciled as failed
    l3 = q.leases.claim_attempt(t3.id, "w", lease_ms=100)
    deadline = time.monotonic() + 5
    while not q.maintenance.expire_leases():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    reconcile_attempt(q, l3.attempt_id)
    t4 = q.producer.enqueue("jobs", "h", {"n": 4})  # canceled while running: acknowledged, then reconciled
    l4 = q.leases.claim_attempt(t4.id, "w")
    q.operator.cancel_task(t4.id, "the operator no longer needs this")
    q.leases.acknowledge_cancel(l4.attempt_id, l4.fence, worker_id="w")
    reconcile_attempt(q, l4.attempt_id)
    t5 = q.producer.enqueue("jobs", "other", {"n": 5})  # another handler: its own series
    l5 = q.leases.claim_attempt(t5.id, "w")
    q.leases.complete_attempt(l5.attempt_id, l5.fence, {"ok": True}, worker_id="w")
    q.leases.complete_attempt(l5.attempt_id, l5.fence, {"ok": True}, worker_id="w")  # a resend (DUP) counts nothing

    m, types = scrape(NamespaceCollector(q))
    assert types["mcq_attempts_finished"] == "counter" and types["mcq_attempt_duration_seconds"] == "histogram"
    finished = {o: v(m, "mcq_attempts_finished_total", queue="jobs", handler="h", outcome=o) for o in OUTCOMES}
    assert finished == {"succeeded": 1, "failed": 2, "canceled": 1}
    assert v(m, "mcq_attempts_finished_total", queue="jobs", handler="other", outcome="succeeded") == 1

    attempts = [q.reads.get_task(t.id).attempts[0] for t in (t1, t2, t3, t4)]
    assert [a.state.value for a in attempts] == ["succeeded", "failed", "failed", "canceled"]
    durations = [a.elapsed_ms or 0 for a in attempts]
    waits = [_ms(a.started_at) - _ms(a.due_at) for a in attempts]
    assert durations[0] >= 200 and waits[0] >= 600

    buckets, count, total = _histogram(m, "mcq_attempt_duration_seconds", queue="jobs", handler="h")
    assert buckets == sorted(buckets), "buckets are cumulative"
    assert buckets == _expected(durations) and count == buckets[-1] == sum(finished.values())
    assert total == pytest.approx(sum(durations) / 1000)
    assert buckets[0] <= 3  # the 0.2 s success is above the 0.1 s bucket

    buckets, count, total = _histogram(m, "mcq_queue_wait_seconds", queue="jobs", handler="h")
    assert buckets == sorted(buckets) and buckets == _expected(waits) and count == buckets[-1] == 4
    assert total == pytest.approx(sum(waits) / 1000) and total >= 0.6
    assert buckets[LE.index("0.5")] <= 3  # the 0.6 s wait is above the 0.5 s bucket
    assert v(m, "mcq_queue_wait_seconds_count", queue="jobs", handler="other") == 1
    assert v(m, "mcq_attempt_duration_seconds_count", queue="jobs", handler="other") == 1


def test_redis_down_answers_200_with_mcq_redis_up_0(tmp_path: Path, prefix: str) -> None:
    server = RedisServer(tmp_path / "redis").start()
    httpd = None
    try:
        q = mc_queue.connect(server.url, prefix=prefix)
        q.producer.enqueue("jobs", "h", {})
        port = free_port()
        httpd, _ = serve(q, port=port)
        url = f"http://127.0.0.1:{port}/metrics"
        up = httpx.get(url, timeout=10)
        m, _ = parse(up.text)
        assert up.status_code == 200 and v(m, "mcq_redis_up") == 1 and v(m, "mcq_namespace_ok") == 1
        assert v(m, "mcq_tasks", queue="jobs", state="pending") == 1

        server.stop()
        down = httpx.get(url, timeout=10)
        assert down.status_code == 200
        m, types = parse(down.text)
        assert v(m, "mcq_redis_up") == 0 and v(m, "mcq_namespace_ok") == 0
        assert set(types) == {"mcq_redis_up", "mcq_namespace_ok"}  # every other series is absent, not stale
        q.close()
    finally:
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        server.stop()


def test_sweeper_passes_are_recorded_for_liveness(q: mc_queue.Client) -> None:
    collector = NamespaceCollector(q)
    m, _ = scrape(collector)
    assert v(m, "mcq_sweeper_passes_total") == 0 and v(m, "mcq_sweeper_last_pass_timestamp_seconds") == 0
    q.producer.enqueue("jobs", "h", {})
    sweeper = Sweeper(q)
    started = time.time()
    sweeper.run_once()
    ended = time.time()
    m, types = scrape(collector)
    assert types["mcq_sweeper_passes"] == "counter"
    assert v(m, "mcq_sweeper_passes_total") == 1
    assert started - 0.001 <= v(m, "mcq_sweeper_last_pass_timestamp_seconds") <= ended + 0.001
    assert 0 <= v(m, "mcq_sweeper_pass_duration_seconds") <= ended - started + 0.001
    sweeper.run_once()
    m, _ = scrape(collector)
    assert v(m, "mcq_sweeper_passes_total") == 2


def test_a_stopped_retention_shows_in_the_metrics_until_the_archive_works(q: mc_queue.Client, tmp_path: Path) -> None:
    """Issue 15: an archive that fails stops retention (nothing deleted) and says so where operators look."""
    from mc_queue.contracts.config import Retention
    from mc_queue.ops.archive import FileArchive

    t = q.producer.enqueue("jobs", "h", {})
    lease = q.leases.claim_attempt(t.id, "w1", 60_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1")
    q.operator.set_retention("jobs", Retention(done_s=0.001), reason="the test retires at once")
    (tmp_path / "file").write_text("not a folder")
    collector = NamespaceCollector(q)
    time.sleep(0.01)
    Sweeper(q, archive=FileArchive(tmp_path / "file" / "archive")).run_once()
    m, _ = scrape(collector)
    assert v(m, "mcq_sweeper_retention_stopped") == 1 and q.reads.task_states([t.id])[t.id] == "succeeded"
    Sweeper(q, archive=FileArchive(tmp_path / "archive")).run_once()
    m, _ = scrape(collector)
    assert v(m, "mcq_sweeper_retention_stopped") == 0 and q.reads.task_states([t.id])[t.id] is None


def test_live_workers_are_counted_per_queue(q: mc_queue.Client) -> None:
    q.producer.enqueue("jobs", "h", {})
    q.producer.enqueue("other", "h", {})
    collector = NamespaceCollector(q)
    conn = rq_connection(q)
    worker = Worker([rq_queue_name(q.keys.prefix, "jobs")], connection=conn, name=f"metrics-{q.keys.prefix}")
    try:
        worker.register_birth()
        m, _ = scrape(collector)
        assert v(m, "mcq_workers_live", queue="jobs") == 1 and v(m, "mcq_workers_live", queue="other") == 0
        worker.register_death()
        m, _ = scrape(collector)
        assert v(m, "mcq_workers_live", queue="jobs") == 0
    finally:
        worker.register_death()
        conn.close()


def test_memory_gauges_read_info_memory(q: mc_queue.Client) -> None:
    m, _ = scrape(NamespaceCollector(q))
    info = q.redis.info("memory")
    assert v(m, "mcq_redis_memory_max_bytes") == info["maxmemory"]
    assert v(m, "mcq_redis_memory_used_bytes") > 0


def test_the_exporter_knows_what_the_scripts_count() -> None:
    """Buckets, refusal kinds, decisions, budgets and outcomes: the same lists as the Lua."""
    lua = {p.name: p.read_text() for p in [*lua_dir().glob("*.lua"), *lua_dir().glob("includes/*.lua")]}
    bounds = re.search(r"METRIC_BUCKETS_MS = \{([^}]*)\}", lua["common.lua"])
    assert bounds and tuple(int(b) / 1000 for b in bounds.group(1).split(",")) == BUCKETS_S
    counted = {k for src in lua.values() for k in re.findall(r"refuse\(K\.\w+, K\.stats, '(\w+)'", src)}
    assert counted == set(REFUSALS)
    decisions = re.search(r"'decision', 'enum', '\|\|([^']*)\|'", lua["decisions.lua"])
    assert decisions and set(decisions.group(1).split("|")) - {"wait"} == set(ACTIONS)
    budgets = re.search(r"'budget', 'enum', '\|\|([^']*)\|'", lua["decisions.lua"])
    assert budgets and set(budgets.group(1).split("|")) == set(BUDGETS)
    outcomes = re.search(r"'outcome', 'enum', '\|([^']*)\|'", lua["reconcile_settle.lua"])
    assert outcomes and set(outcomes.group(1).split("|")) == set(OUTCOMES) == set(RECONCILED)


# --------------------------------------------------------------------------- the example alert rules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Prometheus) is not on PATH")


@needs_promtool
def test_promtool_accepts_the_alert_rules() -> None:
    out = subprocess.run([str(PROMTOOL), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


RULE_TESTS = """
rule_files:
  - {alerts}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{{job="mc_queue", instance="x"}}'
        values: '1 1 1 0x10'
      - series: 'mcq_redis_up{{job="mc_queue", instance="x"}}'
        values: '1 1 1 0x10'
      - series: 'mcq_namespace_ok{{job="mc_queue", instance="x"}}'
        values: '1 1 1 0x10'
      - series: 'up{{job="mc_queue", instance="y"}}'
        values: '1x12'
      - series: 'mcq_redis_up{{job="mc_queue", instance="y"}}'
        values: '1x12'
      - series: 'mcq_namespace_ok{{job="mc_queue", instance="y"}}'
        values: '1 0x11'
      - series: 'mcq_namespace_state{{job="mc_queue", instance="y", state="ok"}}'
        values: '1 0x11'
      - series: 'mcq_namespace_state{{job="mc_queue", instance="y", state="lost"}}'
        values: '0 1x11'
      - series: 'mcq_namespace_state{{job="mc_queue", instance="y", state="recovering"}}'
        values: '0x12'
      - series: 'mcq_namespace_state{{job="mc_queue", instance="y", state="missing"}}'
        values: '0x12'
      # z: a namespace never used, no sweeper yet: nothing pages
      - series: 'mcq_namespace_ok{{job="mc_queue", instance="z"}}'
        values: '1x30'
      - series: 'mcq_namespace_state{{job="mc_queue", instance="z", state="missing"}}'
        values: '1x30'
      - series: 'mcq_namespace_state{{job="mc_queue", instance="z", state="ok"}}'
        values: '0x30'
      - series: 'mcq_sweeper_last_pass_timestamp_seconds{{job="mc_queue", instance="z"}}'
        values: '0x30'
      # w: a namespace created at 60 s whose sweeper never started: pages 5 minutes (and the for) later
      - series: 'mcq_namespace_state{{job="mc_queue", instance="w", state="ok"}}'
        values: '1x30'
      - series: 'mcq_namespace_created_timestamp_seconds{{job="mc_queue", instance="w"}}'
        values: '60x30'
      - series: 'mcq_sweeper_last_pass_timestamp_seconds{{job="mc_queue", instance="w"}}'
        values: '0x30'
      # s: queue busyq has every live worker busy and its oldest Attempt waits longer each minute;
      # queue calm has work waiting too, but an idle worker
      - series: 'mcq_queue_age_seconds{{job="mc_queue", instance="s", queue="busyq"}}'
        values: '0+60x30'
      - series: 'mcq_workers_busy{{job="mc_queue", instance="s", queue="busyq"}}'
        values: '2x30'
      - series: 'mcq_workers_idle{{job="mc_queue", instance="s", queue="busyq"}}'
        values: '0x30'
      - series: 'mcq_queue_age_seconds{{job="mc_queue", instance="s", queue="calm"}}'
        values: '400x30'
      - series: 'mcq_workers_busy{{job="mc_queue", instance="s", queue="calm"}}'
        values: '1x30'
      - series: 'mcq_workers_idle{{job="mc_queue", instance="s", queue="calm"}}'
        values: '1x30'
      - series: 'mcq_queue_age_seconds{{job="mc_queue", instance="x", queue="jobs"}}'
        values: '1000x12'
      - series: 'mcq_queue_depth{{job="mc_queue", instance="x", queue="jobs"}}'
        values: '3x12'
      - series: 'mcq_workers_live{{job="mc_queue", instance="x", queue="jobs"}}'
        values: '0x12'
      - series: 'mcq_decisions_total{{job="mc_queue", instance="x", action="quarantine", failure_class="internal"}}'
        values: '0 0 1 1 1 1 1 1 1 1 1 1 1'
      - series: 'mcq_sweeper_last_pass_timestamp_seconds{{job="mc_queue", instance="x"}}'
        values: '60 120 120x10'
      - series: 'mcq_redis_memory_used_bytes{{job="mc_queue", instance="x"}}'
        values: '900x12'
      - series: 'mcq_redis_memory_max_bytes{{job="mc_queue", instance="x"}}'
        values: '1000x12'
      # c: Attempts wait for a slot of repo:a from minute 2 on; repo:b's line moved on within 5 minutes
      - series: 'mcq_concurrency_waiting{{job="mc_queue", instance="c", key="repo:a"}}'
        values: '0 0 2x20'
      - series: 'mcq_concurrency_waiting{{job="mc_queue", instance="c", key="repo:b"}}'
        values: '1x5 0x16'
      # k: queue full at its cap of 3 from minute 2 on; queue busy reached its cap for 4 minutes only
      - series: 'mcq_queue_cap{{job="mc_queue", instance="k", queue="full"}}'
        values: '3x20'
      - series: 'mcq_queue_cap_depth{{job="mc_queue", instance="k", queue="full"}}'
        values: '1 2 3x18'
      - series: 'mcq_queue_cap{{job="mc_queue", instance="k", queue="busy"}}'
        values: '3x20'
      - series: 'mcq_queue_cap_depth{{job="mc_queue", instance="k", queue="busy"}}'
        values: '3x4 2x15'
      # e: enqueues to jobs refused every minute; to brief for two minutes only
      - series: 'mcq_enqueue_refused_total{{job="mc_queue", instance="e", queue="jobs", reason="queue"}}'
        values: '0+1x25'
      - series: 'mcq_enqueue_refused_total{{job="mc_queue", instance="e", queue="brief", reason="key"}}'
        values: '0 1 2 2x22'
      # s: tenant:a at its cost ceiling of 5 from minute 2 on; tenant:b reached it for 5 minutes only
      - series: 'mcq_spend_ceiling{{job="mc_queue", instance="s", key="tenant:a", kind="cost"}}'
        values: '5x20'
      - series: 'mcq_spend_used{{job="mc_queue", instance="s", key="tenant:a", kind="cost"}}'
        values: '1 3 5x18'
      - series: 'mcq_spend_ceiling{{job="mc_queue", instance="s", key="tenant:b", kind="cost"}}'
        values: '5x20'
      - series: 'mcq_spend_used{{job="mc_queue", instance="s", key="tenant:b", kind="cost"}}'
        values: '5x5 2x14'
    alert_rule_test:
      - eval_time: 16m
        alertname: McqConcurrencyKeyStarved
        exp_alerts: []
      - eval_time: 18m
        alertname: McqConcurrencyKeyStarved
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: c, key: "repo:a"}}
            exp_annotations:
              summary: "Attempts have waited for a slot of repo:a for 15 minutes"
              description: "{starved}"
      - eval_time: 6m
        alertname: McqQueueAtCap
        exp_alerts: []
      - eval_time: 7m
        alertname: McqQueueAtCap
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: k, queue: full}}
            exp_annotations:
              summary: "Queue full has refused new work for 5 minutes: raise its cap or add workers"
              description: "{at_cap}"
      - eval_time: 11m
        alertname: McqSpendCeilingReached
        exp_alerts: []
      - eval_time: 12m
        alertname: McqSpendCeilingReached
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: s, key: "tenant:a", kind: cost}}
            exp_annotations:
              summary: "tenant:a has spent its cost ceiling for 10 minutes: its tasks wait"
              description: "{spent}"
      - eval_time: 10m
        alertname: McqEnqueueShedding
        exp_alerts: []
      - eval_time: 12m
        alertname: McqEnqueueShedding
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: e, queue: jobs, reason: queue}}
            exp_annotations:
              summary: "Enqueues to jobs have been refused (queue) for 10 minutes"
              description: "{shedding}"
      - eval_time: 2m
        alertname: McqRedisDown
        exp_alerts: []
      - eval_time: 10m
        alertname: McqRedisDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: mc_queue, instance: x}}
            exp_annotations:
              summary: "Redis of mc_queue (x) is unreachable"
              description: "The exporter answers but cannot reach Redis: no claim, completion or sweep can happen."
      - eval_time: 10m
        alertname: McqNamespaceNotOk
        exp_alerts:
          - exp_labels: {{severity: critical, job: mc_queue, instance: y, state: lost}}
            exp_annotations:
              summary: "mc_queue namespace on y is lost"
              description: "{namespace}"
      - eval_time: 10m
        alertname: McqQueueWaitTooLong
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: x, queue: jobs}}
            exp_annotations:
              summary: "Queue jobs: the oldest claimable Attempt has waited 16m 40s"
              description: "No worker claimed it for over 15 minutes: too few workers, or none serving this queue."
      - eval_time: 10m
        alertname: McqQueueWithoutWorkers
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: x, queue: jobs}}
            exp_annotations:
              summary: "Queue jobs has work but no live worker"
              description: "3 pending or backoff tasks and no RQ worker with a recent heartbeat serves the queue."
      - eval_time: 3m
        alertname: McqDeadLetterQueueGrowing
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: x}}
            exp_annotations:
              summary: "mc_queue quarantined 1 task(s) in the last 30 minutes"
              description: "Tasks went to the dead-letter queue: see `mcq dlq list` and `mcq attention`."
      - eval_time: 4m
        alertname: McqSweeperDead
        exp_alerts: []
      - eval_time: 7m
        alertname: McqSweeperDead
        exp_alerts: []
      - eval_time: 10m
        alertname: McqSweeperDead
        exp_alerts:
          - exp_labels: {{severity: critical, job: mc_queue, instance: x}}
            exp_annotations:
              summary: "No mc_queue sweeper pass for 8m 0s"
              description: "{sweeper_dead}"
          - exp_labels: {{severity: critical, job: mc_queue, instance: w}}
            exp_annotations:
              summary: "No mc_queue sweeper pass for 9m 0s"
              description: "{sweeper_dead}"
      - eval_time: 25m
        alertname: McqSweeperDead
        exp_alerts:
          - exp_labels: {{severity: critical, job: mc_queue, instance: w}}
            exp_annotations:
              summary: "No mc_queue sweeper pass for 24m 0s"
              description: "{sweeper_dead}"
      - eval_time: 25m
        alertname: McqNamespaceNotOk
        exp_alerts: []
      - eval_time: 6m
        alertname: McqWorkersSaturated
        exp_alerts: []
      - eval_time: 7m
        alertname: McqWorkersSaturated
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: s, queue: busyq}}
            exp_annotations:
              summary: "Queue busyq: every live worker is busy and the oldest claimable Attempt has waited 7m 0s"
              description: "{saturated}"
      - eval_time: 10m
        alertname: McqRedisMemoryHeadroomLow
        exp_alerts:
          - exp_labels: {{severity: warning, job: mc_queue, instance: x}}
            exp_annotations:
              summary: "Redis of mc_queue uses 90% of its maxmemory"
              description: "{memory}"
      - eval_time: 10m
        alertname: McqRedisWithoutMaxmemory
        exp_alerts: []
      - eval_time: 5m
        alertname: McqExporterDown
        exp_alerts: []
      - eval_time: 10m
        alertname: McqExporterDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: mc_queue, instance: x}}
            exp_annotations:
              summary: "mc_queue metrics exporter x is not answering"
              description: "Prometheus cannot scrape `mcq metrics`; no other mc_queue alert can fire while it is down."
"""


@needs_promtool
def test_the_alerts_fire_on_the_conditions_they_name(tmp_path: Path) -> None:
    """promtool's rule unit tests: each alert fires on synthetic series and stays quiet before."""
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(textwrap.dedent(RULE_TESTS).format(
        alerts=ALERTS,
        namespace="Transitions are refused until `mcq recover` has run (see `mcq status` and the namespace log).",
        sweeper_dead="Expired leases are not reconciled and the outbox is not sent while no sweeper runs "
                     "(`mcq sweeper`); when no pass was ever recorded, this counts from the namespace's creation. "
                     "A pass on a lost or recovering namespace is not recorded either.",
        saturated="Work waits for a worker: add workers serving this queue (`mcq worker --pool N`), or check "
                  "for Attempts that run far longer than usual (`mcq workers`, `mcq status`).",
        memory="With noeviction, Redis refuses writes when full (claims, completions, reconciliations). "
               "Purge finished work or raise maxmemory.",
        starved="2 Attempt(s) wait in line for the key: its holders run long (or hang until their leases "
                "expire), or it has too few slots. `mcq slots` shows the holders; `mcq slots set KEY N "
                "--reason ..` gives it more.",
        at_cap="It holds 3 task(s) not ended, its cap: every enqueue of the queue is refused with QueueFull and "
               "a retry-after (nothing written) until tasks end. `mcq caps` shows its depth and its oldest due "
               "task's wait; `mcq caps set QUEUE N --reason ..` raises the cap, more workers serving it drain it.",
        shedding="New work is refused with a retry-after, nothing written, so producers wait or give up. `mcq "
                 "caps` and `mcq fair` show the caps and what fills them; raise a cap, add workers serving the "
                 "queue, or look for a producer resending in a loop (reason overloaded: Redis memory).",
        spent="5 cost spent in the window, the ceiling: the key's Attempts are deferred (or rejected) until spend "
              "leaves the window. `mcq spend` shows spent and reserved; look for a task retrying or looping "
              "(`mcq tasks`, the attempts' cost), or raise the ceiling with `mcq spend set KEY --cost X --per "
              "SECONDS --reason ..`."))
    out = subprocess.run([str(PROMTOOL), "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------- a deployment as the exporter sees it
#
# What `mcq metrics` (the CLI, a subprocess) answers for a namespace, fed to the shipped rules with
# promtool: the scrape's samples from promtool's t=1h on (nothing before, so no alert's `for` has run
# yet), held for an hour at 1 m steps as if nothing changed afterwards. Timestamps keep their age at
# the scrape; the wait of the oldest claimable Attempt grows with the clock, as it does while nothing
# claims it; everything else stays as scraped.

LIFECYCLE_APP = "tests.apps.lifecycle_app:app"  # its handlers serve the queue "jobs"
SCRAPED_AT = 3600  # promtool seconds at which the scrape is taken


class Exporter:
    """`mcq metrics` on a free loopback port, for one namespace."""

    def __init__(self, url: str, prefix: str, tmp: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix,
                                      "metrics", "--port", str(self.port)], cwd=ROOT, stderr=subprocess.DEVNULL,
                                     env={**os.environ, "MCQ_HOME": str(tmp / "home-metrics")})

    def scrape(self) -> tuple[str, float]:
        deadline = time.monotonic() + 20
        while True:
            try:
                at = time.time()
                return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text, at
            except httpx.TransportError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "mcq metrics did not come up"
                time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def scrape_once(url: str, prefix: str, tmp: Path) -> tuple[str, float]:
    exporter = Exporter(url, prefix, tmp)
    try:
        return exporter.scrape()
    finally:
        exporter.close()


def held_series(text: str, at: float) -> list[dict[str, str]]:
    """promtool input_series holding one scrape's samples (see above)."""
    out = [{"series": 'up{job="mc_queue", instance="x"}', "values": f"_x{SCRAPED_AT // 60} 1x60"}]
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {"job": "mc_queue", "instance": "x", **s.labels}
            series = s.name + "{" + ", ".join(f'{k}="{val}"' for k, val in sorted(labels.items())) + "}"
            value = s.value
            if s.name.endswith("_timestamp_seconds") and value > 0:
                value = round(value - at) + SCRAPED_AT  # same age at the scrape
            step = 60 if s.name == "mcq_queue_age_seconds" and value > 0 else 0
            out.append({"series": series, "values": f"_x{SCRAPED_AT // 60} {value:.15g}+{step}x60"})
    return out


def firing(tmp_path: Path, series: list[dict[str, str]], expected: dict[int, set[str]]) -> None:
    """promtool says which of the shipped alerts fire, N minutes after the scrape, for each N given."""
    checks = [{"expr": 'count by (alertname) (ALERTS{alertstate="firing"})', "eval_time": f"{SCRAPED_AT // 60 + m}m",
               "exp_samples": [{"labels": f'{{alertname="{name}"}}', "value": 1} for name in sorted(names)]}
              for m, names in sorted(expected.items())]
    tests = tmp_path / "deployment_test.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": checks}]}))
    out = subprocess.run([str(PROMTOOL), "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def _mcq(url: str, prefix: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MCQ_HOME": str(tmp / "home-cli")})


@needs_promtool
def test_sweeper_dead_and_namespace_not_ok_do_not_page_on_a_namespace_never_used(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """Issue 15: "No sweeper pass for 20788d" before any sweeper ran, and McqNamespaceNotOk on a namespace
    never used. A namespace that never existed is usable (every process may start first): it pages nobody."""
    prefix = unique_prefix("fresh")
    text, at = scrape_once(redis_server.url, prefix, tmp_path)
    m, _ = parse(text)
    assert v(m, "mcq_namespace_ok") == 1 and v(m, "mcq_sweeper_last_pass_timestamp_seconds") == 0
    assert {s: v(m, "mcq_namespace_state", state=s) for s in ("ok", "missing", "lost", "recovering")} == \
        {"ok": 0, "missing": 1, "lost": 0, "recovering": 0}
    firing(tmp_path, held_series(text, at), {m: set() for m in (1, 5, 10, 30, 59)})


@needs_promtool
def test_sweeper_dead_fires_after_a_grace_period_when_a_namespace_exists_and_no_sweeper_ever_ran(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """A fresh deployment whose sweeper never started: quiet for 5 minutes after the namespace was created
    (its first enqueue), then McqSweeperDead (and the queue has work but no worker)."""
    prefix = unique_prefix("nosweep")
    out = _mcq(redis_server.url, prefix, tmp_path, "enqueue", "sleeps", "--app", LIFECYCLE_APP, "--payload",
               '{"seconds": 1}')
    assert out.returncode == 0, out.stderr
    text, at = scrape_once(redis_server.url, prefix, tmp_path)
    m, _ = parse(text)
    assert v(m, "mcq_namespace_state", state="ok") == 1
    assert 0 < at - v(m, "mcq_namespace_created_timestamp_seconds") < 60
    firing(tmp_path, held_series(text, at), {1: set(), 4: set(),
                                             7: {"McqSweeperDead", "McqQueueWithoutWorkers"}})


@needs_promtool
def test_sweeper_dead_fires_when_passes_stop_on_a_namespace_in_use(redis_server: RedisServer, tmp_path: Path) -> None:
    prefix = unique_prefix("swept")
    assert _mcq(redis_server.url, prefix, tmp_path, "enqueue", "sleeps", "--app", LIFECYCLE_APP, "--payload",
               '{"seconds": 1}').returncode == 0
    out = _mcq(redis_server.url, prefix, tmp_path, "sweeper", "--once")
    assert out.returncode == 0, out.stderr
    text, at = scrape_once(redis_server.url, prefix, tmp_path)
    m, _ = parse(text)
    assert 0 < at - v(m, "mcq_sweeper_last_pass_timestamp_seconds") < 60
    firing(tmp_path, held_series(text, at), {1: set(), 4: set(), 7: {"McqSweeperDead", "McqQueueWithoutWorkers"}})


def _live(q: mc_queue.Client, n: int) -> bool:
    return sum(1 for w in live_workers(q) if w["healthy"]) == n


@needs_promtool
def test_saturated_workers_show_busy_and_page_while_work_waits(redis_server: RedisServer, tmp_path: Path) -> None:
    """Issue 15: nothing showed all workers busy while work waits. A real worker busy with one task and
    a second task waiting: mcq_workers_busy 1, mcq_workers_idle 0, and McqWorkersSaturated once the
    oldest waiting Attempt has waited 5 minutes."""
    prefix = unique_prefix("busy")
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    env = {**os.environ, "MCQ_HOME": str(tmp_path / "home-worker")}
    worker = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                               "worker", "--app", LIFECYCLE_APP, "--kind", "simple", "--grace", "1"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    exporter = Exporter(redis_server.url, prefix, tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not _live(q, 1):
            assert worker.poll() is None and time.monotonic() < deadline, "the worker did not come up"
            time.sleep(0.1)
        idle, _ = parse(exporter.scrape()[0])
        assert v(idle, "mcq_workers_idle", queue="jobs") == 1 and v(idle, "mcq_workers_busy", queue="jobs") == 0
        producer = lifecycle_app.app.connect(redis_server.url, prefix=prefix)
        first = producer.enqueue("sleeps", {"seconds": 60})
        producer.enqueue("sleeps", {"seconds": 60})
        producer.close()
        while q.reads.get_task(first.id).state.value != "running":
            assert time.monotonic() < deadline, "the first task was not claimed"
            time.sleep(0.1)
        time.sleep(1.5)  # the second one has waited a moment
        text, at = exporter.scrape()
        m, _ = parse(text)
        assert v(m, "mcq_workers_live", queue="jobs") == 1
        assert v(m, "mcq_workers_busy", queue="jobs") == 1 and v(m, "mcq_workers_idle", queue="jobs") == 0
        assert v(m, "mcq_queue_age_seconds", queue="jobs") >= 1
        firing(tmp_path, held_series(text, at), {1: set(), 3: set(),
                                                 7: {"McqWorkersSaturated", "McqSweeperDead"}})
    finally:
        exporter.close()
        worker.terminate()
        worker.wait(30)
        q.close()

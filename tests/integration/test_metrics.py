"""Prometheus metrics from the namespace's indexes and counters, served on localhost."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, generate_latest

import mc_queue
from mc_queue import reconcile_attempt
from mc_queue.ops.metrics import NamespaceCollector
from mc_queue.testing import RedisServer, free_port


def scrape(q: mc_queue.Client) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(NamespaceCollector(q))
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_count_states_refusals_expiries_and_decisions(q: mc_queue.Client) -> None:
    a = q.producer.enqueue("jobs", "h", {"n": 1})
    q.producer.enqueue("jobs", "h", {"n": 2})
    lease = q.leases.claim_attempt(a.id, "w1", lease_ms=100)
    try:
        q.leases.claim_attempt(a.id, "w2")
    except mc_queue.ClaimRejected:
        pass
    time.sleep(0.15)
    assert len(q.maintenance.expire_leases()) == 1
    try:
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"late": True}, worker_id="w1")
    except mc_queue.StaleFence:
        pass
    reconcile_attempt(q, lease.attempt_id, apply_policy=True)
    m = scrape(q)
    assert m['mcq_tasks{queue="jobs",state="pending"}'] == 1
    assert m['mcq_queue_depth{queue="jobs"}'] == 2  # one pending, one in backoff after the retry decision
    assert m['mcq_queue_age_seconds{queue="jobs"}'] >= 0.1
    assert m["mcq_claims_refused_total"] == 1
    assert m["mcq_stale_writes_refused_total"] == 1
    assert m['mcq_leases_expired_total{kind="expired"}'] == 1
    assert m['mcq_reconciliations_total{outcome="failed"}'] == 1
    assert m['mcq_decisions_total{action="retry",failure_class="executor"}'] == 1
    assert m["mcq_leases_live"] == 0 and m["mcq_attempts_suspect"] == 0 and m["mcq_namespace_ok"] == 1


def test_mcq_metrics_serves_on_localhost(redis_server: RedisServer, prefix: str) -> None:
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    q.producer.enqueue("jobs", "h", {})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                             "metrics", "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "metrics endpoint did not come up"
                time.sleep(0.1)
        assert 'mcq_tasks{queue="jobs",state="pending"} 1.0' in body
        listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
        local = {row.split()[1] for row in listening if row.split()[3] == "0A"}  # 0A: LISTEN
        assert f"0100007F:{port:04X}" in local and f"00000000:{port:04X}" not in local  # 127.0.0.1 only
    finally:
        proc.terminate()
        proc.wait(10)

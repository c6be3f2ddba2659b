"""Prometheus metrics, read from the namespace at scrape time (prometheus-client).

Gauges come from the indexes mc_queue keeps anyway (O(queues) reads per scrape, never a scan of
tasks); counters come from the ``{prefix}:stats`` hash the Lua scripts increment in the same step as
the event they count. Served by ``mcq metrics`` on 127.0.0.1 unless told otherwise.

=========================================  =====================================================
metric                                     labels / meaning
=========================================  =====================================================
mcq_tasks                                  queue, state: tasks in each state
mcq_queue_depth                            queue: pending or backoff tasks
mcq_queue_age_seconds                      queue: wait of the oldest claimable pending Attempt
mcq_leases_live                            running Attempts holding a lease
mcq_attempts_suspect                       Attempts suspect or reconciling
mcq_attention_items                        tasks stopped for a person
mcq_quarantined_tasks                      tasks in the dead-letter queue
mcq_outbox_due                             dispatches due now (unclaimed or after backoff)
mcq_namespace_ok                           1 when the namespace is ok, 0 when lost / recovering
mcq_stale_writes_refused_total             fenced writes refused (audited as events)
mcq_leases_expired_total                   kind: expired (lease passed) | voided (recovery, cancel)
mcq_claims_refused_total                   claims refused (duplicate or late messages)
mcq_reconciliations_total                  outcome: succeeded | failed | canceled
mcq_decisions_total                        action (retry | stop | quarantine), failure_class
mcq_budget_exhaustions_total               budget: which budget ran out
=========================================  =====================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .client import Client


class NamespaceCollector(Collector):
    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        c = self.client
        k = c.keys
        status = c.status()
        tasks = GaugeMetricFamily("mcq_tasks", "Tasks by queue and state", labels=["queue", "state"])
        depth = GaugeMetricFamily("mcq_queue_depth", "Pending or backoff tasks", labels=["queue"])
        age = GaugeMetricFamily("mcq_queue_age_seconds", "Wait of the oldest claimable pending Attempt",
                                labels=["queue"])
        for queue, info in status.items():
            counts = info["counts"]
            for state, n in counts.items():
                tasks.add_metric([queue, state], n)
            depth.add_metric([queue], counts.get("pending", 0) + counts.get("backoff", 0))
            age.add_metric([queue], info["queue_age_ms"] / 1000)
        yield from (tasks, depth, age)

        ov = c.overview()
        raw = c.redis.hgetall(k.stats)
        for name, doc, value in (
            ("mcq_leases_live", "Running Attempts holding a lease", ov["leases_live"]),
            ("mcq_attempts_suspect", "Attempts suspect or reconciling", ov["suspect"]),
            ("mcq_attention_items", "Tasks stopped for a person", ov["attention"]),
            ("mcq_quarantined_tasks", "Tasks in the dead-letter queue", ov["quarantined"]),
            ("mcq_outbox_due", "Dispatches due now", ov["outbox_due"]),
            ("mcq_namespace_ok", "1 when the namespace is ok", 1 if ov["namespace_state"] == "ok" else 0),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))

        stats = {f: int(v) for f, v in cast(dict[str, str], raw).items()}
        yield CounterMetricFamily("mcq_stale_writes_refused", "Fenced writes refused",
                                  value=stats.get("stale_write_refused", 0))
        yield CounterMetricFamily("mcq_claims_refused", "Claims refused", value=stats.get("claim_refused", 0))
        expired = CounterMetricFamily("mcq_leases_expired", "Leases expired or voided", labels=["kind"])
        expired.add_metric(["expired"], stats.get("lease_expired", 0))
        expired.add_metric(["voided"], stats.get("lease_voided", 0))
        yield expired
        recon = CounterMetricFamily("mcq_reconciliations", "Reconciliations by outcome", labels=["outcome"])
        decisions = CounterMetricFamily("mcq_decisions", "Policy decisions after a failure",
                                        labels=["action", "failure_class"])
        budgets = CounterMetricFamily("mcq_budget_exhaustions", "Budgets exhausted", labels=["budget"])
        for field, n in sorted(stats.items()):
            kind, _, rest = field.partition(":")
            if kind == "reconciled":
                recon.add_metric([rest], n)
            elif kind == "decision":
                action, _, fclass = rest.partition(":")
                decisions.add_metric([action, fclass], n)
            elif kind == "budget_exhausted":
                budgets.add_metric([rest], n)
        yield from (recon, decisions, budgets)


def serve(client: Client, *, host: str = "127.0.0.1", port: int = 9464) -> None:
    """Serve /metrics for this namespace until the process ends (localhost by default)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(NamespaceCollector(client))
    start_http_server(port, addr=host, registry=registry)

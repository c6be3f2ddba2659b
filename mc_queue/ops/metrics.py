"""Prometheus metrics, read from the namespace at scrape time (prometheus-client).

Gauges come from the indexes mc_queue keeps anyway (O(queues) reads per scrape, never a scan of
tasks; the live-worker count reads RQ's worker registry and the holder of each live lease);
counters and histograms come from the ``{prefix}:stats`` hash the Lua scripts increment in the same
step as the event they count; the sweeper's liveness from the ``{prefix}:sweeper`` hash it writes
after each pass. Served by ``mcq metrics`` on 127.0.0.1 unless told otherwise.

Every counter is exported from the first scrape on, at 0 for each label set known in advance (every
refusal kind, reconciliation outcome, decision and failure class, budget; every queue of
``Reads.queues()`` for the queue gauges, every task state for ``mcq_tasks``), so ``rate()`` and
``increase()`` see the first event of each kind. Series labelled by handler exist for every
(queue, handler) pair the stats hash has seen (from the first claim of that pair on), and for every
handler of the ``app`` given to the collector from the start.

A namespace that has never existed (``missing``: no process wrote to it yet) is usable: every process
may start first, in any order. ``mcq_namespace_ok`` is 1 for it, and ``mcq_namespace_state`` says
which of ok, missing, lost, recovering it is; only lost and recovering refuse transitions.

When Redis cannot be reached, a scrape still answers (HTTP 200) with ``mcq_redis_up 0`` and
``mcq_namespace_ok 0`` and nothing else: every other series is ABSENT from that scrape (not a stale
copy), so Prometheus marks them stale and alerts on them resolve; alert on ``mcq_redis_up == 0``
(and on ``up == 0`` for the exporter itself).

=========================================  =====================================================
metric                                     labels / meaning
=========================================  =====================================================
mcq_redis_up                               1 when Redis answered this scrape, else 0
mcq_namespace_ok                           1 when the namespace is usable (ok, or missing: never used
                                           yet), 0 when lost or recovering, or Redis is down
mcq_namespace_state                        state (ok | missing | lost | recovering): 1 for the current
                                           state, 0 for the others
mcq_namespace_created_timestamp_seconds    when the namespace was created (Unix time, Redis's clock;
                                           absent while it is missing)
mcq_tasks                                  queue, state: tasks in each state (0 for empty states)
mcq_queue_depth                            queue: pending or backoff tasks
mcq_queue_age_seconds                      queue: wait of the oldest claimable pending Attempt
mcq_workers_live                           queue: RQ workers serving it whose heartbeat is recent
mcq_workers_busy                           queue: live workers serving it that are running an Attempt
                                           (RQ's state busy, or holding a lease): busy for each queue
                                           they serve
mcq_workers_idle                           queue: live workers serving it that wait for work (neither
                                           busy nor suspended by ``rq suspend``)
mcq_leases_live                            running Attempts holding a lease
mcq_attempts_suspect                       Attempts suspect or reconciling
mcq_attention_items                        tasks stopped for a person
mcq_quarantined_tasks                      tasks in the dead-letter queue
mcq_outbox_due                             Attempts claimable now and not claimed (dispatched, or due to be)
mcq_redis_memory_used_bytes                Redis ``used_memory`` (absent when INFO is not allowed)
mcq_redis_memory_max_bytes                 Redis ``maxmemory`` (0: no limit)
mcq_sweeper_last_pass_timestamp_seconds    end of the last sweeper pass, Unix time of the sweeper's
                                           host (0: no pass recorded)
mcq_sweeper_pass_duration_seconds          duration of the last sweeper pass
mcq_sweeper_passes_total                   sweeper passes (all sweepers of the namespace)
mcq_sweeper_retention_stopped              1 while retention is stopped: the archive fails (full disk,
                                           read-only mount ...), nothing is deleted, the rest goes on
mcq_stale_writes_refused_total             fenced writes refused (audited as events)
mcq_claims_refused_total                   claims refused (duplicate or late messages)
mcq_refusals_total                         kind: every refusal a script counts (claim_refused, ...)
mcq_leases_expired_total                   kind: expired (lease passed) | voided (recovery, cancel)
mcq_reconciliations_total                  outcome: succeeded | failed | canceled
mcq_decisions_total                        action (retry | stop | quarantine), failure_class
mcq_budget_exhaustions_total               budget: which budget ran out
mcq_attempts_finished_total                queue, handler, outcome (succeeded | failed | canceled):
                                           claimed Attempts that ended (complete, fail, reconcile)
mcq_attempt_duration_seconds               queue, handler: histogram, claim to end of an Attempt
mcq_queue_wait_seconds                     queue, handler: histogram, due time (enqueue, or end of
                                           the backoff) to claim
mcq_periodic_ticks_total                   schedule, outcome (ran | failed | skipped_overlap |
                                           skipped_missed | skipped_paused | triggered): ticks of each
                                           periodic schedule and what they came to
mcq_deadlines_missed_total                 queue, deadline (start_by | finish_by): tasks the sweeper
                                           canceled for a missed deadline
mcq_enqueue_refused_total                  queue, reason (queue | queue_bytes | key | key_bytes | deadline |
                                           overloaded): enqueues refused, nothing written (load shed)
mcq_dependents_total                       queue, outcome (released | canceled): tasks that waited for
                                           others (after=[...]) released, or canceled by a parent that did
                                           not succeed
mcq_released_pending                       parents ended whose dependents the sweeper has not released yet
mcq_rate_limit_units                       key: units a rate limit admits per window (set ones only)
mcq_rate_limit_window_seconds              key: its sliding window
mcq_rate_limit_used                        key: units taken in the window ending now (Redis clock)
mcq_rate_limit_paused                      key: 1 while a pause holds its claims (a provider's 429, an operator)
mcq_rate_limit_deferred_total              key: claims it deferred (over the limit, or paused)
mcq_breaker_state                          key: a dependency's circuit breaker, 0 closed, 1 open, 2 half-open
mcq_breaker_opened_total                   key: times it opened (its failures, slow calls or one failure
                                           repeated; a probe that failed)
mcq_breaker_deferred_total                 key: claims it held while open or half-open
mcq_breaker_calls_total                    key, outcome (ok | fail | slow): calls recorded through ctx.call
mcq_concurrency_slots                      key: running Attempts a concurrency key admits (its own setting
                                           or its family's; a family '<name>:*' under its own key;
                                           absent while the key is unlimited)
mcq_concurrency_running                    key: running Attempts holding one of its slots
mcq_concurrency_waiting                    key: Attempts parked in line for a slot
mcq_concurrency_waited_total               key: claims that found every slot held and waited (or superseded)
mcq_concurrency_rejected_total             key: claims it rejected when full (their tasks canceled)
mcq_queue_cap                              queue: a capped queue's cap (backpressure: tasks not ended it
                                           admits; absent while the queue has none)
mcq_queue_cap_depth                        queue: a capped queue's tasks not ended (pending, scheduled,
                                           backoff, running, waiting), what its cap bounds (not
                                           mcq_queue_depth: that one counts pending and backoff only)
mcq_probe_failing                          worker, key: 1 while a live worker's health probe of a dependency
                                           fails (app.probe: it claims no task needing it), else 0
mcq_spend_ceiling                          key, kind (cost | tokens): a spend ceiling per window (its own
                                           setting or its family's; absent while not capped)
mcq_spend_window_seconds                   key: its window
mcq_spend_used                             key, kind: spent in the window ending now by the key's Attempts
mcq_spend_reserved                         key, kind: reserved by its running Attempts (their budgets' rest)
mcq_spend_deferred_total                   key: claims it deferred (over the ceiling, on_over wait)
mcq_spend_rejected_total                   key: claims it rejected (their tasks canceled, on_over reject)
mcq_fair_weight                            key: a fairness key's weight in the fair lanes (its own, its
                                           family's, or 1), for each key with a weight set or messages queued
mcq_fair_queued                            key, queue, priority: its messages waiting in that RQ queue's lane
mcq_queue_cap_bytes                        queue: its cap by bytes of payload of its tasks not ended
mcq_queue_bytes                            queue: the bytes of payload of its tasks not ended (capped by bytes)
mcq_key_cap                                key: a fairness key's cap of tasks not ended (its own or its
                                           family's; absent while not capped)
mcq_key_open                               key: its tasks not ended, every queue (what its cap bounds)
mcq_deadline_slack_seconds                 queue: its nearest deadline (a waiting task's start_by or a
                                           task's finish_by) less now; negative: missed, not acted on yet
mcq_periodic_paused                        schedule: 1 while paused by an operator
mcq_periodic_next_tick_timestamp_seconds   schedule: when its next tick is due (Unix time, Redis's clock)
=========================================  =====================================================

The histograms' buckets (:data:`BUCKETS_S`) are those of ``METRIC_BUCKETS_MS`` in
``lua/includes/common.lua``: the scripts count each observation in one bucket, the exporter adds them
up into Prometheus's cumulative ``le`` buckets.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, cast

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..client import Client
from ..contracts.models import TERMINAL_ATTEMPT_STATES, FailureClass, TaskState
from ..producer.app import App

log = logging.getLogger("mc_queue.metrics")

# Upper bounds of the histogram buckets, seconds (METRIC_BUCKETS_MS in lua/includes/common.lua, in ms).
BUCKETS_S: tuple[float, ...] = (0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)
OUTCOMES = tuple(sorted(s.value for s in TERMINAL_ATTEMPT_STATES))  # canceled, failed, succeeded
# Why an enqueue was refused (lua/includes/admit.lua refusal_counted): a queue's cap by count or bytes, its
# fairness key's, a start_by the queue cannot meet, Redis memory above the enqueue mark.
REFUSED_REASONS = ("queue", "queue_bytes", "key", "key_bytes", "deadline", "overloaded")
# Refusals the scripts count in the stats hash (refuse(K.events, K.stats, '<kind>', ...)).
REFUSALS = ("cancel_ack_refused", "cancel_refused", "checkpoint_refused", "claim_refused", "completion_conflict",
            "effect_conflict", "effect_refused", "failure_conflict", "purge_refused", "reconcile_refused",
            "replay_refused", "retry_refused", "settle_refused", "stale_write_refused")
ACTIONS = ("retry", "stop", "quarantine")  # decisions counted (wait is no decision to alert on)
FAILURE_CLASSES = tuple(c.value for c in FailureClass)
BUDGETS = ("attempts", "same_fingerprint", "cost", "tokens", "wall_time", "interruptions", "cost_or_tokens")
RECONCILED = ("succeeded", "failed", "canceled")
_HIST_KINDS = {"wait": 4, "fin": 5}  # stats field kind -> number of '|' parts


class NamespaceCollector(Collector):
    """Collects the namespace's series at each scrape. ``app``: its handlers' (queue, handler) pairs are
    exported from the start (at 0), not only from the first claim on."""

    def __init__(self, client: Client, *, app: App | None = None) -> None:
        self.client = client
        self.known_pairs: set[tuple[str, str]] = (
            {(spec.queue, name) for name, spec in app.handlers.items()} if app is not None else set())

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self._families())
            up = 1.0
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # Redis down: the exporter still answers
            log.warning("metrics: Redis unreachable: %s", exc)
            families = [GaugeMetricFamily("mcq_namespace_ok", "1 when the namespace is ok", value=0.0)]
            up = 0.0
        yield GaugeMetricFamily("mcq_redis_up", "1 when Redis answered this scrape", value=up)
        yield from families

    def _families(self) -> Iterator[Metric]:
        c = self.client
        k = c.keys
        status = c.reads.status()
        ov = c.reads.overview()
        pipe = c.redis.pipeline(transaction=False)
        pipe.hgetall(k.stats)
        pipe.hgetall(k.sweeper)
        pipe.hget(k.meta, "created_at")
        raw_stats, raw_sweeper, created_ms = pipe.execute()
        yield from _namespace(str(ov["namespace_state"]), created_ms)

        tasks = GaugeMetricFamily("mcq_tasks", "Tasks by queue and state", labels=["queue", "state"])
        depth = GaugeMetricFamily("mcq_queue_depth", "Pending or backoff tasks", labels=["queue"])
        age = GaugeMetricFamily("mcq_queue_age_seconds", "Wait of the oldest claimable pending Attempt",
                                labels=["queue"])
        for queue, info in sorted(status.items()):
            counts = info["counts"]
            for state in sorted({s.value for s in TaskState} | set(counts)):
                tasks.add_metric([queue, state], counts.get(state, 0))
            depth.add_metric([queue], counts.get("pending", 0) + counts.get("backoff", 0))
            age.add_metric([queue], info["queue_age_ms"] / 1000)
        yield from (tasks, depth, age)
        yield from self._workers(sorted(status))

        for name, doc, value in (
            ("mcq_leases_live", "Running Attempts holding a lease", ov["leases_live"]),
            ("mcq_attempts_suspect", "Attempts suspect or reconciling", ov["suspect"]),
            ("mcq_attention_items", "Tasks stopped for a person", ov["attention"]),
            ("mcq_quarantined_tasks", "Tasks in the dead-letter queue", ov["quarantined"]),
            ("mcq_outbox_due", "Attempts claimable now and not claimed (dispatched, or due to be)", ov["outbox_due"]),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))
        yield from self._memory()
        yield from _sweeper(cast(dict[str, str], raw_sweeper))
        yield from self._counters({f: int(v) for f, v in cast(dict[str, str], raw_stats).items()})
        yield from _periodic(c.periodic.status())
        yield from self._deadlines(sorted(status), {f: int(v) for f, v in cast(dict[str, str], raw_stats).items()})
        yield from self._limits()
        yield from self._slots(cast(dict[str, str], raw_stats))
        yield from self._caps()
        yield from self._spend()
        yield from self._fair()

    def _limits(self) -> Iterator[Metric]:
        """Each rate limit: its setting, the units in its window now, its pause, the claims it deferred."""
        units = GaugeMetricFamily("mcq_rate_limit_units", "Units a rate limit admits per window", labels=["key"])
        window = GaugeMetricFamily("mcq_rate_limit_window_seconds", "A rate limit's sliding window", labels=["key"])
        used = GaugeMetricFamily("mcq_rate_limit_used", "Units taken in the window ending now", labels=["key"])
        paused = GaugeMetricFamily("mcq_rate_limit_paused", "1 while a pause holds the key's claims", labels=["key"])
        deferred = CounterMetricFamily("mcq_rate_limit_deferred", "Claims a rate limit deferred", labels=["key"])
        state = GaugeMetricFamily("mcq_breaker_state", "A circuit breaker: 0 closed, 1 open, 2 half-open",
                                  labels=["key"])
        opened = CounterMetricFamily("mcq_breaker_opened", "Times a circuit breaker opened", labels=["key"])
        held = CounterMetricFamily("mcq_breaker_deferred", "Claims a circuit breaker held", labels=["key"])
        calls = CounterMetricFamily("mcq_breaker_calls", "Dependency calls recorded", labels=["key", "outcome"])
        stats = cast(dict[str, str], self.client.redis.hgetall(self.client.keys.stats))
        for s in self.client.limits.all():
            if s.breaker is not None or s.breaker_state != "closed":
                state.add_metric([s.key], {"closed": 0.0, "open": 1.0, "half": 2.0}.get(s.breaker_state, 0.0))
                opened.add_metric([s.key], s.breaker_opened)
                held.add_metric([s.key], s.breaker_deferred)
                for outcome in ("ok", "fail", "slow"):
                    calls.add_metric([s.key, outcome], int(stats.get(f"breaker_calls|{s.key}|{outcome}") or 0))
            if s.limit is not None and s.window_ms is not None:
                units.add_metric([s.key], s.limit)
                window.add_metric([s.key], s.window_ms / 1000)
                used.add_metric([s.key], s.used)
            paused.add_metric([s.key], 1.0 if s.paused else 0.0)
            deferred.add_metric([s.key], s.deferred)
        yield from (units, window, used, paused, deferred, state, opened, held, calls)

    def _slots(self, stats: dict[str, str]) -> Iterator[Metric]:
        """Each concurrency key: its slots, the Attempts running with one and waiting for one, and the
        claims that waited or were rejected (one ``Slots.all()``). A key it does not list (no setting of its
        own, nothing held or waiting now: an idle key of a family, or one whose slots were deleted) keeps
        its counters, read from the stats hash, with running and waiting 0 and no slots gauge, so its
        series do not vanish between waits."""
        setting = GaugeMetricFamily("mcq_concurrency_slots", "Running Attempts a concurrency key admits "
                                    "(absent: unlimited)", labels=["key"])
        running = GaugeMetricFamily("mcq_concurrency_running", "Running Attempts holding a slot of the key",
                                    labels=["key"])
        waiting = GaugeMetricFamily("mcq_concurrency_waiting", "Attempts waiting in line for a slot of the key",
                                    labels=["key"])
        waited = CounterMetricFamily("mcq_concurrency_waited", "Claims that found every slot of the key held",
                                     labels=["key"])
        rejected = CounterMetricFamily("mcq_concurrency_rejected", "Claims the key rejected when full",
                                       labels=["key"])
        seen = set()
        for s in self.client.slots.all():
            seen.add(s.key)
            if s.slots is not None:
                setting.add_metric([s.key], s.slots)
            running.add_metric([s.key], s.running)
            waiting.add_metric([s.key], s.waiting)
            waited.add_metric([s.key], s.waited)
            rejected.add_metric([s.key], s.rejected)
        idle = sorted({f.partition("|")[2] for f in stats if f.startswith(("slot_waited|", "slot_rejected|"))} - seen)
        for key in idle:
            running.add_metric([key], 0)
            waiting.add_metric([key], 0)
            waited.add_metric([key], int(stats.get(f"slot_waited|{key}") or 0))
            rejected.add_metric([key], int(stats.get(f"slot_rejected|{key}") or 0))
        yield from (setting, running, waiting, waited, rejected)

    def _caps(self) -> Iterator[Metric]:
        """Each capped queue: its cap and the tasks it holds that have not ended (one ``Caps.all()``; a queue
        without a cap has no series). The enqueue scripts do not count their refusals (E_FULL) in the stats
        hash, so there is no refusal counter: depth at the cap is the signal (``McqQueueAtCap``)."""
        cap = GaugeMetricFamily("mcq_queue_cap", "A capped queue's cap: tasks not ended it admits", labels=["queue"])
        depth = GaugeMetricFamily("mcq_queue_cap_depth", "A capped queue's tasks not ended (pending, scheduled, "
                                  "backoff, running, waiting)", labels=["queue"])
        cap_bytes = GaugeMetricFamily("mcq_queue_cap_bytes", "A queue's cap by bytes of payload of its tasks not "
                                      "ended", labels=["queue"])
        held = GaugeMetricFamily("mcq_queue_bytes", "Bytes of payload of a capped queue's tasks not ended",
                                 labels=["queue"])
        for s in self.client.caps.all():
            if s.max_depth is not None:
                cap.add_metric([s.queue], s.max_depth)
                depth.add_metric([s.queue], s.depth)
            if s.max_bytes is not None:
                cap_bytes.add_metric([s.queue], s.max_bytes)
                held.add_metric([s.queue], s.bytes)
        yield from (cap, depth, cap_bytes, held)

    def _spend(self) -> Iterator[Metric]:
        """Each spend ceiling: its ceilings and window, what was spent in the window ending now and what
        running Attempts reserved, per kind (cost, tokens), and the claims it deferred or rejected (one
        ``Spend.all()``)."""
        ceiling = GaugeMetricFamily("mcq_spend_ceiling", "A key's spend ceiling per window", labels=["key", "kind"])
        window = GaugeMetricFamily("mcq_spend_window_seconds", "A spend ceiling's window", labels=["key"])
        used = GaugeMetricFamily("mcq_spend_used", "Spent in the window ending now", labels=["key", "kind"])
        reserved = GaugeMetricFamily("mcq_spend_reserved", "Reserved by running Attempts", labels=["key", "kind"])
        deferred = CounterMetricFamily("mcq_spend_deferred", "Claims a spend ceiling deferred", labels=["key"])
        rejected = CounterMetricFamily("mcq_spend_rejected", "Claims a spend ceiling rejected", labels=["key"])
        for s in self.client.spend.all():
            for kind, cap, spent, held in (("cost", s.cost, s.spent_cost, s.reserved_cost),
                                           ("tokens", s.tokens, s.spent_tokens, s.reserved_tokens)):
                if cap is not None:
                    ceiling.add_metric([s.key, kind], cap)
                used.add_metric([s.key, kind], spent)
                reserved.add_metric([s.key, kind], held)
            if s.window_s is not None:
                window.add_metric([s.key], s.window_s)
            deferred.add_metric([s.key], s.deferred)
            rejected.add_metric([s.key], s.rejected)
        yield from (ceiling, window, used, reserved, deferred, rejected)

    def _fair(self) -> Iterator[Metric]:
        """Each fairness key: its weight, and its messages waiting in each queue's fair lanes."""
        weight = GaugeMetricFamily("mcq_fair_weight", "A fairness key's weight in the fair lanes", labels=["key"])
        queued = GaugeMetricFamily("mcq_fair_queued", "Messages waiting in a key's fair lane",
                                   labels=["key", "queue", "priority"])
        for s in self.client.fairness.all():
            weight.add_metric([s.key], s.weight)
            for where, n in s.queued.items():
                queue, _, p = where.rpartition("@p")
                queued.add_metric([s.key, queue, p], n)
        key_cap = GaugeMetricFamily("mcq_key_cap", "A fairness key's cap of tasks not ended", labels=["key"])
        key_open = GaugeMetricFamily("mcq_key_open", "A fairness key's tasks not ended", labels=["key"])
        for c in self.client.caps.keys_all():
            if c.max_open is not None:
                key_cap.add_metric([c.key], c.max_open)
            key_open.add_metric([c.key], c.open)
        yield from (weight, queued, key_cap, key_open)

    def _deadlines(self, queues: list[str], stats: dict[str, int]) -> Iterator[Metric]:
        """Deadlines missed per queue and kind, and each queue's slack: its nearest deadline (start_by of a
        task not started, or finish_by) less now, negative once missed and not yet acted on."""
        missed = CounterMetricFamily("mcq_deadlines_missed", "Tasks canceled for a missed deadline",
                                     labels=["queue", "deadline"])
        slack = GaugeMetricFamily("mcq_deadline_slack_seconds", "Nearest deadline of a queue's waiting or "
                                  "running tasks, less now (Redis clock)", labels=["queue"])
        pipe = self.client.redis.pipeline(transaction=False)
        pipe.time()
        for queue in queues:
            pipe.zrange(self.client.keys.deadlines(queue), 0, 0, withscores=True)
        (now_s, now_us), *firsts = pipe.execute() if queues else ((0, 0),)
        now = int(now_s) * 1000 + int(now_us) // 1000
        dependents = CounterMetricFamily("mcq_dependents", "Tasks that waited for others, released or canceled",
                                         labels=["queue", "outcome"])
        for queue, first in zip(queues, firsts, strict=True):
            for kind in ("start_by", "finish_by"):
                missed.add_metric([queue, kind], stats.get(f"deadline_missed|{queue}|{kind}", 0))
            if first:
                slack.add_metric([queue], (first[0][1] - now) / 1000)
            for outcome in ("released", "canceled"):
                dependents.add_metric([queue, outcome], stats.get(f"dependents|{queue}|{outcome}", 0))
        owed = GaugeMetricFamily("mcq_released_pending", "Parents ended whose dependents are not released yet",
                                 value=int(self.client.redis.zcard(self.client.keys.released)))
        refused = CounterMetricFamily("mcq_enqueue_refused", "Enqueues refused by a cap, a deadline the queue "
                                      "cannot meet, or memory pressure (nothing written)", labels=["queue", "reason"])
        seen = {tuple(f.split("|")[1:]) for f in stats if f.startswith("enqueue_refused|") and f.count("|") == 2}
        for queue, reason in sorted(seen | {(q, r) for q in queues for r in REFUSED_REASONS}):
            refused.add_metric([queue, reason], stats.get(f"enqueue_refused|{queue}|{reason}", 0))
        yield from (missed, slack, dependents, owed, refused)

    def _workers(self, queues: list[str]) -> Iterator[GaugeMetricFamily]:
        """Live, busy and idle workers per queue, from ``mcq workers``'s view (RQ's worker registry and
        state, mc_queue's liveness keys and lease holders)."""
        from ..worker.runner import live_workers

        counts = {kind: dict.fromkeys(queues, 0) for kind in ("live", "busy", "idle")}
        probe = GaugeMetricFamily("mcq_probe_failing", "1 while a live worker's health probe of a dependency "
                                  "fails (it claims no task needing it), else 0", labels=["worker", "key"])
        for w in live_workers(self.client):
            for key, said in w["probes"].items():
                probe.add_metric([w["worker"], key], 0.0 if said == "ok" else 1.0)
            if not w["healthy"]:
                continue
            busy = w["state"] == "busy" or bool(w["leases"])
            kinds = ("live", "busy") if busy else ("live",) if w["state"] == "suspended" else ("live", "idle")
            for queue in w["queues"]:
                for kind in kinds:
                    counts[kind][queue] = counts[kind].get(queue, 0) + 1
        for kind, doc in (("live", "RQ workers serving the queue with a recent heartbeat"),
                          ("busy", "Live workers serving the queue that are running an Attempt"),
                          ("idle", "Live workers serving the queue that wait for work")):
            family = GaugeMetricFamily(f"mcq_workers_{kind}", doc, labels=["queue"])
            for queue in sorted(counts["live"]):
                family.add_metric([queue], counts[kind].get(queue, 0))
            yield family
        yield probe

    def _memory(self) -> Iterator[GaugeMetricFamily]:
        try:
            info = self.client.redis.info("memory")
        except redis.ResponseError as exc:  # INFO not allowed for this ACL user
            log.info("metrics: INFO memory refused: %s", exc)
            return
        yield GaugeMetricFamily("mcq_redis_memory_used_bytes", "Redis used_memory",
                                value=float(info.get("used_memory", 0)))
        yield GaugeMetricFamily("mcq_redis_memory_max_bytes", "Redis maxmemory (0: no limit)",
                                value=float(info.get("maxmemory", 0)))

    def _counters(self, stats: dict[str, int]) -> Iterator[Metric]:
        yield CounterMetricFamily("mcq_stale_writes_refused", "Fenced writes refused",
                                  value=stats.get("stale_write_refused", 0))
        yield CounterMetricFamily("mcq_claims_refused", "Claims refused", value=stats.get("claim_refused", 0))
        refusals = CounterMetricFamily("mcq_refusals", "Refusals by kind (each also an event)", labels=["kind"])
        for kind in sorted(set(REFUSALS) | {f for f in stats if "|" not in f and ":" not in f
                                            and f.endswith(("_refused", "_conflict"))}):
            refusals.add_metric([kind], stats.get(kind, 0))
        yield refusals
        expired = CounterMetricFamily("mcq_leases_expired", "Leases expired or voided", labels=["kind"])
        expired.add_metric(["expired"], stats.get("lease_expired", 0))
        expired.add_metric(["voided"], stats.get("lease_voided", 0))
        yield expired

        recon = dict.fromkeys(RECONCILED, 0)
        decisions = {(a, f): 0 for a in ACTIONS for f in FAILURE_CLASSES}
        budgets = dict.fromkeys(BUDGETS, 0)
        buckets: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0] * (len(BUCKETS_S) + 1))
        sums: dict[tuple[str, str, str], int] = defaultdict(int)
        finished: dict[tuple[str, str, str], int] = defaultdict(int)
        pairs = set(self.known_pairs)
        for field, n in stats.items():
            if "|" in field:
                parts = field.split("|")
                kind = parts[0]
                if _HIST_KINDS.get(kind) == len(parts) and parts[-1].isdigit() \
                        and 1 <= int(parts[-1]) <= len(BUCKETS_S) + 1:
                    pairs.add((parts[1], parts[2]))
                    buckets[kind, parts[1], parts[2]][int(parts[-1]) - 1] += n
                    if kind == "fin":
                        finished[parts[1], parts[2], parts[3]] += n
                elif kind in ("wait_ms", "fin_ms") and len(parts) == 3:
                    pairs.add((parts[1], parts[2]))
                    sums[kind[:-3], parts[1], parts[2]] += n
                continue
            kind, _, rest = field.partition(":")
            if kind == "reconciled":
                recon[rest] = n
            elif kind == "decision":
                action, _, fclass = rest.partition(":")
                decisions[action, fclass] = n
            elif kind == "budget_exhausted":
                budgets[rest] = n

        family = CounterMetricFamily("mcq_reconciliations", "Reconciliations by outcome", labels=["outcome"])
        for outcome, n in recon.items():
            family.add_metric([outcome], n)
        yield family
        family = CounterMetricFamily("mcq_decisions", "Policy decisions after a failure",
                                     labels=["action", "failure_class"])
        for (action, fclass), n in decisions.items():
            family.add_metric([action, fclass], n)
        yield family
        family = CounterMetricFamily("mcq_budget_exhaustions", "Budgets exhausted", labels=["budget"])
        for budget, n in budgets.items():
            family.add_metric([budget], n)
        yield family

        family = CounterMetricFamily("mcq_attempts_finished", "Claimed Attempts that ended, by outcome",
                                     labels=["queue", "handler", "outcome"])
        for queue, handler in sorted(pairs):
            for outcome in sorted(set(OUTCOMES) | {o for (q, h, o) in finished if (q, h) == (queue, handler)}):
                family.add_metric([queue, handler, outcome], finished.get((queue, handler, outcome), 0))
        yield family
        for kind, name, doc in (
            ("fin", "mcq_attempt_duration_seconds", "Attempt duration, claim to end"),
            ("wait", "mcq_queue_wait_seconds", "Wait of an Attempt from its due time (enqueue or end of backoff) "
                                               "to its claim"),
        ):
            hist = HistogramMetricFamily(name, doc, labels=["queue", "handler"])
            for queue, handler in sorted(pairs):
                hist.add_metric([queue, handler], _cumulative(buckets.get((kind, queue, handler))),
                                sum_value=sums.get((kind, queue, handler), 0) / 1000)
            yield hist


def _cumulative(per_bucket: list[int] | None) -> list[tuple[str, float]]:
    """Prometheus's cumulative buckets (le, count) from the per-bucket counts of the stats hash."""
    counts = per_bucket or [0] * (len(BUCKETS_S) + 1)
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip([*BUCKETS_S, float("inf")], counts, strict=True):
        total += n
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
    return out


NAMESPACE_STATES = ("ok", "missing", "lost", "recovering")


def _namespace(state: str, created_ms: Any) -> Iterable[Metric]:
    """Usable (ok, or missing: never used yet, so nothing was lost), the state itself, and when it was
    created (absent while it is missing, or when its meta has no creation time)."""
    yield GaugeMetricFamily("mcq_namespace_ok", "1 when the namespace is usable (ok, or never used yet)",
                            value=1.0 if state in ("ok", "missing") else 0.0)
    family = GaugeMetricFamily("mcq_namespace_state", "1 for the namespace's state (ok, missing, lost, recovering)",
                               labels=["state"])
    for name in sorted({*NAMESPACE_STATES, state}):
        family.add_metric([name], 1.0 if name == state else 0.0)
    yield family
    if created_ms and str(created_ms).isdigit():
        yield GaugeMetricFamily("mcq_namespace_created_timestamp_seconds",
                                "When the namespace was created (Unix time, Redis's clock)",
                                value=int(created_ms) / 1000)


def _periodic(rows: list[dict[str, Any]]) -> Iterable[Metric]:
    """Each published periodic schedule's ticks by outcome, its pause, and when its next tick is due."""
    ticks = CounterMetricFamily("mcq_periodic_ticks", "Ticks of a periodic schedule by outcome (ran, failed, "
                                "skipped_overlap, skipped_missed, skipped_paused, triggered)",
                                labels=["schedule", "outcome"])
    paused = GaugeMetricFamily("mcq_periodic_paused", "1 while the schedule is paused", labels=["schedule"])
    nxt = GaugeMetricFamily("mcq_periodic_next_tick_timestamp_seconds", "When the next tick is due (Redis's clock)",
                            labels=["schedule"])
    for r in rows:
        for outcome, n in r["counts"].items():
            ticks.add_metric([r["name"], outcome], n)
        paused.add_metric([r["name"]], 1.0 if r["paused"] else 0.0)
        if r["next_tick_ms"]:
            nxt.add_metric([r["name"]], r["next_tick_ms"] / 1000)
    yield from (ticks, paused, nxt)


def _sweeper(raw: dict[str, str]) -> Iterable[Metric]:
    yield GaugeMetricFamily("mcq_sweeper_last_pass_timestamp_seconds",
                            "End of the last sweeper pass (Unix time; 0: none recorded)",
                            value=int(raw.get("last_pass_ms") or 0) / 1000)
    yield GaugeMetricFamily("mcq_sweeper_pass_duration_seconds", "Duration of the last sweeper pass",
                            value=float(raw.get("pass_ms") or 0) / 1000)
    yield CounterMetricFamily("mcq_sweeper_passes", "Sweeper passes", value=int(raw.get("passes") or 0))
    yield GaugeMetricFamily("mcq_sweeper_retention_stopped",
                            "1 while retention is stopped because the archive fails (nothing is deleted)",
                            value=1 if raw.get("retention_error") else 0)


def serve(client: Client, *, host: str = "127.0.0.1", port: int = 9464, app: App | None = None) -> Any:
    """Serve /metrics for this namespace until the process ends (localhost by default). Returns what
    prometheus-client's ``start_http_server`` returns (the server and its thread: ``server.shutdown()``)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(NamespaceCollector(client, app=app))
    return start_http_server(port, addr=host, registry=registry)

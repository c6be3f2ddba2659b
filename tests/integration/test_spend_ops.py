"""Spend ceilings as operators see them (issue 19, denial of wallet): `mcq spend` as an operator runs it (a
real process against the session's redis-server: the list and --json, set and delete recorded in the
namespace log, bad input refused with exit 2 and nothing written), and each ceiling's metrics."""

from __future__ import annotations

import json

import mc_queue
from mc_queue import Budget, OverLimit
from mc_queue.testing import RedisServer
from tests.integration.test_caps_ops import mcq, namespace_keys, ok


def test_mcq_spend_sets_lists_and_deletes_ceilings(redis_server: RedisServer, prefix: str) -> None:
    assert ok(redis_server, prefix, "spend").startswith("no spend ceilings")
    assert json.loads(ok(redis_server, prefix, "spend", "--json")) == {"spend": []}
    assert ok(redis_server, prefix, "spend", "set", "tenant:*", "--cost", "50", "--tokens", "2000000", "--per",
              "3600", "--reason", "each tenant's hourly ceiling") == "spend tenant:*: set (wait when over)\n"
    assert ok(redis_server, prefix, "spend", "set", "tenant:*", "--cost", "50", "--tokens", "2000000", "--per",
              "3600", "--reason", "each tenant's hourly ceiling").endswith("(unchanged)\n")
    rows = json.loads(ok(redis_server, prefix, "spend", "--json"))["spend"]
    assert rows == [{"key": "tenant:*", "cost": 50.0, "tokens": 2_000_000, "window_s": 3600.0, "on_over": "wait",
                     "setting": "own", "family": False, "source": "operator", "spent_cost": 0.0, "spent_tokens": 0,
                     "reserved_cost": 0.0, "reserved_tokens": 0, "running": 0, "deferred": 0, "rejected": 0}]
    assert ok(redis_server, prefix, "spend").startswith(
        "tenant:*: cost 50 and 2,000,000 tokens per 3600 s for each key of the family (own, operator), wait when over")
    assert ok(redis_server, prefix, "spend", "delete", "tenant:*", "--reason", "no ceiling any more") == \
        "spend tenant:* deleted\n"
    assert ok(redis_server, prefix, "spend", "delete", "tenant:*", "--reason", "no ceiling any more") == \
        "spend tenant:*: none set\n"
    q = mc_queue.Client(redis_server.url, prefix=prefix)
    seen = [e["type"] for e in q.reads.namespace_events() if e["type"].startswith("spend_")]
    assert seen == ["spend_set", "spend_deleted"]
    q.close()


def test_bad_input_is_refused_before_anything_is_written(redis_server: RedisServer, prefix: str) -> None:
    ok(redis_server, prefix, "spend")  # (the namespace exists)
    before = namespace_keys(redis_server, prefix)
    for args, says in ((["set", "tenant:a", "--per", "60"], "give --cost, --tokens or both"),
                       (["set", "tenant:a", "--cost", "0", "--per", "60"], "--cost"),
                       (["set", "tenant:a", "--cost", "nan", "--per", "60"], "cost must be a number above 0"),
                       (["set", "tenant:a", "--tokens", "-5", "--per", "60"], "--tokens"),
                       (["set", "tenant:a", "--cost", "1", "--per", "0"], "--per"),
                       (["set", "bad key", "--cost", "1", "--per", "60"], "invalid concurrency key"),
                       (["set", "tenant:a", "--cost", "1", "--per", "60", "--on-over", "supersede"], "--on-over")):
        out = mcq(redis_server, prefix, "spend", *args, "--reason", "a reason long enough")
        assert out.returncode == 2 and says in out.stderr, (args, out.returncode, out.stderr)
    assert namespace_keys(redis_server, prefix) == before


def test_the_metrics_show_each_ceiling_what_was_spent_and_reserved(q: mc_queue.Client) -> None:
    from mc_queue.ops.metrics import NamespaceCollector
    from tests.integration.test_metrics_alerts import scrape, v

    q.spend.set("tenant:a", cost=1.0, per_s=3600, reason="a small ceiling")
    a, b, c = (q.producer.enqueue("jobs", "h", {"n": i}, limits={"tenant:a": 0}, budget=Budget(max_cost=0.4))
               for i in range(3))
    la = q.leases.claim_attempt(a.id, "w1", 60_000, limits=("tenant:a",))
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": 1}, worker_id="w1", cost=0.3, tokens=12)
    q.leases.claim_attempt(b.id, "w1", 60_000, limits=("tenant:a",))
    try:
        q.leases.claim_attempt(c.id, "w1", 60_000, limits=("tenant:a",))  # 0.3 + 0.4 + 0.4 > 1
        raise AssertionError("the third claim was admitted")
    except OverLimit:
        pass
    m, types = scrape(NamespaceCollector(q))
    assert types["mcq_spend_ceiling"] == "gauge" and types["mcq_spend_deferred"] == "counter"
    assert v(m, "mcq_spend_ceiling", key="tenant:a", kind="cost") == 1.0
    assert not any(name == "mcq_spend_ceiling" and ("kind", "tokens") in labels for name, labels in m)
    assert v(m, "mcq_spend_used", key="tenant:a", kind="cost") == 0.3
    assert v(m, "mcq_spend_used", key="tenant:a", kind="tokens") == 12
    assert v(m, "mcq_spend_reserved", key="tenant:a", kind="cost") == 0.4
    assert v(m, "mcq_spend_window_seconds", key="tenant:a") == 3600
    assert v(m, "mcq_spend_deferred_total", key="tenant:a") == 1
    assert v(m, "mcq_spend_rejected_total", key="tenant:a") == 0

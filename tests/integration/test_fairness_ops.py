"""Fair shares as operators see them (issue 19): `mcq fair` as an operator runs it (a real process against the
session's redis-server: the list and --json, set and delete recorded in the namespace log, bad input refused
with exit 2 and nothing written), `mcq show` naming a task's fairness key, and each key's metrics."""

from __future__ import annotations

import json

import mc_queue
from mc_queue.testing import RedisServer
from tests.integration.test_caps_ops import mcq, namespace_keys, ok


def test_mcq_fair_sets_lists_and_deletes_weights(redis_server: RedisServer, prefix: str) -> None:
    assert ok(redis_server, prefix, "fair").startswith("no fairness keys")
    assert json.loads(ok(redis_server, prefix, "fair", "--json")) == {"fair": []}
    assert ok(redis_server, prefix, "fair", "set", "tenant:*", "3", "--reason", "every tenant counts thrice") == \
        "fair tenant:*: weight 3\n"
    assert ok(redis_server, prefix, "fair", "set", "tenant:*", "3", "--reason", "every tenant counts thrice") \
        .endswith("(unchanged)\n")
    q = mc_queue.Client(redis_server.url, prefix=prefix)
    task = q.producer.enqueue("jobs", "h", {"n": 1}, fair_key="tenant:acme")
    q.runner.run("fair_push", {"lanes": q.keys.fair_lanes("jobs", 5), "turns": q.keys.fair_turns("jobs", 5)},
                 {"lane": "tenant:acme", "job_id": "mcq-x-1"})
    rows = json.loads(ok(redis_server, prefix, "fair", "--json"))["fair"]
    assert rows == [{"key": "tenant:*", "weight": 3, "setting": "own", "family": False, "source": "operator",
                     "queued": {}, "cap": None, "cap_family": False, "open": 0, "max_bytes": None,
                     "bytes": 0},
                    {"key": "tenant:acme", "weight": 3, "setting": "family tenant:*", "family": True,
                     "source": "operator", "queued": {"jobs@p5": 1}, "cap": None, "cap_family": False, "open": 1,
                     "max_bytes": None, "bytes": 7}]
    assert ok(redis_server, prefix, "fair").splitlines() == [
        "tenant:*: weight 3 for each key of the family (own, operator); messages queued: none",
        "tenant:acme: weight 3 (family tenant:*, operator); messages queued: 1 in jobs@p5; 1 task(s) not ended"]
    assert "fair key: tenant:acme" in ok(redis_server, prefix, "show", task.id)
    assert ok(redis_server, prefix, "fair", "delete", "tenant:*", "--reason", "equal shares again") == \
        "fair tenant:*: weight deleted\n"
    assert ok(redis_server, prefix, "fair", "delete", "tenant:*", "--reason", "equal shares again") == \
        "fair tenant:*: no weight set\n"
    seen = [e["type"] for e in q.reads.namespace_events() if e["type"].startswith("weight_")]
    assert seen == ["weight_set", "weight_deleted"]
    q.close()


def test_bad_input_is_refused_before_anything_is_written(redis_server: RedisServer, prefix: str) -> None:
    ok(redis_server, prefix, "fair")  # (the namespace exists)
    before = namespace_keys(redis_server, prefix)
    for args, says in ((["set", "tenant:a", "0"], "WEIGHT"), (["set", "tenant:a", "1001"], "WEIGHT"),
                       (["set", "tenant:a", "nan"], "WEIGHT"), (["set", "tenant:a", "-2"], "-2"),
                       (["set", "bad key", "2"], "invalid concurrency key"), (["set", "tenant:a"], "WEIGHT")):
        out = mcq(redis_server, prefix, "fair", *args, "--reason", "a reason long enough")
        assert out.returncode == 2 and says in out.stderr, (args, out.returncode, out.stderr)
    assert namespace_keys(redis_server, prefix) == before


def test_the_metrics_show_each_key_s_weight_and_backlog(q: mc_queue.Client) -> None:
    from mc_queue.ops.metrics import NamespaceCollector
    from tests.integration.test_metrics_alerts import scrape, v

    q.fairness.set_weight("tenant:gold", 5, reason="pays more")
    q.producer.enqueue("jobs", "h", {"n": 1})  # (the queue is known)
    for i in range(3):
        q.runner.run("fair_push", {"lanes": q.keys.fair_lanes("jobs", 2), "turns": q.keys.fair_turns("jobs", 2)},
                     {"lane": "tenant:free", "job_id": f"mcq-x-{i}"})
    m, types = scrape(NamespaceCollector(q))
    assert types["mcq_fair_weight"] == "gauge" and types["mcq_fair_queued"] == "gauge"
    assert v(m, "mcq_fair_weight", key="tenant:gold") == 5
    assert v(m, "mcq_fair_weight", key="tenant:free") == 1
    assert v(m, "mcq_fair_queued", key="tenant:free", queue="jobs", priority="2") == 3
    assert not any(name == "mcq_fair_queued" and ("key", "tenant:gold") in labels for name, labels in m)

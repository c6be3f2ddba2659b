"""Queue caps as operators see them (issue 19, backpressure): `mcq caps` as an operator runs it (a real
process against the session's redis-server: the list and --json, set and delete recorded in the namespace
log, bad input refused with exit 2 and the check's message, nothing written), `mcq enqueue` on a queue at
its cap (exit 6, QueueFull's message and its retry-after, nothing written), and each capped queue's
metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mc_queue
from mc_queue import QueueFull
from mc_queue.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.lifecycle_app:app"  # its handlers serve the queue "jobs"


def mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def ok(server: RedisServer, prefix: str, *args: str) -> str:
    out = mcq(server, prefix, *args)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def namespace_keys(server: RedisServer, prefix: str) -> list[str]:
    return sorted(server.client().scan_iter(match=f"{{{prefix}}}*"))


def test_mcq_caps_sets_lists_and_deletes_caps(redis_server: RedisServer, prefix: str) -> None:
    assert ok(redis_server, prefix, "caps").startswith("no queue caps")
    assert json.loads(ok(redis_server, prefix, "caps", "--json")) == {"caps": []}
    assert namespace_keys(redis_server, prefix) == []  # a read creates nothing

    assert ok(redis_server, prefix, "caps", "set", "jobs", "3", "--reason", "three agents' work at most") == \
        "cap jobs: 3 task(s) not ended\n"
    assert ok(redis_server, prefix, "caps", "set", "idle", "10", "--reason", "a queue nothing uses yet") == \
        "cap idle: 10 task(s) not ended\n"
    assert ok(redis_server, prefix, "caps", "set", "jobs", "3", "--reason", "three agents' work at most").endswith(
        "(unchanged)\n")

    q = mc_queue.connect(redis_server.url, prefix=prefix)
    first = q.producer.enqueue("jobs", "h", {"n": 1})
    q.producer.enqueue("jobs", "h", {"n": 2}, priority=8)  # room for 2 of 3 at priority 8
    q.producer.enqueue("other", "h", {"n": 3})  # no cap: not listed
    assert q.caps.set("app-q", 5, source="app", reason="declared by app test", actor="app-test")
    time.sleep(0.25)  # the head of jobs has waited 250 ms
    rows = {r["queue"]: r for r in json.loads(ok(redis_server, prefix, "caps", "--json"))["caps"]}
    assert sorted(rows) == ["app-q", "idle", "jobs"]  # by name
    age = rows["jobs"].pop("age_ms")
    assert 250 <= age < 30_000
    assert rows["jobs"] == {"queue": "jobs", "max_depth": 3, "source": "operator", "depth": 2, "room": 1,
                            "max_bytes": None, "bytes": 14}  # (the bytes of its payloads, counted though not capped)
    assert rows["idle"] == {"queue": "idle", "max_depth": 10, "source": "operator", "depth": 0, "room": 10,
                            "age_ms": 0, "max_bytes": None, "bytes": 0}
    assert rows["app-q"]["source"] == "app"

    text = ok(redis_server, prefix, "caps").splitlines()
    assert "idle: cap 10 (operator); 0 not ended, room 10 at priority 5; no due task waits" in text
    line = next(t for t in text if t.startswith("jobs:"))
    assert re.fullmatch(r"jobs: cap 3 \(operator\); 2 not ended, room 1 at priority 5; oldest due task waited "
                        r"(\d+ ms|\d+\.\ds)", line), line

    # a running task has not ended: it still counts; one that ended does not
    lease = q.leases.claim_attempt(first.id, "w1", 60_000)
    assert json.loads(ok(redis_server, prefix, "caps", "--json"))["caps"][2]["depth"] == 2
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    assert json.loads(ok(redis_server, prefix, "caps", "--json"))["caps"][2]["room"] == 2

    assert ok(redis_server, prefix, "caps", "delete", "jobs", "--reason", "the queue may grow again") == \
        "cap jobs deleted\n"
    assert ok(redis_server, prefix, "caps", "delete", "jobs", "--reason", "the queue may grow again") == \
        "cap jobs: none set\n"
    assert q.caps.status("jobs").max_depth is None
    log = [(e["type"], e["queue"], e["actor"], e["reason"]) for e in q.reads.namespace_events()
           if e["type"].startswith("queue_cap_")]
    assert log == [("queue_cap_set", "jobs", "operator", "three agents' work at most"),
                   ("queue_cap_set", "idle", "operator", "a queue nothing uses yet"),
                   ("queue_cap_set", "app-q", "app-test", "declared by app test"),
                   ("queue_cap_deleted", "jobs", "operator", "the queue may grow again")]
    q.close()


@pytest.mark.parametrize("args,needle", [
    (["set", "bad/queue", "1"], "Invalid value for 'QUEUE': invalid queue name 'bad/queue'"),
    (["set", "_jobs", "1"], "invalid queue name '_jobs'"),
    (["set", "x" * 65, "1"], "invalid queue name"),
    (["set", "jobs", "0"], "Invalid value for 'MAX_DEPTH': 0 is not in the range 1<=x<=100000000"),
    (["set", "jobs", "100000001"], "100000001 is not in the range"),
    (["set", "jobs", "ten"], "'ten' is not a valid integer"),
    (["delete", "bad queue"], "invalid queue name 'bad queue'"),
])
def test_bad_input_exits_2_with_the_checks_message_and_writes_nothing(
        redis_server: RedisServer, prefix: str, args: list[str], needle: str) -> None:
    out = mcq(redis_server, prefix, "caps", *args, "--reason", "a reason long enough")
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr and out.stdout == ""
    assert namespace_keys(redis_server, prefix) == []


@pytest.mark.parametrize("args,needle", [
    (["set", "jobs", "1", "--reason", "short"], "a reason of at least ten characters is needed"),
    (["set", "jobs", "1"], "Missing option '--reason'"),
    (["delete", "jobs", "--reason", "  short   "], "a reason of at least ten characters is needed"),
])
def test_a_missing_or_short_reason_is_refused(redis_server: RedisServer, prefix: str, args: list[str],
                                              needle: str) -> None:
    out = mcq(redis_server, prefix, "caps", *args)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert namespace_keys(redis_server, prefix) == []


def test_mcq_enqueue_on_a_queue_at_its_cap_exits_6_with_the_retry_after(redis_server: RedisServer,
                                                                         prefix: str) -> None:
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    q.caps.set("jobs", 1, reason="one at most")
    enqueue = ("enqueue", "sleeps", "--app", APP, "--payload", '{"seconds": 1}')
    task_id = ok(redis_server, prefix, *enqueue).strip()
    assert q.reads.get_task(task_id).queue == "jobs"
    out = mcq(redis_server, prefix, *enqueue)
    assert out.returncode == 6 and out.stdout == "", out.stderr
    assert re.fullmatch(r"mcq: enqueue refused: queue jobs holds 1 tasks, its cap is 1; retry in about \d+ s\n",
                        out.stderr), out.stderr
    with pytest.raises(QueueFull) as full:  # the same refusal, and the retry-after the CLI printed
        q.producer.enqueue("jobs", "sleeps", {"seconds": 1})
    assert 1 <= full.value.retry_after_s <= 60
    assert q.caps.status("jobs").depth == 1 and q.redis.zcard(q.keys.pending("jobs")) == 1  # nothing written

    # room again, but a start_by the queue's age cannot meet: refused, and a retry as is would not help
    q.caps.set("jobs", 10, reason="ten at most")
    time.sleep(0.3)  # the head of the queue has waited 300 ms
    out = mcq(redis_server, prefix, *enqueue, "--start-by", "100ms")
    assert out.returncode == 6, out.stderr
    assert "would not start by its start_by" in out.stderr and out.stderr.count("\n") == 1
    assert out.stderr.endswith("retrying it as is cannot help: give it a later start_by, or none\n"), out.stderr
    assert q.caps.status("jobs").depth == 1
    assert ok(redis_server, prefix, *enqueue, "--start-by", "1h").strip().startswith("jobs:")
    q.close()


def test_the_metrics_show_each_capped_queue_its_cap_and_depth(q: mc_queue.Client) -> None:
    from mc_queue.ops.metrics import NamespaceCollector
    from tests.integration.test_metrics_alerts import scrape, v

    q.caps.set("jobs", 3, reason="three at most")
    q.caps.set("idle", 5, reason="a queue nothing uses yet")
    a = q.producer.enqueue("jobs", "h", {"n": 1})
    q.producer.enqueue("jobs", "h", {"n": 2}, delay_s=3600)  # scheduled: not ended, it counts
    q.producer.enqueue("other", "h", {"n": 3})  # no cap: no cap series
    q.leases.claim_attempt(a.id, "w1", 60_000)  # running: it counts
    m, types = scrape(NamespaceCollector(q))
    assert (types["mcq_queue_cap"], types["mcq_queue_cap_depth"]) == ("gauge", "gauge")
    assert (v(m, "mcq_queue_cap", queue="jobs"), v(m, "mcq_queue_cap_depth", queue="jobs")) == (3, 2)
    assert (v(m, "mcq_queue_cap", queue="idle"), v(m, "mcq_queue_cap_depth", queue="idle")) == (5, 0)
    assert v(m, "mcq_queue_depth", queue="jobs") == 0  # the older gauge: pending or backoff only
    assert not any(name.startswith("mcq_queue_cap") and labels == frozenset({("queue", "other")})
                   for name, labels in m)

    q.producer.enqueue("jobs", "h", {"n": 4})
    with pytest.raises(QueueFull):
        q.producer.enqueue("jobs", "h", {"n": 5})
    m, types = scrape(NamespaceCollector(q))
    assert v(m, "mcq_queue_cap_depth", queue="jobs") == v(m, "mcq_queue_cap", queue="jobs") == 3  # at its cap
    # the load shed is counted where it happened, by what refused it (zero for the rest)
    assert types["mcq_enqueue_refused"] == "counter"
    assert v(m, "mcq_enqueue_refused_total", queue="jobs", reason="queue") == 1
    assert v(m, "mcq_enqueue_refused_total", queue="jobs", reason="deadline") == 0
    assert q.caps.set_key("tenant:x", 1, reason="one task at most")
    q.producer.enqueue("elsewhere", "h", {}, fair_key="tenant:x")
    with pytest.raises(QueueFull):
        q.producer.enqueue("never-accepted", "h", {"n": 6}, fair_key="tenant:x")
    m, _ = scrape(NamespaceCollector(q))
    assert v(m, "mcq_enqueue_refused_total", queue="never-accepted", reason="key") == 1  # a queue it never saw

    assert q.caps.delete("jobs", reason="the queue may grow again")
    m, _ = scrape(NamespaceCollector(q))
    assert not any(name.startswith("mcq_queue_cap") and ("queue", "jobs") in labels for name, labels in m)

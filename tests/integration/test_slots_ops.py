"""Concurrency keys as operators see them (issue 19): `mcq slots` as an operator runs it (a real process
against the session's redis-server: the list and --json, set and delete recorded in the namespace log, bad
input refused with exit 2 and the check's message, nothing written), and each key's metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mc_queue
from mc_queue import OverLimit
from mc_queue.contracts.errors import SlotRejected
from mc_queue.testing import RedisServer

KEY = "repo:acme.web"


def mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          capture_output=True, text=True, timeout=60)


def ok(server: RedisServer, prefix: str, *args: str) -> str:
    out = mcq(server, prefix, *args)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def claim(q: mc_queue.Client, key: str, worker: str = "w1") -> mc_queue.Lease:
    task = q.producer.enqueue("jobs", "h", {"key": key}, limits={key: 1})
    return q.leases.claim_attempt(task.id, worker, 60_000, limits=(key,))


def namespace_keys(server: RedisServer, prefix: str) -> list[str]:
    return sorted(server.client().scan_iter(match=f"{{{prefix}}}*"))


def test_mcq_slots_sets_lists_and_deletes_keys(redis_server: RedisServer, prefix: str) -> None:
    assert ok(redis_server, prefix, "slots").startswith("no concurrency keys")
    assert json.loads(ok(redis_server, prefix, "slots", "--json")) == {"slots": []}
    assert namespace_keys(redis_server, prefix) == []  # a read creates nothing

    assert ok(redis_server, prefix, "slots", "set", KEY, "1", "--reason", "one writer per branch") == \
        f"slots {KEY}: 1 (wait when full)\n"
    assert ok(redis_server, prefix, "slots", "set", "repo:*", "2", "--on-full", "reject", "--reason",
              "two agents per repository") == "slots repo:*: 2 (reject when full)\n"
    assert ok(redis_server, prefix, "slots", "set", KEY, "1", "--reason", "one writer per branch").endswith(
        "(unchanged)\n")

    q = mc_queue.connect(redis_server.url, prefix=prefix)
    held = claim(q, KEY)
    with pytest.raises(OverLimit):
        claim(q, KEY)
    other = claim(q, "repo:b")  # the family's setting: a slot of its own key
    claim(q, "tenant:x")  # no slots set: unlimited, holds none (not listed)
    rows = {r["key"]: r for r in json.loads(ok(redis_server, prefix, "slots", "--json"))["slots"]}
    assert sorted(rows) == ["repo:*", KEY, "repo:b"]
    assert rows[KEY] == {"key": KEY, "slots": 1, "setting": "own", "family": False, "on_full": "wait",
                         "source": "operator", "running": 1, "waiting": 1, "writer_fence": 1, "waited": 1,
                         "rejected": 0, "holders": [{"attempt_id": held.attempt_id,
                                                     "claimed_at_ms": rows[KEY]["holders"][0]["claimed_at_ms"]}]}
    assert (rows["repo:b"]["slots"], rows["repo:b"]["setting"], rows["repo:b"]["on_full"],
            rows["repo:b"]["running"]) == (2, "family repo:*", "reject", 1)
    assert rows["repo:b"]["holders"][0]["attempt_id"] == other.attempt_id
    assert (rows["repo:*"]["slots"], rows["repo:*"]["setting"], rows["repo:*"]["running"]) == (2, "own", 0)

    text = ok(redis_server, prefix, "slots").splitlines()
    assert f"{KEY}: 1 slot(s) (own, operator), wait when full; 1 running, 1 waiting; writer fence 1; " \
           "1 claim(s) waited, 0 rejected so far" in text
    assert "repo:*: 2 slot(s) for each key of the family (own, operator), reject when full; 0 running, " \
           "0 waiting; writer fence 0; 0 claim(s) waited, 0 rejected so far" in text
    assert text[text.index(next(t for t in text if t.startswith(f"{KEY}:"))) + 1].startswith(
        f"  {held.attempt_id} running for ")  # the holder's id whole, under its key

    assert ok(redis_server, prefix, "slots", "delete", KEY, "--reason", "the branch may have two writers") == \
        f"slots {KEY} deleted\n"
    assert ok(redis_server, prefix, "slots", "delete", KEY, "--reason", "the branch may have two writers") == \
        f"slots {KEY}: none set\n"
    s = q.slots.status(KEY)  # falls back to its family's setting
    assert (s.slots, s.family, s.on_full, s.running) == (2, True, "reject", 1)
    log = [(e["type"], e["key"], e["actor"], e["reason"]) for e in q.reads.namespace_events()
           if e["type"].startswith("slots_")]
    assert log == [("slots_set", KEY, "operator", "one writer per branch"),
                   ("slots_set", "repo:*", "operator", "two agents per repository"),
                   ("slots_deleted", KEY, "operator", "the branch may have two writers")]

    # slots deleted while an Attempt holds one: listed as unlimited until it stops running
    q.slots.set("tenant:y", 1, reason="one job per tenant")
    tenant = claim(q, "tenant:y")
    assert q.slots.delete("tenant:y", reason="tenants are not limited any more")
    text = ok(redis_server, prefix, "slots").splitlines()
    line = "tenant:y: unlimited (no slots set); 1 running, 0 waiting; writer fence 1; 0 claim(s) waited, 0 rejected"
    assert f"{line} so far" in text and text[text.index(f"{line} so far") + 1].startswith(f"  {tenant.attempt_id} ")
    row = next(r for r in json.loads(ok(redis_server, prefix, "slots", "--json"))["slots"] if r["key"] == "tenant:y")
    assert (row["slots"], row["setting"], row["on_full"], row["running"]) == (None, "none", None, 1)
    q.close()


@pytest.mark.parametrize("args,needle", [
    (["set", "repo/acme", "1"], "Invalid value for 'KEY': invalid concurrency key 'repo/acme'"),
    (["set", "*", "1"], "invalid concurrency key '*'"),
    (["set", "repo:**", "1"], "invalid concurrency key 'repo:**'"),
    (["set", "x" * 129, "1"], "invalid concurrency key"),
    (["set", KEY, "0"], "Invalid value for 'SLOTS': 0 is not in the range 1<=x<=1000000"),
    (["set", KEY, "1000001"], "1000001 is not in the range"),
    (["set", KEY, "two"], "'two' is not a valid integer"),
    (["set", KEY, "1", "--on-full", "drop"], "'drop' is not one of 'wait', 'reject', 'supersede'"),
    (["delete", ":*"], "invalid concurrency key ':*'"),
])
def test_bad_input_exits_2_with_the_checks_message_and_writes_nothing(
        redis_server: RedisServer, prefix: str, args: list[str], needle: str) -> None:
    out = mcq(redis_server, prefix, "slots", *args, "--reason", "a reason long enough")
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr and out.stdout == ""
    assert namespace_keys(redis_server, prefix) == []


@pytest.mark.parametrize("args,needle", [
    (["set", KEY, "1", "--reason", "short"], "a reason of at least ten characters is needed"),
    (["set", KEY, "1"], "Missing option '--reason'"),
    (["delete", KEY, "--reason", "  short   "], "a reason of at least ten characters is needed"),
])
def test_a_missing_or_short_reason_is_refused(redis_server: RedisServer, prefix: str, args: list[str],
                                              needle: str) -> None:
    out = mcq(redis_server, prefix, "slots", *args)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert namespace_keys(redis_server, prefix) == []


def test_the_metrics_show_each_key_its_slots_holders_waiters_and_refusals(q: mc_queue.Client) -> None:
    from mc_queue.ops.metrics import NamespaceCollector
    from tests.integration.test_metrics_alerts import scrape, v

    q.slots.set(KEY, 1, reason="one writer per branch")
    q.slots.set("repo:*", 1, on_full="reject", reason="one agent per repository")
    claim(q, KEY)
    for _ in range(2):
        with pytest.raises(OverLimit):
            claim(q, KEY)
    held = claim(q, "repo:b")
    with pytest.raises(SlotRejected):
        claim(q, "repo:b")
    claim(q, "tenant:x")  # no slots set: unlimited, holds none
    m, types = scrape(NamespaceCollector(q))
    assert {f"mcq_concurrency_{n}": types[f"mcq_concurrency_{n}"] for n in ("slots", "running", "waiting",
                                                                            "waited", "rejected")} == {
        "mcq_concurrency_slots": "gauge", "mcq_concurrency_running": "gauge", "mcq_concurrency_waiting": "gauge",
        "mcq_concurrency_waited": "counter", "mcq_concurrency_rejected": "counter"}
    assert (v(m, "mcq_concurrency_slots", key=KEY), v(m, "mcq_concurrency_running", key=KEY),
            v(m, "mcq_concurrency_waiting", key=KEY)) == (1, 1, 2)
    assert v(m, "mcq_concurrency_waited_total", key=KEY) == 2 and v(m, "mcq_concurrency_rejected_total", key=KEY) == 0
    assert v(m, "mcq_concurrency_slots", key="repo:b") == 1  # its family's
    assert v(m, "mcq_concurrency_running", key="repo:b") == 1
    assert v(m, "mcq_concurrency_rejected_total", key="repo:b") == 1
    assert v(m, "mcq_concurrency_slots", key="repo:*") == 1 and v(m, "mcq_concurrency_running", key="repo:*") == 0
    assert not any(labels == frozenset({("key", "tenant:x")}) for name, labels in m if name.startswith(
        "mcq_concurrency_"))  # unlimited and never full: no series

    # idle now (its holder ended, its family's setting deleted): no setting, the counters stay
    q.leases.complete_attempt(held.attempt_id, held.fence, {"ok": True}, worker_id="w1")
    assert q.slots.delete("repo:*", reason="no more repository bulkhead")
    m, _ = scrape(NamespaceCollector(q))
    assert ("mcq_concurrency_slots", frozenset({("key", "repo:b")})) not in m
    assert ("mcq_concurrency_slots", frozenset({("key", "repo:*")})) not in m
    assert (v(m, "mcq_concurrency_running", key="repo:b"), v(m, "mcq_concurrency_waiting", key="repo:b"),
            v(m, "mcq_concurrency_rejected_total", key="repo:b"), v(m, "mcq_concurrency_waited_total", key="repo:b")
            ) == (0, 0, 1, 0)

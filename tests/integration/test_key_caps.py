"""Caps per fairness key (issue 19, backpressure): a tenant may hold at most N tasks not ended, in every queue.

On a real redis-server, both sides of each boundary: within the cap / at it (refused, nothing written, the
error naming the key), room again once a task ends (completed, failed for good, canceled) and not when it
only retries, a family's cap / a key's own, the lowest priorities shed first, enqueue_many all or nothing
(the batch's earlier items of the key count), a task without the key untouched, and `mcq fair cap` as typed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, make_failure
from mc_queue.client.producer import NewTask
from mc_queue.testing import RedisServer
from tests.integration.test_caps import shed
from tests.integration.test_caps_ops import mcq, namespace_keys, ok

REASON = "a reason long enough"


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def add(q: mc_queue.Client, key: str | None = "tenant:a", queue: str = "jobs", **kw: Any) -> mc_queue.Task:
    return q.producer.enqueue(queue, "h", {"n": add.n}, fair_key=key, **kw)  # type: ignore[attr-defined]


add.n = 0  # type: ignore[attr-defined]


def open_of(q: mc_queue.Client, key: str) -> int:
    return int(q.redis.hget(q.keys.counts, f"@{key}|open") or 0)


def test_a_key_at_its_cap_refuses_new_work_until_one_of_its_tasks_ends(q: mc_queue.Client) -> None:
    assert q.caps.set_key("tenant:a", 3, reason=REASON)
    tasks = [q.producer.enqueue(queue, "h", {"i": i}, fair_key="tenant:a") for i, queue in
             enumerate(["jobs", "other", "jobs"])]
    assert open_of(q, "tenant:a") == 3  # every queue counts
    with shed(q, "jobs", "key"), pytest.raises(mc_queue.QueueFull,
                                               match="key tenant:a holds 3 tasks not ended, its cap is 3") as err:
        q.producer.enqueue("jobs", "h", {"i": 3}, fair_key="tenant:a")
    assert err.value.retry_after_s == 1.0
    q.producer.enqueue("jobs", "h", {"i": 4}, fair_key="tenant:b")  # another key, and no key at all
    q.producer.enqueue("jobs", "h", {"i": 5})
    # A retry keeps the task open (backoff, then pending): no room.
    la = q.leases.claim_attempt(tasks[0].id, "w", 60_000)
    retry = Decision("retry", "transient", 0.0, next_reason="the provider hiccuped once", next_hypothesis="again")
    q.leases.fail_attempt(la.attempt_id, la.fence, make_failure(FailureClass.PROVIDER, "Busy", "503"), worker_id="w",
                          decision=retry)
    assert open_of(q, "tenant:a") == 3
    with pytest.raises(mc_queue.QueueFull):
        q.producer.enqueue("jobs", "h", {"i": 6}, fair_key="tenant:a")
    # It succeeds: room for one.
    lb = q.leases.claim_attempt(tasks[0].id, "w", 60_000)
    q.leases.complete_attempt(lb.attempt_id, lb.fence, {"ok": True}, worker_id="w")
    assert open_of(q, "tenant:a") == 2
    q.producer.enqueue("jobs", "h", {"i": 7}, fair_key="tenant:a")
    # Failed for good and canceled both end a task; a retry by an operator opens it again.
    lc = q.leases.claim_attempt(tasks[1].id, "w", 60_000)
    q.leases.fail_attempt(lc.attempt_id, lc.fence, make_failure(FailureClass.VALIDATION, "Bad", "x"), worker_id="w")
    q.operator.cancel_task(tasks[2].id, REASON)
    assert open_of(q, "tenant:a") == 1
    q.operator.retry_task(tasks[1].id, "the input was fixed by hand", "it works now")
    assert open_of(q, "tenant:a") == 2
    st = {c.key: c for c in q.caps.keys_all()}
    assert (st["tenant:a"].max_open, st["tenant:a"].open, st["tenant:a"].source) == (3, 2, "operator")
    assert (st["tenant:b"].max_open, st["tenant:b"].open) == (None, 1)
    assert "@tenant:a" not in {s.queue for s in q.caps.all()} and "@tenant:a" not in q.reads.status()


def test_a_family_cap_gives_each_key_its_own_and_a_key_s_own_cap_wins(q: mc_queue.Client) -> None:
    assert q.caps.set_key("tenant:*", 1, reason=REASON)
    assert q.caps.set_key("tenant:big", 2, reason=REASON)
    add(q, "tenant:x")
    with pytest.raises(mc_queue.QueueFull, match=r"key tenant:x holds 1 tasks not ended, its cap is 1 \(its family "
                                                 r"tenant:\*\)"):
        add(q, "tenant:x")
    add(q, "tenant:y")  # each key of the family has its own
    add(q, "tenant:big")
    add(q, "tenant:big")
    with pytest.raises(mc_queue.QueueFull, match="key tenant:big holds 2"):
        add(q, "tenant:big")
    assert q.caps.delete_key("tenant:big", reason=REASON)
    with pytest.raises(mc_queue.QueueFull, match=r"its cap is 1 \(its family"):
        add(q, "tenant:big")


def test_the_lowest_priorities_are_shed_first(q: mc_queue.Client) -> None:
    q.caps.set_key("tenant:a", 5, reason=REASON)
    for _ in range(4):
        add(q)
    with pytest.raises(mc_queue.QueueFull, match="4 for priority 6: the lowest are shed first"):
        add(q, priority=6)
    add(q, priority=2)  # an urgent one may fill the cap


def test_enqueue_many_is_all_or_nothing_and_counts_the_batch_s_earlier_items(q: mc_queue.Client) -> None:
    q.caps.set_key("tenant:a", 2, reason=REASON)
    add(q)
    with shed(q, "jobs", "key"), pytest.raises(mc_queue.QueueFull, match="item 2: key tenant:a holds 2"):
        q.producer.enqueue_many([NewTask("jobs", "h", {"b": 1}, fair_key="tenant:a"),
                                 NewTask("jobs", "h", {"b": 2}, fair_key="tenant:a")])
    q.producer.enqueue_many([NewTask("jobs", "h", {"b": 3}, fair_key="tenant:a"),
                             NewTask("jobs", "h", {"b": 4}, fair_key="tenant:c")])
    assert open_of(q, "tenant:a") == 2 and open_of(q, "tenant:c") == 1


def test_a_key_s_counter_leaves_when_its_last_task_ends_and_retiring_changes_nothing(q: mc_queue.Client) -> None:
    t = add(q, "tenant:gone")
    la = q.leases.claim_attempt(t.id, "w", 60_000)
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": True}, worker_id="w")
    assert q.redis.hget(q.keys.counts, "@tenant:gone|open") is None  # (not a field per key ever seen)
    q.operator.retire_task(t.id, states=["succeeded"], reason=REASON, tombstone_s=1)
    assert q.redis.hget(q.keys.counts, "@tenant:gone|open") is None


@pytest.mark.parametrize("queue", ["@", "@bad key", "@*", "@" + "x" * 129, "@tenant:a\n", "bad@queue"])
def test_the_cap_script_refuses_a_bad_key_and_changes_nothing(q: mc_queue.Client, queue: str) -> None:
    q.caps.set_key("tenant:a", 2, reason=REASON)
    before = snapshot(q)
    reply = q.runner.run("queue_cap", {**q.backend.ns_keys(), "caps": q.keys.caps},
                         {"epoch": q.backend.epoch(), "actor": "t", "op": "set", "queue": queue, "max_depth": "3",
                          "source": "operator", "reason": REASON})
    assert reply[0] == "E_BADARG", reply
    assert snapshot(q) == before


def test_mcq_fair_cap_and_uncap_as_typed(redis_server: RedisServer, prefix: str) -> None:
    assert ok(redis_server, prefix, "fair", "cap", "tenant:*", "20", "--reason", "each tenant at most twenty") == \
        "fair tenant:*: cap 20 task(s) not ended\n"
    q = mc_queue.Client(redis_server.url, prefix=prefix)
    q.producer.enqueue("jobs", "h", {"n": 1}, fair_key="tenant:acme")
    rows = {r["key"]: r for r in json.loads(ok(redis_server, prefix, "fair", "--json"))["fair"]}
    assert (rows["tenant:acme"]["cap"], rows["tenant:acme"]["cap_family"], rows["tenant:acme"]["open"]) == \
        (20, True, 1)
    assert "tenant:acme: weight 1 (default); messages queued: none; cap 20 task(s) not ended (family tenant:*, " \
           "operator), 1 now" in ok(redis_server, prefix, "fair")
    before = namespace_keys(redis_server, prefix)
    out = mcq(redis_server, prefix, "fair", "cap", "tenant:a", "0", "--reason", REASON)
    assert out.returncode == 2 and "MAX_OPEN" in out.stderr, out.stderr
    assert namespace_keys(redis_server, prefix) == before
    assert ok(redis_server, prefix, "fair", "uncap", "tenant:*", "--reason", "no cap any more") == \
        "fair tenant:*: cap deleted\n"
    q.close()


def test_the_metrics_show_each_key_s_cap_and_tasks_not_ended(q: mc_queue.Client) -> None:
    from mc_queue.ops.metrics import NamespaceCollector
    from tests.integration.test_metrics_alerts import scrape, v

    q.caps.set_key("tenant:*", 4, reason=REASON)
    add(q, "tenant:m")
    add(q, "tenant:m")
    add(q, "solo")
    m, types = scrape(NamespaceCollector(q))
    assert types["mcq_key_cap"] == "gauge" and types["mcq_key_open"] == "gauge"
    assert v(m, "mcq_key_cap", key="tenant:m") == 4 and v(m, "mcq_key_cap", key="tenant:*") == 4
    assert v(m, "mcq_key_open", key="tenant:m") == 2 and v(m, "mcq_key_open", key="solo") == 1
    assert not any(name == "mcq_key_cap" and ("key", "solo") in labels for name, labels in m)


# --------------------------------------------------------------------------- caps by bytes


def test_a_queue_capped_by_bytes_refuses_a_payload_that_would_not_fit_until_tasks_end(q: mc_queue.Client) -> None:
    assert q.caps.set_bytes("jobs", 100, reason=REASON)
    a = q.producer.enqueue("jobs", "h", {"blob": "x" * 40})  # 51 bytes of payload (its canonical JSON)
    assert q.caps.status("jobs").bytes == 51 and q.caps.status("jobs").max_bytes == 100
    q.producer.enqueue("jobs", "h", {"blob": "y" * 38})  # 49: 100 exactly, the cap
    with shed(q, "jobs", "queue_bytes"), pytest.raises(
            mc_queue.QueueFull, match=r"queue jobs holds 100 bytes of payload in tasks not ended; this one "
                                      r"\(7 bytes\) is over its cap of 100 bytes"):
        q.producer.enqueue("jobs", "h", {"n": 1})
    q.producer.enqueue("other", "h", {"blob": "z" * 500})  # another queue is not capped
    la = q.leases.claim_attempt(a.id, "w", 60_000)
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": True}, worker_id="w")
    assert q.caps.status("jobs").bytes == 49
    q.producer.enqueue("jobs", "h", {"n": 1})
    assert "bytes" not in q.reads.status()["jobs"]["counts"]  # (a counter, not a state)
    assert q.caps.delete_bytes("jobs", reason=REASON) and not q.caps.delete_bytes("jobs", reason=REASON)


def test_a_key_capped_by_bytes_counts_its_tasks_in_every_queue_and_sheds_low_priorities(q: mc_queue.Client) -> None:
    assert q.caps.set_bytes("@tenant:*", 60, reason=REASON)
    q.producer.enqueue("jobs", "h", {"blob": "x" * 19}, fair_key="tenant:a")  # 30 bytes
    with shed(q, "other", "key_bytes"), pytest.raises(
            mc_queue.QueueFull, match=r"key tenant:a \(its family tenant:\*\) holds 30 bytes .* \(36 for "
                                      r"priority 7: the lowest are shed first\)"):
        q.producer.enqueue("other", "h", {"blob": "y"}, fair_key="tenant:a", priority=7)
    q.producer.enqueue("other", "h", {"blob": "x" * 19}, fair_key="tenant:a")  # 60: at the cap
    with pytest.raises(mc_queue.QueueFull, match="key tenant:a"):
        q.producer.enqueue("jobs", "h", {}, fair_key="tenant:a")
    q.producer.enqueue("jobs", "h", {"blob": "x" * 19}, fair_key="tenant:b")  # its own 60
    # (items 1 and 2 count)
    with pytest.raises(mc_queue.QueueFull,
                       match=r"^enqueue refused: item 3: key tenant:c \(its family tenant:\*\) holds 60 bytes"):
        q.producer.enqueue_many([NewTask("jobs", "h", {"blob": "x" * 19}, fair_key="tenant:c"),
                                 NewTask("jobs", "h", {"blob": "x" * 19}, fair_key="tenant:c"),
                                 NewTask("jobs", "h", {"blob": "x" * 19}, fair_key="tenant:c")])
    st = {c.key: c for c in q.caps.keys_all()}
    assert (st["tenant:a"].bytes, st["tenant:a"].max_bytes, st["tenant:b"].bytes) == (60, 60, 30)
    assert "tenant:c" not in st  # the refused batch wrote nothing


@pytest.mark.parametrize("argv", [{"op": "set_bytes", "max_depth": ""}, {"op": "set_bytes", "max_depth": "0"},
                                  {"op": "set_bytes", "max_depth": str(10**12 + 1)},
                                  {"op": "set", "max_depth": "100000001"},
                                  {"op": "delete_bytes", "max_depth": "5"}, {"op": "bytes", "max_depth": "5"}])
def test_the_cap_script_refuses_bad_bytes_arguments_and_changes_nothing(q: mc_queue.Client,
                                                                        argv: dict[str, str]) -> None:
    q.caps.set_bytes("jobs", 1000, reason=REASON)
    before = snapshot(q)
    reply = q.runner.run("queue_cap", {**q.backend.ns_keys(), "caps": q.keys.caps},
                         {"epoch": q.backend.epoch(), "actor": "t", "queue": "jobs", "source": "operator",
                          "reason": REASON, **argv})
    assert reply[0] == "E_BADARG", reply
    assert snapshot(q) == before


@pytest.mark.parametrize("scope", [7, None, b"jobs", "@bad key", "@", "bad queue"])
def test_a_bad_scope_is_refused_before_anything_is_sent(q: mc_queue.Client, scope: Any) -> None:
    before = snapshot(q)
    for call in (lambda: q.caps.set(scope, 3, reason=REASON), lambda: q.caps.set_bytes(scope, 3, reason=REASON)):
        with pytest.raises(mc_queue.InvalidArgument):
            call()
    assert snapshot(q) == before

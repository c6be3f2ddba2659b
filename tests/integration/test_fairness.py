"""Fair shares across keys (issue 19, bulkheads): a tenant with a deep backlog cannot starve small ones.

On a real redis-server, with real worker processes draining what the producer dispatched: both sides of each
boundary (a task with a fairness key waits in its lane behind a ticket / one without keeps RQ's list; equal
weights / 3 to 1; a key that empties and comes back / one that keeps a backlog; a ticket lost / one too
many; a message sent again while it waits / after it was taken), and the settings refused with nothing
written.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

import mc_queue
from mc_queue import Sweeper, TaskState
from mc_queue.producer.dispatch import dispatch
from mc_queue.producer.transport import TICKET, job_id, move_laned, rq_queue_name, tidy_lanes
from tests.harness import BASIC, Harness, harness_fixture, wait_for

QUEUE = "jobs"
h = harness_fixture(Harness)


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*"))}


def rq_list(h: Harness, priority: int = 5) -> list[str]:
    key = f"rq:queue:{rq_queue_name(h.prefix, QUEUE, priority)}"
    return [j.decode() for j in h.rq.lrange(key, 0, -1)]


def claim_order(h: Harness, ids: list[str]) -> list[str]:
    """The tasks' fairness keys in the order their first Attempts were claimed (every task succeeded)."""
    rows = []
    for tid in ids:
        t = h.task(tid)
        assert t.state is TaskState.SUCCEEDED, (tid, t.state)
        rows.append((int(h.client.redis.hget(h.client.keys.task(tid).task, "1.seq")), t.fair_key or "-"))
    return [key for _, key in sorted(rows)]


def pop(q: mc_queue.Client, priority: int = 5) -> list[Any]:
    return q.runner.run("fair_pop", {"lanes": q.keys.fair_lanes(QUEUE, priority),
                                     "turns": q.keys.fair_turns(QUEUE, priority), "limits": q.keys.limits},
                        {"limit": 100})


def push(q: mc_queue.Client, lane: str, jid: str, priority: int = 5) -> list[Any]:
    return q.runner.run("fair_push", {"lanes": q.keys.fair_lanes(QUEUE, priority),
                                      "turns": q.keys.fair_turns(QUEUE, priority)}, {"lane": lane, "job_id": jid})


def again(h: Harness, task_id: str) -> bool:
    """The sweeper's dispatch of a pending Attempt sent before (True: a message was pushed)."""
    task = h.task(task_id)
    assert task.latest is not None
    return dispatch(h.client, h.rq, task, task.latest, claim_grace_ms=0)


# --------------------------------------------------------------------------- where the messages wait


def test_a_task_with_a_fair_key_waits_in_its_lane_behind_a_ticket_one_without_keeps_rqs_list(h: Harness) -> None:
    plain = h.basic.enqueue("noop", {"n": 0})
    fair = h.basic.enqueue("noop", {"n": 1}, fair_key="tenant:acme")
    assert fair.fair_key == "tenant:acme" and plain.fair_key is None
    assert h.client.redis.hget(h.client.keys.task(fair.id).task, "fair_key") == "tenant:acme"
    assert "fair_key" not in h.client.redis.hgetall(h.client.keys.task(plain.id).task)  # nothing stored without
    assert rq_list(h) == [job_id(h.prefix, f"{plain.id}/1"), TICKET]
    lanes = h.client.redis.hgetall(h.client.keys.fair_lanes(QUEUE, 5))
    jid = job_id(h.prefix, f"{fair.id}/1")
    assert lanes["tenant:acme|1"] == jid and lanes[f"j:{jid}"] == "tenant:acme|1"
    assert h.client.redis.zrange(h.client.keys.fair_turns(QUEUE, 5), 0, -1) == ["tenant:acme"]
    [status] = h.client.fairness.all()
    assert (status.key, status.weight, status.source, status.queued) == ("tenant:acme", 1, None, {f"{QUEUE}@p5": 1})
    h.run_worker("simple", BASIC)
    assert h.task(fair.id).state is TaskState.SUCCEEDED and h.task(plain.id).state is TaskState.SUCCEEDED
    assert rq_list(h) == [] and not h.client.redis.zrange(h.client.keys.fair_turns(QUEUE, 5), 0, -1)
    assert h.client.fairness.all() == []  # (a key is listed while it has a weight or a backlog)


@pytest.mark.parametrize("bad", ["", "a b", "tenant/acme", "x" * 129, "é", 7, "tenant:*"])
def test_a_bad_fair_key_is_refused_with_nothing_written(q: mc_queue.Client, bad: Any) -> None:
    q.producer.enqueue(QUEUE, "h", {"n": 0})
    before = snapshot(q)
    with pytest.raises(mc_queue.InvalidArgument, match="fair_key"):
        q.producer.enqueue(QUEUE, "h", {"n": 1}, fair_key=bad)
    assert snapshot(q) == before


# --------------------------------------------------------------------------- shares


def test_one_tenant_with_a_deep_backlog_cannot_starve_fifty_small_ones(h: Harness) -> None:
    ids = [t.id for t in h.basic.enqueue_many([{"handler": "noop", "payload": {"n": i}, "fair_key": "tenant:big"}
                                               for i in range(300)])]
    ids += [t.id for t in h.basic.enqueue_many([{"handler": "noop", "payload": {"s": s, "i": i},
                                                 "fair_key": f"tenant:s{s:02d}"} for i in range(2) for s in range(50)])]
    h.run_worker("simple", BASIC, timeout=120)
    order = claim_order(h, ids)
    # Every key had a turn before any had a second one: each small tenant's two tasks ran within the first
    # 102 claims (51 keys, two turns each), though 300 of the big tenant's were queued before any of theirs.
    assert max(i for i, k in enumerate(order) if k != "tenant:big") < 102, order[:110]
    # Over any 100 consecutive claims while every key had a backlog (the first 102), each key's share is
    # within 5 claims of its weight's (100 / 51 each).
    for start in range(0, 3):
        window = Counter(order[start:start + 100])
        assert all(abs(n - 100 / 51) <= 5 for n in window.values()), window
    assert order[102:] == ["tenant:big"] * 298


def test_weights_share_the_claims_three_to_one_while_both_keys_have_a_backlog(h: Harness) -> None:
    assert h.client.fairness.set_weight("tenant:gold", 3, reason="pays for three")
    assert not h.client.fairness.set_weight("tenant:gold", 3, reason="pays for three")  # already so
    ids = [t.id for t in h.basic.enqueue_many([{"handler": "noop", "payload": {"n": i}, "fair_key": "tenant:free"}
                                               for i in range(200)])]
    ids += [t.id for t in h.basic.enqueue_many([{"handler": "noop", "payload": {"n": i}, "fair_key": "tenant:gold"}
                                                for i in range(200)])]
    h.run_worker("simple", BASIC, timeout=120)
    order = claim_order(h, ids)
    backlogged = order[:264]  # gold's 200 are gone after ~266 claims (3 of every 4)
    for start in range(0, len(backlogged) - 100 + 1, 10):
        gold = Counter(backlogged[start:start + 100])["tenant:gold"]
        assert 70 <= gold <= 80, (start, gold)
    assert Counter(order) == {"tenant:gold": 200, "tenant:free": 200}


def test_a_family_weight_applies_to_each_key_of_the_family_and_a_key_s_own_wins(q: mc_queue.Client) -> None:
    assert q.fairness.set_weight("tenant:*", 4, reason="every tenant")
    assert q.fairness.set_weight("tenant:small", 2, reason="this one less")
    for i in range(40):
        push(q, "tenant:a", f"a-{i}")
        push(q, "tenant:small", f"s-{i}")
        push(q, "other", f"o-{i}")
    st = {s.key: s for s in q.fairness.all([QUEUE])}
    assert (st["tenant:a"].weight, st["tenant:a"].family, st["tenant:a"].source) == (4, True, "operator")
    assert (st["tenant:small"].weight, st["tenant:small"].family) == (2, False)
    assert (st["other"].weight, st["other"].source, st["other"].queued) == (1, None, {f"{QUEUE}@p5": 40})
    taken = Counter(str(pop(q)[2]) for _ in range(70))
    assert taken == {"tenant:a": 40, "tenant:small": 20, "other": 10}
    assert q.fairness.delete_weight("tenant:small", reason="as the others")
    assert not q.fairness.delete_weight("tenant:small", reason="as the others")
    push(q, "tenant:small", "s-again")
    assert {s.key: s.weight for s in q.fairness.all([QUEUE])}["tenant:small"] == 4  # its family's again


def test_a_key_that_empties_and_comes_back_at_once_does_not_jump_its_turn(q: mc_queue.Client) -> None:
    for i in range(5):
        push(q, "b", f"b-{i}")
    push(q, "a", "a-0")
    assert pop(q)[1:] == ["a-0", "a"]  # a and b at the same pass: a first (by name); a's lane is empty now
    push(q, "a", "a-1")  # back at once: behind b, whose turn it is
    assert pop(q)[1:] == ["b-0", "b"]
    assert pop(q)[1:] == ["a-1", "a"]
    assert [pop(q)[1] for _ in range(4)] == ["b-1", "b-2", "b-3", "b-4"]
    assert pop(q)[0] == "NOOP"


def test_idle_keys_passes_are_trimmed_once_they_say_nothing(q: mc_queue.Client) -> None:
    for jid in ("a-0", "b-0", "c-0", "c-1", "c-2"):
        push(q, jid[0], jid)
    assert [pop(q)[2] for _ in range(2)] == ["a", "b"]  # each at pass 0; emptied, each keeps its pass, 1,000,000
    assert q.fairness.trim(QUEUE) == 0  # the pass now is c's, 0: a or b coming back would wait for theirs
    assert pop(q)[2] == "c"
    assert q.fairness.trim(QUEUE) == 2  # c's is 1,000,000 now: a returning key would join there anyway
    assert [pop(q)[2] for _ in range(2)] == ["c", "c"]
    assert q.fairness.trim(QUEUE) == 0  # c, emptied at 3,000,000, is ahead of the last pass served (2,000,000)
    assert {k for k in q.redis.hgetall(q.keys.fair_lanes(QUEUE, 5)) if k.endswith("|p")} == {"c|p"}


# --------------------------------------------------------------------------- transport faults


def test_a_lost_ticket_is_given_back_by_the_sweeper_and_one_too_many_is_skipped(h: Harness) -> None:
    ids = [h.basic.enqueue("noop", {"n": i}, fair_key=f"tenant:{i % 2}").id for i in range(4)]
    key = f"rq:queue:{rq_queue_name(h.prefix, QUEUE)}"
    assert h.rq.lrem(key, 2, TICKET) == 2  # a failover lost two tickets: two messages no worker would look for
    h.run_worker("simple", BASIC)
    assert sorted(h.task(t).state.value for t in ids) == ["pending", "pending", "succeeded", "succeeded"]
    assert tidy_lanes(h.client, h.rq, QUEUE) == 2 and tidy_lanes(h.client, h.rq, QUEUE) == 0
    h.rq.rpush(key, TICKET, TICKET)  # and two too many
    h.run_worker("simple", BASIC)
    assert all(h.task(t).state is TaskState.SUCCEEDED for t in ids)
    assert rq_list(h) == []


def test_a_message_waiting_in_its_lane_is_not_sent_again_and_one_taken_and_not_claimed_is(h: Harness) -> None:
    task = h.basic.enqueue("noop", {"n": 1}, fair_key="tenant:acme")
    attempt = h.task(task.id).latest
    assert attempt is not None and attempt.dispatches == 1
    assert not again(h, task.id)  # still waiting in its lane: only the recheck moves
    assert rq_list(h) == [TICKET]
    assert pop(h.client)[1] == job_id(h.prefix, f"{task.id}/1")  # taken by a worker that died before its claim
    h.rq.lrem(f"rq:queue:{rq_queue_name(h.prefix, QUEUE)}", 1, TICKET)
    assert again(h, task.id)
    assert rq_list(h) == [TICKET]
    h.run_worker("simple", BASIC)
    assert h.task(task.id).state is TaskState.SUCCEEDED


def test_a_worker_blocked_on_its_queues_wakes_for_a_ticket_and_takes_its_lane(h: Harness) -> None:
    worker = h.spawn(h.worker_cmd("simple", BASIC, burst=False))  # blocked in BLPOP once its queues are empty
    time.sleep(1.0)
    ids = [h.basic.enqueue("noop", {"n": i}, fair_key=f"tenant:{i % 3}").id for i in range(6)]
    wait_for(lambda: all(h.task(t).state is TaskState.SUCCEEDED for t in ids), 30, "the blocked worker to run them")
    assert worker.poll() is None, h.worker_log(worker)
    assert rq_list(h) == []


def test_a_batch_worker_takes_the_fair_lanes_in_turn_too(h: Harness) -> None:
    ids = [t.id for t in h.basic.enqueue_many([{"handler": "noop", "payload": {"n": i}, "fair_key": "tenant:big"}
                                               for i in range(30)])]
    ids += [h.basic.enqueue("noop", {"n": i}, fair_key=f"tenant:s{i}").id for i in range(5)]
    h.run_worker("batch", BASIC, "--batch", "8", timeout=120)
    order = claim_order(h, ids)
    assert max(i for i, k in enumerate(order) if k != "tenant:big") < 10, order


def lanes_of(h: Harness, priority: int) -> dict[str, list[str]]:
    """Each fairness key's messages waiting in the lanes of one priority, in lane order."""
    raw = h.client.redis.hgetall(h.client.keys.fair_lanes(QUEUE, priority))
    out: dict[str, list[str]] = {}
    for field, jid in sorted(raw.items(), key=lambda kv: kv[0]):
        key, _, seq = field.rpartition("|")
        if key and seq.isdigit() and not field.startswith("j:"):
            out.setdefault(key, []).append(jid)
    return out


def test_aging_moves_a_laned_message_to_its_key_s_lane_a_level_up_with_its_ticket(h: Harness) -> None:
    low = h.basic.enqueue("noop", {"n": 1}, fair_key="tenant:acme", priority=9)
    other = h.basic.enqueue("noop", {"n": 2}, fair_key="tenant:acme", priority=9)
    jid, jid2 = job_id(h.prefix, f"{low.id}/1"), job_id(h.prefix, f"{other.id}/1")
    aging = Sweeper(h.client, priority_aging_ms=300)
    assert aging.run_once().aged == [] and lanes_of(h, 9) == {"tenant:acme": [jid, jid2]}  # young: stays
    h.client.redis.hset(h.client.keys.task(low.id).task, "1.dispatched_at",
                        str(h.client.backend.redis_time_ms() - 350))  # only the first waited a period
    assert aging.run_once().aged == [f"{low.id}/1 p9->p8"]
    assert lanes_of(h, 8) == {"tenant:acme": [jid]} and lanes_of(h, 9) == {"tenant:acme": [jid2]}
    assert rq_list(h, 8) == [TICKET] and rq_list(h, 9) == [TICKET]  # one ticket each: none lost, none extra
    assert h.rq.hget(f"rq:job:{jid}", "origin").decode() == rq_queue_name(h.prefix, QUEUE, 8)
    assert not again(h, low.id)  # waiting in its new lane: not sent again
    assert rq_list(h, 8) == [TICKET] and lanes_of(h, 8) == {"tenant:acme": [jid]}
    h.run_worker("simple", BASIC)  # the moved message is accepted (its origin moved with it), the other too
    assert h.task(low.id).state is TaskState.SUCCEEDED and h.task(other.id).state is TaskState.SUCCEEDED
    assert rq_list(h, 8) == [] and rq_list(h, 9) == [] and lanes_of(h, 8) == {} and lanes_of(h, 9) == {}


def test_a_laned_message_taken_while_aging_looks_is_not_moved(h: Harness) -> None:
    low = h.basic.enqueue("noop", {"n": 1}, fair_key="tenant:acme", priority=9)
    jid = job_id(h.prefix, f"{low.id}/1")
    assert move_laned(h.client, h.rq, QUEUE, 9, 8, jid) is True
    assert pop(h.client, 8)[1] == jid  # a worker took it
    assert move_laned(h.client, h.rq, QUEUE, 8, 7, jid) is False  # gone: nothing else is done
    assert lanes_of(h, 7) == {} and rq_list(h, 7) == []
    assert h.rq.hget(f"rq:job:{jid}", "origin").decode() == rq_queue_name(h.prefix, QUEUE, 8)


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("weight", [0, 1001, -1, True, 1.5, "2", float("nan"), float("inf")])
def test_a_bad_weight_is_refused_with_nothing_written(q: mc_queue.Client, weight: Any) -> None:
    before = snapshot(q)
    with pytest.raises(mc_queue.InvalidArgument, match="weight"):
        q.fairness.set_weight("tenant:a", weight, reason="a reason")
    assert snapshot(q) == before


@pytest.mark.parametrize("argv", [
    {"limit": ""}, {"limit": "0"}, {"limit": "1001"}, {"limit": "nan"}, {"limit": "-1"}, {"limit": "2\n"},
    {"key": "tenant:a\n"}, {"key": "*"}, {"key": ""}, {"window_ms": "1000"},
])
def test_the_weight_script_refuses_hostile_arguments_and_changes_nothing(q: mc_queue.Client,
                                                                         argv: dict[str, str]) -> None:
    q.fairness.set_weight("tenant:b", 2, reason="before")
    before = snapshot(q)
    args = {"epoch": q.backend.epoch(), "actor": "t", "op": "weight", "key": "tenant:a", "limit": "2",
            "window_ms": "", "for_ms": "", "source": "operator", "reason": "r", "breaker": "", "on_full": "",
            "tokens": "", "fallbacks": "", **argv}
    base = args["key"][:-1] if str(args["key"]).endswith(":*") else args["key"]
    reply = q.runner.run("limit_admin", {**q.backend.ns_keys(), "limits": q.keys.limits,
                                         "log": f"{q.keys.tag}:limit:{base}", "window": f"{q.keys.tag}:breaker:{base}"},
                         args)
    assert reply[0] == "E_BADARG", reply
    assert snapshot(q) == before

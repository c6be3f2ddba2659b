"""Periodic schedules (issue 18) on a real redis-server: one task per tick whatever the sweepers do.

Both sides of each boundary: a tick due / not yet due, decided by one sweeper / refused to the others
(three replicas racing on the same ticks), a sweeper that died between deciding a tick and making its
task / the next one makes the same task, the previous tick's task running / ended (overlap skip, queue,
cancel), ticks missed while no sweeper ran (catch-up none, last, all within the window), paused /
resumed, a manual trigger, a definition published again / withdrawn, and `mcq schedule` as typed.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest

import mc_queue
from mc_queue import TaskState
from mc_queue.contracts.periodic import PeriodicSchedule, tick_key
from mc_queue.testing import RedisServer
from tests.harness import BASIC, Harness, harness_fixture, wait_for

h = harness_fixture(Harness)
REASON = "a reason that is long enough"


def schedule(name: str = "tick", **kw: Any) -> PeriodicSchedule:
    opts: dict[str, Any] = {"handler": "noop", "queue": "jobs", "payload": {"from": name}}
    opts.update(kw)
    if "cron" not in opts:
        opts.setdefault("every_s", 60)
    return PeriodicSchedule(name=name, **opts)


def back(q: mc_queue.Client, name: str, ms: int) -> int:
    """Move the schedule's cursor ``ms`` into the past (as if its sweepers had been away); returns now."""
    now = q.backend.redis_time_ms()
    q.redis.hset(q.keys.periodic_state(name), "cursor", now - ms)
    return now


def tasks_of(q: mc_queue.Client, name: str) -> dict[int, str]:
    """tick -> task id of every task the schedule made (from the producer keys)."""
    out = {}
    for key, entry in q.redis.hscan_iter(q.keys.idem, match=f"periodic:{name}:*"):
        tick = key.rsplit(":", 1)[1]
        if tick.isdigit():
            out[int(tick)] = entry.split(" ")[0]
    return out


def state(q: mc_queue.Client, name: str) -> dict[str, str]:
    return q.redis.hgetall(q.keys.periodic_state(name))


# --------------------------------------------------------------------------- due / not due, one per tick


def test_a_new_schedule_starts_after_now_and_makes_one_task_per_due_tick(q: mc_queue.Client) -> None:
    # Publish early in a second of Redis's clock, so the next tick (on the 1 s grid) is still ahead
    # when run_due asks next: published at x.999 s it would rightly be due a millisecond later.
    wait_for(lambda: q.backend.redis_time_ms() % 1000 < 200, 3, "the start of a second on Redis's clock")
    assert q.periodic.publish(schedule(every_s=1))
    assert q.periodic.run_due() == []  # nothing due the moment it is published (the next tick is ahead)
    first = wait_for(lambda: q.periodic.run_due(), 3, "the first tick")
    assert [t.outcome for t in first] == ["ran"], first
    task = q.reads.get_task(first[0].task_id or "")
    assert task.handler == "noop" and task.payload == {"from": "tick"} and task.state is TaskState.PENDING
    assert task.idempotency_key == tick_key("tick", first[0].tick_ms)
    assert first[0].tick_ms % 1000 == 0  # ticks are on the grid of every_s (anchor: the epoch)
    assert q.periodic.run_due() == []  # the same tick again: decided already
    st = state(q, "tick")
    assert st["ran"] == "1" and st["last_task"] == task.id and "pending" not in st


def test_a_tick_not_yet_due_on_redis_s_clock_is_not_decided(q: mc_queue.Client) -> None:
    q.periodic.publish(schedule(every_s=3600))
    now = q.backend.redis_time_ms()
    nxt = schedule(every_s=3600).next_tick(now)
    assert nxt is not None and nxt > now
    from mc_queue.client.periodic import Periodic

    reply = Periodic._decide(q.periodic, "tick", nxt, 1, "jobs:01J00000000000000000000000", "", "skip", "", "t")
    assert reply == ["NOOP", f"tick {nxt} is not due yet"]
    assert "pending" not in state(q, "tick") and int(state(q, "tick")["cursor"]) < nxt


def test_three_replicas_racing_make_exactly_one_task_per_tick(redis_server: RedisServer, prefix: str) -> None:
    clients = [mc_queue.connect(redis_server.url, prefix=prefix) for _ in range(3)]
    try:
        clients[0].periodic.publish(schedule(every_s=0.1, overlap="queue", catch_up="all"))
        stop = time.monotonic() + 3.0
        errors: list[BaseException] = []

        def replica(c: mc_queue.Client) -> None:
            try:
                while time.monotonic() < stop:
                    c.periodic.run_due()
            except BaseException as exc:  # (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=replica, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        q = clients[0]
        made = tasks_of(q, "tick")
        ticks = sorted(made)
        assert len(ticks) >= 20, ticks
        assert all(b - a == 100 for a, b in itertools.pairwise(ticks)), "a tick was lost or made twice"
        assert len(set(made.values())) == len(made)  # a task per tick
        counts = Counter(q.reads.get_task(tid).idempotency_key for tid in made.values())
        assert set(counts.values()) == {1}
        assert int(state(q, "tick")["ran"]) == len(made)
    finally:
        for c in clients:
            c.close()


def test_a_sweeper_dying_between_decision_and_task_leaves_the_tick_to_the_next_one(q: mc_queue.Client) -> None:
    q.periodic.publish(schedule())
    now = back(q, "tick", 61_000)
    tick = schedule().ticks(now - 61_000, now, 1)[0]
    from mc_queue.client.periodic import Periodic

    chosen = "jobs:01J1111111111111111111111Z"
    reply = Periodic._decide(q.periodic, "tick", tick, 1, chosen, "", "skip", "", "sweeper-a")
    assert reply == ["OK", "run", chosen, ""]  # ... and sweeper-a dies here: no task yet
    assert tasks_of(q, "tick") == {}
    out = q.periodic.run_due(actor="sweeper-b")  # the next sweeper makes that very task
    assert [(t.outcome, t.task_id, t.tick_ms) for t in out] == [("ran", chosen, tick)]
    assert tasks_of(q, "tick") == {tick: chosen}
    assert q.periodic.run_due() == []


def test_a_lost_decision_made_again_with_another_id_still_makes_one_task(q: mc_queue.Client) -> None:
    """A failover took the decision (not the task): the tick is decided again with another id, and its
    producer key returns the task already made."""
    q.periodic.publish(schedule())
    now = back(q, "tick", 61_000)
    tick = schedule().ticks(now - 61_000, now, 1)[0]
    first = q.periodic.run_due()
    assert [t.outcome for t in first] == ["ran"]
    q.redis.hset(q.keys.periodic_state("tick"), mapping={"cursor": now - 61_000})  # the decision "lost"
    q.redis.hdel(q.keys.periodic_state("tick"), "last_task", "last_tick")
    again = q.periodic.run_due()
    assert [(t.outcome, t.task_id) for t in again] == [("ran", first[0].task_id)]
    assert tasks_of(q, "tick") == {tick: first[0].task_id}


# --------------------------------------------------------------------------- overlap


@pytest.mark.parametrize("overlap", ["skip", "queue", "cancel"])
def test_overlap_while_the_previous_task_runs(q: mc_queue.Client, overlap: str) -> None:
    q.periodic.publish(schedule(overlap=overlap, catch_up="all"))
    back(q, "tick", 121_000)  # two ticks due
    out = q.periodic.run_due()
    first = out[0]
    assert first.outcome == "ran"
    prev = q.reads.get_task(first.task_id or "")
    if overlap == "skip":
        assert [t.outcome for t in out] == ["ran", "skipped"] and out[1].why == "overlap"
        assert state(q, "tick")["skipped_overlap"] == "1" and len(tasks_of(q, "tick")) == 1
    elif overlap == "queue":
        assert [t.outcome for t in out] == ["ran", "ran"] and len(tasks_of(q, "tick")) == 2
        assert prev.state is TaskState.PENDING
    else:
        assert [t.outcome for t in out] == ["ran", "ran"] and len(tasks_of(q, "tick")) == 2
        canceled = q.reads.get_task(prev.id)
        assert canceled.state is TaskState.CANCELED and "overlap policy 'cancel'" in (canceled.cancel_requested or "")


def test_overlap_skip_runs_the_next_tick_once_the_previous_task_ended(q: mc_queue.Client) -> None:
    q.periodic.publish(schedule(every_s=0.4, overlap="skip"))
    first = wait_for(lambda: q.periodic.run_due(), 2, "a first tick")[0]
    lease = q.leases.claim_attempt(first.task_id or "", "w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1")
    second = wait_for(lambda: q.periodic.run_due(), 2, "the next tick")
    assert [t.outcome for t in second] == ["ran"] and second[0].task_id != first.task_id
    assert second[0].tick_ms - first.tick_ms == 400 and "skipped_overlap" not in state(q, "tick")


# --------------------------------------------------------------------------- catch-up after downtime


@pytest.mark.parametrize("catch_up", ["none", "last", "all"])
def test_ticks_missed_while_no_sweeper_ran(q: mc_queue.Client, catch_up: str) -> None:
    now = q.backend.redis_time_ms()
    latest = schedule().ticks(now - 60_000, now, 1)[0]
    since = (now - latest) / 1000  # a late_s two seconds away from the latest tick's age, either side
    late_s = since - 2 if since > 4 else since + 2
    q.periodic.publish(schedule(overlap="queue", catch_up=catch_up, late_s=late_s))
    cursor = latest - 10 * 60_000 - 1  # ten ticks after it, the latest included
    q.redis.hset(q.keys.periodic_state("tick"), "cursor", cursor)
    ticks = schedule().ticks(cursor, now, 100)
    missed = [t for t in ticks if now - t > late_s * 1000]
    in_time = [t for t in ticks if t not in missed]
    assert len(ticks) == 11 and missed  # (ten grid ticks plus the latest one)
    q.periodic.run_due()
    made, st = tasks_of(q, "tick"), state(q, "tick")
    run = {"none": in_time, "all": ticks, "last": in_time or missed[-1:]}[catch_up]
    assert sorted(made) == run, (catch_up, late_s, made, st)
    assert int(st.get("skipped_missed", 0)) == len(ticks) - len(run)
    assert int(st["cursor"]) == ticks[-1]


def test_a_long_outage_is_skipped_in_one_step_and_counted(q: mc_queue.Client) -> None:
    q.periodic.publish(schedule(every_s=1, catch_up="none"))
    back(q, "tick", 3 * 86_400_000)
    q.periodic.run_due()
    st = state(q, "tick")
    assert 100_000 <= int(st["skipped_missed"]) <= 3 * 86_400 + 2  # counted, up to 100,000 per pass
    assert tasks_of(q, "tick") == {}


# --------------------------------------------------------------------------- operator


def test_a_paused_schedule_skips_its_ticks_until_resumed(q: mc_queue.Client) -> None:
    q.periodic.publish(schedule(catch_up="all", overlap="queue"))
    assert q.periodic.pause("tick", reason=REASON, actor="ops")
    assert not q.periodic.pause("tick", reason=REASON)
    back(q, "tick", 121_000)
    out = q.periodic.run_due()
    assert [(t.outcome, t.why) for t in out] == [("skipped", "paused"), ("skipped", "paused")]
    assert tasks_of(q, "tick") == {}
    assert q.periodic.resume("tick", reason=REASON)
    back(q, "tick", 61_000)
    assert [t.outcome for t in q.periodic.run_due()] == ["ran"]
    logged = [f for _, f in q.redis.xrange(q.keys.nslog) if f.get("type", "").startswith("periodic_")]
    assert [f["type"] for f in logged][-2:] == ["periodic_paused", "periodic_resumed"]


def test_pause_refuses_a_short_reason_and_an_unknown_schedule(q: mc_queue.Client) -> None:
    q.periodic.publish(schedule())
    with pytest.raises(mc_queue.InvalidArgument):
        q.periodic.pause("tick", reason="short")
    with pytest.raises(mc_queue.TransitionRefused, match="no periodic schedule named nope"):
        q.periodic.pause("nope", reason=REASON)
    with pytest.raises(mc_queue.InvalidArgument):
        q.periodic.pause("bad name\n", reason=REASON)


def test_trigger_makes_a_task_now_and_the_same_request_id_the_same_task(q: mc_queue.Client) -> None:
    q.periodic.publish(schedule())
    a = q.periodic.trigger("tick", request_id="req-1")
    b = q.periodic.trigger("tick", request_id="req-1")
    c = q.periodic.trigger("tick")
    assert a.id == b.id != c.id and a.idempotency_key == "periodic:tick:trigger:req-1"
    assert state(q, "tick")["triggered"] == "3"
    with pytest.raises(mc_queue.TaskNotFound):
        q.periodic.trigger("nope")


def test_publishing_again_keeps_the_cursor_and_counts_and_an_app_withdraws_what_it_dropped(
        q: mc_queue.Client) -> None:
    app = mc_queue.App(name="cron-app", default_queue="jobs")

    @app.handler("noop")
    def noop(ctx: mc_queue.Context, payload: dict[str, Any]) -> None:
        return None

    app.periodic("a", "noop", every_s=60)
    app.periodic("b", "noop", cron="*/5 * * * *", tz="Europe/Paris")
    app.publish_retention(q)
    assert set(q.periodic.definitions()) == {"a", "b"}
    cursor = state(q, "a")["cursor"]
    q.redis.hset(q.keys.periodic_state("a"), "ran", 7)
    app.schedules.pop("b")
    app.schedules["a"] = app.schedules["a"].model_copy(update={"every_s": 120})
    app.publish_retention(q)
    assert set(q.periodic.definitions()) == {"a"} and q.periodic.definitions()["a"].every_s == 120
    assert state(q, "a")["cursor"] == cursor and state(q, "a")["ran"] == "7"


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"cron": "61 * * * *"}, "Bad minute"),
    ({"cron": "* * * * *", "every_s": 5}, "exactly one of cron"),
    ({}, "exactly one of cron"),
    ({"every_s": 0.01}, "greater than or equal to 0.1"),
    ({"every_s": float("nan")}, "every_s"),
    ({"cron": "0 2 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"every_s": 60, "overlap": "replace"}, "overlap"),
])
def test_a_bad_schedule_is_refused_when_declared(kwargs: dict[str, Any], words: str) -> None:
    app = mc_queue.App(default_queue="jobs")

    @app.handler("noop")
    def noop(ctx: mc_queue.Context, payload: dict[str, Any]) -> None:
        return None

    with pytest.raises(mc_queue.InvalidArgument, match=words):
        app.periodic("bad", "noop", **kwargs)
    with pytest.raises(mc_queue.InvalidArgument, match="unknown handler"):
        app.periodic("bad", "missing", every_s=60)


# --------------------------------------------------------------------------- the sweeper and the CLI


def test_the_sweeper_ticks_and_a_worker_runs_what_it_made(h: Harness) -> None:
    h.client.periodic.publish(schedule(every_s=0.5, overlap="queue"))
    sweeper_stop = time.monotonic() + 1.6
    h.sweeper.run(interval_s=0.2, stop_after_s=1.6)
    assert time.monotonic() >= sweeper_stop - 0.1
    h.sweeper.promote()  # (what the last pass made goes to RQ at the sweeper's next look)
    made = tasks_of(h.client, "tick")
    assert 2 <= len(made) <= 4, made
    h.run_worker("simple", BASIC)
    for tid in made.values():
        assert h.task(tid).state is TaskState.SUCCEEDED


def _mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          capture_output=True, text=True, timeout=60)


def test_mcq_schedule_as_typed(redis_server: RedisServer, prefix: str, q: mc_queue.Client) -> None:
    assert "no periodic schedule" in _mcq(redis_server, prefix, "schedule", "list").stdout
    q.periodic.publish(schedule("nightly", cron="0 2 * * *", tz="Europe/Paris"))
    listed = _mcq(redis_server, prefix, "schedule", "list")
    assert listed.returncode == 0 and "nightly: noop on jobs, cron '0 2 * * *' (Europe/Paris)" in listed.stdout
    rows = json.loads(_mcq(redis_server, prefix, "schedule", "list", "--json").stdout)
    assert rows[0]["name"] == "nightly" and rows[0]["next_tick_ms"] > q.backend.redis_time_ms()
    assert _mcq(redis_server, prefix, "schedule", "pause", "nightly", "--reason", REASON).stdout.strip() == \
        "schedule nightly paused"
    assert "PAUSED by operator" in _mcq(redis_server, prefix, "schedule", "list").stdout
    assert _mcq(redis_server, prefix, "schedule", "pause", "nightly", "--reason", "short").returncode == 2
    assert _mcq(redis_server, prefix, "schedule", "resume", "nightly", "--reason", REASON).stdout.strip() == \
        "schedule nightly resumed"
    trig = _mcq(redis_server, prefix, "schedule", "trigger", "nightly")
    assert trig.returncode == 0 and q.reads.get_task(trig.stdout.strip()).handler == "noop"
    listed = _mcq(redis_server, prefix, "tasks", "--schedule", "nightly").stdout
    assert trig.stdout.strip() in listed
    assert trig.stdout.strip() not in _mcq(redis_server, prefix, "tasks", "--schedule", "other").stdout
    shown = _mcq(redis_server, prefix, "show", trig.stdout.strip()).stdout
    assert "(periodic schedule nightly, triggered by hand)" in shown
    missing = _mcq(redis_server, prefix, "schedule", "pause", "nope", "--reason", REASON)
    assert missing.returncode != 0 and "no periodic schedule named nope" in missing.stderr

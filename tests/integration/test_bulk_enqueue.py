"""Bulk enqueue (issue 18): many tasks in one round trip, all or nothing, each item's producer key honoured.

Both sides of each boundary: every item valid / one bad (by the client's checks or by the script's:
nothing written, the error names the item), two items with one key, a batch sent twice (each task
once), an item naming work admitted before (returned, not made again), the cap, and an App's batch run
by a worker.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import mc_queue
from mc_queue import TaskState
from mc_queue.client.producer import MAX_BULK, NewTask
from tests.harness import BASIC, Harness, harness_fixture

QUEUE = "jobs"
h = harness_fixture(Harness)


def snapshot(q: mc_queue.Client) -> dict[str, Any]:
    q.backend.epoch()  # (the namespace made first: its meta is not what a refusal wrote)
    return {k: q.redis.dump(k) for k in sorted(q.redis.scan_iter(match=f"{q.keys.tag}*")) if not k.endswith(":nslog")}


class Calls:
    def __init__(self) -> None:
        self.names: list[str] = []

    def before(self, name: str, keys: Any, argv: Any) -> Any:
        self.names.append(name)

    def after(self, token: Any, reply: Any) -> None:
        pass


def test_a_batch_is_made_in_one_call_each_task_as_enqueue_makes_it(q: mc_queue.Client) -> None:
    calls = Calls()
    q.backend.epoch()
    q.producer.enqueue_many([NewTask(QUEUE, "h", {"warm": 1})])  # (the script loaded)
    evalsha = q.redis.info("commandstats")["cmdstat_evalsha"]["calls"]
    q.runner.observers.append(calls)
    items = [NewTask(QUEUE, "h", {"n": i}, f"key-{i}", priority=1 + i % 9) for i in range(50)]
    tasks = q.producer.enqueue_many(items)
    q.runner.observers.remove(calls)
    assert q.redis.info("commandstats")["cmdstat_evalsha"]["calls"] - evalsha == 1  # one script, one round trip
    assert set(calls.names) == {"enqueue_many"}  # (an observer sees the call, then each item)
    assert [t.payload for t in tasks] == [{"n": i} for i in range(50)]
    for i, t in enumerate(tasks):
        assert t.state is TaskState.PENDING and t.idempotency_key == f"key-{i}" and t.priority == 1 + i % 9
        stored = q.reads.get_task(t.id)
        assert stored.payload == {"n": i} and stored.attempts[0].state.value == "pending"
        assert q.redis.zscore(q.keys.pending(QUEUE), t.id) is not None
    assert q.reads.status()[QUEUE]["counts"]["pending"] == 51


@pytest.mark.parametrize(("bad", "words"), [
    ({"priority": 0}, "item 3: priority"),
    ({"payload": {"x": float("nan")}}, "item 3"),
    ({"queue": "no spaces"}, "item 3: invalid queue"),
    ({"start_by": timedelta(0)}, "item 3: start_by"),
    ({"idempotency_key": "has space"}, "item 3"),
])
def test_one_bad_item_by_the_clients_checks_writes_nothing(q: mc_queue.Client, bad: dict[str, Any],
                                                           words: str) -> None:
    q.producer.enqueue(QUEUE, "h", {"before": True})
    items = [NewTask(QUEUE, "h", {"n": i}) for i in range(5)]
    opts = {"queue": QUEUE, "handler": "h", "payload": {"n": 2}, **bad}
    items[2] = NewTask(opts.pop("queue"), opts.pop("handler"), opts.pop("payload"), **opts)
    before = snapshot(q)
    with pytest.raises(mc_queue.InvalidArgument, match=words) as exc:
        q.producer.enqueue_many(items)
    assert exc.value.item == 3  # type: ignore[attr-defined]
    assert snapshot(q) == before


def test_one_item_the_script_refuses_writes_nothing_but_its_audit(q: mc_queue.Client) -> None:
    q.producer.enqueue(QUEUE, "h", {"first": True}, "taken")
    before = snapshot(q)
    items = [NewTask(QUEUE, "h", {"n": 1}, "a"), NewTask(QUEUE, "h", {"other": True}, "taken"),
             NewTask(QUEUE, "h", {"n": 3}, "c")]
    with pytest.raises(mc_queue.IdempotencyConflict, match="item 2") as exc:
        q.producer.enqueue_many(items)
    assert exc.value.item == 2  # type: ignore[attr-defined]
    assert snapshot(q) == before  # (the refusal's audit event is in the namespace log, left out here)
    logged = [f for _, f in q.redis.xrange(q.keys.nslog) if f.get("type") == "enqueue_refused"]
    assert logged and logged[-1]["idem_key"] == "taken"


def test_a_deadline_that_could_never_be_met_in_one_item_refuses_the_batch(q: mc_queue.Client) -> None:
    before = snapshot(q)
    items = [NewTask(QUEUE, "h", {"n": 1}),
             NewTask(QUEUE, "h", {"n": 2}, delay_s=3600, start_by=timedelta(seconds=60))]
    with pytest.raises(mc_queue.InvalidArgument, match=r"item 2: .*could never start in time"):
        q.producer.enqueue_many(items)
    assert snapshot(q) == before


def test_two_items_with_one_key_or_id_are_refused(q: mc_queue.Client) -> None:
    before = snapshot(q)
    with pytest.raises(mc_queue.InvalidArgument, match="items 1 and 3 have the same producer key k"):
        q.producer.enqueue_many([NewTask(QUEUE, "h", {"n": i}, "k" if i != 1 else "other") for i in range(3)])
    tid = mc_queue.contracts.keys.new_task_id(QUEUE)
    with pytest.raises(mc_queue.InvalidArgument, match="the same task id"):
        q.producer.enqueue_many([NewTask(QUEUE, "h", {"n": i}, task_id=tid) for i in range(2)])
    assert snapshot(q) == before


def test_the_same_batch_twice_makes_each_task_once(q: mc_queue.Client) -> None:
    old = q.producer.enqueue(QUEUE, "h", {"n": 0}, "k-0")
    items = [NewTask(QUEUE, "h", {"n": i}, f"k-{i}") for i in range(10)]
    first = q.producer.enqueue_many(items)
    assert first[0].id == old.id  # admitted before: returned, not made again
    again = q.producer.enqueue_many(items)
    assert [t.id for t in again] == [t.id for t in first]
    assert q.reads.status()[QUEUE]["counts"]["pending"] == 10


def test_the_cap_and_an_empty_batch_are_refused(q: mc_queue.Client) -> None:
    with pytest.raises(mc_queue.InvalidArgument, match="1 to 1000"):
        q.producer.enqueue_many([])
    with pytest.raises(mc_queue.InvalidArgument, match="1 to 1000"):
        q.producer.enqueue_many([NewTask(QUEUE, "h", {})] * (MAX_BULK + 1))


def test_an_apps_batch_is_sent_to_rq_and_run(h: Harness) -> None:
    tasks = h.basic.enqueue_many([{"handler": "noop", "payload": {"n": i}, "idempotency_key": f"b-{i}"}
                                  for i in range(20)] + [{"handler": "noop", "payload": {"later": 1}, "delay_s": 3600}])
    assert tasks[-1].state is TaskState.SCHEDULED
    h.run_worker("simple", BASIC)
    assert all(h.task(t.id).state is TaskState.SUCCEEDED for t in tasks[:-1])
    assert h.task(tasks[-1].id).state is TaskState.SCHEDULED
    with pytest.raises(mc_queue.InvalidArgument, match=r"item 2: .*unknown handler"):
        h.basic.enqueue_many([{"handler": "noop", "payload": {}}, {"handler": "nope", "payload": {}}])

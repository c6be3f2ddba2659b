"""What one page costs, whatever the namespace holds (issue 15): every list is paged, a live refresh
asks for the page shown and no more, per-queue reads go in one pipeline, and the queue-age sampler
samples the queues ``Reads.queues()`` lists that hold a task. Measured on a redis-server of the
test's own (``INFO commandstats`` counts the commands) and at the client (round trips: one per
command sent alone, one per pipeline)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.connection

import mc_queue
from mc_queue.ops.console import create_app
from mc_queue.ops.console.pages import OVERVIEW_PAGE_SIZE, PAGE_SIZE
from mc_queue.ops.console.samples import sample
from mc_queue.testing import RedisServer, unique_prefix

from .conftest import hidden_fields, local, quarantine

TOKEN = "bounds-test-token-0123456789abcdef"


@pytest.fixture
def client(own_redis: RedisServer) -> Iterator[mc_queue.Client]:
    c = mc_queue.connect(own_redis.url, prefix=unique_prefix("bounds"))
    yield c
    c.close()


class Cost:
    """Round trips (client side) and commands by name (server side) of one call."""

    def __init__(self, server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.admin = server.client()
        self.trips = 0
        original = redis.connection.AbstractConnection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.trips += 1
            original(conn, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def measure(self, call: Callable[[], Any]) -> tuple[Any, int, dict[str, int]]:
        self.admin.config_resetstat()
        self.trips = 0
        result = call()
        trips = self.trips
        stats = self.admin.info("commandstats")
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        calls.pop("config|resetstat", None)
        calls.pop("info", None)
        return result, trips, calls


def test_attention_is_paged_and_its_refresh_bounded(client: mc_queue.Client) -> None:
    ids = sorted(quarantine(client, f"paged-{i}") for i in range(2 * PAGE_SIZE + 3))
    c = local(create_app(client, token=TOKEN, sampling=False))
    shown = re.compile(r'class="card attention-item" id="item-\d+" data-task="([^"]+)"')
    first = c.get("/attention").text
    assert shown.findall(first) == ids[:PAGE_SIZE]
    assert f"{len(ids)} tasks" in first and 'href="/attention?page=2"' in first
    second = c.get("/attention", params={"page": "2"}).text
    assert shown.findall(second) == ids[PAGE_SIZE:2 * PAGE_SIZE]
    assert 'href="/attention?page=1"' in second and 'href="/attention?page=3"' in second
    # a form refused on page 2 answers with page 2 (and the script goes on polling page 2)
    fields = hidden_fields(second, "replay", within=f'data-task="{ids[PAGE_SIZE]}"')
    assert fields["list_page"] == "2"
    refused = c.post("/actions/replay", data={**fields, "reason": "too short"})
    assert refused.status_code == 400 and shown.findall(refused.text) == ids[PAGE_SIZE:2 * PAGE_SIZE]
    assert 'data-page-url="/attention?page=2"' in refused.text and "too short</textarea>" in refused.text
    # the live refresh asks for the page shown (its address carries the page), and gets that page only
    assert 'data-page-url="/attention?page=3"' in c.get("/attention", params={"page": "3"}).text
    last = c.get("/attention", params={"page": "3", "partial": "1"}).text
    assert shown.findall(last) == ids[2 * PAGE_SIZE:] and "page=4" not in last
    assert c.get("/attention", params={"page": "0"}).status_code == 400
    assert c.get("/attention", params={"page": "x"}).status_code == 400
    beyond = c.get("/attention", params={"page": "9"})
    assert beyond.status_code == 200 and shown.findall(beyond.text) == [] and 'href="/attention?page=3"' in beyond.text


def test_attention_reads_only_the_page_it_shows(client: mc_queue.Client, own_redis: RedisServer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3 * PAGE_SIZE):
        quarantine(client, f"read-{i}")
    c = local(create_app(client, token=TOKEN, sampling=False))
    cost = Cost(own_redis, monkeypatch)
    r, trips, calls = cost.measure(lambda: c.get("/attention", params={"partial": "1"}))
    assert r.status_code == 200
    assert "hgetall" not in calls  # never the whole attention hash (13.6 MB with 5,000 items)
    assert calls.get("hmget", 0) <= 2 and calls.get("zrange", 0) == 0  # the page's items; no whole-DLQ read
    assert trips <= 8, (trips, calls)


def test_the_dlq_page_is_paged(client: mc_queue.Client) -> None:
    from mc_queue.ops.console.pages import DLQ_GROUPS_PAGE, DLQ_TASKS_SHOWN

    many = [quarantine(client, "one-failure") for _ in range(DLQ_TASKS_SHOWN + 2)]
    for i in range(DLQ_GROUPS_PAGE):  # digits are normalised out of a fingerprint: letters tell these apart
        quarantine(client, "another-failure-" + "".join(chr(97 + int(d)) for d in f"{i:03d}"))
    c = local(create_app(client, token=TOKEN, sampling=False))
    first = c.get("/dlq").text
    groups = re.findall(r'class="card dlq-group" id="group-\d+" data-fingerprint="([^"]+)"', first)
    assert len(groups) == DLQ_GROUPS_PAGE and 'href="/dlq?page=2"' in first
    listed = re.findall(r'<li data-task="([^"]+)"', first.split('data-fingerprint="', 2)[1])
    assert listed == many[:DLQ_TASKS_SHOWN] and "and 2 more" in first
    assert f"Purge all {len(many)}" in first  # the bulk forms carry every task of the group
    second = c.get("/dlq", params={"page": "2"}).text
    assert len(re.findall(r'class="card dlq-group"', second)) == 1


def test_the_overview_reads_the_series_of_the_queues_it_shows(client: mc_queue.Client, own_redis: RedisServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    queues = [f"q{i:03d}" for i in range(300)]
    for q in queues:
        client.producer.enqueue(q, "h", {"q": q})
    assert sample(client, interval_s=0) == 300
    c = local(create_app(client, token=TOKEN, sampling=False))
    cost = Cost(own_redis, monkeypatch)
    r, trips, calls = cost.measure(lambda: c.get("/"))
    assert r.status_code == 200
    cards = re.findall(r'<h3><a href="/tasks\?queue=([^"]+)">', r.text)
    assert cards == queues[:OVERVIEW_PAGE_SIZE] and 'href="/?page=2"' in r.text
    assert calls.get("xrange", 0) == OVERVIEW_PAGE_SIZE  # the charts of the page, not of 300 queues
    assert trips <= 20, (trips, calls)
    last = c.get("/", params={"page": str(-(-300 // OVERVIEW_PAGE_SIZE))}).text
    assert re.findall(r'<h3><a href="/tasks\?queue=([^"]+)">', last)[-1] == "q299"


def test_the_task_list_pipelines_its_per_queue_reads(client: mc_queue.Client, own_redis: RedisServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(300):
        client.producer.enqueue(f"q{i:03d}", "h", {"n": i})
    c = local(create_app(client, token=TOKEN, sampling=False))
    cost = Cost(own_redis, monkeypatch)
    r, trips, calls = cost.measure(lambda: c.get("/tasks"))
    assert r.status_code == 200
    assert trips <= 20, (trips, calls)


def test_the_sampler_samples_only_listed_queues_that_hold_a_task(client: mc_queue.Client) -> None:
    kept = client.producer.enqueue("busy", "h", {"n": 1}).id
    gone = quarantine(client, "emptied", queue="emptied")
    client.operator.dlq_purge(gone, reason="nobody needs this one any more", actor="operator", keep_key_s=60)
    assert "emptied" in client.reads.queues()  # listed until the core forgets queues without task or policy
    assert sample(client, interval_s=0) == 1
    assert client.redis.exists(client.keys.queue_samples("busy")) == 1
    assert client.redis.exists(client.keys.queue_samples("emptied")) == 0
    # a queue the counts name but Reads.queues() does not list (forgotten): not sampled either
    client.redis.hset(client.keys.counts, "forgotten|pending", 1)
    assert "forgotten" not in client.reads.queues()
    assert sample(client, interval_s=0) == 1
    assert client.redis.exists(client.keys.queue_samples("forgotten")) == 0
    assert client.reads.get_task(kept).state.value == "pending"

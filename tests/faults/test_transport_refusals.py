"""Forged and misrouted RQ jobs against real `mcq worker` processes: refused, never run, task untouched.

Anyone able to write ``rq:*`` keys can push a job naming mc_queue's entry function with RQ options
mc_queue never sets (webhooks, callbacks, dependencies, retries, repeats, another timeout ...), or an
Attempt on another queue than its task's, or an Attempt of a handler this worker's App does not have.
Each such job is refused before anything is claimed: the task's records are byte for byte what they
were, no HTTP request leaves the worker, no callback is imported, and the refusal is recorded in the
namespace's capped refusals log (``Client.reads.refusals()``) and counted in its stats.

Every assertion reads Redis (the task's hashes and events, the refusals stream, the stats hash) or
counts requests at a real local HTTP server; workers are `python -m mc_queue ... worker` processes.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from mc_queue import TaskState
from mc_queue.contracts.keys import new_ulid
from mc_queue.contracts.models import AttemptState, Task
from mc_queue.producer.dispatch import AppClient, dispatch
from mc_queue.producer.transport import ENTRY, job_id, rq_queue_name
from mc_queue.testing import RedisServer, unique_prefix
from tests.apps import lifecycle_app
from tests.harness import Harness, events, harness_fixture

LIFECYCLE = "tests.apps.lifecycle_app:app"


class HookServer:
    """A real local HTTP server that counts every request it gets (a webhook target)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        hits = self.requests

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _hit(self) -> None:
                hits.append((self.command, self.path))
                self.send_response(200)
                self.end_headers()

            do_GET = do_POST = _hit

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


h = harness_fixture(Harness)


@pytest.fixture
def hook() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.stop()


def snapshot(h: Harness, task_id: str) -> tuple[Any, ...]:
    """Every key of the task as Redis holds it, plus the fence counter and the lease key."""
    tk = h.client.keys.task(task_id)
    r = h.client.redis
    return (r.hgetall(tk.task), r.hgetall(tk.attempts), r.lrange(tk.events, 0, -1), r.get(tk.fence), r.exists(tk.lease),
            r.hgetall(tk.effects))


def refusals_by_job(h: Harness) -> dict[str, str]:
    return {e.get("job_id", ""): e["reason"] for e in h.client.reads.refusals(count=10_000)
            if e["type"] == "transport_job_refused"}


def tamper(h: Harness, task: Task, fields: dict[str, Any]) -> str:
    """Dispatch the task's Attempt as mc_queue does, then rewrite its RQ job hash (what a writer of
    ``rq:*`` keys can do). Returns the job id."""
    dispatch(h.client, h.rq, task, task.attempts[0])
    jid = job_id(h.prefix, task.attempts[0].id)
    h.rq.hset(f"rq:job:{jid}", mapping=fields)
    return jid


def entry_data(*args: Any, instance: Any = None, kwargs: dict[str, Any] | None = None) -> bytes:
    return zlib.compress(json.dumps([ENTRY, instance, list(args), kwargs or {}]).encode())


# --------------------------------------------------------------------------- A.1 RQ options mc_queue never sets


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_jobs_carrying_rq_options_mc_queue_never_sets_are_refused_and_never_act(h: Harness, hook: HookServer,
                                                                                 kind: str) -> None:
    marker = "tests.apps.faulty.touch_marker"
    webhook = json.dumps([{"url": f"{hook.url}/finished", "job_status": "finished", "method": "POST",
                           "headers": None, "timeout": 5},
                          {"url": f"{hook.url}/failed", "job_status": "failed", "method": "GET",
                           "headers": None, "timeout": 5}])
    forged: dict[str, dict[str, Any]] = {
        "webhooks": {"webhooks": webhook},
        "success_callback_name": {"success_callback_name": marker},
        "failure_callback_name": {"failure_callback_name": marker},
        "stopped_callback_name": {"stopped_callback_name": marker, "stopped_callback_timeout": "600"},
        "dependency_ids": {"dependency_ids": json.dumps(["rq-job-that-never-finishes"]),
                           "dependency_id": "rq-job-that-never-finishes"},
        "retries_left": {"retries_left": "5", "retry_intervals": "[0]"},
        "repeats_left": {"repeats_left": "5", "repeat_intervals": "[0]"},
        "meta": {"meta": json.dumps({"owner": "someone else"})},
        "ttl": {"ttl": "5"},
        "group_id": {"group_id": "a-group"},
        "rate_limit_key": {"rate_limit_key": "k", "rate_limit_concurrency": "1"},
        "success_callback_timeout": {"success_callback_timeout": "86400"},
        "unknown_field": {"x_future_option": "1"},
        "instance": {},  # data rewritten below: an instance to call the entry on
    }
    tasks: dict[str, Task] = {}
    jobs: dict[str, str] = {}
    for name, fields in forged.items():
        task = h.enqueue_undispatched(h.basic, "long", {"seconds": 0.2, "case": name})
        if name == "instance":
            fields = {"data": entry_data(h.prefix, task.attempts[0].id, 1500, instance={"a": 1})}
        jobs[name] = tamper(h, task, fields)
        tasks[name] = h.task(task.id)
    # One more made with RQ's own API, webhooks and callbacks as a client library sets them.
    from rq import Callback
    from rq.webhook import Webhook

    api_task = h.enqueue_undispatched(h.basic, "long", {"seconds": 0.2, "case": "api"})
    aid = api_task.attempts[0].id
    api_job = Queue(rq_queue_name(h.prefix, "jobs"), connection=h.rq, serializer=JSONSerializer).enqueue_call(
        func=ENTRY, args=(h.prefix, aid, 1500), job_id=job_id(h.prefix, aid), result_ttl=0, failure_ttl=7 * 86400,
        timeout=60, on_success=Callback(marker), webhooks=[Webhook(f"{hook.url}/api", "finished")])
    tasks["api"], jobs["api"] = h.task(api_task.id), api_job.id
    before = {name: snapshot(h, t.id) for name, t in tasks.items()}
    legit = h.basic.enqueue("noop", {"after": "the forged ones"})

    h.run_worker(kind)

    assert hook.requests == [], f"a forged job made the worker send HTTP requests: {hook.requests}"
    assert list(h.home.glob("pwned-*")) == [], "a callback named in Redis ran"
    for name, t in tasks.items():
        assert snapshot(h, t.id) == before[name], f"{name}: the task was touched by a refused job"
        assert h.task(t.id).state is TaskState.PENDING, name
    by_job = refusals_by_job(h)
    for name, jid in jobs.items():
        assert jid in by_job, f"{name}: no refusal recorded; refusals: {by_job}"
    for name in ("webhooks", "dependency_ids", "retries_left", "repeats_left", "meta", "ttl", "group_id",
                 "rate_limit_key", "success_callback_timeout", "x_future_option"):
        key = "unknown_field" if name == "x_future_option" else name
        assert name in by_job[jobs[key]], (name, by_job[jobs[key]])
    assert "callback" in by_job[jobs["success_callback_name"]] and "callback" in by_job[jobs["api"]]
    assert "instance" in by_job[jobs["instance"]]
    assert int(h.client.redis.hget(h.client.keys.stats, "transport_job_refused") or 0) == len(jobs)
    assert h.task(legit.id).state is TaskState.SUCCEEDED, "the worker stopped serving after the forged jobs"

    # The tasks were left for a proper message: dispatched again as mc_queue does, each runs once.
    for t in tasks.values():
        dispatch(h.client, h.rq, t, t.attempts[0])
    h.run_worker(kind)
    for name, t in tasks.items():
        final = h.task(t.id)
        assert final.state is TaskState.SUCCEEDED, (name, final.state)
        assert len(events(final, "attempt_claimed")) == 1 and len(final.attempts) == 1, name
    assert hook.requests == [] and list(h.home.glob("pwned-*")) == []


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_the_options_mc_queue_sets_take_the_task_s_values_never_the_job_s(h: Harness, kind: str) -> None:
    """timeout, result_ttl and failure_ttl are set by mc_queue's producer: a job rewritten to carry
    others runs with the task's timeout and keeps no result, whatever it says."""
    shorter = h.enqueue_undispatched(h.basic, "long", {"seconds": 2})  # the task allows 60 s
    tamper(h, shorter, {"timeout": "1"})
    unbounded = h.enqueue_undispatched(h.basic, "hangs", {})  # the task allows 2 s; the handler sleeps 30
    tamper(h, unbounded, {"timeout": "-1"})
    kept = h.enqueue_undispatched(h.basic, "noop", {})
    kept_job = tamper(h, kept, {"result_ttl": "-1", "failure_ttl": "999999999"})
    t0 = time.monotonic()
    h.run_worker(kind, timeout=60)
    assert time.monotonic() - t0 < 15, "a job's own timeout (none) kept the worker on a hung handler"

    done = h.task(shorter.id)
    assert done.state is TaskState.SUCCEEDED and done.result == {"slept": 2}, "a job's shorter timeout applied"
    ended = h.task(unbounded.id).attempts[0]
    assert ended.state is not AttemptState.RUNNING, "the task's timeout did not end the hung handler"
    assert ended.elapsed_ms is None or ended.elapsed_ms < 10_000
    assert h.task(kept.id).state is TaskState.SUCCEEDED
    assert not h.rq.exists(f"rq:job:{kept_job}"), "the job's result_ttl kept its RQ job (mc_queue keeps none)"
    assert refusals_by_job(h) == {}


# --------------------------------------------------------------------------- A.2 queue and handler


def test_a_job_on_another_queue_or_for_a_foreign_handler_is_refused_without_touching_the_task(h: Harness) -> None:
    lifecycle = AppClient(lifecycle_app.app, h.client)
    try:
        # The handler is only in the lifecycle app; the basic app's worker serves the same queue.
        foreign_handler = lifecycle.enqueue("only-here", {})
        # A basic task whose (genuine) job is moved to the RQ queue of another mc_queue queue.
        moved = h.enqueue_undispatched(h.basic, "noop", {"moved": True})
        other = Queue(rq_queue_name(h.prefix, "other"), connection=h.rq, serializer=JSONSerializer)
        moved_job = other.enqueue_call(func=ENTRY, args=(h.prefix, moved.attempts[0].id, 3000),
                                       job_id=job_id(h.prefix, moved.attempts[0].id), result_ttl=0,
                                       failure_ttl=7 * 86400, timeout=3600)
        # Same, but only the job's recorded origin is rewritten (the id sits in the right list).
        relabeled = h.enqueue_undispatched(h.basic, "noop", {"relabeled": True})
        relabeled_job = tamper(h, relabeled, {"origin": rq_queue_name(h.prefix, "other")})
        # A message for a task that does not exist.
        ghost_aid = f"jobs:{new_ulid()}/1"
        ghost = h.rq_queue().enqueue_call(func=ENTRY, args=(h.prefix, ghost_aid, 3000), job_id="mcq-ghost-1",
                                          result_ttl=0, failure_ttl=7 * 86400)
        ids = [foreign_handler.id, moved.id, relabeled.id]
        before = {t: snapshot(h, t) for t in ids}

        h.run_worker("fork", "tests.apps.basic:app", "--queue", "jobs", "--queue", "other")

        for t in ids:
            assert snapshot(h, t) == before[t], f"{t} was touched by a job this worker must refuse"
        by_job = refusals_by_job(h)
        fh_job = job_id(h.prefix, foreign_handler.attempts[0].id)
        assert "only-here" in by_job[fh_job] and "test-basic" in by_job[fh_job], by_job
        assert "queue" in by_job[moved_job.id], by_job
        assert "origin" in by_job[relabeled_job] or "queue" in by_job[relabeled_job], by_job
        assert "no task" in by_job[ghost.id], by_job
        assert h.client.redis.exists(h.client.keys.task(ghost_aid.split("/")[0]).task) == 0

        # The task of the other app's handler waited for a worker that has it.
        dispatch(h.client, h.rq, h.task(foreign_handler.id), foreign_handler.attempts[0])
        h.run_worker("simple", LIFECYCLE)
        done = h.task(foreign_handler.id)
        assert done.state is TaskState.SUCCEEDED and done.result == {"ran_by": "test-lifecycle", "attempt": 1}
        assert len(done.attempts) == 1 and not events(done, "claim_refused")
    finally:
        lifecycle.close()


# --------------------------------------------------------------------------- A.3 the lease comes from the task


def test_the_lease_length_in_a_message_is_ignored(h: Harness) -> None:
    spec = h.basic.app.spec("long")
    task = h.enqueue_undispatched(h.basic, "long", {"seconds": 0.5})
    aid = task.attempts[0].id
    h.rq_queue().enqueue_call(func=ENTRY, args=(h.prefix, aid, 3_600_000), job_id=job_id(h.prefix, aid),
                              result_ttl=0, failure_ttl=7 * 86400, timeout=int(spec.timeout_s))
    h.run_worker("simple")
    final = h.task(task.id)
    assert final.state is TaskState.SUCCEEDED
    a = final.attempts[0]
    assert a.lease_ms == spec.lease_ms == 1500, a.lease_ms
    claimed = events(final, "attempt_claimed")[0]
    # The lease the claim granted ran for the task's length (1.5 s), not the message's hour.
    assert int(claimed.fields["lease_ms"]) == spec.lease_ms, claimed.fields
    assert a.started_at is not None
    started_ms = round(a.started_at.timestamp() * 1000)
    assert int(claimed.fields["lease_exp"]) - started_ms == spec.lease_ms, claimed.fields


# --------------------------------------------------------------------------- A.4 the refusals log is capped


def test_a_flood_of_forged_jobs_does_not_grow_the_refusals_log_past_its_cap(tmp_path: Path) -> None:
    """The refusals log is capped at about 10,000 entries (XADD MAXLEN ~), so whoever can write RQ's
    keys cannot grow Redis through it. 9,000 refusals already recorded (through Client.audit, the call
    every refusal goes through), then 1,500 forged jobs through one real worker: every one is refused
    and counted, the log holds its newest ~10,000 entries, the oldest are gone, nothing went to the
    namespace log. (A refused job costs a worker RQ's own ~16 round trips, 1.5 to 4.5 ms on these
    machines: a 20,000-job flood would take 30 to 90 s, so the scale is chosen to cross the cap fast.)"""
    prefilled, n = 9_000, 1_500
    server = RedisServer(tmp_path / "redis", appendonly=False).start()  # persistence is not what is tested
    h = Harness(server, unique_prefix(), tmp_path / "home")
    try:
        h.client.backend.open_namespace()
        for i in range(prefilled):
            h.client.operator.audit("transport_job_refused", {"job_id": f"earlier-{i}", "reason": "an earlier refusal"})
        oldest = h.client.redis.xrange(h.client.keys.refused, count=1)[0][0]
        nslog_before = h.client.redis.xlen(h.client.keys.nslog)
        q = h.rq_queue()
        pipe = h.rq.pipeline(transaction=False)
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        for i in range(n):
            if i % 2:  # a foreign function
                data = zlib.compress(json.dumps(["os.system", None, ["true"], {}]).encode())
            else:  # mc_queue's entry, with a webhook
                data = entry_data(h.prefix, f"jobs:{new_ulid()}/1", 3000)
            fields = {"data": data, "origin": q.name, "created_at": now, "enqueued_at": now, "status": "queued",
                      "description": "forged"}
            if not i % 2:
                fields["webhooks"] = json.dumps([{"url": "http://127.0.0.1:9/x", "job_status": "finished",
                                                  "method": "GET", "headers": None, "timeout": 1}])
            pipe.hset(f"rq:job:forged-{i}", mapping=fields)
            pipe.rpush(q.key, f"forged-{i}")
        pipe.execute()

        h.run_worker("simple", timeout=120)

        assert q.count == 0, "the worker did not consume every forged job"
        stats = int(h.client.redis.hget(h.client.keys.stats, "transport_job_refused") or 0)
        assert stats == prefilled + n, f"{stats} refusals counted for {prefilled} + {n}"
        length = h.client.redis.xlen(h.client.keys.refused)
        assert 10_000 <= length <= 10_100, f"the refusals log holds {length} entries after {prefilled + n} refusals"
        first = h.client.redis.xrange(h.client.keys.refused, count=1)[0][0]
        assert first != oldest, "the oldest refusals were not trimmed"
        newest = h.client.reads.refusals(count=n)
        assert newest[0]["job_id"] == f"forged-{n - 1}"
        assert {e["job_id"] for e in newest} == {f"forged-{i}" for i in range(n)}, "a forged job was not recorded"
        assert h.client.redis.xlen(h.client.keys.nslog) == nslog_before, "refusals went to the namespace log"
        assert not any(h.rq.exists(f"rq:job:forged-{i}") for i in range(n)), "refused jobs were kept in RQ"
    finally:
        h.close()
        server.stop()

"""Issue 15, "`Client.effect_begin` accepts records that its own readers reject": an intent without
``operation``/``identity`` broke the task page (500), `mcq show`, and left its Attempt reconciling
forever; and cjson re-encoding turned ``[]`` into ``{}`` and 17-digit integers into floats. Plus the
``:fence`` key a `dlq purge` left behind forever. Against the session's real redis-server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, make_failure
from mc_queue.contracts.keys import new_ulid
from mc_queue.ops.sweeper import Sweeper
from mc_queue.testing import RedisServer
from tests.scripts.test_regressions import every_key

REASON = "a reason that is long enough"
LONG = 60_000
REPO = Path(__file__).resolve().parents[2]


def running(q: mc_queue.Client) -> tuple[mc_queue.Task, mc_queue.Lease]:
    task = q.producer.enqueue("jobs", "h", {"n": new_ulid()})
    return task, q.leases.claim_attempt(task.id, "w1", LONG)


@pytest.mark.parametrize("record", [
    {}, {"operation": "open-pr"}, {"identity": "sha"}, {"operation": "", "identity": "sha"},
    {"operation": 7, "identity": "sha"}, {"operation": "open-pr", "identity": None},
    {"operation": "open-pr", "identity": ["a"]},
    {"operation": "open-pr", "identity": "sha", "state": "done"},  # a field the script writes itself
    {"operation": "open-pr", "identity": "sha", "fence": "99"},
])
def test_effect_begin_refuses_a_record_its_readers_cannot_read(q: mc_queue.Client, record: dict[str, Any]) -> None:
    _, lease = running(q)
    before = every_key(q)
    with pytest.raises(mc_queue.InvalidArgument):
        q.leases.effect_begin(lease.attempt_id, lease.fence, "open-pr:k:1", record, worker_id="w1")
    assert every_key(q) == before  # refused before anything is written


@pytest.mark.parametrize("record", [
    {}, {"operation": "open-pr"}, {"operation": 7, "identity": "sha"},
    {"operation": "open-pr", "identity": "sha", "state": "done"},
])
def test_effect_begin_script_refuses_such_a_record_sent_past_the_client(q: mc_queue.Client,
                                                                      record: dict[str, Any]) -> None:
    """The script's own guard: a caller that skips the Client's checks writes nothing either."""
    task, lease = running(q)
    tk = q.keys.task(task.id)
    before = every_key(q)
    reply = q.runner.run("effect_begin", {
        "meta": q.keys.meta, "epochs": q.keys.epochs, "nslog": q.keys.nslog, "task": tk.task, "attempts": tk.attempts,
        "events": tk.events, "effects": tk.effects, "stats": q.keys.stats, "fence": tk.fence, "lease": tk.lease,
    }, {"n": 1, "fence": lease.fence, "worker": "w1", "key": "open-pr:k:1", "record": json.dumps(record),
        "epoch": q.backend.ns.epoch, "min_seq": 0, "proof": ""})
    assert reply[0] == "E_BADARG", reply
    assert every_key(q) == before


def test_an_effect_record_reads_back_exactly_what_was_recorded(q: mc_queue.Client) -> None:
    """cjson re-encoded the record: [] became {} and 12345678901234567 became 1.2345678901235e+16."""
    task, lease = running(q)
    assume = {"list": [], "nested": {"empty": [], "obj": {}}, "big": 12345678901234567, "neg": -98765432109876543,
              "float": 0.1, "text": "héllo / \"quoted\"", "unicode": "\u2028"}
    key = mc_queue.mint_key(task.id, "open-pr", "sha")
    status, _ = q.leases.effect_begin(lease.attempt_id, lease.fence, key,
                               {"operation": "open-pr", "identity": "sha", "assume": assume}, worker_id="w1")
    assert status == "OK"
    intent = q.reads.effects(task.id)[key]
    assert intent.operation == "open-pr" and intent.identity == "sha" and intent.state == "intent"
    assert getattr(intent, "assume") == assume  # noqa: B009
    q.leases.effect_done(lease.attempt_id, lease.fence, key, "done", {"pr": 12345678901234567, "labels": []},
                         actor="w1")
    done = q.reads.effects(task.id)[key]
    assert getattr(done, "assume") == assume and done.receipt == {"pr": 12345678901234567, "labels": []}  # noqa: B009
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    q.maintenance.pack_tasks([task.id])
    assert getattr(q.reads.effects(task.id)[key], "assume") == assume  # noqa: B009  (and so after packing)


def test_an_unreadable_effect_record_already_in_redis_is_settled_not_retried_forever(
        q: mc_queue.Client, redis_server: RedisServer, tmp_path: Path) -> None:
    """A record without operation/identity written past every check (an older version, a raw client):
    `mcq show` reads the task, and the sweeper settles the Attempt (blocked: it cannot tell what the
    effect did) instead of failing on it at every pass."""
    task, lease = running(q)
    tk = q.keys.task(task.id)
    q.redis.hset(tk.effects, "raw-key", json.dumps({"state": "intent", "attempt": 1, "fence": str(lease.fence),
                                                    "key": "raw-key", "worker": "w1", "intent_at": 1}))
    q.operator.void_leases([lease.attempt_id], reason="the worker vanished")
    report = Sweeper(q).run_once()
    assert not report.errors, report.errors
    t = q.reads.get_task(task.id)
    assert t.attempts[0].state.value != "reconciling" and t.state.value == "blocked", t.state
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", q.keys.prefix,
                          "show", task.id], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "MCQ_HOME": str(tmp_path)})
    assert out.returncode == 0 and "raw-key" in out.stdout, out.stderr


def test_a_dlq_purge_leaves_no_key_without_a_ttl(q: mc_queue.Client) -> None:
    """Every `dlq purge` left the task's `:fence` counter behind, forever."""
    task = q.producer.enqueue("jobs", "h", {"n": new_ulid()})
    lease = q.leases.claim_attempt(task.id, "w1", LONG)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.INTERNAL, "Boom", "boom"),
                          worker_id="w1",
                   decision=Decision("quarantine", "poison", attention={"task_id": task.id}))
    q.operator.dlq_purge(task.id, reason=REASON)
    left = [k for k in q.redis.scan_iter(match=q.keys.tag + "*") if task.id in k]
    assert all(q.redis.pttl(k) > 0 for k in left), {k: q.redis.pttl(k) for k in left}
    assert q.keys.task(task.id).fence not in left

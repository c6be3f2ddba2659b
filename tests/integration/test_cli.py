"""`mcq` as an operator runs it: a real process against the session's redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

import mc_queue
from mc_queue.testing import RedisServer

APP = ("--app", "tests.apps.cli_app:app")


def mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          capture_output=True, text=True, timeout=60)


def counts(server: RedisServer, prefix: str) -> Any:
    out = mcq(server, prefix, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["queues"]


def test_enqueue_show_status_round_trip(redis_server: RedisServer, prefix: str) -> None:
    out = mcq(redis_server, prefix, "enqueue", "fix-issue", *APP, "--payload", '{"issue": 7}',
              "--idempotency-key", "issue-7")
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    again = mcq(redis_server, prefix, "enqueue", "fix-issue", *APP, "--payload", '{"issue": 7}',
                "--idempotency-key", "issue-7")
    assert again.stdout.strip() == task_id

    q = mc_queue.connect(redis_server.url, prefix=prefix)
    lease = q.leases.claim_attempt(task_id, "w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")

    shown = mcq(redis_server, prefix, "show", task_id, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert {"task", "attempts", "events"} <= set(data)
    assert data["effects"] == [] and data["budget_left"]["attempts"] == "1 of 5"
    assert data["task"]["state"] == "succeeded"
    assert [(a["number"], a["state"], a["fence"], a["worker_id"]) for a in data["attempts"]] == [
        (1, "succeeded", 1, "w1")]
    assert [e["type"] for e in data["events"]] == ["task_created", "attempt_created", "attempt_claimed",
                                                   "attempt_succeeded"]
    human = mcq(redis_server, prefix, "show", task_id)
    assert human.returncode == 0 and "attempt_succeeded" in human.stdout
    assert counts(redis_server, prefix) == {"fixes": {"counts": {"succeeded": 1}, "queue_age_ms": 0}}
    overview = json.loads(mcq(redis_server, prefix, "status", "--json").stdout)["overview"]
    used = overview.pop("memory_used_bytes")
    assert isinstance(used, int) and used > 0
    assert overview == {"leases_live": 0, "suspect": 0, "attention": 0, "quarantined": 0, "outbox_due": 0,
                        "namespace_state": "ok", "namespace_reason": "", "memory_max_bytes": 0,
                        "enqueue_headroom_bytes": None}


@pytest.mark.parametrize("args,needle", [
    (["enqueue", "fix-issue", *APP, "--payload", "{not json"], "not valid JSON"),
    (["enqueue", "fix-issue", *APP, "--payload", "[1, 2]"], "must be a JSON object"),
    (["enqueue", "fix-issue", *APP, "--queue", "bad queue", "--payload", "{}"], "invalid queue name"),
    (["enqueue", "bad handler!", *APP, "--payload", "{}"], "unknown handler 'bad handler!'"),
    (["enqueue", "fix-issue", "--payload", "{}"], "Missing option '--app'"),
    (["enqueue", "fix-issue", "--app", "tests.apps.nothing:app", "--payload", "{}"], "cannot import"),
    (["enqueue", "fix-issue", *APP], "--payload"),
    (["show", "not-a-task-id"], "invalid task id"),
    (["show", "fixes:01ARZ3NDEKTSV4RRFFQ69G5FAV"], "no task"),
    (["retry", "fixes:01ARZ3NDEKTSV4RRFFQ69G5FAV", "--reason", "short"], "at least ten characters"),
    (["enqueue", "fix-issue", *APP, "--payload", "[" * 60_000 + "]" * 60_000], "nested too deeply"),
    (["enqueue", "fix-issue", *APP, "--payload", '{"a": "' + "\\ud800" + '"}'], "not valid Unicode"),
    (["enqueue", "fix-issue", *APP, "--payload", '{"a": NaN}'], "JSON cannot carry"),
    (["enqueue", "fix-issue", *APP, "--payload", '{"a": ' + "[" * 100 + "]" * 100 + "}"], "levels deep"),
    (["enqueue", "fix-issue", *APP, "--payload", "{}", "--idempotency-key", "a\nb"], "control character"),
    (["show", "fixes:01ARZ3NDEKTSV4RRFFQ69G5FAV\n"], "invalid task id"),
])
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(
        redis_server: RedisServer, prefix: str, args: list[str], needle: str) -> None:
    before = sorted(redis_server.client().scan_iter(match=f"{{{prefix}}}*"))
    out = mcq(redis_server, prefix, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert needle in out.stderr
    after = sorted(k for k in redis_server.client().scan_iter(match=f"{{{prefix}}}*")
                   if not k.endswith((":meta", ":nslog")))
    assert after == [k for k in before if not k.endswith((":meta", ":nslog"))]


def test_idempotency_conflict_exits_1_and_is_recorded(redis_server: RedisServer, prefix: str) -> None:
    first = mcq(redis_server, prefix, "enqueue", "h", *APP, "--payload", '{"a": 1}', "--idempotency-key", "k")
    assert first.returncode == 0
    out = mcq(redis_server, prefix, "enqueue", "h", *APP, "--payload", '{"a": 2}', "--idempotency-key", "k")
    assert out.returncode == 1 and "different payload" in out.stderr
    log = json.loads(mcq(redis_server, prefix, "namespace", "--json").stdout)["events"]
    assert [e["idem_key"] for e in log if e["type"] == "enqueue_refused"] == ["k"]
    assert counts(redis_server, prefix)["q"]["counts"] == {"pending": 1}


def test_refused_retry_exits_1_and_is_recorded(redis_server: RedisServer, prefix: str) -> None:
    task_id = mcq(redis_server, prefix, "enqueue", "h", *APP, "--payload", "{}").stdout.strip()
    out = mcq(redis_server, prefix, "retry", task_id, "--reason", "operator wants another go")
    assert out.returncode == 1 and "refused" in out.stderr
    events = json.loads(mcq(redis_server, prefix, "show", task_id, "--json").stdout)["events"]
    assert events[-1]["type"] == "retry_refused"


def test_namespace_lost_exits_3_until_recover(redis_server: RedisServer, prefix: str) -> None:
    task_id = mcq(redis_server, prefix, "enqueue", "h", *APP, "--payload", "{}").stdout.strip()
    redis_server.client().delete(f"{{{prefix}}}:meta")
    out = mcq(redis_server, prefix, "enqueue", "h", *APP, "--payload", "{}")
    assert out.returncode == 3 and "mcq recover" in out.stderr
    redis_server.client().delete(f"{{{prefix}}}:meta")  # (the refused writer recorded the loss; wipe again)
    out = mcq(redis_server, prefix, "namespace", "--json")
    assert out.returncode == 3 and json.loads(out.stdout)["state"] == "lost"
    assert redis_server.client().exists(f"{{{prefix}}}:meta") == 0, "a read re-created the namespace"
    status = mcq(redis_server, prefix, "status")
    assert status.returncode == 3 and "mcq recover" in status.stderr
    rec = mcq(redis_server, prefix, "recover", "--json")
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["fence_floor"] > 0
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    assert q.leases.claim_attempt(task_id, "w").fence > json.loads(rec.stdout)["fence_floor"]


def test_read_commands_on_a_new_namespace_say_so_and_create_nothing(redis_server: RedisServer, prefix: str) -> None:
    for args in (["namespace"], ["status"], ["status", "--json"], ["attention"], ["dlq", "list"]):
        out = mcq(redis_server, prefix, *args)
        assert out.returncode == 0, (args, out.stderr)
    assert "missing" in mcq(redis_server, prefix, "namespace").stdout
    assert list(redis_server.client().scan_iter(match=f"{{{prefix}}}*")) == []


def test_a_lone_surrogate_from_the_command_line_is_bad_input(redis_server: RedisServer, prefix: str) -> None:
    """An argument that is not valid UTF-8 reaches Python as a lone surrogate: refused, exit 2."""
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                          "enqueue", "fix-issue", *APP, "--payload", "{}", "--idempotency-key", b"k\xff".decode(
                              "utf-8", "surrogateescape")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Unicode" in out.stderr, out.stderr


def test_redis_unreachable_is_one_line_and_exit_4(prefix: str) -> None:
    from mc_queue.testing import free_port

    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", f"redis://:secret@127.0.0.1:{free_port()}/0",
                          "--prefix", prefix, "status"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, out.stderr
    assert out.stderr.startswith("mcq: cannot reach Redis") and len(out.stderr.strip().splitlines()) == 1
    assert "secret" not in out.stderr



def test_enqueue_goes_through_the_apps_handler_like_app_connect(redis_server: RedisServer, prefix: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`mcq enqueue` freezes the handler's queue, policy, budget, lease and timeout, and its RQ job
    carries the handler's timeout (not RQ's 180 s default); MCQ_APP names the app too."""
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from mc_queue import Budget, RetryPolicy
    from mc_queue.contracts.config import parse_config
    from mc_queue.producer.transport import job_id, rq_connection
    from tests.apps import cli_app

    monkeypatch.setenv("MCQ_APP", "tests.apps.cli_app:app")
    out = mcq(redis_server, prefix, "enqueue", "slow-and-careful", "--payload", "{}")
    assert out.returncode == 0, out.stderr
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    task = q.reads.get_task(out.stdout.strip())
    spec = cli_app.app.spec("slow-and-careful")
    reference = cli_app.app.connect(redis_server.url, prefix=prefix).enqueue("slow-and-careful", {"other": 1})
    assert task.queue == spec.queue == reference.queue == "careful"
    assert parse_config(task.retry_policy, RetryPolicy) == spec.retry
    assert parse_config(task.budget, Budget) == spec.budget
    assert (task.retry_policy, task.budget) == (reference.retry_policy, reference.budget)
    assert task.lease_ms == spec.lease_ms == 20_000
    assert task.manifest is not None and task.manifest.timeout_s == spec.timeout_s == 900
    rq = rq_connection(q)
    job = Job.fetch(job_id(prefix, task.attempts[0].id), connection=rq, serializer=JSONSerializer)
    assert job.timeout == 900 and job.origin == f"mcq:{prefix}:careful"
    rq.close()

"""`mcq` as an operator runs it: a real process against the session's redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

import mc_queue
from mc_queue.testing import RedisServer


def mcq(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, *args],
                          capture_output=True, text=True, timeout=60)


def counts(server: RedisServer, prefix: str) -> Any:
    out = mcq(server, prefix, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["queues"]


def test_enqueue_show_status_round_trip(redis_server: RedisServer, prefix: str) -> None:
    out = mcq(redis_server, prefix, "enqueue", "fixes", "fix-issue", "--payload", '{"issue": 7}',
              "--idempotency-key", "issue-7")
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    again = mcq(redis_server, prefix, "enqueue", "fixes", "fix-issue", "--payload", '{"issue": 7}',
                "--idempotency-key", "issue-7")
    assert again.stdout.strip() == task_id

    q = mc_queue.connect(redis_server.url, prefix=prefix)
    lease = q.claim_attempt(task_id, "w1")
    q.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")

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
    assert overview == {"leases_live": 0, "suspect": 0, "attention": 0, "quarantined": 0, "outbox_due": 0,
                        "namespace_state": "ok", "namespace_reason": ""}


@pytest.mark.parametrize("args,needle", [
    (["enqueue", "fixes", "fix-issue", "--payload", "{not json"], "not valid JSON"),
    (["enqueue", "fixes", "fix-issue", "--payload", "[1, 2]"], "must be a JSON object"),
    (["enqueue", "bad queue", "fix-issue", "--payload", "{}"], "invalid queue name"),
    (["enqueue", "fixes", "bad handler!", "--payload", "{}"], "invalid handler name"),
    (["enqueue", "fixes", "fix-issue"], "--payload"),
    (["show", "not-a-task-id"], "invalid task id"),
    (["show", "fixes:01ARZ3NDEKTSV4RRFFQ69G5FAV"], "no task"),
    (["retry", "fixes:01ARZ3NDEKTSV4RRFFQ69G5FAV", "--reason", "short"], "at least ten characters"),
    (["enqueue", "fixes", "fix-issue", "--payload", "[" * 60_000 + "]" * 60_000], "nested too deeply"),
    (["enqueue", "fixes", "fix-issue", "--payload", '{"a": "' + "\\ud800" + '"}'], "not valid Unicode"),
    (["enqueue", "fixes", "fix-issue", "--payload", '{"a": NaN}'], "JSON cannot carry"),
    (["enqueue", "fixes", "fix-issue", "--payload", '{"a": ' + "[" * 100 + "]" * 100 + "}"], "levels deep"),
    (["enqueue", "fixes", "fix-issue", "--payload", "{}", "--idempotency-key", "a\nb"], "control character"),
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
    first = mcq(redis_server, prefix, "enqueue", "q", "h", "--payload", '{"a": 1}', "--idempotency-key", "k")
    assert first.returncode == 0
    out = mcq(redis_server, prefix, "enqueue", "q", "h", "--payload", '{"a": 2}', "--idempotency-key", "k")
    assert out.returncode == 1 and "different payload" in out.stderr
    log = json.loads(mcq(redis_server, prefix, "namespace", "--json").stdout)["events"]
    assert [e["idem_key"] for e in log if e["type"] == "enqueue_refused"] == ["k"]
    assert counts(redis_server, prefix)["q"]["counts"] == {"pending": 1}


def test_refused_retry_exits_1_and_is_recorded(redis_server: RedisServer, prefix: str) -> None:
    task_id = mcq(redis_server, prefix, "enqueue", "q", "h", "--payload", "{}").stdout.strip()
    out = mcq(redis_server, prefix, "retry", task_id, "--reason", "operator wants another go")
    assert out.returncode == 1 and "refused" in out.stderr
    events = json.loads(mcq(redis_server, prefix, "show", task_id, "--json").stdout)["events"]
    assert events[-1]["type"] == "retry_refused"


def test_namespace_lost_exits_3_until_recover(redis_server: RedisServer, prefix: str) -> None:
    task_id = mcq(redis_server, prefix, "enqueue", "q", "h", "--payload", "{}").stdout.strip()
    redis_server.client().delete(f"{{{prefix}}}:meta")
    out = mcq(redis_server, prefix, "enqueue", "q", "h", "--payload", "{}")
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
    assert q.claim_attempt(task_id, "w").fence > json.loads(rec.stdout)["fence_floor"]


def test_read_commands_on_a_new_namespace_say_so_and_create_nothing(redis_server: RedisServer, prefix: str) -> None:
    for args in (["namespace"], ["status"], ["status", "--json"], ["attention"], ["dlq", "list"]):
        out = mcq(redis_server, prefix, *args)
        assert out.returncode == 0, (args, out.stderr)
    assert "missing" in mcq(redis_server, prefix, "namespace").stdout
    assert list(redis_server.client().scan_iter(match=f"{{{prefix}}}*")) == []


def test_a_lone_surrogate_from_the_command_line_is_bad_input(redis_server: RedisServer, prefix: str) -> None:
    """An argument that is not valid UTF-8 reaches Python as a lone surrogate: refused, exit 2."""
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                          "enqueue", "fixes", "fix-issue", "--payload", "{}", "--idempotency-key", b"k\xff".decode(
                              "utf-8", "surrogateescape")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Unicode" in out.stderr, out.stderr


def test_redis_unreachable_is_one_line_and_exit_4(prefix: str) -> None:
    from mc_queue.testing import free_port

    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", f"redis://:secret@127.0.0.1:{free_port()}/0",
                          "--prefix", prefix, "status"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, out.stderr
    assert out.stderr.startswith("mcq: cannot reach Redis") and len(out.stderr.strip().splitlines()) == 1
    assert "secret" not in out.stderr


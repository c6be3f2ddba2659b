"""Find and act in bulk (issue 10): `mcq tasks` from the indexes, the DLQ by failure fingerprint
(list, replay, purge by age), and worker liveness from mc_queue's own key (a SIGKILLed `mcq worker`
is reported dead within 10 s)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import mc_queue
from mc_queue import Decision, FailureClass, TaskState, make_failure
from mc_queue.worker.runner import live_workers
from tests.harness import BASIC, Harness, harness_fixture

REASON = "a reason that is long enough"


h = harness_fixture(Harness)


def quarantine(q: mc_queue.Client, queue: str, message: str) -> str:
    task = q.producer.enqueue(queue, "h", {"m": message})
    lease = q.leases.claim_attempt(task.id, "w1", 60_000)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.INTERNAL, "Bug", message),
                   worker_id="w1", decision=Decision("quarantine", "bulk test quarantines",
                                                     attention={"task_id": task.id}))
    return task.id


def test_mcq_tasks_lists_tasks_in_every_state_from_the_indexes(h: Harness) -> None:
    q = h.client
    pending = [q.producer.enqueue("jobs", "h", {"n": i}).id for i in range(3)]
    other = q.producer.enqueue("other", "h2", {"n": 9}).id
    running = q.producer.enqueue("jobs", "h2", {"n": 4}).id
    q.leases.claim_attempt(running, "w1", 60_000)
    dead = quarantine(q, "jobs", "boom")
    done = q.producer.enqueue("jobs", "h", {"n": 5}).id
    lease = q.leases.claim_attempt(done, "w1", 60_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")

    def tasks(*args: str) -> dict[str, object]:
        out = h.mcq("tasks", "--json", *args)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    rows = tasks()["tasks"]
    assert isinstance(rows, list)
    ids = {r["task_id"]: r["state"] for r in rows}
    assert ids == {**{p: "pending" for p in pending}, other: "pending", running: "running", dead: "quarantined",
                   done: "succeeded"}  # finished ones from the queue's done index
    assert [r["task_id"] for r in tasks("--state", "succeeded")["tasks"]] == [done]
    only = tasks("--queue", "jobs", "--state", "pending")["tasks"]
    assert isinstance(only, list) and [r["task_id"] for r in only] == pending  # oldest first
    by_handler = tasks("--handler", "h2")["tasks"]
    assert isinstance(by_handler, list) and {r["task_id"] for r in by_handler} == {other, running}
    page = tasks("--state", "pending", "--limit", "2")
    assert isinstance(page["tasks"], list) and len(page["tasks"]) == 2
    assert tasks("--older-than", "1h")["tasks"] == []
    recent = tasks("--since", "1h")["tasks"]
    assert isinstance(recent, list) and len(recent) == 7  # the succeeded one too
    text = h.mcq("tasks", "--state", "running")
    assert text.returncode == 0 and running in text.stdout and pending[0] not in text.stdout
    bad = h.mcq("tasks", "--state", "lost")
    assert bad.returncode == 2 and "lost" in bad.stderr  # not a state: said with the ones there are
    assert "done indexes" in " ".join(h.mcq("tasks", "--help").stdout.split())  # (wrapped at 80 columns)


def test_the_dlq_by_fingerprint_replay_and_purge_in_bulk(h: Harness) -> None:
    q = h.client
    a = [quarantine(q, "jobs", "parser fails on input") for _ in range(3)]
    b = [quarantine(q, "jobs", "disk is full") for _ in range(2)]
    out = h.mcq("dlq", "list", "--by", "fingerprint", "--json")
    assert out.returncode == 0, out.stderr
    groups = json.loads(out.stdout)
    assert [(g["count"], sorted(g["task_ids"])) for g in groups] == [(3, sorted(a)), (2, sorted(b))]
    fp_a = groups[0]["fingerprint"]
    assert len(fp_a) == 16
    assert fp_a in h.mcq("dlq", "list", "--by", "fingerprint").stdout

    out = h.mcq("dlq", "replay", "--fingerprint", fp_a, "--reason", "the parser bug is fixed now")
    assert out.returncode == 0, out.stderr
    assert "replayed 3 of 3" in out.stdout
    for tid in a:
        t = q.reads.get_task(tid)
        assert t.state is TaskState.PENDING and len(t.attempts) == 2
        assert [e.fields.get("reason") for e in t.events if e.type == "dlq_replayed"] == ["the parser bug is fixed now"]
    assert {t for t, _ in q.reads.dlq()} == set(b)
    assert h.mcq("dlq", "replay", "--fingerprint", "0" * 16, "--reason", REASON).returncode == 2
    assert h.mcq("dlq", "replay", "--reason", REASON).returncode == 2  # neither a task nor a fingerprint

    assert h.mcq("dlq", "purge", "--older-than", "1h", "--reason", REASON, "--yes").stdout.startswith("purged 0 of 0")
    assert h.mcq("dlq", "purge", "--older-than", "0s", "--reason", REASON).returncode == 2  # no --yes
    time.sleep(0.05)
    out = h.mcq("dlq", "purge", "--older-than", "0s", "--reason", REASON, "--yes")
    assert out.returncode == 0, out.stderr
    assert "purged 2 of 2" in out.stdout
    assert q.reads.dlq() == []
    for tid in b:
        stone = q.reads.tombstone(tid)
        assert stone is not None and stone.get("reason") == REASON


def test_a_sigkilled_worker_is_reported_dead_within_ten_seconds(h: Harness, tmp_path: Path) -> None:
    proc = h.spawn(h.worker_cmd("simple", BASIC, "--name", "live-w1", burst=False))  # teardown ends it

    def row() -> dict[str, object] | None:
        return next((r for r in live_workers(h.client) if r["worker"] == "live-w1"), None)

    deadline = time.monotonic() + 30
    while not ((r := row()) and r["alive"]):
        assert time.monotonic() < deadline, "the worker never reported alive"
        time.sleep(0.1)
    out = h.mcq("workers", "--json")
    rows = {r["worker"]: r for r in json.loads(out.stdout)}
    assert rows["live-w1"]["alive"] is True and rows["live-w1"]["healthy"] is True
    assert h.client.redis.pttl(h.client.keys.worker("live-w1")) > 0

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    killed = time.monotonic()
    while (r := row()) and r["alive"]:
        assert time.monotonic() - killed < 10.5, "the killed worker still looks alive after 10 s"
        time.sleep(0.2)
    out = h.mcq("workers", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["worker"]: r for r in json.loads(out.stdout)}
    assert time.monotonic() - killed < 12
    # RQ still lists the process (its own TTL is longer); mc_queue's key says it is dead
    assert rows["live-w1"]["alive"] is False and rows["live-w1"]["healthy"] is False
    assert rows["live-w1"]["state"] == "dead"

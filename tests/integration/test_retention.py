"""Bounded memory (issue 10): a finished task's history packed into one compressed document (read
back exactly as it was), retention deleting every key and index entry of a task (a SCAN of the
namespace finds nothing left but its tombstone), the archive round trip, the fence floor that
keeps a re-enqueued id's zombies stale, and `mcq tasks purge` through the CLI a user types."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, make_failure
from mc_queue.contracts.config import Retention
from mc_queue.contracts.errors import ClaimRejected, StaleFence, TaskPurged, TransitionRefused, WriteRefused
from mc_queue.contracts.history import history
from mc_queue.ops.archive import FileArchive
from mc_queue.ops.sweeper import Sweeper
from tests.harness import Harness, harness_fixture

h = harness_fixture(Harness)
REASON = "a reason that is long enough"


def finish(q: mc_queue.Client, queue: str = "jobs", key: str | None = None, effect: bool = False) -> str:
    task = q.producer.enqueue(queue, "h", {"n": 1, "text": "héllo"}, key)
    lease = q.leases.claim_attempt(task.id, "w1", 60_000)
    q.leases.checkpoint(lease.attempt_id, lease.fence, "claimed", 0, {"phase": "claimed"}, worker_id="w1")
    if effect:
        k = mc_queue.mint_key(task.id, "open-pr", "sha1")
        q.leases.effect_begin(lease.attempt_id, lease.fence, k, {"operation": "open-pr", "identity": "sha1"},
                              worker_id="w1")
        q.leases.effect_done(lease.attempt_id, lease.fence, k, "done", {"pr": 7}, actor="w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    return task.id


def keys_of(q: mc_queue.Client, task_id: str) -> list[str]:
    """Every key of the namespace naming the task, and every index that still holds it (a real SCAN)."""
    found = sorted(k for k in q.redis.scan_iter(match=q.keys.tag + "*", count=1000) if task_id in k)
    for k in q.redis.scan_iter(match=q.keys.tag + "*", count=1000):
        kind = q.redis.type(k)
        if kind == "zset" and q.redis.zscore(k, task_id) is not None:
            found.append(f"{k} (member)")
        elif kind == "hash" and k != q.keys.idem and q.redis.hexists(k, task_id):
            found.append(f"{k} (field)")
    return found


def test_a_packed_task_reads_back_exactly_and_is_one_small_hash(q: mc_queue.Client) -> None:
    tid = finish(q, key="k-packed", effect=True)
    before, fx_before = q.reads.get_task(tid).model_dump(), q.reads.effects(tid)
    tk = q.keys.task(tid)
    assert q.maintenance.pack_tasks([tid]) == 1
    assert q.reads.get_task(tid).model_dump() == before and q.reads.effects(tid) == fx_before
    assert q.reads.is_packed(tid)
    assert [k for k in (tk.attempts_v1, tk.events, tk.effects, tk.fence) if q.redis.exists(k)] == []
    assert not any(k[:1].isdigit() for k in q.redis.hkeys(tk.task))  # its Attempts are in the document
    assert q.redis.object("encoding", tk.task) == "listpack"  # one compact allocation, at default settings
    assert int(q.redis.memory_usage(tk.task, samples=0) or 0) < 1400
    assert q.maintenance.pack_tasks([tid]) == 0  # already packed: nothing again
    assert q.redis.zscore(q.keys.topack, tid) is None


def test_a_late_write_to_a_packed_task_is_refused_and_recorded_without_growing_it_back(q: mc_queue.Client) -> None:
    tid = finish(q)
    fence = q.reads.get_task(tid).fence
    q.maintenance.pack_tasks([tid])
    snapshot = q.redis.hgetall(q.keys.task(tid).task)
    for call in (lambda: q.leases.complete_attempt(f"{tid}/1", fence, {"ok": False}, worker_id="zombie"),
                 lambda: q.leases.heartbeat(f"{tid}/1", fence, worker_id="zombie"),
                 lambda: q.leases.complete_attempt(f"{tid}/1", fence + 5, {"x": 1}, worker_id="zombie")):
        with pytest.raises(WriteRefused):
            call()
    with pytest.raises(TransitionRefused):
        q.operator.retry_task(tid, REASON)
    assert q.redis.hgetall(q.keys.task(tid).task) == snapshot
    assert not q.redis.exists(q.keys.task(tid).events)
    refusals = [e for e in q.reads.namespace_events() if e.get("task") == tid]
    assert [e["type"] for e in refusals] == ["stale_write_refused"] * 3 + ["retry_refused"]
    assert q.reads.namespace().state == "ok"  # a fence above the packed one without a claim record is stale, not loss


def test_a_task_changed_after_the_read_is_not_packed(q: mc_queue.Client) -> None:
    tid = finish(q)
    tk = q.keys.task(tid)
    fields, att = q.redis.hgetall(tk.task), q.redis.hgetall(tk.attempts)
    events, fx = history(fields, q.redis.lrange(tk.events, 0, -1), att), q.redis.hgetall(tk.effects)
    from mc_queue.contracts.packing import pack

    blob = pack(fields, att, events, fx)
    with pytest.raises(StaleFence):  # a refusal appends an event after the read
        q.leases.complete_attempt(f"{tid}/1", 99, {"x": 1}, worker_id="zombie")
    reply = q.runner.run("pack", {**q.backend.ns_keys(), "task": tk.task, "attempts": tk.attempts,
                                  "events": tk.events, "effects": tk.effects, "fence": tk.fence,
                                  "topack": q.keys.topack},
                         {"blob": blob, "updated_at": int(fields["updated_at"]), "last_event": events[-1][0],
                          "fields": len(att), "effects": len(fx), "epoch": "", "actor": "test"})
    assert reply[0] == "E_CHANGED"
    assert q.redis.exists(tk.events) and not q.reads.is_packed(tid)
    assert q.maintenance.pack_tasks([tid]) == 1  # read again: packed, with the refusal in its history
    assert q.reads.get_task(tid).events[-1].type == "stale_write_refused"


def _ended(q: mc_queue.Client) -> dict[str, str]:
    ids = {"succeeded": finish(q, key="k-done", effect=True)}
    canceled = q.producer.enqueue("jobs", "h", {"n": 2})
    q.operator.cancel_task(canceled.id, REASON)
    ids["canceled"] = canceled.id
    for state, decision in (("failed", None),
                            ("blocked", Decision("stop", "stop", attention={"task_id": "x"})),
                            ("quarantined", Decision("quarantine", "q", attention={"task_id": "x"}))):
        t = q.producer.enqueue("jobs", "h", {"n": state}, f"k-{state}")
        lease = q.leases.claim_attempt(t.id, "w1", 60_000)
        q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.INTERNAL, "Bug", state),
                       worker_id="w1", decision=decision)
        ids[state] = t.id
    return ids


def test_retention_deletes_every_key_and_index_entry_leaving_only_the_tombstone(q: mc_queue.Client,
                                                                                tmp_path: Path) -> None:
    ids = _ended(q)
    q.maintenance.pack_tasks([ids["succeeded"]])
    keep = finish(q)  # a newer finished task, kept by the count rule
    counts_before = q.reads.status()["jobs"]["counts"]
    q.operator.set_retention("jobs", Retention(done_s=None, done_keep=1, held_s=0.001, tombstone_s=3600),
                    reason="the test keeps one finished task")
    report = Sweeper(q, archive=FileArchive(tmp_path / "archive"), pack_after_ms=3_600_000).run_once()
    assert report.retired == {"jobs/done": 2, "jobs/held": 3}, report.as_dict()
    assert report.archived == 5 and not report.errors
    for state, tid in ids.items():
        assert keys_of(q, tid) == [], state  # nothing names it: its tombstone is an entry in a bucket
        tomb = q.reads.tombstone(tid) or {}
        assert tomb["state"] == state and tomb["fence"] >= (0 if state == "canceled" else 1)
        with pytest.raises(mc_queue.TaskNotFound):
            q.reads.get_task(tid)
    assert q.reads.get_task(keep).state.value == "succeeded"
    counts = q.reads.status()["jobs"]["counts"]
    assert counts.get("succeeded") == 1 and "failed" not in counts and "quarantined" not in counts, counts_before
    # the producer keys of deleted tasks stay refused for the tombstone window: the work does not run again
    with pytest.raises(TaskPurged):
        q.producer.enqueue("jobs", "h", {"n": 1, "text": "héllo"}, "k-done")
    assert any(e["type"] == "tasks_retired" and e["kind"] == "held" for e in q.reads.namespace_events())


def test_the_archive_gives_back_the_task_as_it_was(q: mc_queue.Client, tmp_path: Path) -> None:
    ids = _ended(q)
    q.maintenance.pack_tasks([ids["succeeded"]])
    live = {s: (q.reads.get_task(t).model_dump(), q.reads.effects(t)) for s, t in ids.items()}
    q.operator.set_retention("jobs", Retention(done_s=0.001, held_s=0.001), reason="the test archives everything")
    Sweeper(q, archive=FileArchive(tmp_path / "a")).run_once()
    files = sorted((tmp_path / "a" / "jobs").glob("*.jsonl.gz"))
    assert len(files) == 2  # one file per batch: the done batch and the held batch of this pass
    for state, tid in ids.items():
        rec = FileArchive(tmp_path / "a").find(tid)
        assert rec is not None and rec.state == state
        task = rec.task().model_dump()
        task["fence"], task["lease_pttl_ms"] = live[state][0]["fence"], live[state][0]["lease_pttl_ms"]
        assert task == live[state][0], state
        assert rec.effects() == live[state][1]


def test_a_retired_id_enqueued_again_gets_fences_above_its_zombies(q: mc_queue.Client) -> None:
    tid = finish(q)
    q.maintenance.pack_tasks([tid])
    old_fence = q.reads.get_task(tid).fence
    q.operator.retire_task(tid, states=["succeeded"], reason=REASON, tombstone_s=0)
    again = q.producer.enqueue("jobs", "h", {"n": 3}, task_id=tid)
    lease = q.leases.claim_attempt(again.id, "w2", 60_000)
    assert lease.fence > old_fence
    with pytest.raises(StaleFence):  # the earlier incarnation's worker, back from a pause
        q.leases.complete_attempt(f"{tid}/1", old_fence, {"zombie": True}, worker_id="w1")
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w2")


@pytest.mark.parametrize("write", ["complete", "heartbeat", "fail"])
def test_a_zombie_of_a_retired_task_does_not_mark_the_namespace_lost(q: mc_queue.Client, write: str) -> None:
    """Issue 15: retention deleted a task, the same id was enqueued again (not yet claimed), and a worker
    of the old incarnation, frozen since, speaks with its claim record: refused as stale, namespace ok."""
    zombie = mc_queue.connect(q.url, prefix=q.keys.prefix)  # its own process's client: it holds the claim record
    try:
        task = q.producer.enqueue("jobs", "h", {"n": 1})
        old = zombie.leases.claim_attempt(task.id, "w-zombie", 60_000)
        q.operator.void_leases([old.attempt_id], reason="the worker froze past its lease")
        Sweeper(q).run_once()  # reconciled: nothing was done, a new Attempt under the executor policy
        deadline = time.monotonic() + 30
        while True:  # Attempt 2, once its backoff is over
            try:
                again = q.leases.claim_attempt(task.id, "w2", 60_000)
                break
            except ClaimRejected:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        q.leases.complete_attempt(again.attempt_id, again.fence, {"ok": True}, worker_id="w2")
        q.operator.retire_task(task.id, states=["succeeded"], reason=REASON, tombstone_s=0)
        q.producer.enqueue("jobs", "h", {"n": 2}, task_id=task.id)  # the same id, a new incarnation, never claimed
        with pytest.raises(StaleFence):
            if write == "complete":
                zombie.leases.complete_attempt(old.attempt_id, old.fence, {"zombie": True}, worker_id="w-zombie")
            elif write == "heartbeat":
                zombie.leases.heartbeat(old.attempt_id, old.fence, worker_id="w-zombie")
            else:
                zombie.leases.fail_attempt(old.attempt_id, old.fence, make_failure(FailureClass.PROVIDER, "X", "x"),
                                    worker_id="w-zombie")
        assert q.reads.namespace().state == "ok"
        assert [e for e in q.reads.namespace_events() if e["type"] == "state_loss_detected"] == []
        refused = [e for e in q.reads.get_task(task.id).events if e.type == "stale_write_refused"]
        assert refused and refused[-1].fields["refusal"] == "fence_retired"
        lease = q.leases.claim_attempt(task.id, "w3", 60_000)  # the new incarnation runs as usual
        assert lease.fence > old.fence and lease.number == 1
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": 2}, worker_id="w3")
    finally:
        zombie.close()


def test_retire_refuses_a_task_that_may_still_run(q: mc_queue.Client) -> None:
    t = q.producer.enqueue("jobs", "h", {"n": 1})
    q.leases.claim_attempt(t.id, "w1", 60_000)
    before = q.redis.hgetall(q.keys.task(t.id).task)
    with pytest.raises(TransitionRefused):
        q.operator.retire_task(t.id, states=["succeeded", "canceled", "failed", "blocked", "quarantined"],
                               reason=REASON)
    assert q.redis.hgetall(q.keys.task(t.id).task) == before


def test_idempotency_entries_are_forgotten_after_the_window(q: mc_queue.Client) -> None:
    tid = finish(q, key="k-window")
    q.operator.retire_task(tid, states=["succeeded"], reason=REASON, tombstone_s=0.05)
    assert q.redis.hexists(q.keys.idem, "k-window")
    import time

    time.sleep(0.1)
    assert q.maintenance.trim_idempotency() == 1
    assert not q.redis.hexists(q.keys.idem, "k-window") and q.redis.zcard(q.keys.idem_until) == 0
    assert q.producer.enqueue("jobs", "h", {"new": True}, "k-window").id != tid  # the key is free again


def test_mcq_tasks_purge_and_archive_show_through_the_cli(h: Harness, tmp_path: Path) -> None:
    q = h.client
    old = [finish(q) for _ in range(3)]
    arch = tmp_path / "arch"
    out = h.mcq("tasks", "purge", "--queue", "jobs", "--state", "succeeded", "--older-than", "0s",
                "--reason", "too short")
    assert out.returncode != 0 and "ten characters" in (out.stderr + out.stdout)
    out = h.mcq("tasks", "purge", "--queue", "jobs", "--state", "succeeded", "--older-than", "0s",
                "--reason", "the operator frees memory", "--archive", str(arch))
    assert out.returncode != 0 and "--yes" in out.stderr  # nothing deleted without the confirmation
    assert all(q.reads.get_task(t) for t in old)
    out = h.mcq("tasks", "purge", "--queue", "jobs", "--state", "succeeded", "--older-than", "0s",
                "--reason", "the operator frees memory", "--archive", str(arch), "--yes")
    assert out.returncode == 0, out.stderr
    assert "3 task(s)" in out.stdout
    for t in old:
        assert keys_of(q, t) == [] and q.reads.tombstone(t)
    shown = h.mcq("archive", "show", old[0], "--dir", str(arch))
    assert shown.returncode == 0, shown.stderr
    assert old[0] in shown.stdout and "succeeded" in shown.stdout
    data: dict[str, Any] = json.loads(h.mcq("archive", "show", old[0], "--dir", str(arch), "--json").stdout)
    assert old[0] in json.dumps(data) and data["archive_reason"] == "the operator frees memory"
    purged = [e for e in q.reads.namespace_events() if e["type"] == "task_retired"]
    assert {e["task"] for e in purged} == set(old) and all(e["actor"] == "operator" for e in purged)


def test_a_large_history_is_packed_whole_and_reads_back(q: mc_queue.Client) -> None:
    import os

    noise = os.urandom(60_000).hex()  # does not compress: a document far above 100 chunks of 64 bytes
    task = q.producer.enqueue("jobs", "h", {"blob": noise})
    lease = q.leases.claim_attempt(task.id, "w1", 60_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"echo": noise[:5000]}, worker_id="w1")
    before = q.reads.get_task(task.id).model_dump()
    assert q.maintenance.pack_tasks([task.id]) == 1
    assert q.redis.hget(q.keys.task(task.id).task, "packed") == "1"
    assert q.reads.get_task(task.id).model_dump() == before


def test_the_apps_retention_is_published_and_the_operators_wins(q: mc_queue.Client) -> None:
    app = mc_queue.App(retention={"jobs": Retention(done_s=3600, held_keep=10)})
    assert q.reads.retention("jobs") == (Retention(), "default")
    app.publish_retention(q)
    assert q.reads.retention("jobs") == (Retention(done_s=3600, held_keep=10), "app")
    q.operator.set_retention("jobs", Retention(done_s=60), reason="the operator needs the memory back")
    assert q.reads.retention("jobs") == (Retention(done_s=60), "operator")
    app.publish_retention(q)  # a worker starting again does not undo the operator's choice
    assert q.reads.retention("jobs")[1] == "operator"
    with pytest.raises(mc_queue.InvalidArgument):
        q.operator.set_retention("jobs", Retention(done_s=60), reason="short")
    assert any(e["type"] == "retention_set" for e in q.reads.namespace_events())


def test_mcq_retention_set_and_show(h: Harness) -> None:
    q = h.client
    finish(q)
    out = h.mcq("retention", "set", "jobs", "--done", "2h", "--held-keep", "50", "--reason", "the disk is small here")
    assert out.returncode == 0, out.stderr
    assert q.reads.retention("jobs") == (Retention(done_s=7200, held_keep=50), "operator")
    shown = h.mcq("retention", "show")
    assert shown.returncode == 0 and "jobs: finished 7200s" in shown.stdout and "(operator)" in shown.stdout
    bad = h.mcq("retention", "set", "jobs", "--done", "-5m", "--reason", "the disk is small here")
    assert bad.returncode == 2 and q.reads.retention("jobs")[0].done_s == 7200  # refused, nothing changed
    assert h.mcq("retention", "set", "jobs", "--done", "forever", "--reason", "keep them all again").returncode == 0
    assert q.reads.retention("jobs")[0].done_s is None
    assert h.mcq("retention", "set", "jobs", "--clear", "--reason", "back to the App's policy").returncode == 0
    assert q.reads.retention("jobs")[1] == "default"


def test_queues_with_no_task_and_no_policy_are_forgotten_with_their_samples(q: mc_queue.Client) -> None:
    """Issue 15: after 300 queues' tasks were all retired, the console still sampled and listed all 300."""
    gone, busy, kept, paused = (f"q{i}" for i in range(4))
    for queue in (gone, busy, kept, paused):
        tid = finish(q, queue=queue)
        q.operator.retire_task(tid, states=["succeeded"], reason=REASON, tombstone_s=0)
        q.redis.xadd(q.keys.queue_samples(queue), {"age_ms": "0"})
    q.producer.enqueue(busy, "h", {"n": 1})  # still holds a task
    q.operator.set_retention(kept, Retention(done_s=60), reason="the operator keeps a policy for it")
    q.operator.pause_queue(paused, reason="the operator paused it on purpose")
    report = Sweeper(q).run_once()
    assert report.forgotten == [gone], report.as_dict()
    assert set(q.reads.queues()) == {busy, kept, paused}
    assert not q.redis.exists(q.keys.queue_samples(gone))
    assert all(q.redis.exists(q.keys.queue_samples(x)) for x in (busy, kept, paused))
    assert not [f for f in q.redis.hkeys(q.keys.counts) if f.startswith(f"{gone}|")]
    assert any(e["type"] == "queue_forgotten" and e["queue"] == gone for e in q.reads.namespace_events())
    assert Sweeper(q).run_once().forgotten == []  # nothing more to forget
    q.producer.enqueue(gone, "h", {"n": 2})  # the next enqueue brings it back
    assert gone in q.reads.queues()

"""Chapter 002's whiteboard exercise, end to end, as one test against real processes and providers.

Two workers race for one Attempt; the winner opens a pull request whose response stalls past its
client timeout (the forge accepted it); the winner is frozen past its lease; the sweeper makes the
Attempt suspect, reconciles with the forge by key and records the receipt; a replacement Attempt
replays the receipt instead of opening a second pull request; the old worker wakes up and its
writes are refused and kept as audit events. The task's own events tell the story, in order.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from mc_queue import Task, TaskState
from mc_queue.contracts.models import AttemptState, Event
from mc_queue.ops.render import print_task
from mc_queue.policy.effects import mint_key
from mc_queue.producer.transport import job_id
from mc_queue.testing import ForgeServer
from tests.faults.test_effects import Harness, explain, forge, h
from tests.harness import events, proc_state, wait_for

__all__ = ["forge", "h"]  # fixtures used by name

STORY = [
    ("attempt_claimed", 1), ("claim_refused", 1), ("effect_intent", 1), ("lease_expired", 1),
    ("reconciling_started", 1), ("effect_receipt", 1), ("attempt_reconciled", 1), ("attempt_created", 2),
    ("attempt_claimed", 2), ("effect_replayed", 2), ("attempt_succeeded", 2), ("stale_write_refused", 1),
]


def in_order(evs: list[Event], story: list[tuple[str, int]]) -> list[Event]:
    """The first event of each (type, attempt) of ``story``, each after the previous one; fails if one is missing."""
    found: list[Event] = []
    i = 0
    for typ, n in story:
        while i < len(evs) and not (evs[i].type == typ and evs[i].attempt == n):
            i += 1
        assert i < len(evs), f"{typ} (attempt {n}) missing after {[e.type for e in found]}"
        found.append(evs[i])
        i += 1
    return found


def test_whiteboard_exercise(h: Harness, forge: ForgeServer, tmp_path: Path) -> None:
    head = "feedface0002"
    pidfile, gate = tmp_path / "pid", tmp_path / "gate"
    client_timeout, stall = 2.0, 3.0
    forge.stall_next(1, seconds=stall)  # accepted, then the response is held past the client timeout
    task = h.app.enqueue("open-pr", {"head": head, "pidfile": str(pidfile), "gate": str(gate),
                                     "http_timeout": client_timeout})
    key = mint_key(task.id, "open-pr", head)
    try:
        # 1. The transport delivers Attempt 1 twice; two workers start at once and race for it.
        aid = task.attempts[0].id
        h.rq.rpush(h.rq_queue().key, job_id(h.prefix, aid))
        assert h.queued() == 2
        names = [f"wb-a-{uuid.uuid4().hex[:6]}", f"wb-b-{uuid.uuid4().hex[:6]}"]
        racers = {name: h.start_worker("simple", "--name", name) for name in names}

        def both_tried() -> Task | None:
            t = h.task(task.id)
            return t if events(t, "claim_refused", attempt=1) else None

        raced = wait_for(both_tried, 30, "both workers to try the claim")
        claimed = events(raced, "attempt_claimed", attempt=1)
        assert len(claimed) == 1, explain(raced)
        winner = claimed[0].fields["worker"]
        loser = next(n for n in names if n != winner)
        refused = events(raced, "claim_refused", attempt=1)
        assert [e.fields["worker"] for e in refused] == [loser], explain(raced)
        assert racers[loser].wait(30) == 0, h.worker_log(racers[loser])
        pid = int(wait_for(lambda: Path(f"{pidfile}.1").exists() and Path(f"{pidfile}.1").read_text(), 10,
                           "the winner's pid"))
        assert pid == racers[winner].pid  # --kind simple: the worker process runs the handler
        fence1 = int(claimed[0].fields["fence"])

        # 2. The winner opens the pull request; the forge commits it and holds the response. Freeze
        #    the winner while its client still waits (well inside its 2 s timeout).
        gate.touch()
        wait_for(lambda: forge.count_by_key().get(key), 10, "the forge to accept the pull request", interval=0.002)
        h.sigstop(pid)
        fx = h.client.reads.effects(task.id)
        assert fx[key].state == "intent" and fx[key].attempt == 1, fx  # the worker has no receipt

        # 3. Past its lease: the sweeper expires it, reconciles with the forge by key, records the
        #    receipt, and the retry policy appends Attempt 2 (dispatched through RQ).
        after = h.sweep_until(lambda t: len(t.attempts) == 2 and h.queued() == 1, task.id, 15,
                              "Attempt 1 reconciled and Attempt 2 dispatched")
        assert proc_state(pid) in ("T", "t"), "the winner must still be frozen"
        a1 = after.attempts[0]
        assert a1.state is AttemptState.FAILED and a1.settled_by == "reconcile", explain(after)
        fx = h.client.reads.effects(task.id)
        assert fx[key].state == "done" and fx[key].source == "reconcile", fx
        assert fx[key].receipt == {"number": 1, "url": forge.pulls[0]["url"], "key": key}, fx

        # 4. The replacement Attempt runs on another worker: it replays the receipt, opens nothing.
        replacement = f"wb-c-{uuid.uuid4().hex[:6]}"
        h.run_worker("simple", "--name", replacement)
        done = h.task(task.id)
        assert done.state is TaskState.SUCCEEDED, explain(done)
        assert forge.count_by_key() == {key: 1} and forge.duplicates() == {}, explain(done)

        # 5. The old worker wakes up and carries on with its stale fence: refused, and kept.
        h.sigcont(pid)
        assert racers[winner].wait(30) == 0, h.worker_log(racers[winner])

        final = h.task(task.id)
        why = explain(final)
        story = in_order(final.events, STORY)
        assert story[1].fields["worker"] == loser and story[8].fields["worker"] == replacement, why
        assert story[5].fields["source"] == "reconcile" and story[5].fields["key"] == key, why
        assert story[9].fields["key"] == key and story[9].fields["receipt_attempt"] == "1", why
        for typ in ("attempt_succeeded", "effect_intent", "effect_receipt", "lease_expired", "effect_replayed"):
            assert len(events(final, typ)) == 1, (typ, why)
        assert len(events(final, "attempt_claimed")) == 2 and len(events(final, "claim_refused")) == 1, why

        # Every refusal is the old worker's, presenting its old fence, after the task succeeded.
        stale = events(final, "stale_write_refused")
        assert stale and all(e.attempt == 1 and e.fields["worker"] == winner
                             and int(e.fields["presented_fence"]) == fence1
                             and int(e.fields["current_fence"]) > fence1 for e in stale), why
        succeeded_at = final.events.index(story[10])
        assert all(final.events.index(e) > succeeded_at for e in stale), why

        # Nothing the old worker did changed the outcome.
        assert final.state is TaskState.SUCCEEDED, why
        assert final.result == {"pull_request": 1, "key": key, "attempt": 2}, why
        assert [a.state for a in final.attempts] == [AttemptState.FAILED, AttemptState.SUCCEEDED], why
        assert final.attempts[1].worker_id == replacement, why
        assert forge.count_by_key() == {key: 1}, why
        assert h.client.reads.effects(task.id)[key].receipt_attempt == 1, why
    except AssertionError:
        print_task(h.task(task.id))
        raise

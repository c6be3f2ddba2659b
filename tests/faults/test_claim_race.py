"""Many OS processes race to claim the same task; exactly one wins, every fence is issued once.

Each round the parent enqueues one fresh task, then a multiprocessing.Barrier releases every racer
at once; each racer (its own process, its own Client and connection) calls claim_attempt on that
task. A second barrier wait ends the round. Results travel back to the parent at the end.
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.synchronize
import os
import queue
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import mc_queue
from mc_queue import reconcile_attempt
from mc_queue.contracts.history import history
from mc_queue.contracts.keys import Keys, new_task_id
from mc_queue.testing import RedisServer

from .helpers import attempt_fields, events_of, meta

CTX = multiprocessing.get_context("fork")
RACERS = 8
ROUNDS = 1000
BARRIER_TIMEOUT = 30.0


def _racer(idx: int, url: str, prefix: str, task_ids: list[str], plan: list[tuple[str, int]],
           barrier: multiprocessing.synchronize.Barrier, out: Any) -> None:
    """One racing process. ``plan[r]`` = (what the winner does next, lease_ms) for round r."""
    worker = f"racer-{idx}-{os.getpid()}"
    results: list[tuple[Any, ...]] = []
    client = mc_queue.connect(url, prefix=prefix)
    try:
        client.backend.open_namespace()  # epoch known before the race starts: every racer sends exactly one claim
        for r, tid in enumerate(task_ids):
            then, lease_ms = plan[r]
            barrier.wait(BARRIER_TIMEOUT)
            try:
                lease = client.leases.claim_attempt(tid, worker, lease_ms=lease_ms)
            except mc_queue.ClaimRejected as exc:
                results.append((r, "rejected", tid, exc.detail[0] if exc.detail else "",
                                exc.detail[1] if len(exc.detail) > 1 else ""))
            except Exception as exc:
                results.append((r, "error", tid, f"{type(exc).__name__}: {exc}", ""))
            else:
                results.append((r, "won", tid, lease.fence, lease.number))
                if then == "fail":
                    try:
                        client.leases.fail_attempt(lease.attempt_id, lease.fence,
                                            mc_queue.make_failure("provider", "Flaky", "try again"),
                                            worker_id=worker)
                    except Exception as exc:
                        results.append((r, "error", tid, f"fail_attempt: {type(exc).__name__}: {exc}", ""))
            barrier.wait(BARRIER_TIMEOUT)
        out.put((idx, worker, results, None))
    except BaseException as exc:  # report, never hang the parent
        out.put((idx, worker, results, f"{type(exc).__name__}: {exc}"))
    finally:
        client.close()


class Race:
    """The racing processes and the barrier that releases them (the parent is one more party)."""

    def __init__(self, url: str, prefix: str, task_ids: list[str], plan: list[tuple[str, int]]) -> None:
        self.barrier = CTX.Barrier(RACERS + 1)
        self.out = CTX.Queue()
        self.procs = [CTX.Process(target=_racer, args=(i, url, prefix, task_ids, plan, self.barrier, self.out),
                                  daemon=True) for i in range(RACERS)]
        self.workers: dict[int, str] = {}

    def __enter__(self) -> Race:
        for p in self.procs:
            p.start()
        return self

    def release(self) -> None:
        self._wait()  # start of round: everyone claims now

    def wait_round(self) -> None:
        self._wait()  # end of round: every racer has its answer

    def _wait(self) -> None:
        try:
            self.barrier.wait(BARRIER_TIMEOUT)
        except threading.BrokenBarrierError:
            reports = []
            while True:
                try:
                    idx, _, _, err = self.out.get(timeout=1)
                except queue.Empty:
                    break
                reports.append(f"racer {idx}: {err}")
            raise AssertionError(f"the race broke down; racers reported: {reports}") from None

    def results(self) -> dict[int, list[tuple[Any, ...]]]:
        by_round: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
        errors = []
        for _ in self.procs:
            idx, worker, results, err = self.out.get(timeout=60)
            self.workers[idx] = worker
            if err:
                errors.append(f"racer {idx}: {err}")
            for row in results:
                by_round[row[0]].append((worker, *row[1:]))
        assert not errors, errors
        return by_round

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.barrier.abort()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


def test_one_winner_per_round_across_processes(redis_server: RedisServer, prefix: str) -> None:
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    r = redis_server.client()
    try:
        q.backend.open_namespace()
        seq0 = int(meta(r, prefix)["seq"])
        task_ids = [new_task_id("race") for _ in range(ROUNDS)]
        plan = [("hold", 60_000)] * ROUNDS
        t0 = time.monotonic()
        with Race(redis_server.url, prefix, task_ids, plan) as race:
            for i, tid in enumerate(task_ids):
                q.producer.enqueue("race", "noop", {"round": i}, task_id=tid)
                race.release()
                race.wait_round()
            by_round = race.results()
        elapsed = time.monotonic() - t0
        pids = {int(w.rsplit("-", 1)[1]) for w in race.workers.values()}
        assert len(pids) == RACERS and os.getpid() not in pids  # separate OS processes
        print(f"\nclaim race: {ROUNDS} rounds x {RACERS} processes in {elapsed:.1f}s = {ROUNDS / elapsed:.0f} rounds/s")

        issued: Counter[tuple[str, int]] = Counter()
        pipe = r.pipeline(transaction=False)
        for tid in task_ids:
            tk = Keys(prefix).task(tid)
            pipe.hget(tk.task, "state")
            pipe.hget(tk.task, "fence")
            pipe.hmget(tk.attempts, "1.state", "1.worker", "1.fence", "1.seq")
            pipe.lrange(tk.events, 0, -1)
            pipe.hgetall(tk.task)
        replies = pipe.execute()
        seqs = []
        for i, tid in enumerate(task_ids):
            rows = by_round[i]
            assert len(rows) == RACERS, f"round {i}: {len(rows)} answers"
            winners = [row for row in rows if row[1] == "won"]
            losers = [row for row in rows if row[1] == "rejected"]
            errors = [row for row in rows if row[1] == "error"]
            assert not errors, f"round {i}: {errors}"
            assert len(winners) == 1, f"round {i}: winners {winners}"
            assert len(losers) == RACERS - 1
            winner, _, wtid, fence, number = winners[0]
            assert (wtid, fence, number) == (tid, 1, 1)
            issued[(tid, fence)] += 1
            for _, _, _, why, holder in losers:
                assert why == "task is running" and holder == winner, (why, holder, winner)

            state, task_fence, (a_state, a_worker, a_fence, a_seq), events, fields = replies[5 * i: 5 * i + 5]
            assert (state, task_fence) == ("running", "1")
            assert (a_state, a_worker, a_fence) == ("running", winner, "1")
            types = Counter(f["type"] for _, f in history(fields, events))  # (the claim may be implied)
            assert types["attempt_claimed"] == 1 and types["claim_refused"] == RACERS - 1, types
            seqs.append(int(a_seq))

        assert all(n == 1 for n in issued.values()) and len(issued) == ROUNDS
        # The namespace claim sequence: one number per successful claim, strictly increasing by round.
        assert all(b > a for a, b in itertools.pairwise(seqs)), "claim sequence not increasing"
        assert seqs == list(range(seq0 + 1, seq0 + ROUNDS + 1))
        assert int(meta(r, prefix)["seq"]) == seq0 + ROUNDS
        assert q.reads.status()["race"]["counts"] == {"running": ROUNDS}
    finally:
        q.close()
        r.close()


RECLAIM_ROUNDS = 60


def test_reclaims_after_expiry_or_failure_get_strictly_higher_fences(redis_server: RedisServer, prefix: str) -> None:
    """One task, raced for again and again: after expiry -> reconcile -> retry, or fail -> retry."""
    q = mc_queue.connect(redis_server.url, prefix=prefix)
    r = redis_server.client()
    try:
        tid = q.producer.enqueue("race", "noop", {"reclaim": True}).id
        # Even rounds: the winner gets a 1 ms lease and goes silent; the sweeper expires it (fence
        # bumped), the Attempt is reconciled and a retry appended. Odd rounds: the winner fails the
        # Attempt itself (fence unchanged), then a retry is appended.
        plan = [("hold", 1) if i % 2 == 0 else ("fail", 60_000) for i in range(RECLAIM_ROUNDS)]
        expected_fence = 0
        claimed: list[int] = []
        expired: list[tuple[int, int]] = []
        with Race(redis_server.url, prefix, [tid] * RECLAIM_ROUNDS, plan) as race:
            for i in range(RECLAIM_ROUNDS):
                race.release()
                race.wait_round()
                expected_fence += 1  # this round's claim
                claimed.append(expected_fence)
                aid = f"{tid}/{i + 1}"
                if plan[i][0] == "hold":
                    deadline = time.monotonic() + 5
                    got: list[mc_queue.ExpiredLease] = []
                    while not got and time.monotonic() < deadline:
                        got = q.maintenance.expire_leases()
                    assert [(e.attempt_id, e.old_fence, e.new_fence) for e in got] == \
                        [(aid, expected_fence, expected_fence + 1)]
                    expected_fence += 1
                    expired.append((got[0].old_fence, got[0].new_fence))
                    reconcile_attempt(q, aid)
                q.operator.retry_task(tid, f"round {i}: try again after {plan[i][0]}", hypothesis="another racer")
            by_round = race.results()

        seen_fences = []
        for i in range(RECLAIM_ROUNDS):
            winners = [row for row in by_round[i] if row[1] == "won"]
            others = [row for row in by_round[i] if row[1] != "won"]
            assert len(winners) == 1, f"round {i}: {by_round[i]}"
            assert all(row[1] == "rejected" for row in others), others
            _, _, _, fence, number = winners[0]
            assert number == i + 1
            seen_fences.append(fence)
        assert seen_fences == claimed
        assert all(b > a for a, b in itertools.pairwise(seen_fences))

        # The task's own history: every fence it ever issued (claims and expiry bumps) is unique and
        # strictly increasing, and each Attempt kept the fence it ran with.
        history = []
        for e in events_of(r, prefix, tid, "attempt_claimed") + events_of(r, prefix, tid, "lease_expired"):
            history.append((e["id"], int(e["fence"] if e["type"] == "attempt_claimed" else e["new_fence"])))
        fences = [f for _, f in sorted(history, key=lambda h: tuple(map(int, h[0].split("-"))))]
        assert fences == sorted(set(fences)) and len(fences) == RECLAIM_ROUNDS + len(expired)
        for i in range(RECLAIM_ROUNDS):
            a = attempt_fields(r, prefix, tid, i + 1)
            assert int(a["fence"]) == claimed[i]
            assert a["state"] == "failed"
            assert a.get("settled_by") == ("reconcile" if plan[i][0] == "hold" else None)
        task = q.reads.get_task(tid)
        assert task.attempt_count == RECLAIM_ROUNDS + 1 and task.state == mc_queue.TaskState.PENDING
        assert task.fence == expected_fence
    finally:
        q.close()
        r.close()

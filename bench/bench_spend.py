"""Spend ceilings (denial of wallet) under load, retries and worker deaths: no window spends more than its
ceiling, and a saturated ceiling is used.

    .venv/bin/python bench/bench_spend.py                          # 30 s, 8 workers (about a minute)
    .venv/bin/python bench/bench_spend.py --seconds 5 --workers 2  # seconds

A fresh redis-server; ``--keys`` tenant keys ``tenant:<i>`` of a family whose spend ceiling is ``--ceiling``
cost per ``--window-s`` (wait when over); tasks whose budget is ``--budget`` cost (so each Attempt reserves
what its task's budget has left) are made faster than the ceilings let them run, so every key stays
saturated. ``--workers`` worker processes take a task id from a shared list, claim its Attempt (``claim.lua``:
the reservation taken, or the Attempt deferred: put back on the list at its due time by this process),
work 0-5 ms and are charged a random cost up to what they reserved; ``--fail`` of them fail instead (a
transient failure, retried at once: a retry storm, each retry reserving the budget's rest). Every
``--kill-every-s`` one worker is SIGKILLed (its Attempt's reservation is replaced by what it was charged, 0,
when this process's sweeper loop expires its lease) and replaced.

Printed, from the records (each Attempt's cost and when it stopped running, on Redis's clock):
- **overshoot**: for each key, the most spent in any window of ``--window-s`` that ends when an Attempt stopped,
  over the ceiling (must be <= 1.00);
- **use**: what the keys spent over the run, against the most their ceilings let through in that time (a
  ceiling's worth per window begun; the buckets err toward refusing, and the reservations of budgets not
  spent hold room until their Attempts stop);
- claims, deferrals, retries, kills.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from mc_queue import Budget, Decision, FailureClass, make_failure  # noqa: E402
from mc_queue.client.producer import NewTask  # noqa: E402
from mc_queue.contracts.errors import ClaimRejected, McqError, OverLimit  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

PREFIX = "bspend"
TODO = "bench:spend:todo"  # "<task id> <key>" to claim (a plain list outside the namespace: the bench's transport)
LATER = "bench:spend:later"  # deferred ones -> their due time (ms)
LEASE_MS = 500
RETRY = Decision("retry", "bench: a transient failure", 0.0, next_reason="a transient failure in the bench",
                 next_hypothesis="it passes")


def worker(url: str, fail: float, stop: Any) -> None:
    q = mc_queue.connect(url, prefix=PREFIX)
    me = f"bench-{os.getpid()}"
    rnd = random.Random(os.getpid())
    failure = make_failure(FailureClass.PROVIDER, "Timeout", "the provider timed out (bench)")
    while not stop.is_set():
        item = q.redis.blpop([TODO], timeout=0.2)
        if item is None:
            continue
        task_id, key = str(item[1]).split(" ")
        try:
            lease = q.leases.claim_attempt(task_id, me, LEASE_MS, limits=(key,), with_task=True)
        except OverLimit as over:
            q.redis.zadd(LATER, {f"{task_id} {key}": over.due_ms})
            continue
        except (ClaimRejected, McqError):
            continue
        assert lease.task is not None
        reserved = lease.task.attempts[lease.number - 1].spend.get(key, (0.0, 0))[0]
        cost = round(rnd.uniform(0, reserved), 3)
        time.sleep(rnd.random() * 0.005)
        try:
            if rnd.random() < fail:
                q.leases.fail_attempt(lease.attempt_id, lease.fence, failure, worker_id=me, cost=cost, decision=RETRY)
                q.redis.rpush(TODO, f"{task_id} {key}")  # retried at once
            else:
                q.leases.complete_quietly(lease.attempt_id, lease.fence, {"ok": 1}, worker_id=me, cost=cost)
        except McqError:
            continue  # its lease ran out first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--ceiling", type=float, default=20.0, help="cost per window, each key")
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--budget", type=float, default=0.5, help="each task's max_cost")
    ap.add_argument("--fail", type=float, default=0.3, help="the share of Attempts that fail and are retried")
    ap.add_argument("--kill-every-s", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp) / "redis") as server:
        if run(server.url, args):
            sys.exit(1)


def run(url: str, args: argparse.Namespace) -> int:
    q = mc_queue.connect(url, prefix=PREFIX)
    q.backend.open_namespace()
    q.spend.set("tenant:*", cost=args.ceiling, per_s=args.window_s, reason="bench: each tenant's ceiling")
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs: dict[int, Any] = {}

    def spawn() -> None:
        p = ctx.Process(target=worker, args=(url, args.fail, stop), daemon=True)
        p.start()
        procs[p.pid] = p

    for _ in range(args.workers):
        spawn()
    made: list[str] = []
    budget = Budget(max_cost=args.budget, max_attempts=1000, max_same_fingerprint=1000)
    kills, t0 = 0, time.monotonic()
    last_kill = t0
    try:
        while time.monotonic() - t0 < args.seconds:
            if q.redis.llen(TODO) < args.workers * 4:
                keys = [f"tenant:{random.randrange(args.keys)}" for _ in range(200)]
                tasks = q.producer.enqueue_many([NewTask("bench", "h", {"i": i}, limits={key: 0}, budget=budget)
                                                 for i, key in enumerate(keys)])
                made.extend(t.id for t in tasks)
                q.redis.rpush(TODO, *[f"{t.id} {key}" for t, key in zip(tasks, keys, strict=True)])
            now = q.backend.redis_time_ms()
            due = q.redis.zrangebyscore(LATER, "-inf", now)
            if due:
                q.redis.zrem(LATER, *due)
                q.redis.lpush(TODO, *due)  # (first in line: they waited)
            q.maintenance.expire_leases(actor="bench-sweeper")
            if args.kill_every_s and time.monotonic() - last_kill >= args.kill_every_s:
                last_kill = time.monotonic()
                pid = random.choice(sorted(procs))
                os.kill(pid, signal.SIGKILL)
                procs.pop(pid).join(5)
                kills += 1
                spawn()
            time.sleep(0.01)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        for p in procs.values():
            p.join(5)
            if p.is_alive():
                p.kill()
    time.sleep(LEASE_MS / 1000 + 0.1)
    q.maintenance.expire_leases(actor="bench-sweeper")
    return report(q, made, elapsed, kills, args)


def report(q: mc_queue.Client, made: list[str], elapsed: float, kills: int, args: argparse.Namespace) -> int:
    """Print the figures; returns how many keys spent more than their ceiling in some window (0, or FAIL)."""
    ends: dict[str, list[tuple[int, float]]] = defaultdict(list)  # key -> (stopped at ms, cost)
    attempts = retries = 0
    first = last = None
    for tid in made:
        t = q.reads.get_task(tid)
        key = next(iter(t.attempts[0].spend), None) if t.attempts else None
        for a in t.attempts:
            stopped = a.suspect_at or a.ended_at
            if stopped is None or not a.spend:
                continue
            attempts += 1
            retries += a.number > 1
            ms = round(stopped.timestamp() * 1000)
            ends[key or "?"].append((ms, a.cost))
            first, last = min(first or ms, ms), max(last or ms, ms)
    win = round(args.window_s * 1000)
    worst: dict[str, float] = {}
    for key, xs in ends.items():
        xs.sort()
        lo, total, most = 0, 0.0, 0.0
        for end, cost in xs:  # each window (end - win, end]
            total += cost
            while xs[lo][0] <= end - win:
                total -= xs[lo][1]
                lo += 1
            most = max(most, total)
        worst[key] = most
    over = sum(1 for m in worst.values() if m > args.ceiling + 1e-6)
    spent = sum(c for xs in ends.values() for _, c in xs)
    span_s = ((last or 0) - (first or 0)) / 1000 if first else 0.0
    # the most a sliding window lets through in that span: a full window's worth per window begun in it
    allowed = args.ceiling * len(ends) * (int(span_s / args.window_s) + 1) if span_s else 0.0
    stats = q.redis.hgetall(q.keys.stats)
    deferred = sum(int(v) for k, v in stats.items() if str(k).startswith("spend_deferred|"))
    print("| figure | value |\n|---|---|")
    for name, value in (("seconds", f"{elapsed:.1f}"), ("workers", args.workers), ("keys", len(ends)),
                        ("ceiling per window, each key", f"{args.ceiling:g} per {args.window_s:g} s"),
                        ("Attempts that stopped running", f"{attempts:,}"), ("of them retries", f"{retries:,}"),
                        ("claims deferred by the ceiling", f"{deferred:,}"), ("workers SIGKILLed", kills),
                        ("most spent in a window / ceiling (max over keys)",
                         f"{max(worst.values(), default=0) / args.ceiling:.3f}"),
                        ("spent / the most the ceilings let through in that time",
                         f"{spent / allowed:.3f}" if allowed else "-")):
        print(f"| {name} | {value} |")
    print(f"\noverspend: {over} keys above their ceiling in some window: {'FAIL' if over else 'PASS'}")
    return over


if __name__ == "__main__":
    main()

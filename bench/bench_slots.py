"""Concurrency keys (bulkheads) under worker deaths: no key ever admits more running Attempts than its slots.

    .venv/bin/python bench/bench_slots.py                        # 200,000 claims (a few minutes)
    .venv/bin/python bench/bench_slots.py --claims 1000000       # issue 19's figure (about 15 minutes)
    .venv/bin/python bench/bench_slots.py --claims 2000 --workers 4   # seconds

A fresh redis-server; ``--keys`` tenant keys ``tenant:<i>`` of a family with ``--slots`` slots each (wait when
full); ``--workers`` worker processes that each take a task id from a shared list, claim its Attempt
(``claim.lua``: the slot taken or the Attempt parked), hold it 0-2 ms and complete it; a parked Attempt is
put back on the list when a slot returns and wakes it (``Slots.wake_due``, called by the worker that
returned the slot, and by this process's sweeper loop, which also audits the keys and expires the leases
of dead workers). Every ``--kill-every-s`` one worker in ten (at least one)
is SIGKILLed, holding whatever it holds, and replaced. Tasks are made as they are used up (a batch at a
time) and kept (about 1.7 KB each finished: 1,000,000 claims hold about 2 GB of Redis memory).

Each worker appends ``claimed <attempt id> <key> <claim ms>`` before it acts and ``ended <attempt id> <end
ms>`` after its completion (ms on Redis's clock, from the claim's and the completion's replies), unbuffered;
a killed worker's last Attempt ends when its lease was expired (the Attempt's ``suspect_at``). Printed:
- **over-admission**: for each key, the most Attempts whose [claim, end) intervals overlap, and the number
  of moments above its slots (must be 0);
- claims/s, parks (claims that found the key full), wakes, kills, and how long after a killed holder's
  lease ran out its slot came back (p50, max; the sweeper loop here runs every 20 ms).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from mc_queue.client.producer import NewTask  # noqa: E402
from mc_queue.contracts.errors import ClaimRejected, McqError, OverLimit  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

PREFIX = "bslots"
TODO = "bench:slots:todo"  # task ids to claim (a plain list outside the namespace: the bench's transport)
LEASE_MS = 400


def worker(url: str, log_path: str, stop: Any) -> None:
    q = mc_queue.connect(url, prefix=PREFIX)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    me = f"bench-{os.getpid()}"
    rnd = random.Random(os.getpid())
    while not stop.is_set():
        item = q.redis.blpop([TODO], timeout=0.2)
        if item is None:
            continue
        task_id, key = str(item[1]).split(" ")
        try:
            lease = q.leases.claim_attempt(task_id, me, LEASE_MS, limits=(key,) if key != "-" else (),
                                           with_task=True)
        except OverLimit:
            continue  # parked: woken (and put back on the list) when a slot returns
        except (ClaimRejected, McqError):
            continue
        assert lease.task is not None
        held = lease.task.attempts[lease.number - 1].slots  # the key whose slot the claim took
        os.write(fd, f"claimed {lease.attempt_id} {','.join(held)} {lease.claimed_now_ms}\n".encode())
        time.sleep(rnd.random() * 0.002)
        try:
            _, _, reply = q.leases.complete_quietly(lease.attempt_id, lease.fence, {"ok": 1}, worker_id=me)
            os.write(fd, f"ended {lease.attempt_id} {reply[1]}\n".encode())
        except McqError:
            continue  # its lease ran out first: it ended when it was expired (read at the end)
        # the slot it returned wakes the key's first waiter: sent on at once (its claim reads its keys)
        woken = q.slots.wake_due(limit=10, actor=me)
        if woken:
            q.redis.rpush(TODO, *[f"{aid.rpartition('/')[0]} -" for aid in woken])


def most_open(spans: list[tuple[int, int]]) -> int:
    """The most intervals [start, end) open at once (an end at the same ms as a start closes first)."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = cur = 0
    for _, d in points:
        cur += d
        most = max(most, cur)
    return most


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--claims", type=int, default=200_000)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--kill-every-s", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--fsync", default="everysec", choices=["always", "everysec"],
                    help="the server's appendfsync (always: every write on disk before its reply)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp) / "redis", appendfsync=args.fsync) as server:
        run(server.url, Path(tmp), args)


def run(url: str, tmp: Path, args: argparse.Namespace) -> None:
    q = mc_queue.connect(url, prefix=PREFIX)
    q.backend.open_namespace()
    q.slots.set("tenant:*", args.slots, reason="bench: the tenants' bulkheads")
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs: dict[int, Any] = {}
    logs: list[Path] = []

    def spawn() -> None:
        path = tmp / f"worker-{len(logs)}.log"
        logs.append(path)
        p = ctx.Process(target=worker, args=(url, str(path), stop), daemon=True)
        p.start()
        procs[p.pid] = p

    for _ in range(args.workers):
        spawn()
    made: dict[str, str] = {}  # task id -> its key
    kills, wakes, t0 = 0, 0, time.monotonic()
    last_kill = t0
    claimed = 0
    try:
        while claimed < args.claims:
            if q.redis.llen(TODO) < args.workers * 4 and len(made) < args.claims + args.batch:
                for _ in range(args.batch // 500):  # (enqueue_many: one round trip per 500)
                    keys = [f"tenant:{random.randrange(args.keys)}" for _ in range(500)]
                    tasks = q.producer.enqueue_many([NewTask("bench", "h", {"i": i}, limits={key: 1})
                                                     for i, key in enumerate(keys)])
                    made.update((t.id, key) for t, key in zip(tasks, keys, strict=True))
                    q.redis.rpush(TODO, *[f"{t.id} {key}" for t, key in zip(tasks, keys, strict=True)])
            woken = q.slots.wake_due(limit=1000, audit=True)
            wakes += len(woken)
            if woken:
                q.redis.rpush(TODO, *[f"{tid} {made[tid]}" for tid in (aid.rpartition("/")[0] for aid in woken)])
            q.maintenance.expire_leases(actor="bench-sweeper")
            if time.monotonic() - last_kill >= args.kill_every_s:
                last_kill = time.monotonic()
                for pid in random.sample(sorted(procs), max(1, args.workers // 10)):
                    os.kill(pid, signal.SIGKILL)
                    procs.pop(pid).join(5)
                    kills += 1
                    spawn()
            claimed = int(q.redis.hget(q.keys.meta, "seq") or 0)
            time.sleep(0.02)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        for p in procs.values():
            p.join(5)
            if p.is_alive():
                p.kill()
    time.sleep(LEASE_MS / 1000 + 0.1)
    q.maintenance.expire_leases(actor="bench-sweeper")
    if report(q, logs, claimed, elapsed, kills, wakes, args):
        sys.exit(1)


def report(q: mc_queue.Client, logs: list[Path], claimed: int, elapsed: float, kills: int, wakes: int,
           args: argparse.Namespace) -> int:
    """Print the figures; returns how many keys were ever above their slots (0, or the run failed)."""
    starts: dict[str, tuple[str, int]] = {}
    ends: dict[str, int] = {}
    for path in logs:
        for line in (path.read_text().splitlines() if path.exists() else []):  # (killed before it began)
            parts = line.split(" ")
            if parts[0] == "claimed" and len(parts) == 4:
                starts[parts[1]] = (parts[2], int(parts[3]))
            elif parts[0] == "ended" and len(parts) == 3:
                ends[parts[1]] = int(parts[2])
    returned: list[float] = []
    for aid in [a for a in starts if a not in ends]:  # killed holding it: ended when its lease was expired
        task_id, _, n = aid.rpartition("/")
        att = q.reads.get_task(task_id).attempts[int(n) - 1]
        end = att.suspect_at or att.ended_at  # (ended: killed after its completion, before it wrote it down)
        if end is not None:
            ends[aid] = round(end.timestamp() * 1000)
        if att.suspect_at is not None and att.lease_expires_at is not None:
            returned.append((att.suspect_at - att.lease_expires_at).total_seconds() * 1000)
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    open_ended = 0
    for aid, (key, start) in starts.items():
        if aid in ends:
            by_key[key].append((start, ends[aid]))
        else:
            open_ended += 1
    most = {key: most_open(spans) for key, spans in by_key.items()}
    over = sum(1 for m in most.values() if m > args.slots)
    print(f"claims: {claimed:,} in {elapsed:.1f} s ({claimed / elapsed:,.0f}/s) by {args.workers} workers, "
          f"{args.keys} keys of {args.slots} slots; {kills} workers SIGKILLed")
    print(f"over-admission: {over} keys ever above their slots (most at once per key: max "
          f"{max(most.values(), default=0)}, slots {args.slots}); {sum(len(s) for s in by_key.values()):,} "
          f"intervals checked, {open_ended} without an end")
    stats = q.redis.hgetall(q.keys.stats)
    parks = sum(int(v) for k, v in stats.items() if str(k).startswith("slot_waited|"))
    print(f"parks (claims that found the key full): {parks:,}; wakes: {wakes:,}")
    if over:
        print("FAIL: a key admitted more running Attempts than its slots")
    if returned:
        print(f"a killed holder's slot came back {statistics.median(returned):.0f} ms (p50), "
              f"{max(returned):.0f} ms (max) after its lease ran out ({len(returned)} killed holders)")
    return over


if __name__ == "__main__":
    main()

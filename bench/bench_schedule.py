"""Delayed tasks: how late a task is sent after its due time, with a deep store of delayed tasks
around it, and whether any was sent early, with the producers' clocks an hour off.

    .venv/bin/python bench/bench_schedule.py --delayed 1000000 --probes 500     # issue 18's figure
    .venv/bin/python bench/bench_schedule.py --delayed 20000 --probes 100       # a few seconds

A fresh redis-server (its defaults) gets ``--delayed`` tasks due a day from now (the store a
promotion must not slow down with), filled by ``--fill-procs`` producer processes through
``Producer.enqueue``. Then ``--probes`` tasks are enqueued through the App's path (``AppClient``:
no RQ message at enqueue) with delays spread over ``--spread-s`` seconds, half of them from a
process whose ``time.time`` runs an hour ahead, half an hour behind. A sweeper process runs
``Sweeper.run`` (its pass every second, ``promote`` every 50 ms between passes). A consumer pops
each RQ message as it arrives (BLPOP on the queue's list) and takes the task's Redis time at the
pop; the latency is that time less the task's due time (both Redis's clock). A message popped
before its due time is an early start; the consumer also claims each probe, which must succeed.

Prints: delayed tasks in store, Redis memory, probes sent, early starts (must be 0), claims refused
(must be 0), due -> popped by the consumer p50 / p99 / max / mean in ms (the consumer pops and claims
one message at a time, so a burst waits for it too), and due -> sent p50 / p99 / max (``sent_*``: the
Attempt's ``dispatched_at``, recorded by the sweeper just before its push, Redis's clock; the goal is
p99 <= 250 ms).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import mc_queue  # noqa: E402
from mc_queue.ops.sweeper import Sweeper  # noqa: E402
from mc_queue.producer.dispatch import AppClient  # noqa: E402
from mc_queue.producer.transport import job_id, rq_connection, rq_queue  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

QUEUE = "sched"
PREFIX = "bsched"
DAY_S = 86_400.0


class _Spec:
    queue = QUEUE
    retry = mc_queue.RetryPolicy()
    budget = mc_queue.Budget()
    lease_ms = 60_000
    timeout_s = 600.0


class _App:
    operations: dict[str, Any] = {}  # noqa: RUF012 (read only)

    def spec(self, name: str) -> _Spec:
        return _Spec()


def _fill(url: str, start: int, count: int) -> None:
    q = mc_queue.connect(url, prefix=PREFIX, actor=f"fill-{start}")
    for i in range(start, start + count):
        q.producer.enqueue(QUEUE, "bench.later", {"i": i}, delay_s=DAY_S + (i % 3600))
    q.close()


def _probes(url: str, skew_s: float, delays: list[float], out: Any) -> None:
    real = time.time
    time.time = lambda: real() + skew_s  # type: ignore[assignment]  # this producer's clock is off
    q = mc_queue.connect(url, prefix=PREFIX, actor=f"probe{skew_s:+.0f}")
    ac = AppClient(_App(), q)
    due = {}
    for d in delays:
        t = ac.enqueue("bench.probe", {"d": d, "skew": skew_s}, delay_s=d)
        assert t.attempts[0].due_at is not None
        due[t.id] = int(t.attempts[0].due_at.timestamp() * 1000)
    out.put(due)
    ac.close()


def _sweep(url: str, stop: Any) -> None:
    q = mc_queue.connect(url, prefix=PREFIX, actor="bench-sweeper")
    sweeper = Sweeper(q)
    while not stop.is_set():
        sweeper.run(stop_after_s=1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delayed", type=int, default=20_000, help="tasks due a day from now, kept in store")
    ap.add_argument("--probes", type=int, default=100, help="tasks due within --spread-s, whose latency is measured")
    ap.add_argument("--spread-s", type=float, default=5.0)
    ap.add_argument("--fill-procs", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    with RedisServer(Path(tempfile.mkdtemp()) / "r", appendonly=False) as server:
        url = server.url
        admin = redis.Redis.from_url(url)
        mc_queue.connect(url, prefix=PREFIX, actor="bench").backend.open_namespace()
        t0 = time.monotonic()
        share = -(-args.delayed // args.fill_procs)
        fills = [ctx.Process(target=_fill, args=(url, p * share, min(share, args.delayed - p * share)))
                 for p in range(args.fill_procs) if p * share < args.delayed]
        for p in fills:
            p.start()
        for p in fills:
            p.join()
        fill_s = time.monotonic() - t0
        used_mb = int(admin.info("memory")["used_memory"]) / 1e6

        stop = ctx.Event()
        sweeper = ctx.Process(target=_sweep, args=(url, stop))
        sweeper.start()
        q = mc_queue.connect(url, prefix=PREFIX, actor="bench-consumer")
        rq = rq_connection(q)
        key = rq_queue(rq, q.keys.prefix, QUEUE).key
        results = ctx.Queue()
        lead = 1.0 + args.probes * 0.002  # the probes are all enqueued before the first is due
        delays = [lead + args.spread_s * i / max(1, args.probes - 1) for i in range(args.probes)]
        producers = [ctx.Process(target=_probes, args=(url, skew, delays[k::2], results))
                     for k, skew in enumerate((3600.0, -3600.0))]
        for p in producers:
            p.start()
        due: dict[str, int] = {}
        for _ in producers:
            due.update(results.get(timeout=300))
        for p in producers:
            p.join()
        by_job = {job_id(PREFIX, f"{tid}/1"): tid for tid in due}
        late: list[int] = []
        early = refused = 0
        deadline = time.monotonic() + lead + args.spread_s + 30
        while len(late) + early < len(due) and time.monotonic() < deadline:
            got = rq.blpop([key], timeout=1)
            if got is None:
                continue
            now = q.backend.redis_time_ms()
            jid = got[1].decode()
            tid = by_job.get(jid)
            if tid is None:
                continue
            if now < due[tid]:
                early += 1
            else:
                late.append(now - due[tid])
            try:
                q.leases.claim_attempt(tid, "bench-consumer", expect_attempt=1)
            except mc_queue.TransitionRefused:
                refused += 1
        # When the sweeper handed each probe to RQ (its Attempt's dispatched_at, Redis's clock, recorded just
        # before the push): due -> sent without the consumer's own pace (it pops and claims one at a time).
        pipe = q.redis.pipeline(transaction=False)
        for tid in due:
            pipe.hget(q.keys.task(tid).task, "1.dispatched_at")
        sent = sorted(int(at) - due[tid] for tid, at in zip(due, pipe.execute(), strict=True) if at)
        stop.set()
        sweeper.join(timeout=10)
        if sweeper.is_alive():
            sweeper.kill()
        late.sort()

        def pct(p: float) -> float:
            return late[min(len(late) - 1, int(p * len(late)))] if late else float("nan")

        out = {"delayed_in_store": args.delayed, "fill_s": round(fill_s, 1), "used_memory_mb": round(used_mb, 1),
               "probes": len(due), "sent": len(late) + early, "early_starts": early, "claims_refused": refused,
               "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": late[-1] if late else None,
               "mean_ms": round(statistics.fmean(late), 1) if late else None,
               "sent_p50_ms": sent[len(sent) // 2] if sent else None,
               "sent_p99_ms": sent[min(len(sent) - 1, int(0.99 * len(sent)))] if sent else None,
               "sent_max_ms": sent[-1] if sent else None}
        q.close()
        rq.close()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v}")
    if early or refused or out["sent"] != len(due):
        sys.exit(1)


if __name__ == "__main__":
    main()

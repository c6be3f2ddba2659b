"""Soak: many tasks through enqueue -> claim -> complete with a short retention; Redis memory must
level off once the retention window has passed, and stay flat (issue 10).

One process drives the work (a producer and a worker loop, straight through the Client: no RQ, so
that what is measured is mc_queue's own keys); a second thread runs the sweeper's memory step
(``Sweeper.keep_bounded``: pack finished histories, retire tasks past retention, forget expired
producer keys) once a second, as ``mcq sweeper`` does. Every ``--sample`` seconds it prints Redis's
``used_memory``, the tasks finished so far, the tasks still in Redis (the done index) and the
longest sweeper step since the last sample.

    .venv/bin/python bench/soak.py                      # 100,000 tasks, retention 60 s (~3-4 min)
    .venv/bin/python bench/soak.py --tasks 20000 --retention 20 --after 30   # a short one

The verdict looks at the samples taken after the window while tasks still flowed: flat means the mean
of their second half is within ``--tolerance`` (default 10%) of the mean of their first half.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import mc_queue
from mc_queue.contracts.config import Retention
from mc_queue.ops.sweeper import Sweeper
from mc_queue.testing import RedisServer, unique_prefix

QUEUE = "soak"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--retention", type=float, default=60.0, help="seconds finished tasks stay (and tombstones)")
    ap.add_argument("--pack-after", type=float, default=10.0, help="seconds before a finished history is packed")
    ap.add_argument("--rate", type=float, default=600.0,
                    help="tasks per second at most (the run lasts at least tasks / rate seconds)")
    ap.add_argument("--after", type=float, default=None,
                    help="seconds to keep sampling once all tasks are done (default: retention + 15)")
    ap.add_argument("--sample", type=float, default=5.0)
    ap.add_argument("--tolerance", type=float, default=0.10)
    args = ap.parse_args(argv)
    after = args.after if args.after is not None else args.retention + 15

    base = Path(tempfile.mkdtemp(prefix="mcq-soak-"))
    with RedisServer(base / "redis", appendonly=False) as server:
        admin = server.client()
        prefix = unique_prefix("soak")
        q = mc_queue.connect(server.url, prefix=prefix, actor="soak")
        q.backend.open_namespace()
        q.operator.set_retention(QUEUE, Retention(done_s=args.retention, tombstone_s=args.retention),
                        reason="the soak keeps finished tasks for the window only")
        sq = mc_queue.connect(server.url, prefix=prefix, actor="soak-sweeper")
        sweeper = Sweeper(sq, pack_after_ms=int(args.pack_after * 1000), retention_budget_s=0.8)
        stop = threading.Event()
        steps: list[float] = []
        totals = {"packed": 0, "retired": 0}

        def sweep() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                r = sweeper.keep_bounded()
                steps.append((time.monotonic() - t0) * 1000)
                totals["packed"] += r.packed
                totals["retired"] += sum(r.retired.values())
                stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

        th = threading.Thread(target=sweep, daemon=True)
        th.start()
        start = time.monotonic()
        curve: list[dict[str, Any]] = []
        done = 0
        next_sample = start
        finished_at: float | None = None
        print(f"{'t (s)':>6} {'finished':>9} {'in Redis':>9} {'used_memory':>12} {'sweeper step max (ms)':>22}")

        def sample() -> None:
            mem = int(admin.info("memory")["used_memory"])
            in_redis = int(admin.zcard(q.keys.done(QUEUE)))
            worst = max(steps) if steps else 0.0
            steps.clear()
            row = {"t": round(time.monotonic() - start, 1), "finished": done, "in_redis": in_redis,
                   "used_memory": mem, "step_max_ms": round(worst, 1)}
            curve.append(row)
            print(f"{row['t']:>6} {done:>9} {in_redis:>9} {mem / 1e6:>10.2f} MB {worst:>22.1f}", flush=True)

        while done < args.tasks or time.monotonic() - (finished_at or time.monotonic()) < after:
            now = time.monotonic()
            if now >= next_sample:
                sample()
                next_sample += args.sample
            if done < args.tasks:
                # keep the rate: a steady flow, as a production queue sees
                if done > (now - start) * args.rate:
                    time.sleep(0.005)
                    continue
                t = q.producer.enqueue(QUEUE, "h", {"i": done}, f"soak-{done}")
                lease = q.leases.claim_attempt(t.id, "w", 60_000)
                q.leases.complete_quietly(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w")
                done += 1
                if done == args.tasks:
                    finished_at = time.monotonic()
            else:
                time.sleep(0.05)
        sample()
        stop.set()
        th.join(5)
        q.close()
        sq.close()

    # Verdict: the samples taken once the window has passed, while tasks still flowed, are the plateau.
    # Flat: the mean of its second half is within the tolerance of the mean of its first half (memory
    # moves with the rate, which varies on a shared machine; what must not happen is a trend up).
    plateau = [r for r in curve if r["t"] >= args.retention + args.pack_after + 2 * args.sample]
    steady = [r for r in plateau if r["finished"] < args.tasks] or plateau
    mems = [r["used_memory"] for r in steady]
    half = len(mems) // 2
    first, second = (statistics.mean(mems[:half]), statistics.mean(mems[half:])) if half else (0.0, 0.0)
    ok = half > 0 and abs(second - first) <= args.tolerance * first
    print(f"\npacked {totals['packed']}, retired {totals['retired']} of {args.tasks} tasks; "
          f"sweeper step max over the run {max((r['step_max_ms'] for r in curve), default=0):.1f} ms")
    if mems:
        print(f"plateau (t >= {args.retention + args.pack_after + 2 * args.sample:.0f} s while tasks flowed): "
              f"used_memory {min(mems) / 1e6:.2f} .. {max(mems) / 1e6:.2f} MB over {len(mems)} samples; "
              f"mean of its first half {first / 1e6:.2f} MB, second half {second / 1e6:.2f} MB "
              f"-> {'FLAT' if ok else 'NOT FLAT'} (tolerance {args.tolerance:.0%})")
        in_redis = statistics.mean(r["in_redis"] for r in steady)
        print(f"finished tasks in Redis on the plateau: {in_redis:,.0f} on average (the window's worth), "
              f"{statistics.mean(mems) / max(in_redis, 1):,.0f} B of used_memory each, the last "
              f"{args.pack_after:g} s unpacked and the window's tombstones included")
    last = curve[-1] if curve else None
    if last:
        print(f"at the end: {last['in_redis']} finished tasks still in Redis, "
              f"used_memory {last['used_memory'] / 1e6:.2f} MB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

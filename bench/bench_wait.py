"""Waiting for results: lost wakeups over many tasks finishing before, during and after the waiters look.

    .venv/bin/python bench/bench_wait.py --tasks 100000     # issue 18's figure (a few minutes)
    .venv/bin/python bench/bench_wait.py --tasks 2000       # seconds

A fresh redis-server gets ``--tasks`` tasks. A third is finished (claimed and completed through the
Client) before any waiter starts; then ``--waiters`` threads each wait (``client.results.wait_many``, in
groups of ``--group``) for their share of all the tasks while ``--finishers`` threads finish the rest in
random order, with a pause now and then. A lost wakeup is a task that finished but whose waiter did
not return it with its own result before the timeout (must be 0). Also printed: how long after a task
finished its waiter returned it (its group's last task decides when a group returns: the figure is per
group, p50 / p99 / max, from the later of that finish and the wait_many call, since a waiter takes its
groups one after the other), and what the waiters cost Redis (commands per waited task).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from mc_queue.client.results import WaitTimedOut  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

QUEUE = "waited"


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def finish(q: mc_queue.Client, tid: str) -> None:
    lease = q.leases.claim_attempt(tid, "w")
    q.leases.complete_quietly(lease.attempt_id, lease.fence, {"ok": tid[-6:]}, worker_id="w")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--waiters", type=int, default=4)
    ap.add_argument("--finishers", type=int, default=2)
    ap.add_argument("--group", type=int, default=500, help="tasks per wait_many call")
    ap.add_argument("--timeout", type=float, default=600.0, help="each wait's timeout (seconds)")
    args = ap.parse_args()

    with RedisServer(Path(tempfile.mkdtemp(prefix="mcq-bench-wait-")) / "redis", appendonly=False) as server:
        q = mc_queue.connect(server.url, prefix="bwait")
        t0 = time.monotonic()
        ids = [q.producer.enqueue(QUEUE, "h", {"i": i}).id for i in range(args.tasks)]
        before, rest = ids[: len(ids) // 3], ids[len(ids) // 3:]
        for tid in before:
            finish(q, tid)
        print(f"{args.tasks} tasks enqueued, {len(before)} finished before the waiters, in "
              f"{time.monotonic() - t0:.1f}s", file=sys.stderr)
        random.Random(18).shuffle(rest)
        finished_at: dict[str, float] = {tid: 0.0 for tid in before}
        lock = threading.Lock()
        returned: dict[str, Any] = {}
        late: list[float] = []
        lost: list[str] = []
        admin = server.client()
        cmds0 = sum(v["calls"] for k, v in admin.info("commandstats").items() if k.startswith("cmdstat_"))

        def waiter(share: list[str]) -> None:
            c = mc_queue.connect(server.url, prefix="bwait")
            try:
                for i in range(0, len(share), args.group):
                    group = share[i:i + args.group]
                    called = time.monotonic()
                    try:
                        out = c.results.wait_many(group, timeout_s=args.timeout)
                    except WaitTimedOut as exc:
                        with lock:
                            lost.extend(t for t in group if finished_at.get(t) is not None
                                        and exc.states.get(t) != "succeeded")
                        continue
                    seen = time.monotonic()
                    with lock:
                        for tid, o in out.items():
                            returned[tid] = o.result
                        done = [finished_at[t] for t in group if finished_at.get(t)]
                        if done:  # from the later of its last finish and the call (a waiter takes its groups
                            late.append(seen - max(max(done), called))  # in turn: not the time it was busy)
            finally:
                c.close()

        def finisher(share: list[str]) -> None:
            c = mc_queue.connect(server.url, prefix="bwait")
            try:
                for n, tid in enumerate(share):
                    finish(c, tid)
                    with lock:
                        finished_at[tid] = time.monotonic()
                    if n % 97 == 0:
                        time.sleep(0.005)
            finally:
                c.close()

        shares = [ids[i::args.waiters] for i in range(args.waiters)]
        work = [rest[i::args.finishers] for i in range(args.finishers)]
        threads = [threading.Thread(target=waiter, args=(s,)) for s in shares]
        threads += [threading.Thread(target=finisher, args=(w,)) for w in work]
        t1 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t1
        cmds1 = sum(v["calls"] for k, v in admin.info("commandstats").items() if k.startswith("cmdstat_"))
        wrong = [t for t in ids if returned.get(t) != {"ok": t[-6:]}]
        q.close()
    print("| figure | value |\n|---|---|")
    print(f"| tasks waited for | {len(ids)} ({len(before)} finished before the waiters started) |")
    print(f"| waiters / finishers / tasks per wait_many | {args.waiters} / {args.finishers} / {args.group} |")
    print(f"| returned with their own result | {len(ids) - len(wrong)} |")
    print(f"| **lost wakeups** (finished, not returned) | **{len(lost) + len(wrong)}** |")
    print("| a group's last finish (or the call, if later) -> its waiter returned, s, p50 / p99 / max | "
          f"{pct(late, 50):.3f} / {pct(late, 99):.3f} / {max(late) if late else float('nan'):.3f} |")
    print(f"| Redis commands during the waits and finishes, per task | {(cmds1 - cmds0) / max(1, len(rest)):.1f} |")
    print(f"| wall time of the waits | {took:.1f}s |")
    sys.exit(0 if not lost and not wrong else 1)


if __name__ == "__main__":
    main()

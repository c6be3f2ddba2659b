"""Priorities in a drain: inversions with several real workers, and what aging bounds.

    .venv/bin/python bench/bench_priority.py --tasks 2000 --workers 4     # issue 18's figure
    .venv/bin/python bench/bench_priority.py --tasks 200 --workers 2      # seconds

A fresh redis-server gets ``--tasks`` tasks of random priorities 1..9 (``AppClient.enqueue``: each sent to
its priority's RQ queue), then ``--workers`` ``mcq worker --burst --kind simple`` processes drain them
(a handler that sleeps ``--work-ms``). Each Attempt's claim sequence gives the claim order. An
inversion is a task claimed while a more urgent one that was already waiting was claimed later; with
W workers each may hold one message it took and has not claimed yet, so a more urgent task claimed
less than W claims later is what concurrency allows, not an inversion. Printed: inversions beyond that
window (must be 0), inversions within it, and the claim order's agreement with a perfect priority order.

Then aging: one task of priority 9 waits behind a stream of priority-1 tasks that never ends; with
``--aging-ms`` its message moves up a level per period (a sweeper with ``priority_aging_ms``), and its
wait is printed against the bound 8 x aging + the time to drain one level ahead of it; and again with
fairness keys on both (``laned_``: the messages wait in fair lanes, and the low one ages there).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from mc_queue import Sweeper  # noqa: E402
from mc_queue.producer.dispatch import AppClient  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402
from tests.apps import basic  # noqa: E402

PREFIX = "bprio"


def run_workers(server: RedisServer, n: int, extra: list[str], tmp: Path) -> None:
    cmd = [sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", PREFIX, "worker", "--app",
           "tests.apps.basic:app", "--kind", "simple", "--workspace-root", str(tmp / "ws"), *extra]
    logs = [open(tmp / f"worker-{i}.log", "wb") for i in range(n)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
             for log in logs]
    for p, log in zip(procs, logs, strict=True):
        p.wait(600)
        log.close()


def aging_wait(server: RedisServer, q: mc_queue.Client, app: AppClient, args: argparse.Namespace, tmp: Path,
               low_key: str | None, flood_key: str | None) -> tuple[float, bool]:
    """How long a priority-9 task waited behind endless priority-1 work, with aging on (and whether it ran)."""
    low = app.enqueue("noop", {"low": True}, priority=9, fair_key=low_key)
    stop = threading.Event()

    def flood() -> None:
        c = AppClient(basic.app, mc_queue.connect(server.url, prefix=PREFIX))
        while not stop.is_set():
            c.enqueue("sleepy", {"seconds": args.work_ms / 1000}, priority=1, fair_key=flood_key)
            time.sleep(args.work_ms / 1000 / 2)
        c.close()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    log = tmp / f"aging-worker-{low_key or 'plain'}.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", PREFIX,
                                   "worker", "--app", "tests.apps.basic:app", "--kind", "simple", "--workspace-root",
                                   str(tmp / "ws")], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    sweeper = Sweeper(q, priority_aging_ms=args.aging_ms)
    t1 = time.monotonic()
    bound_s = 8 * args.aging_ms / 1000 + 5.0
    while q.reads.get_task(low.id).state.value != "succeeded" and time.monotonic() - t1 < 3 * bound_s:
        sweeper.run_once()
        time.sleep(0.05)
    waited = time.monotonic() - t1
    stop.set()
    flooder.join(10)
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:  # a worker that does not stop on SIGTERM: say where it is, then kill it
        spy = Path(sys.executable).parent / "py-spy"
        if spy.exists():
            subprocess.run([str(spy), "dump", "--pid", str(worker.pid)], check=False)
        print(f"worker {worker.pid} did not stop within 30 s of SIGTERM; its log: {log}\n"
              + "\n".join(log.read_text(errors="replace").splitlines()[-30:]), file=sys.stderr)
        worker.kill()
        raise
    return waited, q.reads.get_task(low.id).state.value == "succeeded"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--work-ms", type=float, default=5.0)
    ap.add_argument("--aging-ms", type=int, default=300)
    ap.add_argument("--seed", type=int, default=18)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mcq-bench-priority-"))
    out: dict[str, Any] = {}
    with RedisServer(tmp / "redis", appendonly=False) as server:
        q = mc_queue.connect(server.url, prefix=PREFIX)
        app = AppClient(basic.app, q)
        rng = random.Random(args.seed)
        ids = [app.enqueue("sleepy", {"seconds": args.work_ms / 1000, "n": i}, priority=rng.randint(1, 9)).id
               for i in range(args.tasks)]
        t0 = time.monotonic()
        run_workers(server, args.workers, ["--burst"], tmp)
        print(f"drained in {time.monotonic() - t0:.1f}s; worker logs in {tmp}", file=sys.stderr)
        took = time.monotonic() - t0
        pipe = q.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(q.keys.task(tid).task, ["1.seq", "priority", "state"])
        rows = sorted((int(seq), int(p or 5)) for seq, p, state in pipe.execute() if seq and state == "succeeded")
        order = [p for _, p in rows]
        w = args.workers
        beyond = sum(1 for i in range(len(order)) for j in range(i + w, len(order)) if order[j] < order[i])
        within = sum(1 for i in range(len(order)) for j in range(i + 1, min(i + w, len(order))) if order[j] < order[i])
        out.update(tasks=args.tasks, claimed=len(order), workers=w, drain_s=round(took, 2),
                   inversions_beyond_window=beyond, inversions_within_window=within)

        # Aging: a priority-9 task behind a stream of priority-1 tasks (a producer that keeps them coming),
        # then the same with fairness keys (the messages wait in fair lanes, and age there).
        out.update(aging_ms=args.aging_ms, bound_s=round(8 * args.aging_ms / 1000, 2))
        for label, low_key, flood_key in (("", None, None), ("laned_", "tenant:low", "tenant:flood")):
            waited, ran = aging_wait(server, q, app, args, tmp, low_key, flood_key)
            out.update({f"{label}low_priority_waited_s": round(waited, 2), f"{label}low_priority_ran": ran})
        q.close()
    print("| figure | value |\n|---|---|")
    for k, v in out.items():
        print(f"| {k} | {v} |")
    ok = (out["inversions_beyond_window"] == 0 and out["claimed"] == args.tasks and out["low_priority_ran"]
          and out["laned_low_priority_ran"])
    print(f"\npriorities: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

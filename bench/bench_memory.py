"""Redis memory per task by payload size, for this checkout and for the commits given: queued, dispatched
(its Attempt handed to RQ, as an App's enqueue does at once; RQ's own job not counted), finished
(claimed and completed with a result as long as the payload, its whole history kept) and packed (what
the sweeper leaves a minute later), and purged (what retention leaves until the tombstone window ends:
the tombstones, a day's window, no producer key). Finished and what follows include the dispatch.

    .venv/bin/python bench/bench_memory.py --baseline 021095e --sizes 0,60,200,600 --tasks 5000

Each (tree, size) gets a fresh redis-server at its defaults and a fresh namespace; a figure is the
used_memory delta divided by the number of tasks, read after a settle. Size 0 is the payload
``{"i": n}`` and the result ``{"ok": true}``; size N is a payload and a result of N bytes of canonical
JSON (``{"t":"xxx..."}``), what an agent task's issue text or summary looks like at that length. The
trees run through the public API only (``connect``, ``producer.enqueue``, ``leases``,
``maintenance.pack_due``), so any commit that has it can be measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_guards import export  # noqa: E402

DRIVER = r"""
import json, sys, tempfile, time
from pathlib import Path
import redis, mc_queue
from mc_queue.testing import RedisServer

size, n, settle = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def body(i, tag):
    if size == 0:
        return {"i": i} if tag == "p" else {"ok": True}
    return {"t": (tag + str(i)).ljust(size - 8, "x")}
def used(a):
    time.sleep(settle)
    return int(a.info("memory")["used_memory"])
with RedisServer(Path(tempfile.mkdtemp()) / "r") as s:
    a = redis.Redis.from_url(s.url)
    q = mc_queue.connect(s.url, prefix="mem", actor="bench")
    q.backend.open_namespace()
    marks = getattr(q, "schedule", q.maintenance)  # (trees before 2026-12-03 mark dispatches in maintenance)
    # One task through every step first, so that the scripts' bodies and the namespace's own keys are
    # in place before the first reading and the figures hold only what the tasks cost.
    w = q.producer.enqueue("q", "bench.noop", body(-1, "p")).id
    marks.mark_dispatched(w + "/1", recheck_ms=60000)
    wl = q.leases.claim_attempt(w, "bench-worker")
    q.leases.complete_attempt(wl.attempt_id, wl.fence, body(-1, "r"), worker_id="bench-worker")
    while q.maintenance.pack_due(limit=1000, min_age_ms=0):
        pass
    q.maintenance.retire_batch([(w, int(a.zscore(q.keys.done("q"), w)))], states=["succeeded"],
                               reason="bench_memory retires them", tombstone_s=86400)
    m0 = used(a)
    ids = [q.producer.enqueue("q", "bench.noop", body(i, "p")).id for i in range(n)]
    m1 = used(a)
    for tid in ids:  # as an App's enqueue does right after it: the Attempt handed to RQ (RQ's job not counted)
        marks.mark_dispatched(tid + "/1", recheck_ms=60000)
    m1d = used(a)
    for i, tid in enumerate(ids):
        lease = q.leases.claim_attempt(tid, "bench-worker")
        q.leases.complete_attempt(lease.attempt_id, lease.fence, body(i, "r"), worker_id="bench-worker")
    m2 = used(a)
    while q.maintenance.pack_due(limit=1000, min_age_ms=0):
        pass
    m3 = used(a)
    keys = [k.decode() for k in a.scan_iter(match=q.keys.task(ids[0]).task + "*")]
    enc = {k.rsplit(":", 1)[-1] if k != q.keys.task(ids[0]).task else "task": a.object("encoding", k).decode()
           for k in keys}
    done = q.keys.done("q")
    for i in range(0, n, 500):
        rows = [(t, int(a.zscore(done, t))) for t in ids[i:i + 500]]
        q.maintenance.retire_batch(rows, states=["succeeded"], reason="bench_memory retires them",
                                   tombstone_s=86400)
    m4 = used(a)
    q.close()
print(json.dumps({"queued": (m1 - m0) / n, "dispatched": (m1d - m0) / n, "finished": (m2 - m0) / n,
                  "packed": (m3 - m0) / n, "tombstone": (m4 - m0) / n, "keys_packed": len(keys),
                  "encodings_packed": enc}))
"""


def measure(tree: Path, size: int, tasks: int, settle: float) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", DRIVER, str(size), str(tasks), str(settle)], cwd=tree,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin:/usr/local/bin"}, capture_output=True,
                         text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", action="append", default=[], help="a commit to measure too (repeatable)")
    ap.add_argument("--sizes", default="0,60,200,600", help="payload and result bytes, comma-separated")
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--settle", type=float, default=0.5, help="seconds before each used_memory reading")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or any(s != 0 and s < 16 for s in sizes) or args.tasks < 10:
        ap.error("every size must be 0 or at least 16 bytes, and --tasks at least 10")
    tmp = Path(tempfile.mkdtemp(prefix="mcq-mem-"))
    trees = {ref: export(ref, tmp) for ref in args.baseline}
    trees["this checkout"] = ROOT
    got = {label: {size: measure(tree, size, args.tasks, args.settle) for size in sizes}
           for label, tree in trees.items()}
    print(f"Redis bytes per task (used_memory delta / {args.tasks:,} tasks, Redis defaults)")
    print()
    print("| payload and result | " + " | ".join(f"{label}: queued / dispatched / finished / packed / tombstone"
                                                for label in got) + " |")
    print("|---|" + "---|" * len(got))
    for size in sizes:
        cells = [f"{g[size]['queued']:,.0f} / {g[size]['dispatched']:,.0f} / {g[size]['finished']:,.0f} / "
                 f"{g[size]['packed']:,.0f} / "
                 f"{g[size]['tombstone']:,.0f}" for g in got.values()]
        label = '{"i": n} / {"ok": true}' if size == 0 else f"{size} B"
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(got, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the argument guards cost: claim+complete cycles/s of this checkout vs an earlier commit, in one run.

Run from the repository root::

    .venv/bin/python bench/bench_guards.py [--baseline 40d67ad] [--cycles 3000] [--rounds 5]

The baseline commit is exported (``git archive``) into a temporary folder; each round runs the same
driver once with the baseline's ``mc_queue`` and once with this checkout's (order alternating),
against one private redis-server (appendfsync everysec, a fresh namespace per run), from a
subprocess so that each imports only its own package. Per run: claim+complete cycles/s seen by the
client (wall time), the Lua time per cycle measured by redis-server itself (INFO commandstats, usec
of EVALSHA), and the CPU time one cycle costs the client process and the server process (process
time and INFO cpu), which other load on a shared machine moves far less than wall time. The
figures are medians over the rounds; the ratios new/old are what to read (issue 8: the guards must
not cost more than 10%). ``--callgrind N`` counts the server's instructions per cycle instead
(valgrind, slow): by default only inside ``lua_pcall`` (the scripts, which is what the guards
change; repeatable, since nothing there depends on wall time), or with ``--callgrind-scope all``
the whole server (its event loop and cron too, which a loaded machine moves by several percent).
``--callgrind-what enqueue`` counts an enqueue's instructions instead of a claim+complete cycle's.
``--head REF`` measures a commit instead of the working tree.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from mc_queue.store.embedded import find_redis_server  # noqa: E402
from mc_queue.testing import RedisServer, free_port, unique_prefix  # noqa: E402

DRIVER = r"""
import json, sys, time
import redis
import mc_queue
url, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = mc_queue.Client(url, prefix=prefix, actor="bench")
# The Client's calls before issue 16 (one class) and after (its roles): the baseline may be either.
enqueue = q.producer.enqueue if hasattr(q, "producer") else q.enqueue
holder = q.leases if hasattr(q, "leases") else q
ids = [enqueue("bench", "bench.noop", {"i": i}).id for i in range(n)]
admin = redis.Redis.from_url(url)
def evalsha():
    s = admin.info("commandstats").get("cmdstat_evalsha", {})
    return int(s.get("calls", 0)), int(s.get("usec", 0))
def server_cpu():
    c = admin.info("cpu")
    return float(c["used_cpu_user"]) + float(c["used_cpu_sys"])
c0, u0 = evalsha()
s0 = server_cpu()
t0, p0 = time.perf_counter(), time.process_time()
for tid in ids:
    lease = holder.claim_attempt(tid, "bench-worker", 60_000)
    holder.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="bench-worker")
dt, dp = time.perf_counter() - t0, time.process_time() - p0
c1, u1 = evalsha()
s1 = server_cpu()
print(json.dumps({"cycles_per_s": n / dt, "lua_us_per_cycle": (u1 - u0) / n, "evalsha_per_cycle": (c1 - c0) / n,
                  "client_us_per_cycle": dt * 1e6 / n, "client_cpu_us_per_cycle": dp * 1e6 / n,
                  "server_cpu_us_per_cycle": (s1 - s0) * 1e6 / n,
                  "cpu_us_per_cycle": (dp + s1 - s0) * 1e6 / n}))
"""


def export(ref: str, into: Path, parts: tuple[str, ...] = ("mc_queue", "lua")) -> Path:
    """The tree of ``ref`` (``parts`` of it: mc_queue/ and lua/) in a folder of its own under ``into``, via git
    archive."""
    into = into / ref.replace("/", "_")
    into.mkdir()
    data = subprocess.run(["git", "archive", "--format=tar", ref, *parts], cwd=ROOT, check=True,
                          capture_output=True).stdout
    tar_path = into / "tree.tar"
    tar_path.write_bytes(data)
    with tarfile.open(tar_path) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into / "tree", filter="data")
        else:  # Python before 3.11.4 (Debian 12's 3.11.2) has no filter: this repository's own files, checked
            for m in tar.getmembers():
                if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in Path(m.name).parts:
                    raise SystemExit(f"git archive of {ref} holds {m.name!r}, which this script does not extract")
            tar.extractall(into / "tree")  # every member checked above
    return into / "tree"


def run(tree: Path, url: str, cycles: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", DRIVER, url, unique_prefix("guards"), str(cycles)],
                         cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


CALLGRIND_DRIVER = r"""
import sys, mc_queue
url, prefix, n, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
q = mc_queue.Client(url, prefix=prefix, actor="bench", socket_timeout=120)
enqueue = q.producer.enqueue if hasattr(q, "producer") else q.enqueue  # after issue 16 / before
holder = q.leases if hasattr(q, "leases") else q
ids = [enqueue("bench", "bench.noop", {"i": i}).id for i in range(n)]
if cycles:
    for tid in ids:
        lease = holder.claim_attempt(tid, "bench-worker", 60_000)
        holder.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="bench-worker")
"""


def callgrind_instructions(tree: Path, n: int, cycles: bool, tmp: Path, scope: str = "lua") -> int:
    """Instructions redis-server executes (under callgrind) from start to shutdown for n enqueues, and
    the claim+complete cycles when asked; the difference of the two runs is the cycles' cost."""
    d = Path(tempfile.mkdtemp(dir=tmp))
    port, out = free_port(), d / "callgrind.out"
    scope_args = ["--toggle-collect=lua_pcall"] if scope == "lua" else []
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", *scope_args, f"--callgrind-out-file={out}",
                             find_redis_server(),
                             "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    admin = redis.Redis(port=port)
    try:
        for _ in range(600):
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        subprocess.run([sys.executable, "-c", CALLGRIND_DRIVER, f"redis://127.0.0.1:{port}/0", "guards", str(n),
                        "1" if cycles else "0"], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                       check=True)
        admin.shutdown(nosave=True)
    except redis.ConnectionError:
        pass
    proc.wait()
    m = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
    assert m, "callgrind wrote no totals"
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="40d67ad", help="commit before the guards (default: 40d67ad)")
    ap.add_argument("--head", default=None, help="a commit to measure instead of the working tree")
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--callgrind", type=int, default=0, metavar="N",
                    help="instead: count redis-server's instructions per cycle over N cycles (valgrind)")
    ap.add_argument("--callgrind-scope", choices=("lua", "all"), default="lua",
                    help="lua: only inside lua_pcall (the scripts, what the guards change; the default, not "
                         "moved by wall time); all: the whole server, event loop and cron included")
    ap.add_argument("--callgrind-what", choices=("cycle", "enqueue"), default="cycle",
                    help="cycle: a claim+complete cycle (N enqueues plus N cycles, less N enqueues); enqueue: "
                         "an enqueue (N enqueues less none)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mcq-guards-"))
    try:
        old_tree = export(args.baseline, tmp)
        new_tree = export(args.head, tmp) if args.head else ROOT
        if args.callgrind:
            per = {}
            enq = args.callgrind_what == "enqueue"
            for label, tree in (("old", old_tree), ("new", new_tree)):
                if enq:
                    base = callgrind_instructions(tree, 0, False, tmp, args.callgrind_scope)
                    full = callgrind_instructions(tree, args.callgrind, False, tmp, args.callgrind_scope)
                else:
                    base = callgrind_instructions(tree, args.callgrind, False, tmp, args.callgrind_scope)
                    full = callgrind_instructions(tree, args.callgrind, True, tmp, args.callgrind_scope)
                per[label] = (full - base) / args.callgrind
                name = args.baseline if label == "old" else (args.head or "this checkout")
                what = "enqueue" if enq else "claim+complete cycle"
                print(f"{label} ({name}): {per[label]:,.0f} redis-server instructions per {what}", flush=True)
            print(f"ratio new/old: {per['new'] / per['old']:.3f}")
            return 0
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        results: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        with RedisServer(tmp / "redis", appendfsync="everysec") as server:
            run(new_tree, server.url, 300)  # warm up: scripts loaded, caches filled
            run(old_tree, server.url, 300)
            for i in range(args.rounds):
                order = [("old", old_tree), ("new", new_tree)] if i % 2 == 0 else [("new", new_tree), ("old", old_tree)]
                for label, tree in order:
                    results[label].append(run(tree, server.url, args.cycles))
                    r = results[label][-1]
                    print(f"round {i + 1} {label}: {r['cycles_per_s']:6.0f} cycles/s, Lua {r['lua_us_per_cycle']:5.1f}"
                          f" us, CPU per cycle: client {r['client_cpu_us_per_cycle']:5.0f} us + server "
                          f"{r['server_cpu_us_per_cycle']:4.0f} us", flush=True)

        def med(label: str, key: str) -> float:
            return statistics.median(r[key] for r in results[label])

        fields = ("cycles_per_s", "lua_us_per_cycle", "client_us_per_cycle", "client_cpu_us_per_cycle",
                  "server_cpu_us_per_cycle", "cpu_us_per_cycle")
        summary: dict[str, Any] = {
            "baseline": args.baseline, "head": head, "cycles": args.cycles, "rounds": args.rounds,
            "old": {k: med("old", k) for k in fields}, "new": {k: med("new", k) for k in fields},
        }
        summary["ratio_cycles_per_s"] = summary["new"]["cycles_per_s"] / summary["old"]["cycles_per_s"]
        summary["ratio_lua_us"] = summary["new"]["lua_us_per_cycle"] / summary["old"]["lua_us_per_cycle"]
        summary["ratio_cpu_per_cycle"] = summary["new"]["cpu_us_per_cycle"] / summary["old"]["cpu_us_per_cycle"]
        print(json.dumps(summary, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""Rate limits with real worker processes against a provider that counts what reaches it.

    .venv/bin/python bench/bench_limits.py                          # issue 19's figures (about a minute)
    .venv/bin/python bench/bench_limits.py --tasks 60 --limit 10    # seconds

A fresh redis-server; a local HTTP provider (a thread of this process) that records the arrival of
every request on its own clock; the limit ``api`` set to ``--limit`` units per ``--window-s``; then
``--tasks`` tasks of a handler that makes one request each (``bench/controls_app.py``) are enqueued at
once (a saturated limit: far more work than the limit admits), and drained by ``--groups`` worker process
groups of ``--pool`` workers each (``mcq worker --pool``), the first group's host clock moved by
``--skew-s`` and the second by minus that, and one ``mcq sweeper``.

Printed:
- **overshoot**: the most requests the provider saw in any window of ``--window-s`` (every window that
  starts at a request) less the limit: must be 0; and the same on the claims' times (Redis clock, in the
  limit's own window);
- **utilization**: the mean, over windows that start every 10 ms while the limit was saturated, of the
  requests in the window / the limit (goal >= 98%): from the first request, and from one window after it
  (the limit is used in a burst at first, then evenly: the windows that straddle the change are part
  full by design);
- **wake-up latency**: for every claim that followed a deferral, claim time less the due time the
  deferral gave it (Redis clock): p50, p99, max (goal p99 <= 50 ms); and how many re-offers found
  the units gone again (a wake-up for nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from bench.controls_app import KEY, app  # noqa: E402
from mc_queue.producer.dispatch import AppClient  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

PREFIX = "blimits"


class Provider:
    """A local HTTP provider: ``POST /call`` -> 200, the arrival recorded (monotonic seconds, its own clock)."""

    def __init__(self) -> None:
        self.down = False  # True: every request is answered 503 (an outage)
        self.arrivals: list[float] = []
        self.by_task: dict[str, float] = {}
        lock = threading.Lock()
        arrivals, by_task, me = self.arrivals, self.by_task, self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                at = time.monotonic()
                body_in = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    arrivals.append(at)
                    try:
                        by_task[json.loads(body_in)["task"]] = at
                    except (ValueError, KeyError, TypeError):
                        pass
                body = b"{}"
                self.send_response(503 if me.down else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def mcq_processes(url: str, prefix: str, tmp: Path, provider: Provider) -> tuple[list[str], dict[str, str]]:
    """The `mcq` command line for a namespace, and the environment of its processes (a private home)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env.update(MCQ_BENCH_PROVIDER=provider.url, MCQ_HOME=str(tmp / "home"))
    (tmp / "home").mkdir(mode=0o700)
    return [sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix], env


def stop(procs: list[subprocess.Popen[bytes]], provider: Provider) -> None:
    """Terminate the processes (killed after 20 s) and the provider."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    provider.close()


def most_in_window(times: list[float], window: float) -> int:
    """The most entries of ``times`` (sorted) in any window [t, t + window) that starts at one of them."""
    best, j = 0, 0
    for i, t in enumerate(times):
        while j < len(times) and times[j] < t + window:
            j += 1
        best = max(best, j - i)
    return best


def utilization(times: list[float], window: float, limit: int, step: float = 0.01, skip: float = 0.0) -> float:
    """Mean of (entries in [s, s + window)) / limit over windows starting every ``step`` from the first
    entry (plus ``skip``) to the last window that ends by the last entry (the saturated span)."""
    if len(times) < 2 or times[-1] - times[0] - skip <= window:
        return float("nan")
    ratios = []
    s, i, j = times[0] + skip, 0, 0
    while s + window <= times[-1]:
        while i < len(times) and times[i] < s:
            i += 1
        while j < len(times) and times[j] < s + window:
            j += 1
        ratios.append((j - i) / limit)
        s += step
    return statistics.fmean(ratios)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=600)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--guard-ms", type=float, default=20.0,
                    help="The limit's window is the provider's plus this: the spread of the delay between a claim "
                         "and the provider's count of its call (README: Rate limits)")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--skew-s", type=float, default=3600.0)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args()

    provider = Provider()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="mcq-bench-limits-") as tmpdir, RedisServer(Path(tmpdir) / "redis",
                                                                                         appendonly=False) as server:
        tmp = Path(tmpdir)
        client = mc_queue.connect(server.url, prefix=PREFIX)
        client.limits.set(KEY, args.limit, per_s=args.window_s + args.guard_ms / 1000, reason="the bench's limit")
        ac = AppClient(app, client)
        base, env = mcq_processes(server.url, PREFIX, tmp, provider)
        try:
            ids: list[str] = []
            for start in range(0, args.tasks, 500):
                ids += [t.id for t in ac.enqueue_many([{"handler": "call", "payload": {"n": i}}
                                                      for i in range(start, min(args.tasks, start + 500))])]
            t0 = time.monotonic()
            procs.append(subprocess.Popen([*base, "sweeper", "--app", "bench.controls_app:app", "--interval", "0.2"],
                                          cwd=ROOT, env=env, stdout=open(tmp / "sweeper.log", "wb"),
                                          stderr=subprocess.STDOUT))
            for g in range(args.groups):
                skew = args.skew_s if g % 2 == 0 else -args.skew_s
                procs.append(subprocess.Popen(
                    [*base, "worker", "--app", "bench.controls_app:app", "--kind", "simple", "--pool", str(args.pool),
                     "--name", f"g{g}", "--workspace-root", str(tmp / f"ws{g}")], cwd=ROOT,
                    env={**env, "MCQ_BENCH_CLOCK_SKEW_S": str(skew)}, stdout=open(tmp / f"group-{g}.log", "wb"),
                    stderr=subprocess.STDOUT))
            while True:
                done = sum(1 for c in client.reads.status().get("controls", {}).get("counts", {}).items()
                           if c[0] == "succeeded" for _ in range(c[1]))
                if done >= args.tasks:
                    break
                if time.monotonic() - t0 > args.timeout_s:
                    print(f"timed out with {done} of {args.tasks} done", file=sys.stderr)
                    sys.exit(1)
                time.sleep(0.2)
            drain_s = time.monotonic() - t0
        finally:
            stop(procs, provider)
        claims, lateness, refound = [], [], 0
        delays: list[float] = []
        deferred_tasks = 0
        for tid in ids:
            t = client.reads.get_task(tid)
            a = t.attempts[-1]
            assert a.started_at is not None
            claimed = round(a.started_at.timestamp() * 1000)
            claims.append(claimed / 1000)
            if tid in provider.by_task:
                delays.append(provider.by_task[tid] - claimed / 1000)
            dues = [int(e.fields["due_at"]) for e in t.events if e.type == "claim_limited"]
            if dues:
                deferred_tasks += 1
                lateness.append(claimed - dues[-1])
                refound += len(dues) - 1
        client.close()
    arrivals = sorted(provider.arrivals)
    claims.sort()
    w = args.window_s
    out = {
        "tasks": args.tasks, "limit": args.limit, "window_s": w, "guard_ms": args.guard_ms,
        "workers": args.groups * args.pool,
        "groups": args.groups, "clock_skew_s": args.skew_s, "drain_s": round(drain_s, 2),
        "requests_at_provider": len(arrivals),
        "overshoot_at_provider": most_in_window(arrivals, w) - args.limit,
        "overshoot_at_claims": most_in_window(claims, w + args.guard_ms / 1000) - args.limit,
        "utilization_at_provider": round(utilization(arrivals, w, args.limit), 4),
        "utilization_after_the_first_window": round(utilization(arrivals, w, args.limit, skip=w), 4),
        # claim -> the provider's count of its call (two clocks: the least delay is taken as 0)
        "call_delay_spread_ms": {"p50": round((pct(delays, 50) - min(delays, default=0)) * 1000, 1),
                                 "p99": round((pct(delays, 99) - min(delays, default=0)) * 1000, 1),
                                 "max": round((max(delays, default=0) - min(delays, default=0)) * 1000, 1)},
        "deferred_tasks": deferred_tasks, "reoffers_that_found_no_units": refound,
        "wakeup_ms": {"p50": pct(lateness, 50), "p99": pct(lateness, 99), "max": max(lateness, default=float("nan"))},
    }
    print(json.dumps(out, indent=2))
    ok = out["overshoot_at_provider"] <= 0 and out["overshoot_at_claims"] <= 0 and len(arrivals) == args.tasks
    print(f"rate limit: {'PASS' if ok else 'FAIL'} (overshoot 0 at the provider and at the claims, every task "
          "called the provider once)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""A dependency's outage with its circuit breaker, real worker processes, and work that does not need it.

    .venv/bin/python bench/bench_breakers.py                       # issue 19's figures (about a minute)
    .venv/bin/python bench/bench_breakers.py --seconds 12 --outage 4 6   # seconds

A fresh redis-server; the local counting provider of bench_limits.py; the breaker of ``api`` from
``bench/controls_app.py`` (opens at half of >= 5 calls failing in 5 s, for 2 s, then 2 probes). A producer
thread enqueues, for ``--seconds``, ``--dep-rate`` tasks a second that call the provider through the
breaker (``ctx.call``) and keeps a backlog of ``--backlog`` tasks that need nothing (``--work-ms`` each),
drained by ``--workers`` ``mcq worker --kind simple`` processes and one ``mcq sweeper``. From ``--outage``
START to END seconds the provider answers 503 to everything.

Printed: the breaker's transitions; **claims while open** (a dependent Attempt started between a
breaker_opened and the end of its open time: must be 0); the most probe Attempts admitted in one
half-open period (must be <= the breaker's probes); requests that reached the provider during the
outage; the independent tasks' completions per second before the outage and during it (ratio, goal
>= 95%); and that every task ended succeeded, each dependent with one pull of the provider that worked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from bench.bench_limits import Provider, mcq_processes  # noqa: E402
from bench.bench_limits import stop as stop_processes  # noqa: E402
from bench.controls_app import KEY, app  # noqa: E402
from mc_queue.producer.dispatch import AppClient  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

PREFIX = "bbreakers"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--outage", type=float, nargs=2, default=(15.0, 30.0), metavar=("START", "END"))
    ap.add_argument("--dep-rate", type=float, default=5.0)
    ap.add_argument("--backlog", type=int, default=200)
    ap.add_argument("--work-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()

    provider = Provider()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="mcq-bench-breakers-") as tmpdir, RedisServer(
            Path(tmpdir) / "redis", appendonly=False) as server:
        tmp = Path(tmpdir)
        client = mc_queue.connect(server.url, prefix=PREFIX)
        ac = AppClient(app, client)
        base, env = mcq_processes(server.url, PREFIX, tmp, provider)
        deps: list[str] = []
        frees: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            t0 = time.monotonic()
            n = 0
            while not stop.is_set() and time.monotonic() - t0 < args.seconds:
                due = int((time.monotonic() - t0) * args.dep_rate)
                while n < due:
                    deps.append(ac.enqueue("dep", {"n": n}).id)
                    n += 1
                waiting = client.reads.status().get("controls", {}).get("counts", {}).get("pending", 0)
                if waiting < args.backlog:
                    frees.extend(t.id for t in ac.enqueue_many(
                        [{"handler": "free", "payload": {"work_ms": args.work_ms}}
                         for _ in range(args.backlog - waiting)]))
                time.sleep(0.05)

        try:
            procs.append(subprocess.Popen([*base, "sweeper", "--app", "bench.controls_app:app", "--interval", "0.2"],
                                          cwd=ROOT, env=env, stdout=open(tmp / "sweeper.log", "wb"),
                                          stderr=subprocess.STDOUT))
            time.sleep(1.0)  # the sweeper publishes the App's breaker
            t_start = time.monotonic()
            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            for w in range(args.workers):
                procs.append(subprocess.Popen(
                    [*base, "worker", "--app", "bench.controls_app:app", "--kind", "simple", "--name", f"w{w}",
                     "--workspace-root", str(tmp / f"ws{w}")], cwd=ROOT, env=env,
                    stdout=open(tmp / f"worker-{w}.log", "wb"), stderr=subprocess.STDOUT))
            outage_at = [0.0, 0.0]
            while time.monotonic() - t_start < args.seconds:
                now = time.monotonic() - t_start
                if not provider.down and args.outage[0] <= now < args.outage[1]:
                    provider.down, outage_at[0] = True, time.monotonic()
                elif provider.down and now >= args.outage[1]:
                    provider.down, outage_at[1] = False, time.monotonic()
                time.sleep(0.05)
            provider.down = False
            if not outage_at[1]:
                outage_at[1] = time.monotonic()
            stop.set()
            producer.join()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                states = client.reads.task_states(deps)
                if all(s in ("succeeded", "failed", "blocked", "quarantined", "canceled") for s in states.values()):
                    break
                time.sleep(0.2)
        finally:
            stop.set()
            stop_processes(procs, provider)
        # Redis clock <-> this process's monotonic clock, for the outage's bounds
        offset_ms = client.backend.redis_time_ms() - time.monotonic() * 1000
        out_lo, out_hi = outage_at[0] * 1000 + offset_ms, outage_at[1] * 1000 + offset_ms
        events = [e for e in client.reads.namespace_events() if str(e["type"]).startswith("breaker_")]
        spans = [(int(str(e["id"]).split("-")[0]), int(e["until"])) for e in events if e["type"] == "breaker_opened"]
        halves = [int(str(e["id"]).split("-")[0]) for e in events if e["type"] == "breaker_half_open"]
        while_open, probes_per_half, dep_states = 0, [0] * len(halves), {}
        pulls_ok = 0
        for tid in deps:
            t = client.reads.get_task(tid)
            dep_states[t.state.value] = dep_states.get(t.state.value, 0) + 1
            raw = client.redis.hgetall(client.keys.task(tid).task)
            for a in t.attempts:
                if a.started_at is None:
                    continue
                started = round(a.started_at.timestamp() * 1000)
                if any(lo < started < hi for lo, hi in spans):
                    while_open += 1
                if raw.get(f"{a.number}.probe"):
                    for i, h in enumerate(halves):
                        if started >= h and (i + 1 == len(halves) or started < halves[i + 1]):
                            probes_per_half[i] += 1
                if a.state.value == "succeeded":
                    pulls_ok += 1
        frees_done = []
        for tid in frees:
            t = client.reads.get_task(tid)
            a = t.attempts[-1]
            if a.ended_at is not None and t.state.value == "succeeded":
                frees_done.append(a.ended_at.timestamp() * 1000)
        before = [x for x in frees_done if out_lo - (out_hi - out_lo) <= x < out_lo]
        during = [x for x in frees_done if out_lo <= x < out_hi]
        arrivals_down = sum(1 for a in provider.arrivals if outage_at[0] <= a < outage_at[1])
        status = client.limits.status(KEY)
        client.close()
    span_s = (out_hi - out_lo) / 1000
    rate_before, rate_during = len(before) / span_s, len(during) / span_s
    out = {
        "seconds": args.seconds, "outage_s": round(span_s, 2), "workers": args.workers,
        "dependent_tasks": len(deps), "dependent_states": dep_states, "independent_tasks": len(frees),
        "transitions": [e["type"] for e in events], "opened": status.breaker_opened,
        "claims_while_open": while_open, "most_probes_in_one_half_open": max(probes_per_half, default=0),
        "requests_at_provider_during_outage": arrivals_down,
        "independent_per_s_before": round(rate_before, 1), "independent_per_s_during": round(rate_during, 1),
        "independent_ratio": round(rate_during / rate_before, 3) if rate_before else float("nan"),
        "claims_deferred_by_the_breaker": status.breaker_deferred,
    }
    print(json.dumps(out, indent=2))
    ok = (while_open == 0 and out["most_probes_in_one_half_open"] <= 2 and status.breaker_opened >= 1
          and dep_states.get("succeeded", 0) == len(deps) and pulls_ok == len(deps))
    print(f"circuit breaker: {'PASS' if ok else 'FAIL'} (it opened, 0 claims while open, at most 2 probes per "
          "half-open, every dependent task succeeded once)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

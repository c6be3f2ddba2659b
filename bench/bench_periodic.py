"""Periodic schedules under fire: exactly one task per tick with several sweepers, the busiest one
SIGKILLed again and again.

    .venv/bin/python bench/bench_periodic.py --ticks 10000 --every 0.1 --replicas 3   # issue 18's figure
    .venv/bin/python bench/bench_periodic.py --ticks 300                              # about a minute

A fresh redis-server gets one schedule (``every_s = --every``, overlap ``queue``, catch-up ``all``:
every tick must make its task, however late), published with the Client. ``--replicas`` real
``mcq sweeper`` processes tick it (each pass every ``--interval`` seconds, ``promote`` every 50 ms in
between). Every ``--kill-every`` seconds the replica that made the newest tick's task (its actor names
its pid) is SIGKILLed and a new one started in its place. When ``--ticks`` ticks have passed, the
replicas are stopped and the producer keys ``periodic:<name>:<tick>`` are counted against the grid of
ticks from the schedule's first to its last: each tick must have exactly one task (missing and
duplicated must be 0), and ``ran`` in the schedule's state must equal the tasks. Also printed: how
late each task was made after its tick (Redis's clock: the task's created_at less the tick), p50 / p99
/ max.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from mc_queue.contracts.periodic import PeriodicSchedule  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

PREFIX = "bperiodic"
NAME = "pulse"


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=300, help="ticks to run through")
    ap.add_argument("--every", type=float, default=0.1, help="the schedule's every_s")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.5, help="each sweeper's pass interval (seconds)")
    ap.add_argument("--kill-every", type=float, default=3.0, help="seconds between SIGKILLs of the busiest replica")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="mcq-bench-periodic-"))
    with RedisServer(tmp / "redis") as server:
        q = mc_queue.connect(server.url, prefix=PREFIX)
        q.periodic.publish(PeriodicSchedule(name=NAME, handler="noop", queue="pulse", every_s=args.every,
                                            overlap="queue", catch_up="all", late_s=1.0,
                                            catch_up_window_s=3600.0))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", PREFIX, "sweeper",
               "--interval", str(args.interval)]
        logs = tmp / "logs"
        logs.mkdir()
        started = 0

        def spawn() -> subprocess.Popen[bytes]:
            nonlocal started
            started += 1
            with open(logs / f"sweeper-{started}.log", "wb") as log:
                return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

        procs = {p.pid: p for p in (spawn() for _ in range(args.replicas))}
        print(f"redis-server on {server.url}; {args.replicas} sweepers, a tick every {args.every:g}s, the busiest "
              f"killed every {args.kill_every:g}s, {args.ticks} ticks; temp {tmp}", file=sys.stderr)
        t0 = time.monotonic()
        run_s = args.ticks * args.every
        kills = 0
        next_kill = t0 + args.kill_every
        while time.monotonic() - t0 < run_s:
            time.sleep(0.05)
            if time.monotonic() < next_kill:
                continue
            next_kill += args.kill_every
            last = q.redis.hget(q.keys.periodic_state(NAME), "last_task")
            actor = q.redis.hget(q.keys.task(last).task, "actor") if last else None
            pid = int(str(actor).rsplit(":", 1)[-1]) if actor and str(actor).rsplit(":", 1)[-1].isdigit() else None
            victim = procs.get(pid) if pid else None
            if victim is None:
                victim = next(iter(procs.values()))
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            del procs[victim.pid]
            kills += 1
            fresh = spawn()
            procs[fresh.pid] = fresh
        time.sleep(max(2 * args.interval, 1.5))  # the last ticks are made and closed
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        # A tick decided just before the sweepers stopped may still be pending: one more pass (as the next
        # sweeper would) makes and closes it, and decides what came due meanwhile.
        q.periodic.run_due(actor="bench-final")
        made: dict[int, list[str]] = {}
        for key, entry in q.redis.hscan_iter(q.keys.idem, match=f"periodic:{NAME}:*", count=1000):
            tick = str(key).rsplit(":", 1)[1]
            if tick.isdigit():
                made.setdefault(int(tick), []).append(str(entry).split(" ")[0])
        state = q.redis.hgetall(q.keys.periodic_state(NAME))
        spec = q.periodic.definitions()[NAME]
        ticks = sorted(made)
        grid = spec.ticks(ticks[0] - 1, ticks[-1], 10 * args.ticks + 10) if ticks else []
        missing = [t for t in grid if t not in made]
        dup_keys = [t for t, ids in made.items() if len(ids) > 1]
        ids = [i for v in made.values() for i in v]
        pipe = q.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(q.keys.task(tid).task, "created_at")
        created = dict(zip(ids, pipe.execute(), strict=True))
        late = [int(created[i]) - t for t, v in made.items() for i in v if created.get(i)]
        tasks_total = sum(len(v) for v in made.values())
        out: dict[str, Any] = {
            "replicas": args.replicas, "every_s": args.every, "seconds": round(time.monotonic() - t0, 1),
            "kills": kills, "ticks_in_grid": len(grid), "tasks": tasks_total, "distinct_tasks": len(set(ids)),
            "missing_ticks": len(missing), "ticks_with_two_tasks": len(dup_keys),
            "ran_in_state": int(state.get("ran", 0)),
            "skipped": {k: v for k, v in state.items() if k.startswith("skipped")},
            "pending_left": state.get("pending"),
            "tick_to_task_ms": {"p50": pct(late, 50), "p99": pct(late, 99), "max": max(late) if late else None},
        }
        q.close()
    ok = out["missing_ticks"] == 0 and out["ticks_with_two_tasks"] == 0 and out["tasks"] == out["ticks_in_grid"] \
        == out["distinct_tasks"] and not out["pending_left"]
    if args.json:
        print(json.dumps(out, indent=2))
    print("| figure | value |\n|---|---|")
    for k in ("replicas", "every_s", "seconds", "kills", "ticks_in_grid", "tasks", "distinct_tasks", "missing_ticks",
              "ticks_with_two_tasks", "ran_in_state"):
        print(f"| {k} | {out[k]} |")
    lat = out["tick_to_task_ms"]
    print(f"| tick -> task made, ms (Redis clock) p50 / p99 / max | {lat['p50']} / {lat['p99']} / {lat['max']} |")
    print(f"\nexactly one task per tick: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

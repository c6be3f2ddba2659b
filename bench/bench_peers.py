"""What a no-op job costs the Redis server in peer task queues: bare RQ, Celery and Dramatiq.

Run from the repository root (``pip install 'mc_queue[peers]'`` brings Celery and Dramatiq)::

    .venv/bin/python bench/bench_peers.py [--jobs 2000] [--repeat 3] [--peers rq-simple,rq-fork,celery,dramatiq]
                                          [--fsync everysec|always] [--json out.json]

Each (peer, repeat) gets a FRESH private redis-server (``mc_queue.testing.RedisServer``, AOF on, in a
temporary folder; never the machine's Redis on port 6379). ``--jobs`` no-op jobs are enqueued from this
process (untimed), then ONE worker process of the peer drains them:

- ``rq-simple`` / ``rq-fork``: ``rq worker --burst`` with ``rq.worker.SimpleWorker`` / ``rq.worker.Worker``
  (a work horse forked per job), RQ's defaults (pickle, result_ttl 500), queue ``default``;
- ``celery`` (``celery-prefork``, not in the default list): ``celery -A bench.peers.celery_app worker
  --pool=solo`` (``--pool=prefork``) ``--concurrency=1 --without-gossip --without-mingle
  --without-heartbeat`` (cluster chatter, not per-job work), Redis broker, no result backend;
- ``dramatiq``: ``dramatiq bench.peers.dramatiq_app --processes 1 --threads 1``, RedisBroker, default
  middleware.

The jobs (``bench/peers/``) append one line to a file and touch no Redis; the benchmark polls that
file's size, so completion detection sends the server nothing. Per peer, medians of ``--repeat``:

- **jobs/s**: jobs / wall time from starting the worker until the last job has run (worker start-up
  included, exit excluded); the progress lines also give the start-up time and the first-to-last-job rate;
- **Redis CPU us/job**: ``INFO cpu`` (used_cpu_sys + used_cpu_user) delta over that window / jobs;
- **commands/job**: ``INFO stats`` total_commands_processed delta / jobs. Redis 7 counts commands run
  inside Lua scripts and MULTI/EXEC themselves, so this is work done, not requests sent;
- **round trips/job**: ``INFO stats`` total_reads_processed delta / jobs: socket reads, i.e. requests
  (a pipeline or script call is one, a very large pipeline may be several).

Both counts have the benchmark's own INFO pair subtracted (measured on the same server just before).
Start-up commands (and idle polling before the first job) are included, spread over the jobs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so that `bench.peers` imports when run as bench/bench_peers.py
    sys.path.insert(0, str(ROOT))

from bench.peers import LINE  # noqa: E402
from mc_queue.testing import RedisServer  # noqa: E402

PEERS = ("rq-simple", "rq-fork", "celery", "celery-prefork", "dramatiq")
DEFAULT_PEERS = "rq-simple,rq-fork,celery,dramatiq"
NEEDS = {"rq-simple": "rq", "rq-fork": "rq", "celery": "celery", "celery-prefork": "celery", "dramatiq": "dramatiq"}
RQ_CLASS = {"rq-simple": "bench.rq_baseline.SimpleWorker", "rq-fork": "bench.rq_baseline.Worker"}
NOOP_RQ = "bench.peers.noop"
COLUMNS = [("jobs/s", "rate", ".1f"), ("Redis CPU us/job", "cpu_us_per_job", ".1f"),
           ("commands/job", "commands_per_job", ".2f"), ("round trips/job", "round_trips_per_job", ".2f")]


def missing(peer: str) -> str | None:
    """The module a peer needs that does not import here, or None."""
    try:
        importlib.import_module(NEEDS[peer])
    except ImportError:
        return NEEDS[peer]
    return None


def pkg_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def snapshot(admin: redis.Redis) -> dict[str, Any]:
    """One INFO call: server CPU seconds, commands and reads so far, calls per command (INFO left out)."""
    info = admin.info("cpu", "stats", "commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()
             if k.startswith("cmdstat_") and k != "cmdstat_info"}
    return {"cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
            "commands": int(info["total_commands_processed"]), "reads": int(info["total_reads_processed"]),
            "calls": calls}


def enqueue(peer: str, url: str, n: int) -> None:
    if peer.startswith("rq"):
        from rq import Queue

        conn = redis.Redis.from_url(url)
        q = Queue("default", connection=conn)
        for _ in range(n):
            q.enqueue(NOOP_RQ)
        conn.close()
    elif peer.startswith("celery"):
        from celery import Celery

        app = Celery("bench_peers_producer", broker=url)
        app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
        with app.producer_or_acquire() as producer:
            for _ in range(n):
                app.send_task("bench.noop", producer=producer)
        app.close()
    else:
        from dramatiq import Message
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=url)
        for _ in range(n):
            broker.enqueue(Message(queue_name="default", actor_name="noop", args=(), kwargs={}, options={}))
        broker.close()


def backlog(peer: str, admin: redis.Redis) -> int:
    """Jobs the broker still holds (queued, unacked or failed); 0 once the drain is complete."""
    if peer.startswith("rq"):
        return int(admin.llen("rq:queue:default")) + int(admin.zcard("rq:failed:default"))
    if peer.startswith("celery"):
        return int(admin.llen("celery")) + int(admin.hlen("unacked"))
    return int(admin.hlen("dramatiq:default.msgs"))  # a message stays in it until acked


def worker_command(peer: str, url: str) -> list[str]:
    py = sys.executable
    if peer.startswith("rq"):
        return [py, "-m", "rq.cli", "worker", "--burst", "--url", url, "--worker-class", RQ_CLASS[peer],
                "--path", str(ROOT), "--logging_level", "WARNING", "default"]
    if peer.startswith("celery"):
        pool = "prefork" if peer == "celery-prefork" else "solo"
        return [py, "-m", "celery", "-A", "bench.peers.celery_app", "worker", f"--pool={pool}", "--concurrency=1",
                "--loglevel=WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    return [py, "-m", "dramatiq", "bench.peers.dramatiq_app", "--processes", "1", "--threads", "1"]


def done_count(path: Path) -> int:
    try:
        return path.stat().st_size // LINE
    except FileNotFoundError:
        return 0


def stop(proc: subprocess.Popen[bytes], burst: bool) -> None:
    """End the worker and everything it started (its own process group): a burst worker exits by
    itself, the others get SIGTERM (their warm shutdown), then SIGKILL after 20 s."""
    try:
        if proc.poll() is None:
            if not burst:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20 if not burst else 30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers (prefork children, dramatiq's worker processes)
        except (ProcessLookupError, PermissionError):
            pass


def run_one(peer: str, n: int, rep: int, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    base = tmp / f"{peer}-{rep}"
    with RedisServer(base / "redis", appendfsync=args.fsync) as server:
        admin = server.client()
        t_enq = time.perf_counter()
        enqueue(peer, server.url, n)
        enqueue_s = time.perf_counter() - t_enq
        queued = backlog(peer, admin)
        a, b = snapshot(admin), snapshot(admin)  # what one INFO pair adds by itself
        own_cmds, own_reads = b["commands"] - a["commands"], b["reads"] - a["reads"]
        done = base / "done"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BENCH_PEERS_URL", "BENCH_PEERS_DONE")}
        env.update(PYTHONPATH=str(ROOT), BENCH_PEERS_URL=server.url, BENCH_PEERS_DONE=str(done))
        log_path = base / "worker.log"
        s0 = snapshot(admin)
        with open(log_path, "wb") as log:
            e0, t0 = time.time(), time.perf_counter()
            proc = subprocess.Popen(worker_command(peer, server.url), cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            count, last_change, deadline = 0, t0, t0 + args.timeout
            while True:
                now_count = done_count(done)
                now = time.perf_counter()
                if now_count != count:
                    count, last_change = now_count, now
                if count >= n or proc.poll() is not None or now > deadline or now - last_change > args.stall:
                    break
                time.sleep(0.005)
            wall = time.perf_counter() - t0
            s1 = snapshot(admin)
            count = done_count(done)
            settle = time.perf_counter() + 3  # the last ack may still be on its way
            while (left := backlog(peer, admin)) and time.perf_counter() < settle:
                time.sleep(0.05)
        finally:
            stop(proc, burst=peer.startswith("rq"))
        admin.close()
    stamps = sorted(float(x) for x in done.read_text().split()) if done.exists() else []
    problems = []
    if queued != n:
        problems.append(f"{queued} jobs queued for {n} enqueued")
    if count != n:
        problems.append(f"{count} of {n} jobs ran (worker exit code {proc.returncode})")
    if left:
        problems.append(f"{left} jobs left in the broker")
    if problems:
        tail = log_path.read_text(errors="replace").splitlines()[-12:]
        print(f"  !! {peer}: {'; '.join(problems)}; {log_path}:\n    " + "\n    ".join(tail), flush=True)
    calls = {k: v - s0["calls"].get(k, 0) for k, v in s1["calls"].items() if v - s0["calls"].get(k, 0)}
    jobs = max(n, 1)
    res: dict[str, Any] = {
        "peer": peer, "repeat": rep, "jobs": n, "ran": count, "ok": not problems, "problems": problems,
        "enqueue_s": enqueue_s, "wall_s": wall, "rate": n / wall,
        "cpu_us_per_job": 1e6 * (s1["cpu"] - s0["cpu"]) / jobs,
        "commands_per_job": (s1["commands"] - s0["commands"] - own_cmds) / jobs,
        "round_trips_per_job": (s1["reads"] - s0["reads"] - own_reads) / jobs,
        "calls_per_job": {k: v / jobs for k, v in sorted(calls.items(), key=lambda kv: -kv[1])},
        "snapshot_pair": {"commands": own_cmds, "reads": own_reads},
    }
    if len(stamps) >= 2:
        res.update(first_job_after_s=stamps[0] - e0, rate_steady=(len(stamps) - 1) / (stamps[-1] - stamps[0]))
    top = ", ".join(f"{k} {v:.2f}" for k, v in list(res["calls_per_job"].items())[:6])
    print(f"  {peer:14s} #{rep + 1}: {res['rate']:7.1f} jobs/s ({wall:.2f} s, first job after "
          f"{res.get('first_job_after_s', float('nan')):.2f} s, steady {res.get('rate_steady', float('nan')):.1f}/s), "
          f"{res['cpu_us_per_job']:.1f} us CPU, {res['commands_per_job']:.2f} cmds, "
          f"{res['round_trips_per_job']:.2f} reads per job [{top}]", flush=True)
    return res


def table(medians: dict[str, dict[str, float]], skipped: list[str]) -> str:
    lines = ["| peer | " + " | ".join(c[0] for c in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for peer, m in medians.items():
        lines.append(f"| {peer} | " + " | ".join(format(m[key], fmt) for _, key, fmt in COLUMNS) + " |")
    for peer in skipped:
        lines.append(f"| {peer} | skipped: pip install 'mc_queue[peers]' |" + " |" * (len(COLUMNS) - 1))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2000, help="no-op jobs per drain")
    p.add_argument("--repeat", type=int, default=3, help="repeats; figures are medians")
    p.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma-separated, from {','.join(PEERS)}")
    p.add_argument("--fsync", choices=["everysec", "always"], default="everysec", help="appendfsync of the servers")
    p.add_argument("--timeout", type=float, default=600, help="seconds a drain may take at most")
    p.add_argument("--stall", type=float, default=60, help="seconds without a finished job before giving up")
    p.add_argument("--dir", default=None, help="parent of the temporary folder (default: the system's)")
    p.add_argument("--json", dest="json_out", default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = [x for x in peers if x not in PEERS]
    if unknown:
        p.error(f"unknown peer(s) {unknown}; choose from {', '.join(PEERS)}")
    runnable = []
    for peer in peers:
        if (mod := missing(peer)) is not None:
            print(f"{peer}: skipped, {mod} is not importable here (pip install 'mc_queue[peers]')", flush=True)
        else:
            runnable.append(peer)
    versions = {name: pkg_version(name) for name in ("rq", "celery", "kombu", "dramatiq", "redis")}
    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=args.dir))
    runs: list[dict[str, Any]] = []
    try:
        if runnable:
            with RedisServer(tmp / "probe", appendfsync=args.fsync) as probe:
                c = probe.client()
                versions["redis-server"] = str(c.info("server")["redis_version"])
                c.close()
        print(f"{args.jobs} jobs, {args.repeat} repeat(s), appendfsync {args.fsync}; "
              + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
        for rep in range(args.repeat):  # peers interleaved, so that each sees the same machine conditions
            for peer in runnable:
                runs.append(run_one(peer, args.jobs, rep, tmp, args))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    medians: dict[str, dict[str, float]] = {}
    for peer in runnable:
        mine = [r for r in runs if r["peer"] == peer and r["ok"]] or [r for r in runs if r["peer"] == peer]
        medians[peer] = {key: float(statistics.median(r[key] for r in mine)) for _, key, _ in COLUMNS}
        medians[peer]["ok_runs"] = sum(r["ok"] for r in runs if r["peer"] == peer)
    print(f"\n## Peers: what a no-op job costs the Redis server ({args.jobs} jobs, one worker process, "
          f"medians of {args.repeat}, appendfsync {args.fsync})\n")
    print(table(medians, [x for x in peers if x not in runnable]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "versions": versions, "median": medians,
                                                   "runs": runs}, indent=2))
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

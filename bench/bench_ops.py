"""Operational benchmark of mc_queue: sweeper pass time against idle tasks, Redis CPU of live leases.

Run from the repository root::

    .venv/bin/python bench/bench_ops.py [--idle 1000,1000000] [--leases 10000] [--seconds 20] [--json out.json]

1. **Sweeper pass vs idle tasks.** One private redis-server (AOF off: this is about the sweeper's
   reads, and a multi-GB AOF of loaded data would only slow the load). For each ``--idle`` size
   (ascending, loaded incrementally into the same server) the server holds that many idle tasks:
   half succeeded (one Attempt, claimed and completed), half pending with their first Attempt due in
   30 days (in the pending index, scored 30 days ahead). Idle tasks are written
   by cloning two *template* tasks made through the public API (enqueue, claim, complete) with
   pipelined HSET/XADD/ZADD/HINCRBY, 1,000 tasks per pipeline: the same keys, fields and events the
   scripts write, under a new task id (the counts hash is kept consistent). Before every timed pass
   the due work is made fresh, untimed: ``--expired`` (10) tasks enqueued and claimed with a 1 ms
   lease (so they are expired by the pass: expire + reconcile with the default policy), and
   ``--due`` (10) tasks enqueued (first dispatch due now: the pass sends them to RQ in the same Redis).
   Leftovers of earlier passes (the due tasks an earlier pass dispatched) are removed from the pending
   index first, so each pass sees exactly the same amount of due work. ``Sweeper(client).run_once()``
   (no app) is timed ``--passes`` times; empty passes (no due work) are timed too.
2. **Live leases heartbeating.** A fresh private redis-server (AOF on, appendfsync everysec).
   ``--leases`` tasks are enqueued and claimed with a 10 s lease (pipelined EVALSHA of enqueue.lua and
   claim.lua through the client's ``Scripts``). Then ``--threads`` threads (one Client each) renew
   every lease once per ~3.33 s (a third of the lease, the worker's heartbeat cadence) with pipelined
   EVALSHA of renew.lua, in batches spread evenly over the period, for ``--seconds``. Reported:
   redis-server CPU (``INFO cpu`` user+sys delta / wall, as a fraction of one core; an idle baseline
   is measured first), renewals/s, refusals, and how many leases expired (``P:leases`` entries past
   their expiry at the end, and a ``Sweeper.run_once()`` afterwards: both must be 0).

Never uses the machine's Redis on port 6379.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

import mc_queue
from mc_queue.client import Client
from mc_queue.contracts.codec import encode_payload
from mc_queue.contracts.config import Budget, RetryPolicy
from mc_queue.contracts.history import history
from mc_queue.contracts.keys import new_task_id
from mc_queue.contracts.models import Manifest
from mc_queue.ops.sweeper import Sweeper
from mc_queue.testing import RedisServer, unique_prefix

QUEUE = "bench"
HANDLER = "bench.noop"
WORKER = "bench-worker"
FAR_MS = 30 * 86_400_000  # idle pending tasks are due in 30 days
CLEANUP_HORIZON_MS = 86_400_000  # pending entries due within a day are leftovers of earlier passes


def now_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile (an observed value)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, -(-95 * len(s) // 100) - 1)]


def server_cpu(admin: redis.Redis) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def used_memory(admin: redis.Redis) -> int:
    return int(admin.info("memory")["used_memory"])


# --------------------------------------------------------------------------- part 1: sweeper


class IdleLoader:
    """Clones a succeeded and a far-pending template task under new ids, with pipelines."""

    def __init__(self, q: Client, admin: redis.Redis) -> None:
        self.q, self.admin = q, admin
        done = q.producer.enqueue(QUEUE, HANDLER, {"i": "template-done"})
        lease = q.leases.claim_attempt(done.id, WORKER)
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id=WORKER)
        pend = q.producer.enqueue(QUEUE, HANDLER, {"i": "template-pending"})
        self.templates = {"succeeded": self._read(done.id), "pending": self._read(pend.id)}
        # The pending template stays a real task: push it far out like the clones.
        far = now_ms(admin) + FAR_MS
        tk = q.keys.task(pend.id)
        admin.hset(tk.attempts, "1.due_at", far)
        admin.zadd(tk.pending, {pend.id: far})
        self.loaded = 0

    def _read(self, tid: str) -> dict[str, Any]:
        tk = self.q.keys.task(tid)
        fields, att = self.admin.hgetall(tk.task), self.admin.hgetall(tk.attempts)
        return {"id": tid, "task": fields, "attempts": att,
                "events": [f for _, f in history(fields, self.admin.lrange(tk.events, 0, -1), att)]}

    def load(self, n: int, batch: int = 1000) -> None:
        keys = self.q.keys
        far = now_ms(self.admin) + FAR_MS
        pipe = self.admin.pipeline(transaction=False)
        counts = {"succeeded": 0, "pending": 0}
        for i in range(n):
            kind = "succeeded" if (self.loaded + i) % 2 == 0 else "pending"
            t = self.templates[kind]
            old, tid = t["id"], new_task_id(QUEUE)
            tk = keys.task(tid)
            pipe.hset(tk.task, mapping={k: v.replace(old, tid) for k, v in t["task"].items()})
            att = {k: v.replace(old, tid) for k, v in t["attempts"].items()}
            if kind == "pending":
                att["1.due_at"] = str(far)
            pipe.hset(tk.attempts, mapping=att)
            for ev in t["events"]:
                pipe.xadd(tk.events, {k: v.replace(old, tid) for k, v in ev.items()})
            if kind == "pending":
                pipe.zadd(tk.pending, {tid: far})
            counts[kind] += 1
            if (i + 1) % batch == 0:
                pipe.execute()
        for kind, c in counts.items():
            if c:
                pipe.hincrby(keys.counts, f"{QUEUE}|{kind}", c)
        pipe.execute()
        self.loaded += n


class DueWork:
    """Makes the same small amount of due work before each timed pass (untimed)."""

    def __init__(self, q: Client, admin: redis.Redis, expired: int, due: int) -> None:
        self.q, self.admin, self.expired, self.due = q, admin, expired, due

    def clear(self) -> None:
        """Drop leftovers of earlier passes: pending entries due within a day (idle ones are 30 days out)."""
        self.admin.zremrangebyscore(self.q.keys.pending(QUEUE), "-inf", now_ms(self.admin) + CLEANUP_HORIZON_MS)

    def make(self) -> None:
        self.clear()
        for i in range(self.expired):
            t = self.q.producer.enqueue(QUEUE, HANDLER, {"expire": i, "n": uuid.uuid4().hex})
            self.q.leases.claim_attempt(t.id, WORKER, lease_ms=1)
        for i in range(self.due):
            self.q.producer.enqueue(QUEUE, HANDLER, {"due": i, "n": uuid.uuid4().hex})
        time.sleep(0.005)  # the 1 ms leases are past expiry


def time_passes(sweeper: Sweeper, work: DueWork | None, passes: int) -> tuple[list[float], dict[str, int]]:
    times: list[float] = []
    seen = {"expired": 0, "reconciled": 0, "dispatched": 0, "errors": 0}
    for _ in range(passes):
        if work is not None:
            work.make()
        t0 = time.perf_counter()
        rep = sweeper.run_once()
        times.append(1000 * (time.perf_counter() - t0))
        seen["expired"] += len(rep.expired)
        seen["reconciled"] += len(rep.reconciled)
        seen["dispatched"] += len(rep.dispatched)
        seen["errors"] += len(rep.errors)
    return times, seen


def bench_sweeper(base: Path, sizes: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    server = RedisServer(base / "sweeper", appendonly=False)
    out = []
    with server:
        admin = server.client()
        q = mc_queue.connect(server.url, prefix=unique_prefix("ops"), actor="bench")
        q.backend.open_namespace()
        mem0 = used_memory(admin)
        loader = IdleLoader(q, admin)
        sweeper = Sweeper(q, batch=args.batch)
        work = DueWork(q, admin, args.expired, args.due)
        # warm: scripts loaded, RQ connection made
        time_passes(sweeper, work, 3)
        for size in sizes:
            need = size - loader.loaded - 2  # the two templates count as idle tasks
            print(f"  loading {need:,} idle tasks (total {size:,}) ...", file=sys.stderr)
            t0 = time.perf_counter()
            if need > 0:
                loader.load(need)
            load_s = time.perf_counter() - t0
            work.clear()
            time.sleep(0.5)
            mem = used_memory(admin)
            print(f"  {size:,} idle tasks: {args.passes} passes ...", file=sys.stderr)
            empty, _ = time_passes(sweeper, None, args.passes)
            busy, seen = time_passes(sweeper, work, args.passes)
            counts = admin.hgetall(q.keys.counts)
            out.append({
                "idle_tasks": size, "load_s": load_s, "load_tasks": max(need, 0),
                "load_per_s": max(need, 0) / load_s if load_s > 0 and need > 0 else None,
                "used_memory": mem, "used_memory_delta": mem - mem0, "dbsize": admin.dbsize(),
                "pending_len": admin.zcard(q.keys.pending(QUEUE)), "leases_len": admin.zcard(q.keys.leases),
                "pass_ms": {"median": median(busy), "p95": p95(busy), "max": max(busy), "all": busy},
                "empty_pass_ms": {"median": median(empty), "p95": p95(empty), "max": max(empty), "all": empty},
                "per_pass": {k: v / args.passes for k, v in seen.items()},
                "counts": counts,
            })
        q.close()
        admin.close()
    return out


# --------------------------------------------------------------------------- part 2: leases


def enqueue_and_claim(q: Client, n: int, lease_ms: int, batch: int = 1000) -> list[tuple[str, int, int]]:
    """n tasks enqueued and claimed with pipelined EVALSHA through the client's Scripts."""
    epoch = q.backend.epoch()
    scripts, keys = q.runner, q.keys
    policy, budget = RetryPolicy().model_dump_json(), Budget().model_dump_json()
    leases: list[tuple[str, int, int]] = []
    ids = [new_task_id(QUEUE) for _ in range(n)]
    for start in range(0, n, batch):
        chunk = ids[start:start + batch]
        pipe = q.writer.pipeline(transaction=False)
        for tid in chunk:
            text, dg = encode_payload({"tid": tid})
            tk = keys.task(tid)
            manifest = Manifest(handler=HANDLER, payload_digest=dg, policy_version="default-v1").model_dump_json()
            # The keys and arguments Client.enqueue and Client.claim_attempt send, pipelined.
            scripts.call("enqueue", {
                **q.backend.ns_keys(), "idem": keys.idem,
                "queues": keys.queues, "counts": keys.counts, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, **tk.tomb_keys(), "deadlines": tk.deadlines,
                "caps": keys.caps, "stats": keys.stats,
            }, {"task_id": tid, "queue": QUEUE, "handler": HANDLER, "payload": text, "payload_digest": dg,
                "idem_key": "", "manifest": manifest, "retry_policy": policy, "budget": budget, "lease_ms": lease_ms,
                "epoch": epoch, "actor": "bench", "delay_ms": "", "run_at_ms": "", "start_by_ms": "",
                "finish_by_ms": "", "priority": "", "limits": "", "fair_key": ""}, client=pipe)
        for reply in pipe.execute():
            assert reply[0] == "OK", reply
        pipe = q.writer.pipeline(transaction=False)
        for tid in chunk:
            tk = keys.task(tid)
            scripts.call("claim", {
                **q.backend.ns_keys(), "stats": keys.stats,
                "counts": keys.counts, "leases": keys.leases, "task": tk.task, "attempts": tk.attempts,
                "events": tk.events, "pending": tk.pending, "fence": tk.fence,
                "lease": tk.lease, "paused": keys.paused, "limits": keys.limits, "done": tk.done, "held": tk.held,
                "released": keys.released, "slotheld": keys.slotheld, "slotwait": keys.slotwait, "spent": keys.spent,
            }, {"worker": WORKER, "lease_ms": lease_ms, "epoch": epoch, "min_seq": 0,
                "request_id": uuid.uuid4().hex, "expect_n": "", "with_task": "", "budget_ms": ""}, client=pipe)
        for tid, reply in zip(chunk, pipe.execute(), strict=True):
            assert reply[0] == "OK", reply
            leases.append((tid, int(reply[1]), int(reply[2])))
    return leases


class Renewer(threading.Thread):
    """Renews its share of the leases once per period, in batches spread evenly over the period."""

    def __init__(self, url: str, prefix: str, leases: list[tuple[str, int, int]], period_s: float, seconds: float,
                 batch: int, offset_s: float) -> None:
        super().__init__(daemon=True)
        self.q = Client(url, prefix=prefix, actor="bench-renewer")
        self.leases, self.period, self.seconds, self.batch, self.offset = leases, period_s, seconds, batch, offset_s
        self.renewals = 0
        self.refused: dict[str, int] = {}
        self.lateness: list[float] = []
        self.start_at = 0.0

    def run(self) -> None:
        q, keys, scripts = self.q, self.q.keys, self.q.runner
        batches = [self.leases[i:i + self.batch] for i in range(0, len(self.leases), self.batch)]
        slot = self.period / len(batches)
        prepared = []
        for b in batches:
            rows = []
            for tid, n, fence in b:
                tk = keys.task(tid)
                # The keys and arguments Client.heartbeat sends (no charge), pipelined.
                rows.append(({**q.backend.ns_keys(), "leases": keys.leases, "task": tk.task, "attempts": tk.attempts,
                              "stats": keys.stats, "events": tk.events, "fence": tk.fence, "lease": tk.lease},
                             {"n": n, **q.leases._fenced_args(f"{tid}/{n}", fence, WORKER), "lease_ms": "", "cost": "0",
                              "tokens": 0, "request_id": ""}))
            prepared.append(rows)
        end = self.start_at + self.seconds
        k = 0
        while True:
            due = self.start_at + self.offset + k * slot
            if due >= end:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                self.lateness.append(-wait)
            pipe = q.writer.pipeline(transaction=False)
            for ks, av in prepared[k % len(prepared)]:
                scripts.call("renew", ks, av, client=pipe)
            for reply in pipe.execute():
                if reply[0] == "OK":
                    self.renewals += 1
                else:
                    self.refused[str(reply[0])] = self.refused.get(str(reply[0]), 0) + 1
            k += 1
        q.close()


def bench_leases(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer(base / "leases", appendfsync="everysec", extra=["--auto-aof-rewrite-percentage", "0"])
    with server:
        admin = server.client()
        prefix = unique_prefix("ops")
        q = mc_queue.connect(server.url, prefix=prefix, actor="bench")
        q.backend.open_namespace()
        print(f"  enqueue + claim {args.leases:,} attempts (lease {args.lease_ms} ms) ...", file=sys.stderr)
        t0 = time.perf_counter()
        leases = enqueue_and_claim(q, args.leases, args.lease_ms)
        setup_s = time.perf_counter() - t0
        c0, w0 = server_cpu(admin), time.perf_counter()
        time.sleep(2.0)
        baseline = (server_cpu(admin) - c0) / (time.perf_counter() - w0)
        period = args.lease_ms / 3000.0
        threads = args.threads
        shares = [leases[i::threads] for i in range(threads)]
        renewers = [Renewer(server.url, prefix, s, period, args.seconds, args.renew_batch, period * i / threads / 10)
                    for i, s in enumerate(shares)]
        print(f"  {threads} threads renewing every {period:.2f} s for {args.seconds} s ...", file=sys.stderr)
        start = time.monotonic() + 0.2
        for r in renewers:
            r.start_at = start
        stats0 = admin.info("commandstats").get("cmdstat_evalsha", {})
        c0, p0 = server_cpu(admin), time.process_time()
        w0 = time.monotonic()
        for r in renewers:
            r.start()
        for r in renewers:
            r.join()
        wall = time.monotonic() - w0
        c1, p1 = server_cpu(admin), time.process_time()
        stats1 = admin.info("commandstats").get("cmdstat_evalsha", {})
        expired_now = admin.zcount(q.keys.leases, "-inf", now_ms(admin))
        live = admin.zcard(q.keys.leases)
        report = Sweeper(q).run_once()
        renewals = sum(r.renewals for r in renewers)
        refused: dict[str, int] = {}
        for r in renewers:
            for k, v in r.refused.items():
                refused[k] = refused.get(k, 0) + v
        lateness = [x for r in renewers for x in r.lateness]
        stats = admin.hgetall(q.keys.stats)
        calls = int(stats1.get("calls", 0)) - int(stats0.get("calls", 0))
        usec = int(stats1.get("usec", 0)) - int(stats0.get("usec", 0))
        q.close()
        admin.close()
    return {
        "leases": args.leases, "lease_ms": args.lease_ms, "period_s": period, "threads": threads,
        "setup_s": setup_s, "seconds": wall, "renewals": renewals, "renewals_per_s": renewals / wall,
        "target_per_s": args.leases / period, "redis_cpu_cores": (c1 - c0) / wall, "redis_cpu_idle_baseline": baseline,
        "redis_cpu_us_per_renewal": 1e6 * (c1 - c0) / max(renewals, 1),
        "lua_us_per_renewal": usec / max(calls, 1),
        "bench_process_cpu_cores": (p1 - p0) / wall,
        "refused": refused, "expired_at_end": expired_now, "live_leases_at_end": live,
        "sweeper_expired_after": len(report.expired), "expired_counter": int(stats.get("expired", 0) or 0),
        "batches_late": len(lateness), "max_lateness_ms": 1000 * max(lateness) if lateness else 0.0,
    }


# --------------------------------------------------------------------------- output


def render(sweeps: list[dict[str, Any]], leases: dict[str, Any] | None, args: argparse.Namespace) -> str:
    lines = []
    if sweeps:
        lines += [f"**Sweeper pass** (`Sweeper.run_once()`, no app, batch {args.batch}; {args.passes} passes per "
                  f"row; due work per pass: {args.expired} expired leases to expire + reconcile, {args.due} due "
                  "first dispatches to RQ)", "",
                  "| idle tasks | load time | used_memory | pass with due work, median / p95 ms | "
                  "empty pass, median / p95 ms | per pass: expired / reconciled / dispatched / errors |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for s in sweeps:
            load = f"{s['load_s']:.1f} s ({s['load_per_s']:,.0f}/s)" if s["load_per_s"] else "-"
            pp = s["per_pass"]
            lines.append(f"| {s['idle_tasks']:,} | {load} | {s['used_memory'] / 2**20:,.0f} MiB | "
                         f"{s['pass_ms']['median']:.2f} / {s['pass_ms']['p95']:.2f} | "
                         f"{s['empty_pass_ms']['median']:.3f} / {s['empty_pass_ms']['p95']:.3f} | "
                         f"{pp['expired']:g} / {pp['reconciled']:g} / {pp['dispatched']:g} / {pp['errors']:g} |")
        if len(sweeps) > 1:
            a, b = sweeps[0], sweeps[-1]
            ratio = b['pass_ms']['median'] / a['pass_ms']['median']
            lines += ["", f"Ratio largest/smallest: pass with due work {ratio:.2f}x,"
                      f" empty pass {b['empty_pass_ms']['median'] / a['empty_pass_ms']['median']:.2f}x "
                      f"for {b['idle_tasks'] / a['idle_tasks']:,.0f}x the idle tasks."]
    if leases:
        L = leases
        lines += ["", f"**Live leases heartbeating** ({L['leases']:,} leases of {L['lease_ms'] / 1000:g} s, "
                  "each renewed "
                  f"every {L['period_s']:.2f} s by {L['threads']} threads with pipelined renew.lua, "
                  f"{L['seconds']:.1f} s, AOF everysec)", "",
                  "| figure | value |", "|---|---:|",
                  f"| redis-server CPU (fraction of one core) | {L['redis_cpu_cores']:.3f} |",
                  f"| redis-server CPU idle baseline (same server, no renewals) | {L['redis_cpu_idle_baseline']:.3f} |",
                  f"| redis-server CPU per renewal | {L['redis_cpu_us_per_renewal']:.1f} µs |",
                  f"| Lua time per renew.lua (commandstats) | {L['lua_us_per_renewal']:.1f} µs |",
                  f"| renewals/s achieved (target {L['target_per_s']:,.0f}) | {L['renewals_per_s']:,.0f} |",
                  f"| renewals refused | {sum(L['refused'].values())} {L['refused'] or ''} |",
                  f"| leases past expiry at the end / expired by a sweep after | {L['expired_at_end']} / "
                  f"{L['sweeper_expired_after']} |",
                  f"| benchmark process CPU (renewer threads) | {L['bench_process_cpu_cores']:.3f} cores |",
                  f"| batches started late / max lateness | {L['batches_late']} / {L['max_lateness_ms']:.1f} ms |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", default="1000,1000000", help="idle task counts, comma separated (default 1000,1000000)")
    ap.add_argument("--passes", type=int, default=50, help="timed sweeper passes per size (default 50)")
    ap.add_argument("--expired", type=int, default=10, help="expired leases per pass (default 10)")
    ap.add_argument("--due", type=int, default=10, help="due first dispatches per pass (default 10)")
    ap.add_argument("--batch", type=int, default=200, help="Sweeper batch (default 200, the Sweeper's default)")
    ap.add_argument("--leases", type=int, default=10_000, help="live leases (default 10000; 0 skips part 2)")
    ap.add_argument("--lease-ms", type=int, default=10_000, help="lease length (default 10000, the client's default)")
    ap.add_argument("--threads", type=int, default=4, help="renewer threads (default 4)")
    ap.add_argument("--renew-batch", type=int, default=100, help="renewals per pipeline (default 100)")
    ap.add_argument("--seconds", type=float, default=20.0, help="heartbeat run length (default 20)")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--dir", type=Path, help="parent folder for the servers' data (default: a new temp folder)")
    args = ap.parse_args(argv)
    sizes = sorted({int(x.replace("_", "")) for x in args.idle.split(",") if x.strip()})
    if any(s < 2 for s in sizes) or args.passes < 1 or args.leases < 0 or args.threads < 1:
        ap.error("--idle sizes must be >= 2; --passes, --threads positive")

    base = Path(tempfile.mkdtemp(prefix="mcq-bench-ops-", dir=args.dir))
    t_start = time.perf_counter()
    try:
        print(f"data under {base}; python {platform.python_version()}, redis-py {redis.__version__}, "
              f"{os.cpu_count()} CPUs", file=sys.stderr)
        sweeps = bench_sweeper(base, sizes, args) if sizes else []
        leases = bench_leases(base, args) if args.leases else None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    with RedisServer(base, appendonly=False) as s:  # only to name the redis-server version
        version = s.client().info("server")["redis_version"]
    shutil.rmtree(base, ignore_errors=True)
    print()
    print(f"mc_queue ops benchmark: redis-server {version} (private), python {platform.python_version()}, "
          f"redis-py {redis.__version__}, {os.cpu_count()} CPUs shared by client and server, "
          f"{time.perf_counter() - t_start:.0f} s in all.")
    print()
    print(render(sweeps, leases, args))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "redis_version": version,
                                         "sweeper": sweeps, "leases": leases}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Core benchmark of mc_queue: claim+complete cycles against a raw EVALSHA floor, memory, enqueue rate.

Run from the repository root::

    .venv/bin/python bench/bench_core.py [--seconds N] [--repeat 3] [--json out.json] [--profile]

Everything runs against private redis-servers started here (``mc_queue.testing.RedisServer`` in a
temporary folder, one per appendfsync mode), never the machine's Redis on port 6379. See
``bench/README.md`` for what each figure means.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.retry import Retry

import mc_queue
from mc_queue.contracts.models import Attempt
from mc_queue.testing import RedisServer, unique_prefix

QUEUE = "bench"
HANDLER = "bench.noop"
WORKER = "bench-worker"
RESULT: dict[str, Any] = {"ok": True}
TRIVIAL_LUA = "return redis.call('INCR', KEYS[1])"
RAW_KEY = "{bench-raw}:n"
GOAL_RATIO = 0.8
PIN_LABEL = {"split": "2 CPUs", "same": "1 CPU", "none": "unpinned"}

# /work/shared/NOTES.md, "Baseline throughput measured here" (measured for QUEUED jobs, not finished ones).
NOTES_MEMORY_PER_QUEUED_JOB = {"huey": 131, "arq": 391, "Dramatiq": 412, "RQ": 549, "Celery": 1047}
NOTES_ENQUEUE_PER_S = {"RQ": 2800, "Dramatiq": 5700}
NOTES_EVALSHA_PER_S = 10_200

# The same connection settings mc_queue.Client uses for its transition connection (client.py).
CLIENT_SOCKET_TIMEOUT = 10.0


def transition_conn_kwargs() -> dict[str, Any]:
    return dict(decode_responses=True, socket_timeout=CLIENT_SOCKET_TIMEOUT,
                socket_connect_timeout=CLIENT_SOCKET_TIMEOUT, health_check_interval=30,
                retry=Retry(NoBackoff(), 0))


# --------------------------------------------------------------------------- measurement helpers


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def cmdstats(admin: redis.Redis) -> dict[str, tuple[int, int]]:
    """INFO commandstats as {command: (calls, usec)}; the INFO calls themselves are left out."""
    out = {}
    for name, v in admin.info("commandstats").items():
        cmd = name.removeprefix("cmdstat_")
        if cmd != "info":
            out[cmd] = (int(v["calls"]), int(v["usec"]))
    return out


def server_cpu(admin: redis.Redis) -> float:
    """redis-server CPU seconds (user + sys, all threads)."""
    info = admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Window:
    """One measured section: wall time, this process's CPU, redis-server CPU, command-stat deltas."""

    def __init__(self, admin: redis.Redis) -> None:
        self.admin = admin
        self.wall = 0.0
        self.cpu = 0.0
        self.server_cpu = 0.0
        self.calls: dict[str, int] = {}
        self.usec: dict[str, int] = {}

    @contextmanager
    def timed(self) -> Iterator[None]:
        s0, c0 = cmdstats(self.admin), server_cpu(self.admin)
        p0, t0 = time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            t1, p1 = time.perf_counter(), time.process_time()
            s1, c1 = cmdstats(self.admin), server_cpu(self.admin)
            self.wall += t1 - t0
            self.cpu += p1 - p0
            self.server_cpu += c1 - c0
            for cmd, (calls, usec) in s1.items():
                dc = calls - s0.get(cmd, (0, 0))[0]
                du = usec - s0.get(cmd, (0, 0))[1]
                if dc:
                    self.calls[cmd] = self.calls.get(cmd, 0) + dc
                    self.usec[cmd] = self.usec.get(cmd, 0) + du

    def scripts(self) -> int:
        return sum(self.calls.get(c, 0) for c in ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"))

    def script_usec(self) -> int:
        return sum(self.usec.get(c, 0) for c in ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"))

    def total_calls(self) -> int:
        return sum(self.calls.values())


@contextmanager
def count_round_trips() -> Iterator[list[int]]:
    """Count requests written by redis-py in this process (a pipeline is one request, one round trip)."""
    counter = [0]
    original: Callable[..., None] = AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        counter[0] += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def new_client(server: RedisServer) -> mc_queue.Client:
    q = mc_queue.connect(server.url, prefix=unique_prefix("bench"), actor="bench")
    q.backend.open_namespace()  # create the namespace (init script) outside any timed section
    return q


def enqueue_n(q: mc_queue.Client, n: int) -> list[str]:
    return [q.producer.enqueue(QUEUE, HANDLER, {"i": i}).id for i in range(n)]


def run_cycle(q: mc_queue.Client, task_id: str) -> None:
    lease = q.leases.claim_attempt(task_id, WORKER)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER)


# --------------------------------------------------------------------------- the three loops


class RawLoop:
    """EVALSHA of a trivial script, unpipelined, from this process, with the Client's connection settings."""

    def __init__(self, server: RedisServer, admin: redis.Redis) -> None:
        self.r = redis.Redis.from_url(server.url, **transition_conn_kwargs())
        self.sha = self.r.script_load(TRIVIAL_LUA)
        for _ in range(200):  # warm the connection
            self.r.evalsha(self.sha, 1, RAW_KEY)
        self.w = Window(admin)
        self.n = 0

    def run(self, seconds: float) -> None:
        evalsha, sha = self.r.evalsha, self.sha
        n = 0
        with self.w.timed():
            deadline = time.perf_counter() + seconds
            while True:
                for _ in range(100):
                    evalsha(sha, 1, RAW_KEY)
                n += 100
                if time.perf_counter() >= deadline:
                    break
        self.n += n

    def result(self) -> dict[str, Any]:
        w, n = self.w, self.n
        self.r.close()
        return {
            "calls": n, "seconds": w.wall, "per_s": n / w.wall, "wall_us": 1e6 * w.wall / n,
            "client_cpu_us": 1e6 * w.cpu / n, "server_cpu_us": 1e6 * w.server_cpu / n,
            "server_script_us": w.script_usec() / max(w.scripts(), 1),
            "scripts_per_call": w.scripts() / n, "commands_per_call": w.total_calls() / n,
        }


class CycleLoop:
    """claim_attempt + complete_attempt through the public API; tasks are enqueued outside the timing."""

    def __init__(self, q: mc_queue.Client, admin: redis.Redis, ready: list[str], chunk: int) -> None:
        self.q, self.w, self.pool, self.chunk = q, Window(admin), list(ready), chunk
        self.done = 0

    def run(self, seconds: float) -> None:
        claim, complete = self.q.leases.claim_attempt, self.q.leases.complete_attempt
        target = self.w.wall + seconds
        while self.w.wall < target:
            if not self.pool:
                self.pool = enqueue_n(self.q, self.chunk)  # untimed refill
            used = 0
            with self.w.timed():
                deadline = time.perf_counter() + (target - self.w.wall)
                for tid in self.pool:
                    lease = claim(tid, WORKER)
                    complete(lease.attempt_id, lease.fence, RESULT, worker_id=WORKER)
                    used += 1
                    if not used & 31 and time.perf_counter() >= deadline:
                        break
            self.done += used
            self.pool = self.pool[used:]

    def result(self) -> dict[str, Any]:
        w, done = self.w, self.done
        return {
            "cycles": done, "seconds": w.wall, "per_s": done / w.wall, "wall_us": 1e6 * w.wall / done,
            "client_cpu_us": 1e6 * w.cpu / done, "server_cpu_us": 1e6 * w.server_cpu / done,
            "server_script_us": w.script_usec() / max(w.scripts(), 1),
            "scripts_per_cycle": w.scripts() / done, "commands_per_cycle": w.total_calls() / done,
            "commands_by_name_per_cycle": {c: round(k / done, 3) for c, k in sorted(w.calls.items())},
            "usec_by_name_per_cycle": {c: round(u / done, 2) for c, u in sorted(w.usec.items())},
        }


class BatchLoop:
    """Batch mode from one client: each round trip completes the Attempts claimed by the one before and
    claims the next ``size`` (``q.leases.batch``: each still its own fenced claim and completion)."""

    def __init__(self, q: mc_queue.Client, admin: redis.Redis, ready: list[str], chunk: int, size: int) -> None:
        self.q, self.w, self.pool, self.chunk, self.size = q, Window(admin), list(ready), chunk, size
        self.done = 0
        self.trips = 0

    def run(self, seconds: float) -> None:
        from mc_queue.client.holder import Completion

        leases = self.q.leases
        target = self.w.wall + seconds
        held: list[Any] = []
        while self.w.wall < target or held:
            if len(self.pool) < self.size:
                self.pool += enqueue_n(self.q, self.chunk)  # untimed refill
            with self.w.timed():
                deadline = time.perf_counter() + max(0.0, target - self.w.wall)
                while True:
                    more = time.perf_counter() < deadline and len(self.pool) >= self.size
                    take, self.pool = (self.pool[:self.size], self.pool[self.size:]) if more else ([], self.pool)
                    got = leases.batch(WORKER, complete=[Completion(x.attempt_id, x.fence, RESULT) for x in held],
                                       claim=[leases.claim_request(t) for t in take], with_task=False)
                    self.trips += 1
                    assert all(c is None for c in got.completed), got.completed
                    self.done += len(held)
                    held = list(got.claimed)
                    if not take or len(self.pool) < self.size:
                        break
            if not held and self.w.wall >= target:
                break

    def result(self) -> dict[str, Any]:
        w, done = self.w, self.done
        return {
            "attempts": done, "size": self.size, "seconds": w.wall, "per_s": done / w.wall,
            "client_cpu_us": 1e6 * w.cpu / done, "server_cpu_us": 1e6 * w.server_cpu / done,
            "round_trips_per_attempt": self.trips / done, "commands_per_attempt": w.total_calls() / done,
        }


def measure_enqueue(q: mc_queue.Client, admin: redis.Redis, seconds: float) -> tuple[dict[str, Any], list[str]]:
    """One producer calling q.producer.enqueue in a loop; the tasks it creates feed the cycle measurement."""
    ids: list[str] = []
    w = Window(admin)
    enqueue = q.producer.enqueue
    with w.timed():
        deadline = time.perf_counter() + seconds
        i = 0
        while True:
            for _ in range(50):
                ids.append(enqueue(QUEUE, HANDLER, {"i": i}).id)
                i += 1
            if time.perf_counter() >= deadline:
                break
    n = len(ids)
    return {
        "tasks": n, "seconds": w.wall, "per_s": n / w.wall, "wall_us": 1e6 * w.wall / n,
        "client_cpu_us": 1e6 * w.cpu / n, "server_cpu_us": 1e6 * w.server_cpu / n,
        "scripts_per_task": w.scripts() / n, "commands_per_task": w.total_calls() / n,
    }, ids


def measure_pair(server: RedisServer, q: mc_queue.Client, admin: redis.Redis, seconds: float, ready: list[str],
                 chunk: int, slice_s: float, batch: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Raw loop, cycle loop and batch loop in alternating slices, so all see the same machine conditions."""
    raw, cyc = RawLoop(server, admin), CycleLoop(q, admin, ready, chunk)
    bat = BatchLoop(q, admin, [], chunk, batch)
    while raw.w.wall < seconds or cyc.w.wall < seconds or bat.w.wall < seconds:
        if raw.w.wall < seconds:
            raw.run(min(slice_s, seconds - raw.w.wall))
        if cyc.w.wall < seconds:
            cyc.run(min(slice_s, seconds - cyc.w.wall))
        if bat.w.wall < seconds:
            bat.run(min(slice_s, seconds - bat.w.wall))
    return raw.result(), cyc.result(), bat.result()


def client_round_trips(q: mc_queue.Client, n: int = 500) -> dict[str, float]:
    """Requests redis-py writes per cycle and per enqueue, counted in this process (not timed)."""
    with count_round_trips() as c:
        ids = enqueue_n(q, n)
    per_enqueue = c[0] / n
    with count_round_trips() as c:
        for tid in ids:
            run_cycle(q, tid)
    return {"per_cycle": c[0] / n, "per_enqueue": per_enqueue}


# --------------------------------------------------------------------------- memory


def used_memory(admin: redis.Redis, settle: float) -> tuple[int, int]:
    time.sleep(settle)
    m = admin.info("memory")
    return int(m["used_memory"]), int(m["used_memory_dataset"])


WHAT_IF_CONFIG = ["--stream-node-max-bytes", "512", "--hash-max-listpack-value", "1024"]


def measure_memory(base: Path, n: int, settle: float, extra: list[str] | None = None) -> dict[str, Any]:
    """A fresh server: used_memory delta per queued task and per finished task (one attempt), and MEMORY USAGE."""
    extra = list(extra or [])
    server = RedisServer(base / f"memory{len(extra)}", appendfsync="everysec",
                         extra=["--auto-aof-rewrite-percentage", "0", *extra])
    with server:
        admin = server.client()
        q = new_client(server)
        mem0, ds0 = used_memory(admin, settle)
        ids = enqueue_n(q, n)
        mem1, ds1 = used_memory(admin, settle)
        for tid in ids:
            run_cycle(q, tid)
        mem2, ds2 = used_memory(admin, settle)
        while q.maintenance.pack_due(limit=1000, min_age_ms=0):  # what the sweeper does a minute after each finish
            pass
        mem3, ds3 = used_memory(admin, settle)
        packed_parts: dict[str, list[int]] = {"task hash (packed)": []}
        for tid in ids[:: max(1, n // 200)]:
            tk = q.keys.task(tid)
            packed_parts["task hash (packed)"].append(int(admin.memory_usage(tk.task, samples=0) or 0))
        packed_index = {name: int(admin.memory_usage(key, samples=0) or 0) / n
                        for name, key in (("done index", q.keys.done(QUEUE)), ("idempotency hash", q.keys.idem))
                        if admin.exists(key)}
        sample = ids[:: max(1, n // 200)]
        parts: dict[str, list[int]] = {"task hash": [], "attempts hash": [], "events list": []}
        shape: dict[str, list[int]] = {"task fields": [], "attempt fields": [], "events": []}
        for tid in sample:
            tk = q.keys.task(tid)
            parts["task hash"].append(int(admin.memory_usage(tk.task, samples=0) or 0))
            parts["attempts hash"].append(int(admin.memory_usage(tk.attempts, samples=0) or 0))
            parts["events list"].append(int(admin.memory_usage(tk.events, samples=0) or 0))
            shape["task fields"].append(admin.hlen(tk.task))
            shape["attempt fields"].append(admin.hlen(tk.attempts))
            shape["events"].append(admin.llen(tk.events))
        encodings = {
            "task hash": admin.object("encoding", q.keys.task(ids[0]).task),
            "attempts hash": admin.object("encoding", q.keys.task(ids[0]).attempts),
        }
        shared = {name: int(admin.memory_usage(key, samples=0) or 0)
                  for name, key in (("counts", q.keys.counts), ("leases", q.keys.leases),
                                    ("pending", q.keys.pending(QUEUE)), ("meta", q.keys.meta))
                  if admin.exists(key)}
        event_types = sorted({e.type for e in q.reads.get_task(ids[0]).events})
        q.close()
        admin.close()
    breakdown = {k: median([float(x) for x in v]) for k, v in parts.items()}
    return {
        "tasks": n, "server_config": " ".join(extra) or "defaults",
        "per_queued_task": (mem1 - mem0) / n, "per_queued_task_dataset": (ds1 - ds0) / n,
        "per_finished_task": (mem2 - mem0) / n, "per_finished_task_dataset": (ds2 - ds0) / n,
        "per_finished_task_packed": (mem3 - mem0) / n, "per_finished_task_packed_dataset": (ds3 - ds0) / n,
        "packed_breakdown": {k: median([float(x) for x in v]) for k, v in packed_parts.items()},
        "packed_shared_per_task": packed_index,
        "memory_usage_breakdown": breakdown, "memory_usage_sum": sum(breakdown.values()),
        "shape": {k: median([float(x) for x in v]) for k, v in shape.items()},
        "encodings": encodings, "event_types": event_types, "shared_keys_after": shared,
    }


# --------------------------------------------------------------------------- profile


def profile_cycles(server: RedisServer, n: int) -> dict[str, Any]:
    q = new_client(server)
    ids = enqueue_n(q, n + 200)
    for tid in ids[:200]:
        run_cycle(q, tid)
    ids = ids[200:]

    def loop() -> None:
        for tid in ids:
            run_cycle(q, tid)

    prof = cProfile.Profile()
    prof.runcall(loop)
    q.close()
    st = pstats.Stats(prof)
    out: dict[str, Any] = {}
    for order in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(10 if order == "cumulative" else 12)
        out[order] = _trim_pstats(buf.getvalue())
    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    total = max(ct for (_, _, name), (_, _, _, ct, _) in raw.items() if name == "loop")

    def cum(match: Callable[[str, str], bool]) -> float:
        return float(sum(ct for (f, _, name), (_, _, _, ct, _) in raw.items() if match(f, name)))

    def tot(match: Callable[[str, str], bool]) -> float:
        return float(sum(tt for (f, _, name), (_, _, tt, _, _) in raw.items() if match(f, name)))

    sock_wait = tot(lambda f, name: f == "~" and ("method 'recv" in name or "select" in name or "poll" in name))
    sock_send = tot(lambda f, name: "sendall" in name)
    redis_py = cum(lambda f, name: name == "execute_command" and f.endswith(os.path.join("redis", "client.py")))
    from_fields = cum(lambda f, name: name == "from_fields" and f.endswith("models.py"))
    uuid_cost = cum(lambda f, name: name == "uuid4")
    parse_ids = cum(lambda f, name: name in ("_task_keys", "_attempt"))
    canon = cum(lambda f, name: name in ("canonical_json", "digest") and f.endswith("codec.py"))
    out["summary"] = {
        "cycles": n,
        "profiled_us_per_cycle": 1e6 * total / n,
        "socket_send+recv_incl_waiting_for_redis_pct": 100 * (sock_wait + sock_send) / total,
        "redis_py_execute_command_excl_socket_pct": 100 * (redis_py - sock_wait - sock_send) / total,
        "Attempt.from_fields_pydantic_pct": 100 * from_fields / total,
        "uuid4_request_id_pct": 100 * uuid_cost / total,
        "task/attempt_id_parsing_pct": 100 * parse_ids / total,
        "canonical_json+sha256_pct": 100 * canon / total,
    }
    return out


def _trim_pstats(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    root = str(Path(mc_queue.__file__).resolve().parent.parent) + os.sep
    site = str(Path(redis.__file__).resolve().parent.parent) + os.sep
    return "\n".join(line.replace(root, "").replace(site, "") for line in lines[start:] if line.strip())


def micro_from_fields(server: RedisServer, n: int = 5000) -> dict[str, float]:
    """Unprofiled cost of the pydantic Attempt built from complete's reply (mc_queue does it every complete)."""
    q = new_client(server)
    tid = enqueue_n(q, 1)[0]
    run_cycle(q, tid)
    admin = server.client()
    flat: Any = admin.hgetall(q.keys.task(tid).attempts)
    fields = {k.partition(".")[2]: v for k, v in flat.items() if k.startswith("1.")}
    admin.close()
    q.close()
    t0 = time.perf_counter()
    for _ in range(n):
        Attempt.from_fields(tid, 1, fields)
    return {"attempt_from_fields_us": 1e6 * (time.perf_counter() - t0) / n, "fields": len(fields)}


# --------------------------------------------------------------------------- driver


ALL_CPUS = sorted(os.sched_getaffinity(0))


def apply_pin(server_pid: int, pin: str) -> str:
    """Pin redis-server's main thread and this process: to one CPU ("same"), two CPUs ("split"), or not."""
    if pin == "none":
        os.sched_setaffinity(server_pid, ALL_CPUS)
        os.sched_setaffinity(0, ALL_CPUS)
        return f"unpinned ({len(ALL_CPUS)} CPUs)"
    server_cpu_id = ALL_CPUS[0]
    client_cpu_id = ALL_CPUS[0] if pin == "same" else ALL_CPUS[1]
    os.sched_setaffinity(server_pid, {server_cpu_id})
    os.sched_setaffinity(0, {client_cpu_id})
    return f"server on CPU {server_cpu_id}, client on CPU {client_cpu_id}"


def system_cpu() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = vals
    # irq/softirq left out: much of it is the loopback traffic of this benchmark itself
    return (user + nice + system) / tick, steal / tick


def run_mode(base: Path, fsync: str, pin: str, args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, ALL_CPUS)  # the server (and its threads) inherit this at spawn
    server = RedisServer(base / f"redis-{fsync}-{pin}", appendfsync=fsync)
    reps: list[dict[str, Any]] = []
    with server:
        assert server.proc is not None
        placement = apply_pin(server.proc.pid, pin)
        admin = server.client()
        m0, p0, c0, t0 = system_cpu(), time.process_time(), server_cpu(admin), time.perf_counter()
        for rep in range(args.repeat):
            q = new_client(server)
            for tid in enqueue_n(q, 200):  # warm up: script cache, connections, namespace
                run_cycle(q, tid)
            enq, ready = measure_enqueue(q, admin, args.seconds)
            raw, cyc, bat = measure_pair(server, q, admin, args.seconds, ready, args.chunk, args.slice, args.batch)
            q.close()
            reps.append({"raw": raw, "cycles": cyc, "enqueue": enq, "batch": bat,
                         "ratio_per_cycle": cyc["per_s"] / raw["per_s"],
                         "ratio_per_round_trip": 2 * cyc["per_s"] / raw["per_s"]})
            print(f"  [{fsync}/{pin} #{rep + 1}] cycles {cyc['per_s']:,.0f}/s  raw EVALSHA {raw['per_s']:,.0f}/s  "
                  f"enqueue {enq['per_s']:,.0f}/s  batch {bat['per_s']:,.0f} Attempts/s", file=sys.stderr)
        m1, p1, c1, t1 = system_cpu(), time.process_time(), server_cpu(admin), time.perf_counter()
        other_cpu = steal = None
        if m0 and m1:  # CPUs kept busy by anything but this process and its redis-server, on average
            other_cpu = max(0.0, (m1[0] - m0[0]) - (p1 - p0) - (c1 - c0)) / (t1 - t0)
            steal = (m1[1] - m0[1]) / (t1 - t0)
        q = new_client(server)
        trips = client_round_trips(q)
        q.close()
        info = admin.info("server")
        admin.close()
    os.sched_setaffinity(0, ALL_CPUS)
    return {"fsync": fsync, "pin": pin, "placement": placement, "repeats": reps, "client_round_trips": trips,
            "other_cpu": other_cpu, "steal_cpu": steal,
            "redis_version": info.get("redis_version")}


def med(reps: list[dict[str, Any]], *path: str) -> float:
    vals = []
    for r in reps:
        v: Any = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return median(vals)


def spread(reps: list[dict[str, Any]], *path: str) -> str:
    vals = []
    for r in reps:
        v: Any = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return f"{min(vals):,.0f}-{max(vals):,.0f}"


def render(modes: list[dict[str, Any]], mems: list[dict[str, Any]], args: argparse.Namespace) -> str:
    heads = [f"{m['fsync']}, {PIN_LABEL[m['pin']]}" for m in modes]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, fn: Callable[[dict[str, Any]], str]) -> None:
        rows.append((label, [fn(m) for m in modes]))

    def r(m: dict[str, Any]) -> list[dict[str, Any]]:
        return m["repeats"]  # type: ignore[no-any-return]

    row("1. claim+complete cycles/s (public API, 1 process)",
        lambda m: f"**{med(r(m), 'cycles', 'per_s'):,.0f}** ({spread(r(m), 'cycles', 'per_s')})")
    row("2. raw EVALSHA `INCR` calls/s (same process, same settings)",
        lambda m: f"**{med(r(m), 'raw', 'per_s'):,.0f}** ({spread(r(m), 'raw', 'per_s')})")
    row(f"3a. cycles/s ÷ raw calls/s (per cycle; goal >= {GOAL_RATIO})",
        lambda m: _verdict(med(r(m), "ratio_per_cycle")))
    row(f"3b. 2 x cycles/s ÷ raw calls/s (per round trip; goal >= {GOAL_RATIO})",
        lambda m: _verdict(med(r(m), "ratio_per_round_trip")))
    row("wall µs per cycle / per raw call",
        lambda m: f"{med(r(m), 'cycles', 'wall_us'):.0f} / {med(r(m), 'raw', 'wall_us'):.0f}")
    row("client (this process) CPU µs per cycle / per raw call",
        lambda m: f"{med(r(m), 'cycles', 'client_cpu_us'):.0f} / {med(r(m), 'raw', 'client_cpu_us'):.0f}")
    row("redis-server CPU µs per cycle / per raw call",
        lambda m: f"{med(r(m), 'cycles', 'server_cpu_us'):.0f} / {med(r(m), 'raw', 'server_cpu_us'):.0f}")
    row("Lua time in Redis µs per claim-or-complete / per trivial call",
        lambda m: f"{med(r(m), 'cycles', 'server_script_us'):.1f} / {med(r(m), 'raw', 'server_script_us'):.1f}")
    row("4a. EVALSHA calls per cycle (commandstats)",
        lambda m: f"{med(r(m), 'cycles', 'scripts_per_cycle'):.2f}")
    row("4b. client round trips per cycle (requests redis-py wrote)",
        lambda m: f"{m['client_round_trips']['per_cycle']:.2f}")
    row("4c. Redis commands per cycle, incl. those run inside Lua (commandstats)",
        lambda m: f"{med(r(m), 'cycles', 'commands_per_cycle'):.1f}")
    row(f"5a. batch mode: fenced Attempts/s (claim+complete, {args.batch} per round trip, 1 process)",
        lambda m: f"**{med(r(m), 'batch', 'per_s'):,.0f}** ({spread(r(m), 'batch', 'per_s')})")
    row("5b. batch mode: redis-server CPU µs / client CPU µs / Redis commands per Attempt",
        lambda m: f"{med(r(m), 'batch', 'server_cpu_us'):.0f} / {med(r(m), 'batch', 'client_cpu_us'):.0f} / "
                  f"{med(r(m), 'batch', 'commands_per_attempt'):.1f}")
    row("6. enqueue tasks/s (1 producer, q.producer.enqueue)",
        lambda m: f"**{med(r(m), 'enqueue', 'per_s'):,.0f}** ({spread(r(m), 'enqueue', 'per_s')})")
    row("CPUs busy outside this benchmark during the column's runs (avg) / VM steal",
        lambda m: "n/a" if m["other_cpu"] is None else f"{m['other_cpu']:.2f} / {m['steal_cpu']:.2f}")
    row("enqueue: client round trips per task / commands incl. Lua",
        lambda m: f"{m['client_round_trips']['per_enqueue']:.2f} / {med(r(m), 'enqueue', 'commands_per_task'):.1f}")

    lines = [f"| metric (median of {args.repeat} x {args.seconds:g} s; min-max) | " + " | ".join(heads) + " |",
             "|---|" + "---|" * len(heads)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]

    first = mems[0]
    lines += ["", f"| 5. Redis memory, bytes per task ({first['tasks']:,} tasks, fresh server) | "
              + " | ".join(f"`{m['server_config']}`" for m in mems) + " |",
              "|---|" + "---|" * len(mems)]

    def mrow(label: str, fn: Callable[[dict[str, Any]], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(fn(m) for m in mems) + " |")

    mrow("used_memory delta per queued task (enqueued, not yet claimed)", lambda m: f"{m['per_queued_task']:,.0f}")
    mrow("**used_memory delta per finished task** (1 attempt, succeeded, events kept)",
         lambda m: f"**{m['per_finished_task']:,.0f}**")
    mrow("used_memory_dataset delta per finished task", lambda m: f"{m['per_finished_task_dataset']:,.0f}")
    mrow(f"MEMORY USAGE task hash ({first['shape']['task fields']:.0f} fields)",
         lambda m: f"{m['memory_usage_breakdown']['task hash']:,.0f} ({m['encodings']['task hash']})")
    mrow(f"MEMORY USAGE attempts hash ({first['shape']['attempt fields']:.0f} fields)",
         lambda m: f"{m['memory_usage_breakdown']['attempts hash']:,.0f} ({m['encodings']['attempts hash']})")
    mrow(f"MEMORY USAGE events list ({first['shape']['events']:.0f} events: {', '.join(first['event_types'])})",
         lambda m: f"{m['memory_usage_breakdown']['events list']:,.0f}")
    mrow("MEMORY USAGE, sum of the three keys", lambda m: f"{m['memory_usage_sum']:,.0f}")
    mrow("**used_memory delta per finished task, packed** (what the sweeper leaves a minute after; goal <= 1,500)",
         lambda m: f"**{m['per_finished_task_packed']:,.0f}**")
    mrow("MEMORY USAGE packed task hash (its whole history)",
         lambda m: f"{m['packed_breakdown']['task hash (packed)']:,.0f}")
    mrow("done index, per task", lambda m: f"{m['packed_shared_per_task'].get('done index', 0):,.0f}")
    others = ", ".join(f"{k} {v:,}" for k, v in NOTES_MEMORY_PER_QUEUED_JOB.items())
    lines.append(f"| NOTES.md, per **queued** job (not finished): {others} | " + " | ".join("" for _ in mems) + " |")
    return "\n".join(lines)


def _verdict(x: float) -> str:
    return f"{x:.2f} ({'met' if x >= GOAL_RATIO else 'NOT met'})"


def conclusions(modes: list[dict[str, Any]], mems: list[dict[str, Any]], micro: dict[str, float]) -> str:
    out = []
    for m in modes:
        reps = m["repeats"]
        rc, rr = med(reps, "ratio_per_cycle"), med(reps, "ratio_per_round_trip")
        cyc_us, raw_us = med(reps, "cycles", "wall_us"), med(reps, "raw", "wall_us")
        ccpu, rcpu = med(reps, "cycles", "client_cpu_us"), med(reps, "raw", "client_cpu_us")
        scpu, rscpu = med(reps, "cycles", "server_cpu_us"), med(reps, "raw", "server_cpu_us")
        s_cyc, s_raw = med(reps, "cycles", "server_script_us"), med(reps, "raw", "server_script_us")
        gap = cyc_us - 2 * raw_us
        extra_client = ccpu - 2 * rcpu
        extra_server = scpu - 2 * rscpu
        extra_lua = 2 * (s_cyc - s_raw)
        rest = gap - extra_client - extra_server
        mid = sorted(reps, key=lambda x: x["cycles"]["per_s"])[len(reps) // 2]["cycles"]
        per_cmd = mid["usec_by_name_per_cycle"]
        top = sorted(((u, c) for c, u in per_cmd.items() if c not in ("evalsha", "eval")), reverse=True)[:4]
        in_cmds = sum(u for c, u in per_cmd.items() if c not in ("evalsha", "eval"))
        n_cmds = sum(k for c, k in mid["commands_by_name_per_cycle"].items() if c not in ("evalsha", "eval"))
        lua_total = per_cmd.get("evalsha", 0.0)
        out.append(
            f"- appendfsync {m['fsync']}, {m['placement']}: a cycle takes {cyc_us:.0f} µs against "
            f"{2 * raw_us:.0f} µs for two trivial "
            f"EVALSHA round trips. Per cycle the goal (>= {GOAL_RATIO}) is {'met' if rc >= GOAL_RATIO else 'NOT met'} "
            f"({rc:.2f}); per round trip it is {'met' if rr >= GOAL_RATIO else 'NOT met'} ({rr:.2f}). "
            f"Of the {gap:.0f} µs above that floor, ~{extra_client:.0f} µs is extra CPU in this Python process "
            f"(mc_queue + redis-py packing/parsing + pydantic, beyond a bare evalsha) and ~{extra_server:.0f} µs extra "
            f"redis-server CPU, of which {extra_lua:.0f} µs inside the two Lua scripts, and ~{rest:.0f} µs with "
            f"neither process on a CPU (waiting for fsync, wake-ups). The scripts run {lua_total:.0f} µs per "
            f"cycle, of which only {in_cmds:.0f} µs in the {n_cmds:.0f} Redis commands they call (costliest, µs per "
            "cycle: " + ", ".join(f"{c} {u:.1f}" for u, c in top) + "); the rest is Lua and redis.call overhead."
        )
    for m in modes:
        if m["pin"] != "same":
            raw_us = med(m["repeats"], "raw", "wall_us")
            out.append(f"- Floor check ({m['fsync']}, {m['placement']}): one trivial EVALSHA round trip took "
                       f"{raw_us:.0f} µs here; NOTES.md measured ~83 µs per unpipelined round trip (PING ~12,000/s, a "
                       f"small claim script ~{NOTES_EVALSHA_PER_S:,}/s) without pinning.")
    out.append(f"- Attempt.from_fields (pydantic, built from every complete reply, {micro['fields']:.0f} fields) "
               f"costs {micro['attempt_from_fields_us']:.1f} µs unprofiled.")
    d = mems[0]
    out.append(f"- A finished task keeps ~{d['per_finished_task']:,.0f} B of Redis memory until the sweeper packs it "
               f"(then ~{d['per_finished_task_packed']:,.0f} B, until retention deletes it); a queued one "
               f"~{d['per_queued_task']:,.0f} B. NOTES.md's figures (huey 131 ... "
               "Celery 1,047 B) were measured for queued jobs; those queues keep no attempt record or event stream.")
    if len(mems) > 1:
        w = mems[1]
        out.append(f"- With `{w['server_config']}` (not mc_queue's configuration; a what-if) a finished task takes "
                   f"~{w['per_finished_task']:,.0f} B: Redis 7 preallocates up to stream-node-max-bytes (4 KB by "
                   "default) for a new stream node, and hash values over hash-max-listpack-value (64 B; the "
                   "manifest and payload JSON are longer) force the costlier hashtable encoding.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per loop per repeat (default 3)")
    ap.add_argument("--repeat", type=int, default=3, help="repeats; medians are reported (default 3)")
    ap.add_argument("--json", type=Path, help="write every measured number to this file")
    ap.add_argument("--fsync", default="everysec,always",
                    help="comma-separated appendfsync modes, one private server each (default everysec,always)")
    ap.add_argument("--pin", default="same,split",
                    help="comma-separated CPU placements of client and redis-server: split (one CPU each), same "
                         "(both on one CPU), none (default same,split)")
    ap.add_argument("--slice", type=float, default=1.0,
                    help="seconds per alternating slice of the raw and the cycle loop (default 1)")
    ap.add_argument("--tasks", type=int, default=10_000, help="tasks for the memory measurement (default 10000)")
    ap.add_argument("--no-what-if", action="store_true",
                    help="skip the second memory measurement with " + " ".join(WHAT_IF_CONFIG))
    ap.add_argument("--batch", type=int, default=50, help="Attempts claimed per round trip in batch mode (default 50)")
    ap.add_argument("--chunk", type=int, default=2000, help="tasks enqueued per untimed refill (default 2000)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds to wait before reading used_memory")
    ap.add_argument("--profile", action="store_true", help="cProfile one cycle loop and print the top entries")
    ap.add_argument("--profile-cycles", type=int, default=2000)
    ap.add_argument("--dir", type=Path, help="parent folder for the servers' data (default: a new temp folder)")
    args = ap.parse_args(argv)
    modes_wanted = [m.strip() for m in args.fsync.split(",") if m.strip()]
    for m in modes_wanted:
        if m not in ("always", "everysec", "no"):
            ap.error(f"unknown appendfsync mode {m!r}")
    pins = [p.strip() for p in args.pin.split(",") if p.strip()]
    for p in pins:
        if p not in PIN_LABEL:
            ap.error(f"unknown --pin {p!r}")
        if p == "split" and len(ALL_CPUS) < 2:
            ap.error("--pin split needs two CPUs")
    if args.seconds <= 0 or args.slice <= 0 or args.repeat < 1 or args.tasks < 1 or args.chunk < 1:
        ap.error("--seconds, --repeat, --tasks and --chunk must be positive")

    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="mcq-bench-", dir=args.dir))
    try:
        print(f"data under {base}; python {platform.python_version()}, redis-py {redis.__version__}, "
              f"{os.cpu_count()} CPUs", file=sys.stderr)
        modes = [run_mode(base, fsync, pin, args) for fsync in modes_wanted for pin in pins]
        print("  memory ...", file=sys.stderr)
        mems = [measure_memory(base, args.tasks, args.settle)]
        if not args.no_what_if:
            mems.append(measure_memory(base, args.tasks, args.settle, WHAT_IF_CONFIG))
        prof = None
        with RedisServer(base / "redis-profile", appendfsync=modes_wanted[0]) as server:
            assert server.proc is not None
            apply_pin(server.proc.pid, pins[0])
            micro = micro_from_fields(server)
            if args.profile:
                print("  profile ...", file=sys.stderr)
                prof = profile_cycles(server, args.profile_cycles)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    load_after = os.getloadavg()
    print()
    others = [m["other_cpu"] for m in modes if m["other_cpu"] is not None]
    if any(o > 0.1 for o in others):
        print(f"WARNING: other processes used CPU during this run (up to {max(others):.2f} of {len(ALL_CPUS)} CPUs "
              "on average, beside this process and its redis-server): rates are lower and noisier than on an "
              "idle machine.")
    version = code_version()
    print(f"mc_queue core benchmark of commit {version}: redis-server {modes[0]['redis_version']} (private, AOF on), "
          f"python {platform.python_version()}, redis-py {redis.__version__} (hiredis: "
          f"{'yes' if _has_hiredis() else 'no'}), {os.cpu_count()} CPUs shared by client and server.")
    print()
    print(render(modes, mems, args))
    print()
    print(conclusions(modes, mems, micro))
    if prof:
        print()
        print(f"cProfile of {prof['summary']['cycles']} cycles (appendfsync {modes_wanted[0]}, "
              f"{PIN_LABEL[pins[0]]}), "
              "top 10 by cumulative time:")
        print("```")
        print(prof["cumulative"])
        print("```")
        print("top 12 by own time:")
        print("```")
        print(prof["tottime"])
        print("```")
        print("share of profiled cycle time (profiler overhead inflates Python parts): "
              + ", ".join(f"{k.removesuffix('_pct')} {v:.1f}%" if k.endswith("pct") else f"{k} {v:.0f}"
                          for k, v in prof["summary"].items()))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "modes": modes,
                                         "memory": mems, "micro": micro, "profile": prof,
                                         "hiredis": _has_hiredis(), "code_version": version,
                                         "loadavg_before_after": [load_before, load_after],
                                         "notes_md": {"memory_per_queued_job": NOTES_MEMORY_PER_QUEUED_JOB,
                                                      "enqueue_per_s": NOTES_ENQUEUE_PER_S,
                                                      "evalsha_per_s": NOTES_EVALSHA_PER_S}}, indent=2))
    return 0


def code_version() -> str:
    """The commit of the mc_queue checkout this ran against, and whether its tracked files had local edits."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
                                "mc_queue", "lua"], capture_output=True, text=True, check=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{head}{' + uncommitted edits in mc_queue/ or lua/' if dirty else ''}"


def _has_hiredis() -> bool:
    return importlib.util.find_spec("hiredis") is not None


if __name__ == "__main__":
    sys.exit(main())

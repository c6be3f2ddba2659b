"""Worker benchmark: bare RQ against mc_queue on RQ, same worker class, real worker processes.

Run from the repository root::

    .venv/bin/python bench/bench_workers.py [--jobs 2000] [--repeat 3] [--kinds fork,simple] [--workers 1,2]
                                            [--json out.json] [--fsync everysec|always]

For each (worker kind, worker count) and each repeat, on one private redis-server started here
(``mc_queue.testing.RedisServer`` in a temporary folder, never the machine's Redis on port 6379):

1. bare RQ: ``--jobs`` no-op jobs (``bench.noop_jobs.noop``, JSONSerializer) are enqueued, then drained
   by ``rq worker --burst`` processes (``rq.Worker`` for fork, ``rq.SimpleWorker`` for simple, their command
   channel's thread woken every 0.2 s like mc_queue's: ``bench/rq_baseline.py``);
2. mc_queue: ``--jobs`` no-op Attempts (``bench.noop_app``) are enqueued with ``AppClient.enqueue``
   (which also dispatches the RQ job), then drained by ``mcq worker --burst --kind fork|simple``
   processes; every task must end succeeded with exactly one Attempt.

Rates are jobs per second of wall time from starting the workers until the last one exits (enqueue
excluded), medians of ``--repeat``; an empty-queue drain per run measures worker start and exit, so a
second rate excludes it. ``INFO commandstats`` deltas give Redis commands per job, and an untimed
sample counts the requests (round trips) the worker processes write. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import redis
from rq import Queue
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so that `bench.noop_app` imports when run as bench/bench_workers.py
    sys.path.insert(0, str(ROOT))

from mc_queue.producer.transport import rq_queue_name  # noqa: E402
from mc_queue.store.scripts import specs  # noqa: E402
from mc_queue.testing import RedisServer, unique_prefix  # noqa: E402

GOAL_RATIO = 0.85
RQ_QUEUE = "bench-rq"
NOOP_FUNC = "bench.noop_jobs.noop"
APP_SPEC = "bench.noop_app:app"
# bare RQ's classes, their command channel woken as often as mc_queue's (bench/rq_baseline.py); batch: mcq's own
RQ_WORKER_CLASS = {"fork": "bench.rq_baseline.Worker", "simple": "bench.rq_baseline.SimpleWorker",
                   "batch": "bench.rq_baseline.SimpleWorker"}
SYSTEMS = ("rq", "mcq")
LABEL = {"rq": "RQ", "mcq": "mc_queue"}
# What mc_queue.producer.dispatch.dispatch passes to RQ for every Attempt (App default timeout_s is 3600).
MCQ_RQ_JOB_OPTIONS: dict[str, Any] = {"result_ttl": 0, "failure_ttl": 7 * 86400, "timeout": 3600}
# /work/shared/NOTES.md, "Baseline throughput measured here".
NOTES_RQ = {("fork", 1): 100, ("fork", 2): 153, ("simple", 1): 322, ("simple", 2): 588}

# Loaded by every worker process of the round-trip sample (PYTHONPATH): logs each request redis-py
# writes (one line per send_packed_command; a pipeline is one request), with the command names in it.
# One file per pid, written with os.write, so RQ's forked work horses (which leave by os._exit) lose nothing.
RT_HOOK = r'''
import os

_DIR = os.environ.get("MCQ_BENCH_RT_DIR")
if _DIR:
    import redis.connection as _rc

    _orig = _rc.AbstractConnection.send_packed_command
    _state = {"pid": None, "fd": None}
    _SUB = {b"client", b"script", b"config", b"object", b"xinfo", b"function", b"command"}

    def _names(command):
        if isinstance(command, str):
            data = command.encode()
        elif isinstance(command, (bytes, bytearray, memoryview)):
            data = bytes(command)
        else:
            data = b"".join(bytes(c) if not isinstance(c, str) else c.encode() for c in command)
        out, i, n = [], 0, len(data)
        while i < n and data[i:i + 1] == b"*":
            j = data.index(b"\r\n", i)
            count, i = int(data[i + 1:j]), j + 2
            parts = []
            for k in range(count):
                j = data.index(b"\r\n", i)
                length, i = int(data[i + 1:j]), j + 2
                if k < 2:
                    parts.append(data[i:i + length])
                i += length + 2
            name = parts[0].lower() if parts else b"?"
            if name in _SUB and len(parts) > 1:
                name += b"|" + parts[1].lower()
            elif name == b"evalsha" and len(parts) > 1:
                name += b":" + parts[1][:12]
            out.append(name.decode("ascii", "replace"))
        return out

    def _counting(self, command, check_health=True):
        pid = os.getpid()
        if _state["pid"] != pid:
            _state["pid"] = pid
            _state["fd"] = os.open(os.path.join(_DIR, f"{pid}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(_state["fd"], (" ".join(_names(command)) + "\n").encode())
        except Exception:
            pass
        return _orig(self, command, check_health)

    _rc.AbstractConnection.send_packed_command = _counting
'''


# --------------------------------------------------------------------------- small helpers


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return float(statistics.median(xs)) if xs else float("nan")


def cmdstats(admin: redis.Redis) -> dict[str, int]:
    """INFO commandstats as {command: calls} (Redis 7 also counts commands run inside Lua); INFO left out."""
    out = {}
    for name, v in admin.info("commandstats").items():
        cmd = name.removeprefix("cmdstat_")
        if cmd != "info":
            out[cmd] = int(v["calls"])
    return out


def server_cpu(admin: redis.Redis) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def machine_busy_s() -> float | None:
    """CPU seconds the whole machine spent busy so far (/proc/stat), or None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def reset_server(admin: redis.Redis) -> None:
    """Empty the server and compact its AOF, so no rewrite starts in the middle of a timed drain."""
    admin.flushall()
    info = admin.info("persistence")
    if int(info.get("aof_enabled", 0)):
        while admin.info("persistence").get("aof_rewrite_in_progress"):
            time.sleep(0.05)
        admin.bgrewriteaof()
        time.sleep(0.05)
        while True:
            p = admin.info("persistence")
            if not p.get("aof_rewrite_in_progress") and not p.get("aof_rewrite_scheduled"):
                break
            time.sleep(0.05)


def script_names() -> dict[str, str]:
    """sha1 prefix (12 hex) of each mc_queue script -> its name, to label EVALSHA calls."""
    return {hashlib.sha1(s.source.encode()).hexdigest()[:12]: s.name for s in specs().values()}


# --------------------------------------------------------------------------- worker processes


class Bench:
    def __init__(self, args: argparse.Namespace, server: RedisServer, tmp: Path) -> None:
        self.args = args
        self.server = server
        self.url = server.url
        self.tmp = tmp
        self.admin = redis.Redis.from_url(self.url, decode_responses=True)
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.hook_dir = tmp / "hook"
        self.hook_dir.mkdir()
        (self.hook_dir / "sitecustomize.py").write_text(RT_HOOK)
        self.home = tmp / "mcq-home"
        self.home.mkdir()
        self.run_no = 0
        noop_app = importlib.import_module("bench.noop_app")
        self.app = noop_app.app
        self.mcq_queue: str = noop_app.QUEUE
        self.handler: str = noop_app.HANDLER
        self.prefix = unique_prefix("bw")

    # -- environment and command lines

    def env(self, rt_dir: Path | None = None, stamp_dir: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("MCQ_REDIS_URL", "MCQ_PREFIX", "PYTHONPATH", "MCQ_BENCH_STAMP_DIR", "MCQ_BENCH_RT_DIR")}
        env["MCQ_HOME"] = str(self.home)
        if stamp_dir is not None:
            env["MCQ_BENCH_STAMP_DIR"] = str(stamp_dir)
        if rt_dir is not None:
            env["PYTHONPATH"] = str(self.hook_dir)
            env["MCQ_BENCH_RT_DIR"] = str(rt_dir)
        return env

    def command(self, system: str, kind: str) -> list[str]:
        py = sys.executable
        if system == "rq":
            return [py, "-m", "rq.cli", "worker", "--burst", "--url", self.url, "--serializer", "json",
                    "--worker-class", RQ_WORKER_CLASS[kind], "--path", str(ROOT), "--logging_level", "WARNING",
                    RQ_QUEUE]
        return [py, "-m", "mc_queue", "--redis-url", self.url, "--prefix", self.prefix, "worker", "--app", APP_SPEC,
                "--burst", "--kind", kind, "--queue", self.mcq_queue, "--workspace-root", str(self.tmp / "ws"),
                "--log-level", "WARNING", *(["--batch", str(self.args.batch)] if kind == "batch" else [])]

    # -- enqueue (never timed) and verification

    def enqueue(self, system: str, n: int) -> list[str]:
        if system == "rq":
            conn = redis.Redis.from_url(self.url)
            q = Queue(RQ_QUEUE, connection=conn, serializer=JSONSerializer)
            opts = {} if self.args.rq_defaults else MCQ_RQ_JOB_OPTIONS
            ids = [q.enqueue_call(func=NOOP_FUNC, **opts).id for _ in range(n)]
            conn.close()
            return ids
        self.prefix = unique_prefix("bw")  # a fresh namespace for every mc_queue drain
        ac = self.app.connect(self.url, prefix=self.prefix)
        try:
            return [ac.enqueue(self.handler, {"i": i}).id for i in range(n)]
        finally:
            ac.close()

    def verify(self, system: str, ids: list[str], handler_calls: int | None = None) -> dict[str, Any]:
        conn = redis.Redis.from_url(self.url)
        name = RQ_QUEUE if system == "rq" else rq_queue_name(self.prefix, self.mcq_queue)
        q = Queue(name, connection=conn, serializer=JSONSerializer)
        out: dict[str, Any] = {"rq_left_in_queue": q.count, "rq_failed": FailedJobRegistry(queue=q).count,
                               "rq_started": StartedJobRegistry(queue=q).count}
        problems = [f"{k}={v}" for k, v in out.items() if v]
        if handler_calls is not None:
            out["handler_calls"] = handler_calls
            if handler_calls != len(ids):
                problems.append(f"the no-op ran {handler_calls} times for {len(ids)} jobs")
        if system == "rq" and not self.args.rq_defaults:
            left = sum(1 for _ in conn.scan_iter("rq:job:*", count=1000))
            out["rq_job_hashes_left"] = left  # result_ttl=0: a job that succeeded is deleted
            if left:
                problems.append(f"{left} RQ job hashes left (not succeeded)")
        if system == "mcq":
            import mc_queue

            client = mc_queue.connect(self.url, prefix=self.prefix)
            try:
                bad = []
                for tid in ids:
                    t = client.reads.get_task(tid)
                    if (t.state.value != "succeeded" or len(t.attempts) != 1
                            or t.attempts[0].state.value != "succeeded"):
                        bad.append(f"{tid}: {t.state.value}, {len(t.attempts)} attempt(s)")
                out["tasks_not_single_success"] = len(bad)
                if bad:
                    problems.append(f"{len(bad)} task(s) not succeeded with exactly one Attempt, e.g. {bad[:3]}")
            finally:
                client.close()
        conn.close()
        out["ok"] = not problems
        out["problems"] = problems
        if problems:
            print(f"  !! {LABEL[system]} verification failed: {'; '.join(problems)}", flush=True)
        return out

    # -- one drain: start the workers, wait until all exit

    def drain(self, system: str, kind: str, workers: int, n: int, *, rt_dir: Path | None = None,
              profile_to: Path | None = None) -> dict[str, Any]:
        self.run_no += 1
        cmd = self.command(system, kind)
        if profile_to is not None:
            cmd = [cmd[0], "-m", "cProfile", "-o", str(profile_to), *cmd[1:]]
        stamp_dir = self.tmp / f"stamps-{self.run_no:03d}"
        stamp_dir.mkdir()
        env = self.env(rt_dir, stamp_dir)
        timeout = 120 + 0.1 * n
        logs = [self.logs / f"{self.run_no:03d}-{system}-{kind}-{workers}-{i}.log" for i in range(workers)]
        s0, c0, w0, m0 = cmdstats(self.admin), server_cpu(self.admin), children_cpu(), machine_busy_s()
        procs: list[subprocess.Popen[bytes]] = []
        e0 = time.time()
        t0 = time.perf_counter()
        try:
            for log in logs:
                with open(log, "wb") as fh:
                    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT))
            for p in procs:
                p.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        wall = time.perf_counter() - t0
        e1 = e0 + wall
        s1, c1, w1, m1 = cmdstats(self.admin), server_cpu(self.admin), children_cpu(), machine_busy_s()
        calls = delta(s1, s0)
        rcs = [p.returncode for p in procs]
        if any(rcs):
            for log, rc in zip(logs, rcs, strict=True):
                if rc:
                    tail = log.read_text(errors="replace").splitlines()[-15:]
                    print(f"  !! worker exited {rc}; {log}:\n    " + "\n    ".join(tail), flush=True)
        worker_cpu, redis_cpu = w1 - w0, c1 - c0
        other = None if m0 is None or m1 is None else max(0.0, (m1 - m0) - worker_cpu - redis_cpu) / wall
        stamps = sorted(float(x) for f in stamp_dir.glob("*.stamps") for x in f.read_text().split())
        shutil.rmtree(stamp_dir, ignore_errors=True)
        out: dict[str, Any] = {
            "wall_s": wall, "calls": calls, "total_calls": sum(calls.values()),
            "evalsha": calls.get("evalsha", 0) + calls.get("eval", 0), "worker_cpu_s": worker_cpu,
            "redis_cpu_s": redis_cpu, "other_cpus": other, "returncodes": rcs, "handler_calls": len(stamps)}
        if len(stamps) >= 2:
            out.update(first_job_after_s=stamps[0] - e0, exit_after_last_job_s=e1 - stamps[-1],
                       steady_s=stamps[-1] - stamps[0], rate_steady=(len(stamps) - 1) / (stamps[-1] - stamps[0]))
        return out

    def run_pair_member(self, system: str, kind: str, workers: int, n: int) -> dict[str, Any]:
        """Empty-queue drain (worker start and exit only), then enqueue n and drain them."""
        reset_server(self.admin)
        if system == "mcq":
            self.prefix = unique_prefix("bw")
        empty = self.drain(system, kind, workers, 0)
        reset_server(self.admin)
        ids = self.enqueue(system, n)
        full = self.drain(system, kind, workers, n)
        check = self.verify(system, ids, full["handler_calls"])
        res = {
            "system": system, "kind": kind, "workers": workers, "n": n, "empty": empty, "full": full,
            "verify": check,
            "rate": n / full["wall_s"],
            "rate_steady": full.get("rate_steady", float("nan")),
            "calls_per_job": full["total_calls"] / n,
            "calls_per_job_net": (full["total_calls"] - empty["total_calls"]) / n,
            "evalsha_per_job": full["evalsha"] / n,
            "evalsha_per_job_net": (full["evalsha"] - empty["evalsha"]) / n,
            "worker_cpu_ms_per_job": 1000 * (full["worker_cpu_s"] - empty["worker_cpu_s"]) / n,
            "redis_cpu_us_per_job": 1e6 * (full["redis_cpu_s"] - empty["redis_cpu_s"]) / n,
        }
        print(f"  {LABEL[system]:8s} {kind:6s} x{workers}: {res['rate']:7.1f}/s wall "
              f"({full['wall_s']:.2f} s; first job after {full.get('first_job_after_s', 0):.2f} s, exit "
              f"{full.get('exit_after_last_job_s', 0):.2f} s after the last; steady {res['rate_steady']:7.1f}/s), "
              f"{res['calls_per_job_net']:.1f} cmds/job, other CPU {fmt_opt(full['other_cpus'], '.2f')}",
              flush=True)
        return res

    # -- round trips: an untimed sample with the request-logging hook

    def round_trips(self, system: str, kind: str, n: int) -> dict[str, Any]:
        counts = []
        for size in (0, n):
            reset_server(self.admin)
            if system == "mcq":
                self.prefix = unique_prefix("bw")
            ids = self.enqueue(system, size) if size else []
            rt_dir = self.tmp / f"rt-{system}-{kind}-{size}"
            rt_dir.mkdir()
            d = self.drain(system, kind, 1, size, rt_dir=rt_dir)
            if size:
                self.verify(system, ids, d["handler_calls"])
            requests = [line.split() for f in sorted(rt_dir.glob("*.log")) for line in f.read_text().splitlines()]
            counts.append({"requests": len(requests), "commands": sum(len(r) for r in requests),
                           "by_command": Counter(c for r in requests for c in r),
                           "by_request": Counter(request_label(r) for r in requests),
                           "server_calls": d["total_calls"], "server_by_command": d["calls"],
                           "processes": len(list(rt_dir.glob("*.log")))})
        empty, full = counts

        def per(key: str) -> float:
            return (full[key] - empty[key]) / n

        def per_counter(key: str) -> dict[str, float]:
            names = set(full[key]) | set(empty[key])
            return {k: (full[key][k] - empty[key][k]) / n for k in names if full[key][k] - empty[key][k]}

        # Per command name, Redis counts what the workers sent plus what Lua ran; a command Redis does not
        # know (redis-py 8 sends CLIENT MAINT_NOTIFICATIONS, unknown to 7.0) is refused and not counted.
        sent = per_counter_server(normalize(full["by_command"]), normalize(empty["by_command"]), n)
        server = per_counter_server(full["server_by_command"], empty["server_by_command"], n)
        names = set(sent) | set(server)
        lua = sum(max(0.0, server.get(c, 0) - sent.get(c, 0)) for c in names)
        refused = sum(max(0.0, sent.get(c, 0) - server.get(c, 0)) for c in names)
        return {"system": system, "kind": kind, "n": n, "round_trips_per_job": per("requests"),
                "toplevel_commands_per_job": per("commands"), "server_commands_per_job": per("server_calls"),
                "lua_inner_commands_per_job": lua, "refused_commands_per_job": refused,
                "processes_per_job": per("processes"),
                "by_command": per_counter("by_command"), "by_request": per_counter("by_request"),
                "server_by_command": per_counter_server(full["server_by_command"], empty["server_by_command"], n)}

    # -- run_attempt's steps one by one, in this process, without a profiler

    def steps(self, n: int) -> dict[str, float]:
        """Time the steps mc_queue.worker.attempt.run_attempt takes for a no-op Attempt, each on its own (us/Attempt).

        Same calls as run_attempt (claim with expect_attempt, get_task, Context with a lazy workspace that a
        no-op never creates, heartbeat registration, handler, unregistration, complete without parsing).
        """
        import functools

        from mc_queue.worker.context import Context
        from mc_queue.worker.workspace import WorkspaceRoot

        reset_server(self.admin)
        self.prefix = unique_prefix("bw")
        ac = self.app.connect(self.url, prefix=self.prefix)
        client = ac.client
        spec = self.app.spec(self.handler)
        ids = [ac.enqueue(self.handler, {"i": i}).id for i in range(n)]
        ws = WorkspaceRoot(self.tmp / "ws-steps", namespace=self.prefix)
        t: Counter[str] = Counter()
        pc = time.perf_counter
        ping0 = pc()
        for _ in range(n):
            client.writer.ping()
        t["(one PING round trip, for scale)"] = pc() - ping0
        start = pc()
        for tid in ids:
            aid = f"{tid}/1"
            t0 = pc()
            lease = client.leases.claim_attempt(tid, "bench-steps", lease_ms=spec.lease_ms, expect_attempt=1)
            t1 = pc()
            task = client.reads.get_task(tid)
            t2 = pc()
            ctx = Context(client, spec, task, task.attempts[0], lease.fence, "bench-steps",
                          functools.partial(ws.create, aid))
            t3 = pc()
            ctx.start_heartbeats(spec.lease_ms / 3000)
            t4 = pc()
            spec.fn(ctx, task.payload)
            t5 = pc()
            ctx.stop_heartbeats()
            t6 = pc()
            client.leases.complete_quietly(aid, lease.fence, None, worker_id="bench-steps")
            t7 = pc()
            t8 = t7
            for name, a, b in (("claim_attempt (EVALSHA claim)", t0, t1),
                               ("get_task (pipeline HGETALL x2 + XRANGE, pydantic Task)", t1, t2),
                               ("Context (lazy workspace, not created by a no-op)", t2, t3),
                               ("heartbeat registration (one thread per process)", t3, t4),
                               ("handler (no-op)", t4, t5),
                               ("heartbeat unregistration", t5, t6),
                               ("complete (EVALSHA complete, reply not parsed)", t6, t7),
                               ("workspace remove (none created)", t7, t8)):
                t[name] += b - a
        t["total of the steps"] = pc() - start
        ac.close()
        return {k: 1e6 * v / n for k, v in t.items()}

    # -- cProfile of one drain (worker process of the given kind)

    def profile(self, system: str, kind: str, n: int) -> dict[str, Any]:
        reset_server(self.admin)
        ids = self.enqueue(system, n)
        out = self.tmp / f"profile-{system}-{kind}.pstats"
        d = self.drain(system, kind, 1, n, profile_to=out)
        self.verify(system, ids, d["handler_calls"])
        return {"system": system, "kind": kind, "n": n, "wall_s": d["wall_s"], "stats": load_profile(out, n)}


def normalize(counter: Counter[str]) -> Counter[str]:
    """Client-side command names as Redis's commandstats spells them (EVALSHA without the script)."""
    out: Counter[str] = Counter()
    for name, v in counter.items():
        out[name.split(":", 1)[0]] += v
    return out


def per_counter_server(full: dict[str, int], empty: dict[str, int], n: int) -> dict[str, float]:
    names = set(full) | set(empty)
    return {k: (full.get(k, 0) - empty.get(k, 0)) / n for k in names if full.get(k, 0) - empty.get(k, 0)}


def request_label(names: list[str]) -> str:
    """One request: its command, or the commands of its pipeline (MULTI/EXEC left out, repeats collapsed)."""
    if len(names) == 1:
        return names[0]
    inner: list[str] = []
    for c in names:
        if c in ("multi", "exec"):
            continue
        if not inner or inner[-1] != c:
            inner.append(c)
    tx = "tx" if names[0] == "multi" else "pipe"
    label = "+".join(inner)
    return f"{tx}[{label[:70]}{'...' if len(label) > 70 else ''}]"


def code_version() -> str:
    """HEAD, plus a digest of the working tree's mc_queue/ and lua/ when they differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "mc_queue", "lua"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    if not dirty:
        return head
    h = hashlib.sha1()
    for path in sorted([*ROOT.glob("mc_queue/**/*.py"), *ROOT.glob("lua/**/*.lua")]):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return f"{head} + uncommitted changes in mc_queue/ or lua/ (tree digest {h.hexdigest()[:10]})"


def fmt_opt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


# --------------------------------------------------------------------------- profiles


CATEGORIES: list[tuple[str, Callable[[str, str], bool]]] = [
    ("socket I/O (incl. waiting for Redis)",
     lambda f, fn: f == "~" and ("_socket.socket" in fn or "select" in fn or "poll" in fn)),
    ("fork / wait / signals (os, signal)",
     lambda f, fn: f == "~" and any(s in fn for s in ("posix.fork", "posix.wait", "setitimer", "signal",
                                                      "posix._exit", "posix.kill"))),
    ("filesystem (mkdir, rmtree, stat, realpath)",
     lambda f, fn: (f == "~" and any(s in fn for s in ("posix.mkdir", "posix.rmdir", "posix.lstat", "posix.stat",
                                                       "posix.scandir", "posix.unlink", "posix.open",
                                                       "posix.readlink", "posix.close", "posix.getcwd")))
     or any(s in f for s in ("/shutil.py", "/pathlib.py", "/posixpath.py", "/genericpath.py"))),
    ("threads (start, join, locks, Event)",
     lambda f, fn: f.endswith("/threading.py") or (f == "~" and ("_thread" in fn or "lock" in fn))),
    ("pydantic", lambda f, fn: "/pydantic" in f or (f == "~" and "pydantic" in fn)),
    ("mc_queue (own Python code)", lambda f, fn: "/mc_queue/" in f),
    ("redis-py (own Python code)", lambda f, fn: "/redis/" in f),
    ("rq (own Python code)", lambda f, fn: "/rq/" in f),
    ("json / uuid / hashlib / datetime",
     lambda f, fn: any(s in f for s in ("/json/", "/uuid.py", "/_strptime.py")) or
     (f == "~" and any(s in fn for s in ("json", "hashlib", "_sha", "datetime", "uuid")))),
    ("logging", lambda f, fn: "/logging/" in f),
    ("imports and start-up", lambda f, fn: "<frozen" in f or "importlib" in f or "/click/" in f or
     "site-packages/rich" in f),
]


def categorize(filename: str, funcname: str) -> str:
    for name, match in CATEGORIES:
        if match(filename, funcname):
            return name
    return "other"


def load_profile(path: Path, n: int) -> dict[str, Any]:
    st = pstats.Stats(str(path))
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = st.stats  # type: ignore[attr-defined]
    cats: Counter[str] = Counter()
    funcs: dict[str, dict[str, float]] = {}
    for (filename, line, fn), (_cc, nc, tt, ct, _callers) in raw.items():
        cats[categorize(filename, fn)] += tt
        key = f"{short_path(filename)}:{line}({fn})" if filename != "~" else fn
        funcs[key] = {"calls_per_job": nc / n, "own_us_per_job": 1e6 * tt / n, "cum_us_per_job": 1e6 * ct / n}
    # RQ's exit joins its pubsub thread for up to 1 s (Worker.unsubscribe): a lock wait, not per-job work.
    unsub = sum(ct for (filename, _line, fn), (_cc, _nc, _tt, ct, _callers) in raw.items()
                if fn == "unsubscribe" and "/rq/" in filename)
    threads = "threads (start, join, locks, Event)"
    moved = min(unsub, cats[threads])
    cats[threads] -= moved
    cats["worker exit (RQ's pubsub thread join, up to 1 s per worker)"] += moved
    total = sum(cats.values())
    return {"total_us_per_job": 1e6 * total / n, "categories_us_per_job": {k: 1e6 * v / n for k, v in cats.items()},
            "functions": funcs}


def short_path(filename: str) -> str:
    for marker in ("/site-packages/", "/lib/python3.11/", str(ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


# --------------------------------------------------------------------------- report


def spread(xs: list[float], spec: str = ".0f") -> str:
    if not xs:
        return "-"
    med = format(median(xs), spec)
    if len(xs) == 1:
        return med
    return f"{med} [{format(min(xs), spec)}-{format(max(xs), spec)}]"


def render(data: dict[str, Any]) -> str:
    args = data["args"]
    runs = data["runs"]
    configs = [(k, w) for k in args["kinds"] for w in args["workers"]]

    def sel(system: str, kind: str, w: int) -> list[dict[str, Any]]:
        return [r for r in runs if r["system"] == system and r["kind"] == kind and r["workers"] == w]

    def ratios(kind: str, w: int, key: str) -> list[float]:
        by_rep: dict[int, dict[str, float]] = {}
        for r in runs:
            if r["kind"] == kind and r["workers"] == w:
                by_rep.setdefault(r["rep"], {})[r["system"]] = r[key]
        return [v["mcq"] / v["rq"] for v in by_rep.values() if "mcq" in v and "rq" in v and v["rq"] > 0]

    head = "| figure | " + " | ".join(f"{k} x{w}" for k, w in configs) + " |"
    lines = [head, "|" + "---|" * (len(configs) + 1)]

    def row(label: str, cell: Callable[[str, int], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(k, w) for k, w in configs) + " |")

    def val(system: str, key: str, spec: str = ".0f") -> Callable[[str, int], str]:
        return lambda k, w: spread([r[key] for r in sel(system, k, w)], spec)

    def diff(key: str, spec: str = ".1f") -> Callable[[str, int], str]:
        def cell(k: str, w: int) -> str:
            a, b = [r[key] for r in sel("rq", k, w)], [r[key] for r in sel("mcq", k, w)]
            return f"{median(b) - median(a):+{spec}}" if a and b else "-"
        return cell

    def ratio_cell(key: str) -> Callable[[str, int], str]:
        def cell(k: str, w: int) -> str:
            xs = ratios(k, w, key)
            if not xs:
                return "-"
            mark = "meets" if median(xs) >= GOAL_RATIO else "below"
            return f"**{spread(xs, '.2f')}** {mark}"
        return cell

    def ms_per_job(k: str, w: int) -> str:
        a, b = [r["rate_steady"] for r in sel("rq", k, w)], [r["rate_steady"] for r in sel("mcq", k, w)]
        if not (a and b):
            return "-"
        x, y = 1000 / median(a), 1000 / median(b)
        return f"{x:.2f} / {y:.2f} ({y - x:+.2f})"

    def full(system: str, key: str, spec: str = ".2f") -> Callable[[str, int], str]:
        return lambda k, w: spread([r["full"][key] for r in sel(system, k, w) if key in r["full"]], spec)

    row("RQ jobs/s (wall: workers start -> all exit)", val("rq", "rate"))
    row("mc_queue Attempts/s (same)", val("mcq", "rate"))
    row(f"**ratio mc_queue/RQ** (goal >= {GOAL_RATIO})", ratio_cell("rate"))
    row("RQ jobs/s, steady state (first job -> last job)", val("rq", "rate_steady"))
    row("mc_queue Attempts/s, steady state", val("mcq", "rate_steady"))
    row("**ratio, steady state**", ratio_cell("rate_steady"))
    row("ms per job, steady state: RQ / mc_queue (added)", ms_per_job)
    row("start -> first job, s: RQ", full("rq", "first_job_after_s"))
    row("start -> first job, s: mc_queue", full("mcq", "first_job_after_s"))
    row("last job -> all workers exited, s: RQ", full("rq", "exit_after_last_job_s"))
    row("last job -> all workers exited, s: mc_queue", full("mcq", "exit_after_last_job_s"))
    row("Redis commands/job, RQ (commandstats, incl. inside Lua)", val("rq", "calls_per_job_net", ".1f"))
    row("Redis commands/Attempt, mc_queue", val("mcq", "calls_per_job_net", ".1f"))
    row("commands added per Attempt", diff("calls_per_job_net"))
    row("EVALSHA/job: RQ", val("rq", "evalsha_per_job_net", ".2f"))
    row("EVALSHA/Attempt: mc_queue", val("mcq", "evalsha_per_job_net", ".2f"))
    row("worker CPU ms/job (all worker processes): RQ", val("rq", "worker_cpu_ms_per_job", ".2f"))
    row("worker CPU ms/Attempt: mc_queue", val("mcq", "worker_cpu_ms_per_job", ".2f"))
    row("redis-server CPU us/job: RQ", val("rq", "redis_cpu_us_per_job", ".0f"))
    row("redis-server CPU us/Attempt: mc_queue", val("mcq", "redis_cpu_us_per_job", ".0f"))
    row("other processes' CPU during drains (CPUs)", lambda k, w: spread(
        [r["full"]["other_cpus"] for r in sel("rq", k, w) + sel("mcq", k, w) if r["full"]["other_cpus"] is not None],
        ".2f"))
    row("NOTES.md RQ baseline jobs/s", lambda k, w: str(NOTES_RQ.get((k, w), "-")))
    out = ["## Throughput and Redis commands per job "
           f"({args['jobs']} jobs, medians of {args['repeat']} [min-max], appendfsync {args['fsync']})", "",
           *lines, ""]
    bad = [r for r in runs if not r["verify"]["ok"] or any(r["full"]["returncodes"])]
    out.append(f"Verification: {len(runs) - len(bad)}/{len(runs)} drains verified (RQ: queue and registries empty, "
               "every job deleted after success; mc_queue: every task succeeded with exactly one Attempt)."
               + (f" FAILED: {[(r['system'], r['kind'], r['workers'], r['rep']) for r in bad]}" if bad else ""))
    out.append("")

    if data.get("round_trips"):
        out += render_round_trips(data["round_trips"], data["script_names"])
    if data.get("steps"):
        st = data["steps"]
        rq_ms = [r["rate_steady"] for r in runs if r["system"] == "rq" and r["kind"] == "simple" and r["workers"] == 1]
        out += [f"## run_attempt's steps for a no-op Attempt, timed one by one in the benchmark process "
                f"(no profiler, {data['args']['steps']} Attempts)", "",
                "| step | us/Attempt |", "|---|---|"]
        out += [f"| {k} | {v:.0f} |" for k, v in st.items()]
        if rq_ms:
            out.append(f"| (for scale: bare RQ SimpleWorker, whole job, steady state above) | "
                       f"{1e6 / median(rq_ms):.0f} |")
        out.append("")
    if data.get("profiles"):
        out += render_profiles(data["profiles"])
    return "\n".join(out)


def render_round_trips(rts: list[dict[str, Any]], names: dict[str, str]) -> list[str]:
    def label(c: str) -> str:
        if c.startswith("evalsha:"):
            return f"evalsha ({names.get(c.split(':', 1)[1], c.split(':', 1)[1])})"
        return c

    kinds = sorted({r["kind"] for r in rts}, key=["fork", "simple", "batch"].index)
    out = [f"## Round trips per job (untimed sample of {rts[0]['n']} jobs, 1 worker, minus an empty-queue run)", ""]
    head = "| per job | " + " | ".join(f"{k}: RQ | {k}: mc_queue | {k}: added" for k in kinds) + " |"
    out += [head, "|" + "---|" * (1 + 3 * len(kinds))]

    def get(system: str, kind: str) -> dict[str, Any] | None:
        return next((r for r in rts if r["system"] == system and r["kind"] == kind), None)

    for key, title in [("round_trips_per_job", "round trips (requests written by redis-py; a pipeline is one)"),
                       ("toplevel_commands_per_job", "commands sent by the workers"),
                       ("lua_inner_commands_per_job", "commands run inside Lua scripts"),
                       ("refused_commands_per_job", "commands Redis refused as unknown (not in commandstats)"),
                       ("server_commands_per_job", "all commands (commandstats)"),
                       ("processes_per_job", "processes that talked to Redis")]:
        cells = []
        for k in kinds:
            a, b = get("rq", k), get("mcq", k)
            cells += [f"{a[key]:.2f}" if a else "-", f"{b[key]:.2f}" if b else "-",
                      f"{b[key] - a[key]:+.2f}" if a and b else "-"]
        out.append(f"| {title} | " + " | ".join(cells) + " |")
    out.append("")
    for k in kinds:
        a, b = get("rq", k), get("mcq", k)
        if not (a and b):
            continue
        out += [f"Requests mc_queue adds per Attempt ({k}), by request (|difference| >= 0.05):", "",
                "| request | RQ | mc_queue | added |", "|---|---|---|---|"]
        keys = set(a["by_request"]) | set(b["by_request"])
        rows = sorted(((b["by_request"].get(x, 0) - a["by_request"].get(x, 0), x) for x in keys),
                      key=lambda t: -abs(t[0]))
        for d, x in rows:
            if abs(d) >= 0.05:
                out.append(f"| `{label(x)}` | {a['by_request'].get(x, 0):.2f} | {b['by_request'].get(x, 0):.2f} "
                           f"| {d:+.2f} |")
        out += ["", f"Commands mc_queue adds per Attempt ({k}), as Redis counts them (|difference| >= 0.05):", "",
                "| command | RQ | mc_queue | added |", "|---|---|---|---|"]
        sa, sb = a["server_by_command"], b["server_by_command"]
        rows = sorted(((sb.get(x, 0) - sa.get(x, 0), x) for x in set(sa) | set(sb)), key=lambda t: -abs(t[0]))
        for d, x in rows:
            if abs(d) >= 0.05:
                out.append(f"| `{x}` | {sa.get(x, 0):.2f} | {sb.get(x, 0):.2f} | {d:+.2f} |")
        out.append("")
    return out


def render_profiles(profiles: list[dict[str, Any]]) -> list[str]:
    rq = next((p for p in profiles if p["system"] == "rq"), None)
    mcq = next((p for p in profiles if p["system"] == "mcq"), None)
    if not (rq and mcq):
        return []
    a, b = rq["stats"], mcq["stats"]
    out = [f"## cProfile of one {mcq['kind']}-worker drain ({mcq['n']} jobs, main thread of the worker process; "
           "the profiler inflates Python-heavy parts)", "",
           f"Profiled wall: RQ {1000 * rq['wall_s'] / rq['n']:.2f} ms/job, mc_queue "
           f"{1000 * mcq['wall_s'] / mcq['n']:.2f} ms/Attempt.", "",
           "| own time by area, us/job | RQ | mc_queue | added |", "|---|---|---|---|"]
    cats = sorted(set(a["categories_us_per_job"]) | set(b["categories_us_per_job"]),
                  key=lambda c: -(b["categories_us_per_job"].get(c, 0) - a["categories_us_per_job"].get(c, 0)))
    for c in cats:
        x, y = a["categories_us_per_job"].get(c, 0), b["categories_us_per_job"].get(c, 0)
        out.append(f"| {c} | {x:.0f} | {y:.0f} | {y - x:+.0f} |")
    out.append(f"| **total** | {a['total_us_per_job']:.0f} | {b['total_us_per_job']:.0f} | "
               f"{b['total_us_per_job'] - a['total_us_per_job']:+.0f} |")
    out += ["", "mc_queue's drain, top 25 by cumulative time (us per Attempt; start-up entries left out):", "",
            "| function | calls/Attempt | cum us | own us | in RQ's drain: cum us |", "|---|---|---|---|---|"]
    skip = ("<module>", "<built-in method builtins.exec>", "main", "invoke", "_run_module_as_main", "_run_code",
            "run", "runctx", "__call__", "new_func", "wrapper", "worker", "work", "_main", "_run_module_code")
    funcs = b["functions"]
    top = sorted(((v["cum_us_per_job"], k) for k, v in funcs.items()
                  if v["calls_per_job"] >= 0.5 and not any(k.endswith(f"({s})") or k == s for s in skip)),
                 reverse=True)[:25]
    for _, k in top:
        v = funcs[k]
        other = a["functions"].get(k)
        out.append(f"| `{k}` | {v['calls_per_job']:.1f} | {v['cum_us_per_job']:.0f} | {v['own_us_per_job']:.0f} | "
                   f"{other['cum_us_per_job']:.0f} |" if other else
                   f"| `{k}` | {v['calls_per_job']:.1f} | {v['cum_us_per_job']:.0f} | {v['own_us_per_job']:.0f} | - |")
    out += ["", "mc_queue's drain, top 15 by own time (us per Attempt):", "",
            "| function | calls/Attempt | own us | in RQ's drain: own us |", "|---|---|---|---|"]
    for _, k in sorted(((v["own_us_per_job"], k) for k, v in funcs.items()), reverse=True)[:15]:
        v = funcs[k]
        other = a["functions"].get(k)
        out.append(f"| `{k}` | {v['calls_per_job']:.1f} | {v['own_us_per_job']:.0f} | "
                   f"{other['own_us_per_job']:.0f} |" if other else
                   f"| `{k}` | {v['calls_per_job']:.1f} | {v['own_us_per_job']:.0f} | - |")
    out.append("")
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--jobs", type=int, default=2000, help="jobs (Attempts) per drain")
    p.add_argument("--repeat", type=int, default=3, help="repeats; figures are medians")
    p.add_argument("--kinds", default="fork,simple", help="worker kinds: fork (rq.Worker), simple (rq.SimpleWorker), "
                   "batch (mcq worker --kind batch, against bare rq.SimpleWorker)")
    p.add_argument("--batch", type=int, default=50, help="--kind batch: messages a batch worker takes at once")
    p.add_argument("--workers", default="1,2", help="numbers of worker processes")
    p.add_argument("--fsync", choices=["everysec", "always"], default="everysec", help="appendfsync of the server")
    p.add_argument("--sample", type=int, default=200, help="jobs in the round-trip sample (0 skips it)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                   help="cProfile one simple-worker drain of each system")
    p.add_argument("--profile-jobs", type=int, default=1000)
    p.add_argument("--steps", type=int, default=1000,
                   help="Attempts for the in-process timing of run_attempt's steps (0 skips it)")
    p.add_argument("--rq-defaults", action="store_true",
                   help="enqueue bare-RQ jobs with RQ's defaults (result_ttl 500 s, timeout 180 s) instead of the "
                        "options mc_queue's dispatch uses (result_ttl 0, failure_ttl 7 d, timeout 3600 s)")
    p.add_argument("--dir", default=None, help="parent of the temporary folder (default: the system's)")
    p.add_argument("--json", dest="json_out", default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    for k in args.kinds:
        if k not in RQ_WORKER_CLASS:
            p.error(f"unknown kind {k!r}: use fork and/or simple")
    if args.jobs < 1 or args.repeat < 1 or any(w < 1 for w in args.workers):
        p.error("--jobs, --repeat and --workers must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mcq-bench-workers-", dir=args.dir))
    server = RedisServer(tmp / "redis", appendfsync=args.fsync)
    started = time.time()
    data: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_start": os.getloadavg()},
        "code": code_version(), "hiredis": importlib.util.find_spec("hiredis") is not None,
        "script_names": script_names(), "runs": [], "round_trips": [], "profiles": [],
    }
    try:
        server.start()
        admin = server.client()
        data["machine"]["redis"] = admin.info("server")["redis_version"]
        admin.close()
        bench = Bench(args, server, tmp)
        print(f"redis-server {data['machine']['redis']} on port {server.port} (appendfsync {args.fsync}), "
              f"temp {tmp}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
        # Warm-up (untimed): first imports, script loading, page cache.
        for system in SYSTEMS:
            reset_server(bench.admin)
            ids = bench.enqueue(system, 50)
            d = bench.drain(system, "simple", 1, 50)
            bench.verify(system, ids, d["handler_calls"])
        for rep in range(args.repeat):
            print(f"repeat {rep + 1}/{args.repeat}", flush=True)
            for kind in args.kinds:
                for w in args.workers:
                    order = SYSTEMS if rep % 2 == 0 else SYSTEMS[::-1]
                    for system in order:
                        res = bench.run_pair_member(system, kind, w, args.jobs)
                        res["rep"] = rep
                        data["runs"].append(res)
        if args.sample:
            print(f"round-trip sample ({args.sample} jobs, 1 worker)", flush=True)
            for kind in args.kinds:
                for system in SYSTEMS:
                    data["round_trips"].append(bench.round_trips(system, kind, args.sample))
        if args.steps:
            print(f"timing run_attempt's steps in this process ({args.steps} Attempts)", flush=True)
            data["steps"] = bench.steps(args.steps)
        if args.profile:
            print(f"profiling one simple-worker drain of each ({args.profile_jobs} jobs)", flush=True)
            for system in SYSTEMS:
                data["profiles"].append(bench.profile(system, "simple", args.profile_jobs))
        data["machine"]["loadavg_end"] = os.getloadavg()
        data["script_names"].update(script_names())  # lua/ may have changed during a long run
        data["elapsed_s"] = time.time() - started
        report = render(data)
        print()
        print(report)
        print(f"(took {data['elapsed_s']:.0f} s; load average at start {data['machine']['loadavg_start'][0]:.2f}, "
              f"at end {data['machine']['loadavg_end'][0]:.2f}; Python {platform.python_version()}, "
              f"redis-server {data['machine']['redis']}; hiredis: {'yes' if data['hiredis'] else 'no'}; "
              f"code {data['code']})")
        if args.json_out:
            for p in data["profiles"]:  # keep the JSON readable: only the functions that matter
                funcs = p["stats"]["functions"]
                keep = sorted(funcs, key=lambda k: -funcs[k]["cum_us_per_job"])[:200]
                p["stats"]["functions"] = {k: funcs[k] for k in keep}
            Path(args.json_out).write_text(json.dumps(data, indent=2, default=str))
            print(f"wrote {args.json_out}")
        return 0
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

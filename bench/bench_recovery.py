"""Recovery benchmark: from a worker's SIGKILL to the recorded decision, mc_queue next to RQ 3.0.

Run from the repository root::

    .venv/bin/python bench/bench_recovery.py [--runs 20] [--rq-runs 1] [--rq-timeout-s 900] [--rq-fast]
                                             [--rq-settings default|fast|both] [--json out.json]

One private redis-server (``mc_queue.testing.RedisServer`` in a temporary folder, never the machine's
Redis on port 6379) and one in-process ``ForgeServer`` (a local HTTP pull-request API) serve both
systems.

mc_queue, at its defaults (lease ``DEFAULT_LEASE_MS`` = 10 s renewed every third by the worker's
heartbeat thread, the App's retry policy, one ``mcq sweeper --app bench.recovery_app:app`` process
at its 1 s interval, shared by every run). Each of ``--runs`` runs, one after the other (each after a
random pause of up to one sweep interval, so the kill lands at a random point of the sweeper's cycle),
with its own task: enqueue ``bench.recovery_app``'s handler, start one real worker process (``python -m mc_queue
... worker --kind simple``), wait until the handler wrote its pid file (its pull request is open and
the receipt recorded), SIGKILL the worker's process group and note the time (``time.time()``), then
wait for the task's ``attempt_reconciled`` event for Attempt 1. Recovery time = that event's stream
time (Redis's clock, ms) minus the kill time: both are the wall clock of this machine. A fresh worker
then runs Attempt 2 (dispatched by the sweeper after the policy's backoff), which must replay the
recorded receipt; at the end the forge must hold exactly one pull request per operation key.

RQ, in the same run (in background threads while the mc_queue runs go on; RQ's side only waits):
a plain RQ job (``bench.recovery_app.rq_hang``, JSONSerializer) writes its pid and sleeps; its
worker's process group is SIGKILLed; a second, non-burst ``rq worker`` is started on the queue and
the registries are polled until RQ moves the job to its FailedJobRegistry (AbandonedJobError). That
happens only in a worker's registry maintenance (``StartedJobRegistry.cleanup``) after the job's
execution entry expired, so with RQ's defaults it takes ~810 s: see ``rq_expected_detection_s``.
``--rq-fast`` changes the few settings RQ exposes to their floor and says which.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
from rq import Queue
from rq.defaults import (
    DEFAULT_JOB_MONITORING_INTERVAL,
    DEFAULT_MAINTENANCE_TASK_INTERVAL,
    DEFAULT_WORKER_TTL,
)
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so that `bench.recovery_app` imports when run as bench/bench_recovery.py
    sys.path.insert(0, str(ROOT))

from mc_queue.client import DEFAULT_LEASE_MS  # noqa: E402
from mc_queue.contracts.history import history  # noqa: E402
from mc_queue.testing import ForgeServer, RedisServer, unique_prefix  # noqa: E402

APP_SPEC = "bench.recovery_app:app"
GOAL_P95_MS = 12_000
# Issue 17's goals when the process running the Attempt dies and its parent lives to see it: a fork
# worker's work horse (the worker's RQ monitor) and a SimpleWorker of a --pool (the pool's watch).
GOALS = {"group": ("p95", 95, GOAL_P95_MS), "horse": ("p95", 95, 50), "pool-child": ("p99", 99, 250)}
RQ_WORKER_CLASS = {"fork": "bench.rq_baseline.Worker", "simple": "bench.rq_baseline.SimpleWorker"}
RQ_DEFAULT_JOB_TIMEOUT = Queue.DEFAULT_TIMEOUT  # 180 s
# RQ adds a fixed 60 s to every execution heartbeat TTL (BaseWorker/SimpleWorker.get_heartbeat_ttl);
# no setting changes it, so it is the floor of RQ's detection.
RQ_HEARTBEAT_GRACE_S = 60
# What --rq-fast sets. The job timeout: the job is killed ~0.1 s after it starts, so 5 s never fires;
# shorter would only shave seconds off the hard-coded 60 s grace. The observer's worker TTL: the
# maintenance check runs only between two blocking dequeues of max(1, worker_ttl - 15) s each.
RQ_FAST = {"job_timeout_s": 5, "maintenance_interval_s": 1, "worker_ttl_s": 16}
NOTES_FIELD = "BullMQ 6.7: 57 s, RQ 3.0: 810 s, arq: 307 s, Celery: ~1 h (their defaults; each re-ran the job)"


# --------------------------------------------------------------------------- helpers


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (an observed value): p95 of 20 runs is the 19th smallest."""
    s = sorted(xs)
    if not s:
        return float("nan")
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def stream_ms(entry_id: str) -> int:
    return int(str(entry_id).split("-")[0])


def wait_for_pid(path: Path, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return int(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode} before the job started; see {log}:\n"
                               + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))
        time.sleep(0.005)
    raise RuntimeError(f"no pid file {path} after {timeout:.0f} s; see {log}")


def kill_group(proc: subprocess.Popen[bytes], pid: int) -> float:
    """SIGKILL the worker's whole process group (it runs in a session of its own); returns the time."""
    pgid = os.getpgid(pid)
    if pgid != proc.pid:
        raise RuntimeError(f"the job ran in pid {pid} (group {pgid}), outside the worker's group {proc.pid}")
    os.killpg(proc.pid, signal.SIGKILL)
    t = time.time()
    proc.wait(10)
    return t


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Warm shutdown (SIGTERM) of a worker or sweeper this benchmark started; SIGKILL if it hangs."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# --------------------------------------------------------------------------- RQ settings


@dataclass
class RqSettings:
    mode: str  # "default" | "fast"
    kind: str  # "simple" (rq.SimpleWorker) | "fork" (rq.Worker)
    job_timeout_s: int = RQ_DEFAULT_JOB_TIMEOUT
    maintenance_interval_s: int = DEFAULT_MAINTENANCE_TASK_INTERVAL
    worker_ttl_s: int = DEFAULT_WORKER_TTL

    @classmethod
    def make(cls, mode: str, kind: str) -> RqSettings:
        return cls(mode, kind, **RQ_FAST) if mode == "fast" else cls(mode, kind)

    def heartbeat_ttl_s(self) -> int:
        """How long after its last heartbeat a killed worker's job stays in the StartedJobRegistry."""
        if self.kind == "simple":  # SimpleWorker: timeout + 60, set once at start, never renewed
            return self.job_timeout_s + RQ_HEARTBEAT_GRACE_S
        return min(self.job_timeout_s, DEFAULT_JOB_MONITORING_INTERVAL) + RQ_HEARTBEAT_GRACE_S

    def dequeue_timeout_s(self) -> int:
        return max(1, self.worker_ttl_s - 15)

    def expected_detection_s(self) -> float:
        """When the observer (started right after the kill, ~ when the job started) first cleans the
        registries after the job's entry expired: it cleans at start, then checks between blocking
        dequeues of dequeue_timeout s and cleans once more than maintenance_interval s have passed."""
        ttl, d, m = self.heartbeat_ttl_s(), self.dequeue_timeout_s(), self.maintenance_interval_s
        last = t = 0.0
        while True:
            t += d
            if t - last > m:
                last = t
                if t >= ttl:
                    return t

    def observer_args(self) -> list[str]:
        if self.mode == "default":
            return []
        return ["--maintenance-interval", str(self.maintenance_interval_s), "--worker-ttl", str(self.worker_ttl_s)]

    def describe(self) -> str:
        cls = RQ_WORKER_CLASS[self.kind]
        base = (f"`{cls}`, JSONSerializer, job timeout {self.job_timeout_s} s, observer maintenance interval "
                f"{self.maintenance_interval_s} s, worker_ttl {self.worker_ttl_s} s (dequeue timeout "
                f"{self.dequeue_timeout_s()} s), job_monitoring_interval {DEFAULT_JOB_MONITORING_INTERVAL} s")
        if self.mode == "default":
            return f"RQ defaults: {base}"
        return (f"fast: enqueue `timeout={self.job_timeout_s}` (default {RQ_DEFAULT_JOB_TIMEOUT}), observer "
                f"`rq worker --maintenance-interval {self.maintenance_interval_s} --worker-ttl {self.worker_ttl_s}` "
                f"(defaults {DEFAULT_MAINTENANCE_TASK_INTERVAL}, {DEFAULT_WORKER_TTL}); {base}")


# --------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, args: argparse.Namespace, server: RedisServer, forge: ForgeServer, tmp: Path) -> None:
        self.args = args
        self.url = server.url
        self.forge = forge
        self.tmp = tmp
        self.logs = tmp / "logs"
        self.pids = tmp / "pids"
        self.logs.mkdir()
        self.pids.mkdir()
        self.home = tmp / "mcq-home"
        self.home.mkdir()
        self.prefix = unique_prefix("br")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.lock = threading.Lock()
        mod = importlib.import_module("bench.recovery_app")  # after MCQ_BENCH_FORGE is set
        self.handler: str = mod.HANDLER
        self.rq_func: str = mod.RQ_FUNC
        self.ac = mod.app.connect(self.url, prefix=self.prefix)
        self.client = self.ac.client
        self.sweeper: subprocess.Popen[bytes] | None = None
        self.rng = random.Random(args.seed)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("MCQ_REDIS_URL", "MCQ_PREFIX", "PYTHONPATH")}
        env["MCQ_HOME"] = str(self.home)
        env["MCQ_BENCH_FORGE"] = self.forge.url
        env["MCQ_BENCH_LEASE_MS"] = str(self.args.lease_ms)
        return env

    def spawn(self, cmd: list[str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.logs / f"{name}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env(), stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        with self.lock:
            self.procs.append(proc)
        return proc, log

    def mcq(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "mc_queue", "--redis-url", self.url, "--prefix", self.prefix, *argv]

    def mcq_worker(self, pool: bool = False) -> list[str]:
        return self.mcq("worker", "--app", APP_SPEC, "--kind", self.args.kind, *(["--pool", "2"] if pool else []),
                        "--workspace-root", str(self.tmp / "ws"), "--log-level", "WARNING")

    def start_sweeper(self) -> None:
        self.sweeper, _ = self.spawn(self.mcq("sweeper", "--app", APP_SPEC, "--interval",
                                              str(self.args.sweep_interval)), "sweeper")

    def check_sweeper(self) -> None:
        if self.sweeper is not None and self.sweeper.poll() is not None:
            raise RuntimeError(f"the sweeper exited with {self.sweeper.returncode}; see {self.logs / 'sweeper.log'}")

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)
        self.ac.close()

    # -- one mc_queue run

    def events(self, task_id: str) -> list[tuple[str, dict[str, str]]]:
        tk = self.client.keys.task(task_id)
        r = self.client.redis
        return history(r.hgetall(tk.task), r.lrange(tk.events, 0, -1), r.hgetall(tk.attempts))  # type: ignore[arg-type]

    def wait_event(self, task_id: str, typ: str, attempt: int, timeout: float) -> tuple[str, dict[str, str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for eid, f in self.events(task_id):
                if f.get("type") == typ and f.get("attempt") == str(attempt):
                    return eid, f
            self.check_sweeper()
            time.sleep(0.05)
        raise RuntimeError(f"no {typ} event for attempt {attempt} of {task_id} within {timeout:.0f} s")

    def mcq_run(self, i: int) -> dict[str, Any]:
        timeout = self.args.run_timeout_s
        # Each run follows the previous one's sweeper-paced steps, so without this pause every kill would
        # land at the same point of the sweeper's cycle; a real crash does not know the sweeper's phase.
        phase = self.rng.uniform(0, self.args.sweep_interval)
        time.sleep(phase)
        pid_file = self.pids / f"mcq-{i:03d}.pid"
        payload = {"head": f"recovery-{i:03d}", "pid_file": str(pid_file), "sleep_s": 3600}
        task = self.ac.enqueue(self.handler, payload)
        horse = self.args.kill in ("horse", "pool-child")
        victim, log = self.spawn(self.mcq_worker(pool=self.args.kill == "pool-child"), f"mcq-{i:03d}-attempt1")
        try:
            pid = wait_for_pid(pid_file, victim, timeout, log)
            # horse: only the work horse (the job's process), its worker lives on and sees it die; pool-child:
            # only the pool's SimpleWorker running the job, the pool lives on and sees it die
            if horse:
                os.kill(pid, signal.SIGKILL)
                t_kill = time.time()
            else:
                t_kill = kill_group(victim, pid)
        finally:
            if victim.poll() is None and not horse:  # it failed to start the job: leave no worker behind
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait(10)
        kill_ms = t_kill * 1000
        try:
            rec_id, rec = self.wait_event(task.id, "attempt_reconciled", 1, timeout)
        finally:
            if horse:
                stop(victim)
        # Attempt 2 on a fresh worker: it must replay the recorded receipt, not open a second PR.
        retry, _ = self.spawn(self.mcq_worker(), f"mcq-{i:03d}-attempt2")
        try:
            done_id, _ = self.wait_event(task.id, "attempt_succeeded", 2, timeout)
        finally:
            stop(retry)
        final = self.client.reads.get_task(task.id)
        evs = self.events(task.id)

        def first(typ: str, attempt: int) -> tuple[str, dict[str, str]] | None:
            return next(((e, f) for e, f in evs if f.get("type") == typ and f.get("attempt") == str(attempt)), None)

        claimed = first("attempt_claimed", 1)
        expired = first("lease_expired", 1)
        created2 = first("attempt_created", 2)
        replayed = first("effect_replayed", 2)
        keys = list(self.client.reads.effects(task.id))
        counts = self.forge.count_by_key()
        a1 = final.attempts[0]
        a2 = final.attempts[1] if len(final.attempts) > 1 else None
        out: dict[str, Any] = {
            "run": i, "task_id": task.id, "worker_pid": pid, "kill_time": t_kill, "phase_pause_s": phase,
            "recovery_ms": stream_ms(rec_id) - kill_ms,
            "claim_to_kill_ms": kill_ms - stream_ms(claimed[0]) if claimed else None,
            "lease_left_at_kill_ms": int(expired[1]["lease_exp"]) - kill_ms if expired else None,
            "sweep_lag_ms": int(expired[1].get("overdue_ms", 0)) if expired else None,
            "kill_to_expired_ms": stream_ms(expired[0]) - kill_ms if expired else None,
            "expired_to_reconciled_ms": stream_ms(rec_id) - stream_ms(expired[0]) if expired else None,
            "reconciled_to_attempt2_done_ms": stream_ms(done_id) - stream_ms(rec_id),
            "decision": rec.get("decision"), "outcome": rec.get("outcome"), "why": rec.get("why"),
            "backoff_ms": int(created2[1].get("delay_ms", 0)) if created2 else None,
            "attempt1_state": a1.state.value, "attempt2_state": a2.state.value if a2 else None,
            "task_state": final.state.value, "attempts": len(final.attempts),
            "effect_keys": keys, "prs_per_key": {k: counts.get(k, 0) for k in keys},
            "attempt2_replayed_receipt": replayed is not None,
            "pr_number": (a2.result or {}).get("pull_request") if a2 else None,
        }
        problems = []
        if rec.get("outcome") != "failed" or rec.get("decision") != "retry":
            problems.append(f"decision {rec.get('outcome')}/{rec.get('decision')}, expected failed/retry")
        if final.state.value != "succeeded" or len(final.attempts) != 2:
            problems.append(f"task {final.state.value} with {len(final.attempts)} attempts")
        if len(keys) != 1 or any(v != 1 for v in out["prs_per_key"].values()):
            problems.append(f"pull requests per key {out['prs_per_key']}")
        if replayed is None:
            problems.append("Attempt 2 did not replay the receipt")
        out["problems"] = problems
        return out

    # -- one RQ run (started in the main thread, waited for in a background thread)

    def rq_start(self, settings: RqSettings, n: int) -> dict[str, Any]:
        name = f"bench-recovery-rq-{settings.mode}-{n}-{uuid.uuid4().hex[:6]}"
        conn = redis.Redis.from_url(self.url)
        q = Queue(name, connection=conn, serializer=JSONSerializer)
        pid_file = self.pids / f"{name}.pid"
        opts: dict[str, Any] = {} if settings.mode == "default" else {"timeout": settings.job_timeout_s}
        job = q.enqueue_call(func=self.rq_func, args=(str(pid_file), 3600), **opts)
        base = [sys.executable, "-m", "rq.cli", "worker", "--url", self.url, "--serializer", "json",
                "--worker-class", RQ_WORKER_CLASS[settings.kind], "--path", str(ROOT), "--logging_level", "INFO"]
        victim, log = self.spawn([*base, name], f"{name}-victim")
        pid = wait_for_pid(pid_file, victim, self.args.run_timeout_s, log)
        t_kill = kill_group(victim, pid)
        observer, olog = self.spawn([*base, *settings.observer_args(), name], f"{name}-observer")
        t_observer = time.time()
        conn.close()
        return {"settings": settings, "queue": name, "job_id": job.id, "job_timeout": job.timeout, "pid": pid,
                "kill_time": t_kill, "observer_started": t_observer, "observer": observer, "observer_log": olog}

    def rq_wait(self, run: dict[str, Any], deadline: float) -> None:
        conn = redis.Redis.from_url(self.url)
        q = Queue(run["queue"], connection=conn, serializer=JSONSerializer)
        failed, started = FailedJobRegistry(queue=q), StartedJobRegistry(queue=q)
        try:
            while time.time() < deadline:
                if conn.zscore(failed.key, run["job_id"]) is not None:
                    seen = time.time()
                    last = conn.xrevrange(f"rq:results:{run['job_id']}", count=1)
                    job = Job.fetch(run["job_id"], connection=conn, serializer=JSONSerializer)
                    rid = last[0][0].decode() if last else None
                    result = job.latest_result()
                    run.update(detected=True, seen_at=seen,
                               detection_s=(stream_ms(rid) / 1000 if rid else seen) - run["kill_time"],
                               poll_detection_s=seen - run["kill_time"], status=str(job.get_status()),
                               exc_info=result.exc_string if result else None)
                    return
                time.sleep(0.25)
            members = [m.decode() for m in conn.zrange(started.key, 0, -1)]
            run.update(detected=False, waited_s=time.time() - run["kill_time"],
                       still_started=any(m.startswith(run["job_id"]) for m in members))
        finally:
            stop(run["observer"])
            conn.close()


# --------------------------------------------------------------------------- report


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "recovery_ms" in r]

    def stat(key: str) -> dict[str, float] | None:
        xs = [r[key] for r in ok if r.get(key) is not None]
        if not xs:
            return None
        return {"p50": statistics.median(xs), "p95": percentile(xs, 95), "max": max(xs), "min": min(xs)}

    dups = sum(max(0, n - 1) for r in ok for n in r["prs_per_key"].values())
    return {
        "runs": len(runs), "measured": len(ok), "problems": [(r["run"], r["problems"]) for r in runs if r["problems"]],
        "recovery_ms": stat("recovery_ms"), "claim_to_kill_ms": stat("claim_to_kill_ms"),
        "lease_left_at_kill_ms": stat("lease_left_at_kill_ms"), "sweep_lag_ms": stat("sweep_lag_ms"),
        "kill_to_expired_ms": stat("kill_to_expired_ms"), "expired_to_reconciled_ms": stat("expired_to_reconciled_ms"),
        "reconciled_to_attempt2_done_ms": stat("reconciled_to_attempt2_done_ms"),
        "backoff_ms": stat("backoff_ms"),
        "duplicates": dups, "prs": sum(sum(r["prs_per_key"].values()) for r in ok),
        "keys": sum(len(r["prs_per_key"]) for r in ok),
        "replayed": sum(1 for r in ok if r["attempt2_replayed_receipt"]),
        "dups_ok": dups == 0 and len(ok) == len(runs),
    }


def goal(data: dict[str, Any]) -> tuple[str, float, bool]:
    """The kill mode's goal: (percentile name, its value in ms, met)."""
    s = data["summary"]
    name, q, limit = GOALS[data["args"].get("kill", "group")]
    rec = [r["recovery_ms"] for r in data["runs"] if "recovery_ms" in r]
    value = percentile(rec, q)
    return name, value, bool(rec) and value <= limit and s["dups_ok"]


def render(data: dict[str, Any]) -> str:
    a = data["args"]
    s = data["summary"]
    r = s["recovery_ms"]
    lease_s = data["lease_ms"] / 1000
    lease_is = "`DEFAULT_LEASE_MS`" if data["lease_ms"] == DEFAULT_LEASE_MS else "`--lease-ms`, not the default"

    def ms(x: float) -> str:
        return f"{x:,.0f}"

    lines = ["## Recovery time: SIGKILL of a worker -> the decision recorded "
             f"({s['measured']}/{s['runs']} mc_queue runs)", "",
             "| system and settings | runs | kill -> decision p50 | p95 | max | duplicate effects | what happens "
             "to the job |", "|---|---|---|---|---|---|---|"]
    if r:
        lines.append(
            f"| mc_queue: lease {lease_s:g} s ({lease_is}, heartbeat every {lease_s / 3:.1f} s), sweeper "
            f"every {a['sweep_interval']:g} s, `--kind {a['kind']}` worker ({a.get('kill', 'group')} killed), killed "
            f"~{ms(s['claim_to_kill_ms']['p50'])} "
            f"ms after its claim (a whole lease left) | {s['measured']} | {ms(r['p50'])} ms | "
            f"{ms(r['p95'])} ms | {ms(r['max'])} ms | **{s['duplicates']}** ({s['prs']} PRs for {s['keys']} keys) "
            f"| reconciled with the forge (PR found), failed (executor) -> retry; Attempt 2 replayed the receipt in "
            f"{s['replayed']}/{s['measured']} runs, the PR was not opened again |")
    for run in data["rq"]:
        st = run["settings"]
        label = f"RQ {data['rq_version']}, {st['describe']}; expected ~{run.get('expected_s', 0):.0f} s"
        if run.get("skipped"):
            lines.append(f"| {label} | 0 | not measured: {run['skipped']} | | | | |")
        elif run.get("detected"):
            d = run["detection_s"]
            lines.append(f"| {label} | 1 | {d * 1000:,.0f} ms ({d:.1f} s) | - | - | n/a (job not resumed) | "
                         "FailedJobRegistry (AbandonedJobError); nothing asks what the job did; with `Retry` it "
                         "re-runs from scratch |")
        else:
            lines.append(f"| {label} | 1 | not detected within {run.get('waited_s', 0):.0f} s (--rq-timeout-s) | | | "
                         "| | still in the StartedJobRegistry |")
    lines.append("")
    if r:
        pname, value, ok = goal(data)
        limit = GOALS[a.get("kill", "group")][2]
        met = "**met**" if ok else "**NOT met**"
        where = "at the default lease and sweep settings" if a.get("kill", "group") == "group" else \
            "the process running the Attempt killed, its parent alive"
        lines.append(f"Goal ({pname} <= {limit:,} ms {where}, no duplicate effect): {met}: {pname} "
                     f"{value:,.0f} ms, {s['duplicates']} duplicate(s)."
                     + (f" Problems: {s['problems']}" if s["problems"] else ""))
        lines.append("")
        lines += ["Where mc_queue's time goes (ms, p50 / p95 / max over the runs):", "",
                  "| stage | p50 | p95 | max |", "|---|---|---|---|"]
        for key, title in [
            ("claim_to_kill_ms", "claim -> kill (worker ran the effect, wrote its pid)"),
            ("lease_left_at_kill_ms", "lease left at the kill (lease end - kill)"),
            ("sweep_lag_ms", "lease end -> sweeper expired it (`overdue_ms`)"),
            ("kill_to_expired_ms", "kill -> `lease_expired`"),
            ("expired_to_reconciled_ms", "`lease_expired` -> `attempt_reconciled` (forge asked, decision)"),
            ("recovery_ms", "**kill -> `attempt_reconciled`** (the figure above)"),
            ("backoff_ms", "decision -> Attempt 2 due (policy backoff)"),
            ("reconciled_to_attempt2_done_ms", "decision -> Attempt 2 succeeded (incl. fresh worker start)"),
        ]:
            v = s.get(key)
            if v:
                lines.append(f"| {title} | {ms(v['p50'])} | {ms(v['p95'])} | {ms(v['max'])} |")
        lines.append("")
    lines.append(f"For scale (NOTES.md, measured here with their defaults): {NOTES_FIELD}.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=20, help="mc_queue runs (one task each)")
    p.add_argument("--kind", choices=["simple", "fork", "batch"], default="simple", help="mc_queue worker kind")
    p.add_argument("--kill", choices=["group", "horse", "pool-child"], default="group",
                   help="group: the worker's whole process group; horse: only the work horse running the job "
                        "(--kind fork), its worker lives on; pool-child: only the SimpleWorker of a `--pool 2` "
                        "running the job (--kind simple), its pool lives on")
    p.add_argument("--sweep-interval", type=float, default=1.0, help="sweeper interval, s (mcq's default: 1)")
    p.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS,
                   help=f"the App's lease (default {DEFAULT_LEASE_MS}, mc_queue's DEFAULT_LEASE_MS); a shorter one "
                        "makes a quick run, not the figure at the defaults")
    p.add_argument("--run-timeout-s", type=float, default=120.0, help="give up on one mc_queue step after this")
    p.add_argument("--rq-runs", type=int, default=1, help="RQ runs per RQ setting (0: no RQ side)")
    p.add_argument("--rq-timeout-s", type=float, default=900.0,
                   help="longest wait for RQ's detection; a setting expected to take longer is not measured")
    p.add_argument("--rq-settings", choices=["default", "fast", "both"], default="default")
    p.add_argument("--rq-fast", action="store_true", help="same as --rq-settings fast")
    p.add_argument("--rq-kind", choices=["simple", "fork"], default="simple",
                   help="RQ worker class: simple (rq.SimpleWorker, like mc_queue's --kind simple) or fork (rq.Worker)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random pause before each mc_queue run")
    p.add_argument("--dir", default=None, help="parent of the temporary folder (default: the system's)")
    p.add_argument("--json", dest="json_out", default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    if args.rq_fast:
        args.rq_settings = "fast"
    if args.runs < 1 or args.rq_runs < 0 or args.lease_ms < 100:
        p.error("--runs must be >= 1, --rq-runs >= 0 and --lease-ms >= 100")
    if args.kill == "horse" and args.kind != "fork":
        p.error("--kill horse needs --kind fork (a SimpleWorker runs the job in its own process)")
    if args.kill == "pool-child" and args.kind not in ("simple", "batch"):
        p.error("--kill pool-child needs --kind simple or batch (a fork worker's job runs in its work horse)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import rq

    # Clean up (workers, sweeper, redis-server) on Ctrl-C and on SIGTERM, also when started in the
    # background by a shell that set SIGINT to be ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    tmp = Path(tempfile.mkdtemp(prefix="mcq-bench-recovery-", dir=args.dir))
    server = RedisServer(tmp / "redis")
    forge = ForgeServer()
    started = time.time()
    data: dict[str, Any] = {"args": vars(args), "rq_version": rq.__version__, "lease_ms": args.lease_ms,
                            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                        "loadavg_start": os.getloadavg()}, "runs": [], "rq": []}
    bench: Bench | None = None
    threads: list[threading.Thread] = []
    try:
        server.start()
        forge.start()
        os.environ["MCQ_BENCH_FORGE"] = forge.url
        os.environ["MCQ_BENCH_LEASE_MS"] = str(args.lease_ms)  # read by bench.recovery_app at its import
        admin = server.client()
        data["machine"]["redis"] = admin.info("server")["redis_version"]
        admin.close()
        bench = Bench(args, server, forge, tmp)
        print(f"redis-server {data['machine']['redis']} on port {server.port}, forge {forge.url}, temp {tmp}; "
              f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)

        # RQ first: its detection takes minutes, so it is waited for in the background meanwhile.
        modes = {"default": ["default"], "fast": ["fast"], "both": ["default", "fast"]}[args.rq_settings]
        rq_runs: list[dict[str, Any]] = []
        for mode in modes if args.rq_runs else []:
            st = RqSettings.make(mode, args.rq_kind)
            expected = st.expected_detection_s()
            for n in range(args.rq_runs):
                if expected + 30 > args.rq_timeout_s:
                    rq_runs.append({"settings": st, "expected_s": expected,
                                    "skipped": f"expected ~{expected:.0f} s > --rq-timeout-s {args.rq_timeout_s:.0f}"})
                    continue
                run = bench.rq_start(st, n)
                run["expected_s"] = expected
                rq_runs.append(run)
                t = threading.Thread(target=bench.rq_wait, args=(run, run["kill_time"] + args.rq_timeout_s),
                                     name=f"rq-{mode}-{n}", daemon=True)
                t.start()
                threads.append(t)
                print(f"RQ ({mode}): job {run['job_id']} killed; observer started; expected detection "
                      f"~{expected:.0f} s after the kill", flush=True)

        bench.start_sweeper()
        time.sleep(1.0)  # the sweeper's imports and first pass, before the first kill
        for i in range(args.runs):
            try:
                res = bench.mcq_run(i)
            except RuntimeError as exc:
                res = {"run": i, "problems": [str(exc)]}
            data["runs"].append(res)
            if "recovery_ms" in res:
                print(f"mc_queue run {i + 1}/{args.runs}: recovery {res['recovery_ms']:,.0f} ms (lease left at kill "
                      f"{res['lease_left_at_kill_ms']:,.0f} ms, sweep lag {res['sweep_lag_ms']} ms), "
                      f"{res['decision']}; Attempt 2 {res['attempt2_state']}, PRs {res['prs_per_key']}"
                      + (f"; PROBLEMS {res['problems']}" if res["problems"] else ""), flush=True)
            else:
                print(f"mc_queue run {i + 1}/{args.runs} FAILED: {res['problems']}", flush=True)
        if bench.sweeper is not None:
            stop(bench.sweeper)

        if threads:
            print(f"waiting for RQ's detection (up to {args.rq_timeout_s:.0f} s after each kill)...", flush=True)
        for t in threads:
            t.join()
        for run in rq_runs:
            st = run["settings"]
            row = {k: v for k, v in run.items() if k not in ("settings", "observer", "observer_log")}
            row["settings"] = {**asdict(st), "describe": st.describe(), "heartbeat_ttl_s": st.heartbeat_ttl_s()}
            data["rq"].append(row)
            if run.get("detected"):
                print(f"RQ ({st.mode}): detected after {run['detection_s']:.1f} s: {run['exc_info']}", flush=True)
        data["summary"] = summarize(data["runs"])
        data["machine"]["loadavg_end"] = os.getloadavg()
        data["elapsed_s"] = time.time() - started
        print()
        print(render(data))
        print(f"\n(took {data['elapsed_s']:.0f} s; load average at start {data['machine']['loadavg_start'][0]:.2f}, "
              f"at end {data['machine']['loadavg_end'][0]:.2f}; Python {platform.python_version()}, redis-server "
              f"{data['machine']['redis']}, rq {rq.__version__}. Times: kill = time.time() after killpg; "
              "decision = the event's Redis stream id (ms) = redis-server's wall clock; same machine, same clock.)")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(data, indent=2, default=str))
            print(f"wrote {args.json_out}")
        return 0  # a benchmark: it reports the goal, it does not fail on it
    finally:
        if bench is not None:
            bench.cleanup()
        forge.stop()
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

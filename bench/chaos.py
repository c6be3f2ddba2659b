"""Chaos run: the example agent app under a seeded random fault schedule, then one audit report.

Real processes: a private redis-server (AOF, appendfsync always) in a temp dir, W worker processes
(``mcq worker --kind simple``) that reach Redis through a TCP proxy this script owns, one sweeper
process (through a second proxy), a bare git remote and a local pull-request API (ForgeServer,
fence-checking, without GitHub's one-PR-per-head rule). Tasks of
``mc_queue.examples.agents`` (push a commit, open a pull request) are enqueued at a steady rate with
idempotency keys while, every few seconds, the schedule (``random.Random(seed)``, a shuffled bag of
fault kinds refilled each round) injects one of:

- ``kill``: SIGKILL of a worker that holds a lease (a replacement worker joins);
- ``pause``: SIGSTOP of a worker that holds a lease, SIGCONT after lease + 4 s;
- ``redis_restart``: ``RedisServer.restart(keep_data=True, sig=SIGKILL)``;
- ``link_delay``: the worker <-> Redis proxy delays every chunk (both ways) for a few seconds;
- ``link_cut``: the proxy closes every worker connection and refuses new ones for a few seconds;
- ``provider_stall``: the next pull request is created, then the answer is held past the client's
  timeout (``ForgeServer.stall_next``);
- ``zombie_push`` / ``zombie_pr``: the fail point ``effect.before_call`` is armed for the push or the
  pull request (``mc_queue.contracts.failpoints``): the next worker to reach it freezes itself between its
  intent and its call; it is resumed after lease + 4 s, when a replacement has usually made the call,
  and its late call must be refused by the provider (the forge checks ``Mcq-Fence`` and has no
  one-PR-per-head rule here, so only the fence stands; git refuses a push whose lease value, read
  before the intent, is stale);
- ``sweeper_link_cut``: the sweeper's own link to Redis (a second proxy) is cut for a few seconds.

Any worker or sweeper process that exits without being killed by the schedule is restarted (new
name, 1 s later) and counted. At the end injection stops, a paused worker still gets its full pause,
and the run waits until every
task is at rest (or ``--settle-timeout``), then audits records and providers and prints ONE markdown
report. Exit 0 only if no task is lost, no duplicate effect and no stale write accepted.

Failover mode (``--failover``, with ``--min-replicas N``, default 1): Redis is a
``mc_queue.testing.RepeatableFailoverCluster`` (a primary with AOF, one replica, three sentinels
with down-after 3 s and failover-timeout 10 s; each node behind a pausable proxy of its own, which
also carries the replication link when the other node replicates from it). The producer, the
workers and the sweeper use the cluster's ``redis+sentinel://`` URL with ``min_replicas=N`` and
``replica_timeout_ms=1000``, and one state dir (``MCQ_STATE_DIR``: the sweeper judges every
process's replication watermark). Sentinels hand out the nodes' own addresses, so the link faults
cannot apply: ``redis_restart``, ``link_delay``, ``link_cut`` and ``sweeper_link_cut`` are replaced by

- ``failover``: the replication link is held back for 1-2 s of work (``lag()``), the primary is
  SIGKILLed, the sentinels promote the replica, and the old primary is started again on its data
  (the sentinels make it a replica of the new one, through the new primary's proxy); repeated
  during the run, each time on the node that is the primary then, and each one lagged.

The producer resends an enqueue that raised ``ReplicationUnconfirmed`` (or lost its link) with the
same key. When the namespace turns ``lost`` (a failover dropped acknowledged writes: possible with
``--min-replicas 0``), the run does what an operator does: ``mcq recover``, then the producer
resends every key it holds. The report adds the failovers, kill -> promotion seconds, acknowledged
tasks missing on the new primary, the ``ReplicationUnconfirmed`` errors the producer saw, whether a
loss was detected and the namespace's state at the end. On top of the checks above, it passes only
if at least one failover was injected and every one completed, and the namespace ends ``ok``; with
``--min-replicas`` >= 1, no acknowledged task went missing and no loss was detected; with 0, every
failover that dropped acknowledged tasks was followed by a ``state_loss_detected`` before the next one.

    .venv/bin/python bench/chaos.py --short --seed 1
    .venv/bin/python bench/chaos.py --minutes 3 --seed 7 --json chaos.json
    .venv/bin/python bench/chaos.py --failover --minutes 1 --seed 5 --json chaos_fo.json
    .venv/bin/python bench/chaos.py --failover --min-replicas 0 --minutes 1 --seed 5
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rq.job import Job  # noqa: E402

from mc_queue.client import Client  # noqa: E402
from mc_queue.contracts import failpoints  # noqa: E402
from mc_queue.contracts.errors import McqError, NamespaceLost, OutcomeUnknown, ReplicationUnconfirmed  # noqa: E402
from mc_queue.contracts.keys import parse_attempt_id  # noqa: E402
from mc_queue.contracts.models import Task, TaskState  # noqa: E402
from mc_queue.demo.fleet import Fleet, provider_env  # noqa: E402
from mc_queue.producer.transport import job_id, rq_connection, rq_queue  # noqa: E402
from mc_queue.providers.git import TRAILER, git  # noqa: E402
from mc_queue.testing import ForgeServer, RedisServer, RepeatableFailoverCluster, TcpProxy  # noqa: E402

HANDLER = "fix-issue"
# At rest: nothing will happen to the task without a person (failed / blocked wait for one).
AT_REST = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.BLOCKED, TaskState.QUARANTINED, TaskState.CANCELED}
KINDS = ["kill", "kill", "pause", "redis_restart", "link_delay", "link_cut", "provider_stall", "zombie_push",
         "zombie_pr", "sweeper_link_cut"]
# --failover: the link faults cannot apply (sentinels hand out the nodes' own addresses); failovers instead,
# two a bag, so that a one-minute run sees the roles swapped and swapped back.
FAILOVER_KINDS = ["kill", "kill", "pause", "failover", "failover", "provider_stall", "zombie_push", "zombie_pr"]
ZOMBIE_OPERATIONS = {"zombie_push": "push", "zombie_pr": "open-pr"}
TRANSIENT: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
# --failover: what a producer and the run's own reads meet while the primary changes (or after a loss).
FAILOVER_TRANSIENT: tuple[type[Exception], ...] = (*TRANSIENT, OutcomeUnknown, NamespaceLost)
WORKER_WRITES = {"attempt_succeeded", "attempt_failed", "checkpoint_recorded", "effect_intent"}


# ---------------------------------------------------------- the fault log (processes: demo.fleet)


@dataclass
class Fault:
    kind: str
    at: float  # wall clock, seconds
    detail: str = ""
    attempt: str | None = None  # kill / pause: the Attempt the victim held
    worker: str | None = None


# --------------------------------------------------------------------------- the run


@dataclass
class Run:
    args: argparse.Namespace
    client: Client
    redis_server: RedisServer | None  # None with --failover (the cluster instead)
    proxy: TcpProxy | None  # None with --failover (no proxies on the data link)
    sweeper_proxy: TcpProxy | None
    forge: ForgeServer
    fleet: Fleet
    rng: random.Random
    lease_s: float
    faults: list[Fault] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    keys: dict[str, str | None] = field(default_factory=dict)  # idempotency key -> task id
    enqueue_errors: int = 0
    bag: list[str] = field(default_factory=list)
    points: Path = Path(".")  # the fail point directory the workers watch
    armed: dict[str, Fault] = field(default_factory=dict)  # operation -> the zombie fault waiting to fire
    seen_fired: int = 0
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    transient: tuple[type[Exception], ...] = TRANSIENT  # what a tick of the loop shrugs off
    # --failover only
    cluster: RepeatableFailoverCluster | None = None
    url: str = ""  # the sentinel URL (mcq recover gets it)
    unconfirmed: int = 0  # enqueues that raised ReplicationUnconfirmed (resent with the same key)
    outcome_unknown: int = 0  # other OutcomeUnknown on enqueue (resent with the same key)
    namespace_lost_errors: int = 0  # enqueues refused with NamespaceLost (resent after the recovery)
    failovers: list[dict[str, Any]] = field(default_factory=list)
    failover_thread: threading.Thread | None = None
    failover_ready_at: float = 0.0  # monotonic: no new failover before
    failover_broken: str | None = None  # a failover that did not complete: no more of them
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    resent_after_recovery: int = 0
    ns_state: str = ""
    next_ns_check: float = 0.0
    loop_errors: Counter[str] = field(default_factory=Counter)

    def enqueue_due(self, due: int, ac: Any) -> None:
        for i in range(due):
            key = f"chaos-{self.args.seed}-{i}"
            if self.keys.get(key):
                continue
            payload = {"repository": "example/app", "issue": 1000 + i, "think_s": self.args.think_s,
                       "instruction": f"make test_{i} pass"}
            fair = f"tenant:{i % self.args.fair_keys}" if self.args.fair_keys else None
            try:
                self.keys[key] = ac.enqueue(HANDLER, payload, idempotency_key=key, fair_key=fair).id
            except self.transient as exc:
                self.keys.setdefault(key, None)  # resent with the same key next tick
                self.enqueue_errors += 1
                if isinstance(exc, ReplicationUnconfirmed):  # on the primary only: not acknowledged
                    self.unconfirmed += 1
                elif isinstance(exc, OutcomeUnknown):
                    self.outcome_unknown += 1
                elif isinstance(exc, NamespaceLost):
                    self.namespace_lost_errors += 1
                return

    def leased_victim(self) -> tuple[str, str] | None:
        """(attempt id, worker name) of a running Attempt held by a live, unpaused worker."""
        live = set(self.fleet.live_workers())
        aids = [str(a) for a in self.client.redis.zrange(self.client.keys.leases, 0, -1)]
        self.rng.shuffle(aids)
        for aid in aids:
            task_id, n = parse_attempt_id(aid)
            att = self.client.reads.get_task(task_id).attempts[n - 1]
            name = self.fleet.process_of(str(att.worker_id)) if att.worker_id else None
            if att.state.value == "running" and name in live:
                return aid, str(name)
        return None

    def inject(self) -> bool:
        """Inject the next fault of the bag; False when its precondition does not hold yet."""
        if not self.bag:
            self.bag = list(self.kinds)
            self.rng.shuffle(self.bag)
        kind = self.bag[0]
        f = Fault(kind, time.time())
        if kind == "failover":
            if self.failover_broken:  # the cluster did not come back from the last one: no more
                self.skipped[kind] += 1
                self.bag.pop(0)
                return True
            if self.failover_busy() or time.monotonic() < self.failover_ready_at:
                return False
            self.start_failover(f)
        elif kind in ("kill", "pause"):
            if kind == "pause" and self.fleet.paused:
                return False
            victim = self.leased_victim()
            if victim is None:
                return False
            f.attempt, f.worker = victim
            if kind == "kill":
                self.fleet.kill(f.worker)
                self.fleet.worker()  # a replacement joins
            else:
                self.fleet.pause(f.worker)
            f.detail = f"{f.worker} holding {f.attempt}"
        elif kind == "redis_restart":
            assert self.redis_server is not None
            t0 = time.monotonic()
            self.redis_server.restart(keep_data=True, sig=signal.SIGKILL)
            f.detail = f"down {1000 * (time.monotonic() - t0):.0f} ms"
        elif kind == "link_delay":
            assert self.proxy is not None
            d, secs = self.rng.uniform(0.05, 0.4), self.rng.uniform(3, 6)
            self.proxy.delay_s = d
            threading.Timer(secs, lambda: setattr(self.proxy, "delay_s", 0.0)).start()
            f.detail = f"+{1000 * d:.0f} ms per chunk for {secs:.1f} s"
        elif kind == "link_cut":
            assert self.proxy is not None
            secs = self.rng.uniform(1, 4)
            self.proxy.cut(secs)
            f.detail = f"cut for {secs:.1f} s"
        elif kind == "provider_stall":
            self.forge.stall_next(1, 3.0)
            f.detail = "next pull request accepted, answer held 3 s (client timeout 1.5 s)"
        elif kind in ZOMBIE_OPERATIONS:
            operation = ZOMBIE_OPERATIONS[kind]
            if operation in self.armed:
                return False
            failpoints.arm(self.points, "effect.before_call", operation=operation)
            self.armed[operation] = f
            f.detail = f"armed effect.before_call@{operation}"
        elif kind == "sweeper_link_cut":
            assert self.sweeper_proxy is not None
            secs = self.rng.uniform(1, 4)
            self.sweeper_proxy.cut(secs)
            f.detail = f"sweeper link cut for {secs:.1f} s"
        self.bag.pop(0)
        self.faults.append(f)
        return True

    # ------------------------------------------------------------------ --failover

    def failover_busy(self) -> bool:
        return self.failover_thread is not None and self.failover_thread.is_alive()

    def start_failover(self, f: Fault) -> None:
        """Start one failover in a thread of its own (the producer, the other faults and the fleet's
        bookkeeping go on meanwhile): lag, kill, promotion, rejoin."""
        lag_s = self.rng.uniform(1.0, 2.0)
        rec: dict[str, Any] = {"n": len(self.failovers) + 1, "lag_s": round(lag_s, 2)}
        self.failovers.append(rec)
        f.detail = f"lag {lag_s:.1f} s, then SIGKILL of the primary"
        self.failover_thread = threading.Thread(target=self._failover, args=(rec, lag_s, f), name="failover",
                                                daemon=True)
        self.failover_thread.start()

    def _failover(self, rec: dict[str, Any], lag_s: float, f: Fault) -> None:
        cl = self.cluster
        assert cl is not None
        try:
            rec["primary_port"], rec["replica_port"] = cl.primary.port, cl.replica.port
            cl.lag()  # the replica falls behind while tasks run
            time.sleep(lag_s)
            try:
                rec["lag_bytes"] = (int(cl.primary_info()["master_repl_offset"])
                                    - int(cl.replica_info().get("master_repl_offset", 0)))
            except (redis.RedisError, KeyError, ValueError):
                rec["lag_bytes"] = None
            acked = {k: t for k, t in dict(self.keys).items() if t}  # acknowledged to the producer so far
            t_kill = time.monotonic()
            rec["killed_at"] = time.time()
            cl.kill_primary()
            cl.wait_failover(timeout=120)
            rec["kill_to_promotion_s"] = round(time.monotonic() - t_kill, 2)
            new = cl.replica.client(socket_timeout=5)  # the promoted node, read straight
            try:
                pipe = new.pipeline(transaction=False)
                for tid in acked.values():
                    pipe.exists(self.client.keys.task(tid).task)
                there = pipe.execute()
            finally:
                new.close()
            rec["acknowledged_before_kill"] = len(acked)
            rec["acknowledged_missing"] = sorted(k for (k, _), ok in zip(acked.items(), there, strict=True) if not ok)
            t0 = time.monotonic()
            cl.restart_old_primary(timeout=120)
            rec["rejoin_s"] = round(time.monotonic() - t0, 2)
            f.detail = (f"lag {lag_s:.1f} s ({rec['lag_bytes']} bytes behind), kill -> promotion "
                        f"{rec['kill_to_promotion_s']:.1f} s, old primary rejoined {rec['rejoin_s']:.1f} s later, "
                        f"{len(rec['acknowledged_missing'])} acknowledged task(s) missing on the new primary")
        except Exception as exc:  # the cluster did not come back: reported, and no further failover
            rec["error"] = f"{type(exc).__name__}: {exc}"
            f.detail += f": FAILED {rec['error']}"
            self.failover_broken = rec["error"]
        finally:
            self.failover_ready_at = time.monotonic() + 3.0

    def operate(self) -> None:
        """What an operator does (about once a second): a namespace found lost (a failover dropped
        acknowledged writes) gets ``mcq recover``, then the producer resends every key it holds."""
        now = time.monotonic()
        if now < self.next_ns_check:
            return
        self.next_ns_check = now + 1.0
        self.ns_state = self.client.reads.namespace().state
        if self.ns_state not in ("lost", "recovering") or self.failover_busy():
            return
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", self.url, "--prefix",
                                   self.client.keys.prefix, "recover", "--reason",
                                   "chaos: a failover lost acknowledged writes"],
                                  env=self.fleet.env, capture_output=True, text=True, timeout=180)
            code: int | None = proc.returncode
            out = (proc.stdout + proc.stderr).strip()
        except subprocess.TimeoutExpired:
            code, out = None, "timed out after 180 s"
        self.recoveries.append({"at": time.time(), "found": self.ns_state, "exit_code": code,
                                "seconds": round(time.monotonic() - t0, 1), "output": out[-400:]})
        if code == 0:
            self.next_ns_check = 0.0  # read the state again next tick
            for key in self.keys:  # the producer resends every key it holds, with that key
                self.keys[key] = None
            self.resent_after_recovery += len(self.keys)

    def poll_zombies(self) -> None:
        """A worker that froze itself at an armed fail point: note which, and let the fleet resume it
        after lease + 4 s like a paused worker."""
        records = failpoints.fired(self.points)
        for rec in records[self.seen_fired:]:
            f = self.armed.pop(str(rec.get("operation")), None)
            if f is None:
                continue
            f.attempt, f.worker = str(rec.get("attempt")), str(rec.get("worker"))
            f.detail += f": {f.worker} froze holding {f.attempt}"
            # (by its pid: a worker that reconnected names itself <process>.r<round>, and one never adopted
            # stayed stopped for good, its slot lost: seed 5102 ended with all four workers frozen so)
            name = self.fleet.process_of(f.worker, int(rec.get("pid") or 0))
            if name is not None:
                self.fleet.adopt_pause(name)
        self.seen_fired = len(records)

    def disarm(self) -> None:
        """Points armed but never reached are taken back (nothing freezes after the faults end)."""
        for operation, f in list(self.armed.items()):
            (self.points / f"effect.before_call@{operation}").unlink(missing_ok=True)
            f.detail += ": never reached, disarmed"
            del self.armed[operation]

    def at_rest(self) -> tuple[int, int]:
        ids = [t for t in self.keys.values() if t]
        pipe = self.client.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(self.client.keys.task(tid).task, "state")
        states = pipe.execute()
        return sum(1 for s in states if s and TaskState(s) in AT_REST), len(self.keys)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="mcq-chaos-"))
    rs: RedisServer | None = None
    cluster: RepeatableFailoverCluster | None = None
    proxy: TcpProxy | None = None
    sweeper_proxy: TcpProxy | None = None
    extra = {"PYTHONPATH": str(ROOT)}
    if args.failover:
        # down-after 3 s: with 1 s a sentinel on a loaded 2-core machine took a freshly promoted
        # replica for dead and failed back (bench/failover.py).
        cluster = RepeatableFailoverCluster(tmp / "cluster", down_after_ms=3000, failover_timeout_ms=10000).start()
        url = cluster.url(min_replicas=args.min_replicas, replica_timeout_ms=args.replica_timeout_ms)
        extra["MCQ_STATE_DIR"] = str(tmp / "state")  # every process's watermark where the sweeper finds it
    else:
        rs = RedisServer(tmp / "redis", appendonly=True, appendfsync="always").start()
        url = rs.url
    points = tmp / "failpoints"
    points.mkdir()
    # git remote, a forge that checks fences (and has no one-PR-per-head rule: the fence alone stands), env
    providers = provider_env(tmp, extra={**extra, failpoints.ENV: str(points)},
                             enforce_fence=True, one_pr_per_head=False)
    forge, remote = providers.forge, providers.remote
    if rs is not None:
        proxy = TcpProxy(("127.0.0.1", rs.port)).start()
        sweeper_proxy = TcpProxy(("127.0.0.1", rs.port)).start()
    from mc_queue.examples.agents import app
    from mc_queue.producer.dispatch import AppClient

    prefix = f"chaos-{args.seed}-{int(time.time())}"
    client = Client(url, prefix=prefix, actor="chaos", state_dir=extra.get("MCQ_STATE_DIR"))
    # Workers and the sweeper reach Redis through proxies of their own (with --failover: the sentinel
    # URL); whatever exits on its own is restarted.
    fleet = Fleet(prefix, proxy.url if proxy else url, providers.env, tmp,
                  sweeper_url=sweeper_proxy.url if sweeper_proxy else url, worker_prefix="chaos-w", restart=True)
    r = Run(args, client, rs, proxy, sweeper_proxy, forge, fleet, random.Random(args.seed),
            app.spec(HANDLER).lease_ms / 1000, points=points)
    if cluster is not None:
        r.cluster, r.url, r.kinds, r.transient = cluster, url, list(FAILOVER_KINDS), FAILOVER_TRANSIENT
    ac = AppClient(app, client)
    started = time.monotonic()
    inject_s = args.minutes * 60
    try:
        fleet.sweeper()
        for _ in range(args.workers):
            fleet.worker()
        next_fault = started + r.rng.uniform(args.fault_min, args.fault_max)
        def injecting(now: float) -> bool:
            if now - started < inject_s:
                return True
            # --cover-kinds: go on (up to three times as long) until every kind has been injected once.
            missing = set(r.kinds) - {f.kind for f in r.faults}
            return bool(args.cover_kinds and missing and now - started < 3 * inject_s)

        while injecting(now := time.monotonic()):
            try:
                r.enqueue_due(int((now - started) / 60 * args.tasks_per_minute) + 1, ac)
                r.poll_zombies()
                fleet.resume_due(r.lease_s + 4)
                if now >= next_fault:
                    if r.inject():
                        next_fault = now + r.rng.uniform(args.fault_min, args.fault_max)
                    else:
                        next_fault = now + 0.5
                fleet.reap(r.faults[-1].kind if r.faults else "")
                if cluster is not None:
                    r.operate()
            except r.transient as exc:
                r.loop_errors[type(exc).__name__] += 1
            except McqError as exc:  # --failover: a read of a task lost with its primary, ...; counted
                if cluster is None:
                    raise
                r.loop_errors[type(exc).__name__] += 1
            time.sleep(0.2)
        injected_s = time.monotonic() - started
        # Settle: no more faults; resume everyone; finish enqueueing; wait until every task is at rest.
        if proxy is not None and sweeper_proxy is not None:
            proxy.heal()
            sweeper_proxy.heal()
        r.poll_zombies()
        r.disarm()
        deadline = time.monotonic() + args.settle_timeout
        rest, total = 0, 0
        settle_transient = (redis.ConnectionError, redis.TimeoutError) if cluster is None else r.transient
        while time.monotonic() < deadline:
            try:
                r.enqueue_due(len(r.keys), ac)
                r.poll_zombies()  # a point reached just before it was disarmed
                fleet.resume_due(r.lease_s + 4)  # a worker paused last keeps its full pause
                fleet.reap("settle")
                if cluster is not None:
                    r.operate()  # a loss found late is recovered (the producer resends) before the end
                rest, total = r.at_rest()
                if rest == total and all(r.keys.values()) and not fleet.paused and (
                        cluster is None or (not r.failover_busy() and r.ns_state == "ok")):
                    break
            except settle_transient as exc:
                r.loop_errors[type(exc).__name__] += 1
            except McqError as exc:
                if cluster is None:
                    raise
                r.loop_errors[type(exc).__name__] += 1
            time.sleep(0.5)
        settle_s = time.monotonic() - started - injected_s
        time.sleep(1.0)  # the last refused writes of resumed workers land
        stuck = diagnose_stuck(r)  # before the fleet stops: what RQ and the workers say of a task not at rest
        fleet.stop_all()
        return audit(r, remote, injected_s, settle_s) | {"stuck": stuck}
    finally:
        fleet.stop_all()
        if proxy is not None and sweeper_proxy is not None:
            proxy.close()
            sweeper_proxy.close()
        providers.stop()
        client.close()
        if rs is not None:
            rs.stop(signal.SIGKILL)
        if cluster is not None:
            if r.failover_thread is not None:
                r.failover_thread.join(timeout=1)
            cluster.stop()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- the audit


def diagnose_stuck(r: Run) -> list[str]:
    """For each task not at rest when the settle ended: its last dispatch, its RQ job (status, worker,
    registries) and the worker log lines that name its Attempt, so that a failed run says why."""
    c = r.client
    out: list[str] = []
    try:
        rq = rq_connection(c)
        now_ms = c.backend.redis_time_ms()
        for key, known in r.keys.items():
            tid = known or c.redis.hget(c.keys.idem, key)
            if not tid:
                continue
            t = c.reads.get_task(str(tid))
            if t.state in AT_REST or t.latest is None:
                continue
            aid = t.latest.id
            at = c.redis.hget(c.keys.task(t.id).task, f"{t.latest.number}.dispatched_at")
            queue = rq_queue(rq, c.keys.prefix, t.queue)
            jid = job_id(c.keys.prefix, aid)
            job = {k.decode(): v.decode(errors="replace")[:80] for k, v in rq.hgetall(Job.key_for(jid)).items()
                   if k.decode() in ("status", "worker_name", "started_at", "enqueued_at", "last_heartbeat")}
            started = [(m.decode(), round(s - time.time())) for m, s in rq.zscan_iter(
                queue.started_job_registry.key, match=f"{jid}:*")]
            out.append(f"{aid}: attempt {t.latest.state.value}, dispatches {t.latest.dispatches}, last dispatch "
                       f"{'none' if at is None else f'{now_ms - int(at)} ms ago'}; RQ job {job or 'none'}, "
                       f"in list at {rq.lpos(queue.key, jid)}, started registry (member, s left) {started}; "
                       f"events {[e.type for e in t.events]}")
            for log in sorted(r.fleet.log_dir.glob("*.log")):
                hits = [line for line in log.read_text(errors="replace").splitlines() if aid in line]
                out += [f"  {log.name}: {line[:240]}" for line in hits[-6:]]
        if out:
            out += where_workers_are(r.fleet)
    except Exception as exc:  # a diagnosis never hides the run's result
        out.append(f"diagnosis failed: {type(exc).__name__}: {exc}")
    return out


def where_workers_are(fleet: Fleet) -> list[str]:
    """What each live worker process is doing (a task is stuck): its state in /proc and, where py-spy is
    installed (``pip install py-spy``), the stack of each of its threads."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out: list[str] = []
    for name in fleet.live_workers():
        pid = fleet.procs[name].pid
        try:
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            state = "State: ?"
        out.append(f"worker {name} (pid {pid}) {state}")
        if Path(spy).exists():
            dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
            out += [f"  {line}" for line in (dump.stdout + dump.stderr).splitlines()[:80]]
    return out


def pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def stale_writes_accepted(t: Task) -> list[str]:
    """Writes the records accepted from an Attempt that no longer held the authority to make them.

    - a worker write (attempt_succeeded / attempt_failed / checkpoint_recorded / effect_intent, and a
      ``perform`` effect_receipt) of Attempt n after the lease_expired of Attempt n, or with a fence
      other than the one Attempt n was claimed with;
    - more than one attempt_succeeded for one Attempt, or more than one success (worker completion or
      reconciliation) for one task, or a succeeded task whose result is not its succeeded Attempt's.
    """
    bad: list[str] = []
    claimed: dict[int, str] = {}
    expired: set[int] = set()
    successes: list[int] = []
    per_attempt: Counter[int] = Counter()
    for e in t.events:
        n = e.attempt or 0
        if e.type == "attempt_claimed":
            claimed[n] = e.fields.get("fence", "")
        elif e.type == "lease_expired":
            expired.add(n)
        elif e.type == "attempt_reconciled" and e.fields.get("outcome") == "succeeded":
            successes.append(n)
        is_write = e.type in WORKER_WRITES or (e.type == "effect_receipt" and e.fields.get("source") == "perform")
        if not is_write:
            continue
        if n in expired:
            bad.append(f"{t.id}/{n}: {e.type} accepted after its lease expired")
        if "fence" in e.fields and e.fields["fence"] != claimed.get(n):
            bad.append(f"{t.id}/{n}: {e.type} with fence {e.fields['fence']}, claimed {claimed.get(n)}")
        if e.type == "attempt_succeeded":
            per_attempt[n] += 1
            successes.append(n)
    bad += [f"{t.id}/{n}: {c} attempt_succeeded" for n, c in per_attempt.items() if c > 1]
    if len(successes) > 1:
        bad.append(f"{t.id}: {len(successes)} successes (attempts {successes})")
    if t.state is TaskState.SUCCEEDED:
        won = [a for a in t.attempts if a.state.value == "succeeded"]
        if len(won) != 1 or won[0].result != t.result:
            bad.append(f"{t.id}: task result is not the one succeeded Attempt's result")
    return bad


def audit(r: Run, remote: Path, injected_s: float, settle_s: float) -> dict[str, Any]:
    c = r.client
    tasks: list[Task] = []
    missing: list[str] = []
    for key, known in r.keys.items():
        tid = known or c.redis.hget(c.keys.idem, key)
        try:
            tasks.append(c.reads.get_task(str(tid))) if tid else missing.append(key)
        except Exception:
            missing.append(key)
    states = Counter(t.state.value for t in tasks)
    not_final = [t for t in tasks if t.state not in AT_REST]
    events: Counter[str] = Counter()
    refused_by: Counter[str] = Counter()
    stale_bad: list[str] = []
    found_done = redone = replayed = unknown = 0
    reconciled_outcomes: Counter[str] = Counter()
    decided_at: dict[str, float] = {}
    for t in tasks:
        events.update(e.type for e in t.events)
        stale_bad += stale_writes_accepted(t)
        intents_after: dict[str, list[int]] = defaultdict(list)
        for e in t.events:
            if e.type == "effect_intent":
                intents_after[e.fields.get("key", "")].append(e.attempt or 0)
        for e in t.events:
            if e.type == "stale_write_refused":
                refused_by[f"{e.fields.get('op')}/{e.fields.get('refusal')}"] += 1
            elif e.type == "attempt_reconciled":
                reconciled_outcomes[e.fields.get("outcome", "?")] += 1
                decided_at.setdefault(f"{t.id}/{e.attempt}", e.at.timestamp())
            elif e.type == "effect_receipt" and e.fields.get("source") == "reconcile":
                found_done += 1
            elif e.type == "effect_absent" and e.fields.get("source") == "reconcile":
                key = e.fields.get("key", "")
                redone += any(n > (e.attempt or 0) for n in intents_after[key])
            elif e.type == "effect_unknown":
                unknown += 1
            elif e.type == "effect_replayed":
                replayed += 1
    stats = {k: int(v) for k, v in c.redis.hgetall(c.keys.stats).items()}
    # Providers: pull requests per key at the forge, commits per push key on every ref of the remote.
    forge_dups = r.forge.duplicates()
    log = git("log", "--all", "--format=%B", cwd=remote)
    push_keys = Counter(line.split(":", 1)[1].strip() for line in log.splitlines()
                        if line.startswith(f"{TRAILER}:"))
    git_dups = {k: v for k, v in push_keys.items() if v > 1}
    latencies: dict[str, list[float]] = defaultdict(list)
    undecided: list[str] = []
    for f in r.faults:
        if f.attempt:
            at = decided_at.get(f.attempt)
            if at is None:
                undecided.append(f"{f.kind} {f.attempt}")
            else:
                latencies[f.kind].append(1000 * (at - f.at))
    try:
        ns_state = c.reads.namespace().state
    except Exception as exc:
        ns_state = f"unreadable: {exc}"
    refused_events = events["stale_write_refused"]
    proxy = r.proxy
    not_succeeded = []
    for t in tasks:
        if t.state is not TaskState.SUCCEEDED:
            why = [f"{a.number}:{a.state.value}" + (
                f" {a.failure.failure_class.value}/{a.failure.type}: {a.failure.message[:160]}" if a.failure else "")
                for a in t.attempts]
            not_succeeded.append(f"{t.id} {t.state.value}: " + "; ".join(why))
    return {
        "seed": r.args.seed, "minutes": r.args.minutes, "workers": r.args.workers,
        "tasks_per_minute": r.args.tasks_per_minute, "fair_keys": r.args.fair_keys, "injecting_s": round(injected_s, 1),
        "settle_s": round(settle_s, 1),
        "faults": Counter(f.kind for f in r.faults), "fault_log": [f.__dict__ for f in r.faults],
        "unexpected_exits": r.fleet.unexpected_exits, "enqueue_errors": r.enqueue_errors,
        "proxy": {"accepted": proxy.connections, "refused": proxy.refused, "closed_by_cut": proxy.closed_by_cut}
        if proxy else None,
        "tasks": len(r.keys), "states": dict(states),
        "lost": missing + [f"{t.id} ({t.state.value})" for t in not_final],
        "forge_pulls": len(r.forge.pulls), "forge_duplicates": forge_dups, "forge_fenced_out": r.forge.fenced_out,
        "zombies_frozen": sum(1 for f in r.faults if f.kind in ZOMBIE_OPERATIONS and f.worker),
        "push_commits": sum(push_keys.values()), "push_keys": len(push_keys), "git_duplicates": git_dups,
        "stale_accepted": stale_bad,
        "stale_refused_stats": stats.get("stale_write_refused", 0), "stale_refused_events": refused_events,
        "stale_refused_by": dict(refused_by),
        "lease_expired": events["lease_expired"], "reconciled": dict(reconciled_outcomes),
        "effects_found_done": found_done, "effects_redone": redone, "effects_replayed": replayed,
        "effects_unknown": unknown, "quarantined": events["task_quarantined"],
        "attention_raised": events["attention_raised"],
        "latency_ms": {k: sorted(v) for k, v in latencies.items()}, "undecided": undecided,
        "namespace_state": ns_state, "not_succeeded": not_succeeded,
    } | (failover_figures(r) if r.cluster is not None else {})


def failover_figures(r: Run) -> dict[str, Any]:
    """--failover: what the failovers did, what the producer saw, whether a loss was detected."""
    try:
        losses = [{"at": e.get("id", ""), "actor": e.get("actor", ""), "reason": e.get("reason", "")[:300]}
                  for e in r.client.reads.namespace_events() if e.get("type") == "state_loss_detected"]
    except Exception as exc:
        losses = [{"at": "", "actor": "", "reason": f"namespace log unreadable: {exc}"}]
    done = [f for f in r.failovers if "kill_to_promotion_s" in f]
    # The event id is Redis TIME in ms (same host clock as time.time()): the first loss recorded between
    # a failover's kill and the next one's, and each failover that dropped acknowledged tasks without one.
    loss_ms = sorted(int(str(e["at"]).split("-")[0]) for e in losses if str(e["at"])[:1].isdigit())
    undetected = []
    for i, f in enumerate(done):
        promoted_ms = 1000 * (f["killed_at"] + f["kill_to_promotion_s"])
        until_ms = 1000 * done[i + 1]["killed_at"] if i + 1 < len(done) else float("inf")
        after = [ms for ms in loss_ms if 1000 * f["killed_at"] <= ms < until_ms]
        f["loss_detected_s_after_promotion"] = round((after[0] - promoted_ms) / 1000, 1) if after else None
        if f.get("acknowledged_missing") and not after:
            undetected.append(f["n"])
    return {"failover": {
        "min_replicas": r.args.min_replicas, "replica_timeout_ms": r.args.replica_timeout_ms,
        "failovers_injected": len(r.failovers), "failovers_completed": sum(1 for f in r.failovers if "rejoin_s" in f),
        "failovers_lagged": sum(1 for f in r.failovers if f.get("lag_s")),
        "failover_errors": [f["error"] for f in r.failovers if "error" in f],
        "failovers_skipped": r.skipped.get("failover", 0),
        "kill_to_promotion_s": [f["kill_to_promotion_s"] for f in done],
        "acknowledged_missing": sorted({k for f in r.failovers for k in f.get("acknowledged_missing", [])}),
        "replication_unconfirmed": r.unconfirmed, "outcome_unknown": r.outcome_unknown,
        "namespace_lost_errors": r.namespace_lost_errors,
        "loss_detected": bool(losses), "state_loss_events": losses, "undetected_losses": undetected,
        "recoveries": r.recoveries,
        "resent_after_recovery": r.resent_after_recovery, "loop_errors": dict(r.loop_errors),
        "failovers": r.failovers,
    }}


def kv(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "-"


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def report(a: dict[str, Any]) -> tuple[str, bool]:
    dup_pr = sum(v - 1 for v in a["forge_duplicates"].values())
    dup_push = sum(v - 1 for v in a["git_duplicates"].values())
    lost = len(a["lost"])
    stale = len(a["stale_accepted"])
    counts_agree = a["stale_refused_stats"] == a["stale_refused_events"]
    ok = lost == 0 and dup_pr == 0 and dup_push == 0 and stale == 0 and counts_agree
    fo = a.get("failover")
    fo_rows: list[str] = []
    fo_notes: list[str] = []
    if fo:
        fo_rows, fo_notes, fo_ok = failover_report(a, fo)
        ok = ok and fo_ok
    mode = f", failover mode (min_replicas={fo['min_replicas']})" if fo else ""
    mode += f", {a['fair_keys']} fairness keys (fair lanes)" if a.get("fair_keys") else ""
    out = [f"## Chaos run: seed {a['seed']}, {a['minutes']} min of faults, {a['workers']} workers, "
           f"{a['tasks_per_minute']} tasks/min{mode}", "",
           f"Injecting {a['injecting_s']} s, then settling {a['settle_s']} s. Result: **{'PASS' if ok else 'FAIL'}**.",
           "", "| fault | injected |", "|---|---:|"]
    for kind in dict.fromkeys(FAILOVER_KINDS if fo else KINDS):
        out.append(f"| {kind} | {a['faults'].get(kind, 0)} |")
    out.append(f"| processes that died on their own, restarted | {len(a['unexpected_exits'])} |")
    out += ["", "| check | value | must be |", "|---|---:|---|",
            f"| tasks enqueued (idempotency keys) | {a['tasks']} | |",
            f"| task states | {kv(a['states'])} | |",
            f"| **tasks lost** (missing, or not at rest) | {lost} | 0 |",
            f"| pull requests at the provider / duplicates | {a['forge_pulls']} / {dup_pr} | dup 0 |",
            f"| zombies frozen between intent and call / late pull requests refused by the forge's fence | "
            f"{a['zombies_frozen']} / {a['forge_fenced_out']} | |",
            f"| push commits on the remote / push keys / duplicates | {a['push_commits']} / {a['push_keys']} / "
            f"{dup_push} | dup 0 |",
            f"| **stale writes accepted** | {stale} | 0 |",
            f"| stale writes refused: `stale_write_refused` in `{{prefix}}:stats` / events | "
            f"{a['stale_refused_stats']} / {a['stale_refused_events']} | equal |",
            f"| refused, by op/refusal | {kv(a['stale_refused_by'])} | |",
            f"| leases expired | {a['lease_expired']} | |",
            f"| suspects reconciled, by outcome | {kv(a['reconciled'])} | |",
            f"| effects found done by the reconciler / found absent and redone | {a['effects_found_done']} / "
            f"{a['effects_redone']} | |",
            f"| receipts replayed by a later Attempt (not repeated) / effects unknown | {a['effects_replayed']} / "
            f"{a['effects_unknown']} | |",
            f"| quarantined / attention items raised | {a['quarantined']} / {a['attention_raised']} | |",
            f"| enqueue calls that failed and were resent with the same key | {a['enqueue_errors']} | |",
            f"| namespace state at the end | {a['namespace_state']} | ok |",
            *fo_rows,
            "", "| fault -> attempt_reconciled of the victim's Attempt | n | p50 ms | p95 ms | max ms |",
            "|---|---:|---:|---:|---:|"]
    for kind, vals in sorted(a["latency_ms"].items()):
        out.append(f"| {kind} | {len(vals)} | {fmt_ms(pct(vals, 50))} | {fmt_ms(pct(vals, 95))} | "
                   f"{fmt_ms(max(vals))} |")
    every = [v for vals in a["latency_ms"].values() for v in vals]
    out.append(f"| all | {len(every)} | {fmt_ms(pct(every, 50))} | {fmt_ms(pct(every, 95))} | "
               f"{fmt_ms(max(every) if every else None)} |")
    if a["undecided"]:
        out += ["", f"Faults whose Attempt got no attempt_reconciled: {', '.join(a['undecided'])}"]
    for e in a["unexpected_exits"]:
        out.append(f"- {e['process']} exited {e['exit_code']} (last fault: {e['last_fault']}): "
                   f"`{e['last_log_line']}`")
    for item in a["not_succeeded"][:20]:
        out.append(f"- at rest, not succeeded: {item}")
    for item in a["lost"][:20]:
        out.append(f"- LOST: {item}")
    for item in a.get("stuck", [])[:60]:
        out.append(f"- stuck: {item}")
    for item in a["stale_accepted"][:20]:
        out.append(f"- STALE WRITE ACCEPTED: {item}")
    if not counts_agree:
        out.append("- the stats counter and the audited events disagree")
    out += fo_notes
    return "\n".join(out), ok


def failover_report(a: dict[str, Any], fo: dict[str, Any]) -> tuple[list[str], list[str], bool]:
    """--failover: the rows of the check table, the notes below it, and whether the promise held:
    at least one failover, each one completed, the namespace ok at the end, and with min_replicas >= 1
    no acknowledged task missing and no loss detected; with 0, every loss detected (and recovered)."""
    secs = fo["kill_to_promotion_s"]
    missing = len(fo["acknowledged_missing"])
    detected = fo["loss_detected"]
    strict = fo["min_replicas"] >= 1
    ok = (fo["failovers_injected"] >= 1 and not fo["failover_errors"] and a["namespace_state"] == "ok"
          and ((missing == 0 and not detected) if strict else not fo["undetected_losses"]))
    recs = fo["recoveries"]
    rows = [
        f"| **failovers injected** / completed (old primary rejoined) / lagged | {fo['failovers_injected']} / "
        f"{fo['failovers_completed']} / {fo['failovers_lagged']} | >= 1, all completed |",
        f"| kill -> promotion, s (each failover) | {', '.join(f'{v:.1f}' for v in secs) or '-'} | |",
        f"| **acknowledged tasks missing on the new primary** (right after promotion) | {missing} | "
        f"{'0' if strict else 'detected if > 0'} |",
        f"| enqueues refused with `ReplicationUnconfirmed` (resent with the same key) | "
        f"{fo['replication_unconfirmed']} | |",
        f"| other `OutcomeUnknown` / `NamespaceLost` on enqueue (resent) | {fo['outcome_unknown']} / "
        f"{fo['namespace_lost_errors']} | |",
        f"| **loss detected** (`state_loss_detected` in the namespace log) | "
        f"{'yes' if detected else 'no'} ({len(fo['state_loss_events'])} events) | "
        f"{'no' if strict else 'yes after each failover that dropped acknowledged tasks'} |",
        f"| failovers that dropped acknowledged tasks with no loss detected after them | "
        f"{len(fo['undetected_losses'])} | 0 |",
        f"| `mcq recover` runs (exit codes) / keys resent after a recovery | {len(recs)} "
        f"({', '.join(str(x['exit_code']) for x in recs) or '-'}) / {fo['resent_after_recovery']} | |",
    ]
    notes = [f"- failover {f['n']}: " + (f"ERROR {f['error']}" if "error" in f else
             f"lag {f['lag_s']:.1f} s ({f.get('lag_bytes')} bytes behind), kill -> promotion "
             f"{f['kill_to_promotion_s']:.1f} s, rejoin {f['rejoin_s']:.1f} s, acknowledged before the kill "
             f"{f['acknowledged_before_kill']}, missing after {len(f['acknowledged_missing'])}"
             + ("" if f.get("loss_detected_s_after_promotion") is None else
                f", loss detected {f['loss_detected_s_after_promotion']} s after the promotion"))
             for f in fo["failovers"]]
    notes += [f"- LOSS DETECTED by {e['actor']}: {e['reason']}" for e in fo["state_loss_events"]]
    notes += [f"- mcq recover (found {x['found']}) exit {x['exit_code']} in {x['seconds']} s: `{x['output'][-160:]}`"
              for x in recs]
    if fo["loop_errors"]:
        notes.append(f"- errors the run's own loop met and went on: {kv(fo['loop_errors'])}")
    return rows, notes, ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=2.0, help="minutes of fault injection")
    p.add_argument("--short", action="store_true", help="CI mode: 0.5 min of faults, settle timeout 50 s")
    p.add_argument("--fair-keys", type=int, default=0, metavar="N",
                   help="tasks name one of N fairness keys in turn (their messages wait in fair lanes, a ticket in "
                        "RQ's list): the lanes under the same faults; 0 (default): none")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cover-kinds", action="store_true",
                   help="inject until every fault kind happened once (at most 3x --minutes); on with --short")
    p.add_argument("--tasks-per-minute", type=float, default=40.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--think-s", type=float, default=0.5, help="pause in each task between push and pull request")
    p.add_argument("--fault-min", type=float, default=2.5, help="seconds between faults, at least")
    p.add_argument("--fault-max", type=float, default=5.0, help="seconds between faults, at most")
    p.add_argument("--settle-timeout", type=float, default=None, help="seconds (default 50 short, 120 else)")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, Redis data, git remote)")
    p.add_argument("--failover", action="store_true",
                   help="Redis is a primary + replica + 3 sentinels; the link faults are replaced by failovers")
    p.add_argument("--min-replicas", type=int, default=1, help="--failover: min_replicas of every process's URL")
    p.add_argument("--replica-timeout-ms", type=int, default=1000, help="--failover: replica_timeout_ms of the URL")
    args = p.parse_args()
    if args.short:
        args.minutes = 0.5
        args.cover_kinds = True
    if args.settle_timeout is None:
        args.settle_timeout = 50.0 if args.minutes <= 0.5 else 120.0
    a = run(args)
    text, ok = report(a)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({**a, "ok": ok}, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

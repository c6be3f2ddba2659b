"""Failovers with real processes: a lagging replica promoted after the primary is SIGKILLed, and a
planned `SENTINEL FAILOVER` under load; each with min_replicas=0 and with the Sentinel URL's default
(1); then the cost of min_replicas=1 on enqueue and claim+complete throughput.

The scenario, once per mode (``--modes``, ``<kill|planned>:<min_replicas|default>``;
``mc_queue.testing.FailoverCluster``): a primary (AOF, appendfsync always) and one replica whose
replication link runs through a TCP proxy, three redis-sentinel processes (quorum 2, down-after 3 s,
failover-timeout 10 s by default); ``mcq worker`` (x2, ``--kind simple``) and ``mcq sweeper`` processes
of the example app (``mc_queue.examples.agents``: push a commit to a bare git remote, open a pull
request at a local forge) on the service's ``redis+sentinel://`` URL, and a producer in this process
enqueueing tasks with idempotency keys. ``kill``: after a warm-up, the replication link is held back
(``--lag-s`` seconds of acknowledged work: enqueues, claims, effects, completions), then the primary is
SIGKILLed and the proxy cut, the sentinels promote the replica, and the old primary is started again
(the sentinels make it a replica of the new one). ``planned``: after the warm-up, ``SENTINEL FAILOVER``
while the producer keeps sending: the replica is promoted with the primary alive, which takes writes
until the sentinels demote it. The workers and the sweeper follow the failover through Sentinel,
without a restart; a process started afterwards on the new primary's plain URL (``mcq namespace --json``
with the same ``MCQ_STATE_DIR``) shows what a restarted process finds. The producer resends whatever
was not acknowledged with the same key. When the loss is reported the script runs ``mcq recover`` and
the producer resends every key it was acknowledged for (the resend path the README prescribes after a
loss). Reported per run: acknowledged tasks lost (acknowledged by enqueue, absent from the new
primary), duplicates at the providers (commits per operation key on the remote, pull requests per key
at the forge), whether the loss was detected (namespace state, the ``state_loss_detected`` event, who
saw it, how long after the failover), the final task states and the time from the failover to every
task succeeded (``recovered_s``).

The throughput part runs a primary and a replica (direct replication link, appendfsync always)
and one producer/worker process: enqueue tasks/s and claim+complete cycles/s with tracking off,
with tracking on (min_replicas=0), and with min_replicas=1, interleaved, median of ``--repeat``.

    .venv/bin/python bench/failover.py                      # four scenarios + throughput (~6 min)
    .venv/bin/python bench/failover.py --only scenario --modes planned:default,planned:0 --json fo.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mc_queue  # noqa: E402
from mc_queue.contracts.errors import ReplicationUnconfirmed  # noqa: E402
from mc_queue.contracts.keys import Keys  # noqa: E402
from mc_queue.contracts.models import TaskState  # noqa: E402
from mc_queue.demo.fleet import Fleet, provider_env  # noqa: E402
from mc_queue.providers.git import git  # noqa: E402
from mc_queue.testing import FailoverCluster, RedisServer  # noqa: E402

TRAILER = "Mcq-Operation-Key"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Producer:
    """Enqueues tasks with idempotency keys through the app's client; resends what was not acknowledged."""

    def __init__(self, url: str, prefix: str) -> None:
        from mc_queue.examples.agents import app

        self.ac = app.connect(url, prefix=prefix)
        self.acked: dict[str, str] = {}  # key -> task id, acknowledged by enqueue
        self.errors: Counter[str] = Counter()
        self.unacked: list[str] = []

    def send(self, key: str, issue: int, think_s: float) -> bool:
        try:
            task = self.ac.enqueue("fix-issue", {"repository": "example/app", "issue": issue, "think_s": think_s,
                                                 "instruction": f"fix issue {issue}"}, idempotency_key=key)
        except ReplicationUnconfirmed:
            self.errors["ReplicationUnconfirmed"] += 1
            return False
        except (mc_queue.McqError, redis.RedisError) as exc:
            self.errors[type(exc).__name__] += 1
            return False
        self.acked.setdefault(key, task.id)
        return True

    def close(self) -> None:
        self.ac.close()


def provider_counts(remote: Path, forge: Any) -> tuple[int, int, dict[str, int], int, dict[str, int]]:
    out = git("log", "--all", "--format=%B", cwd=remote)
    commits = Counter(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith(f"{TRAILER}:"))
    return (sum(commits.values()), len(commits), {k: v for k, v in commits.items() if v > 1}, len(forge.pulls),
            forge.duplicates())


def scenario(mode: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run. ``mode`` is ``<kind>:<min_replicas>``: kind ``kill`` (the replication link held back, the
    primary SIGKILLed, the replica promoted, the old primary restarted) or ``planned`` (``SENTINEL
    FAILOVER`` under load: the replica is promoted while the primary lives and takes writes until it is
    demoted); min_replicas a number, or ``default`` (the URL names none: a Sentinel URL's default, 1)."""
    kind, _, mr = mode.partition(":")
    min_replicas = None if mr == "default" else int(mr)
    prefix = f"fo{kind[0]}{mr[0]}"
    state = root / "state"
    # Sentinel's down-after of 1 s (the tests' setting) made a sentinel on this loaded 2-core machine
    # take the freshly promoted replica for dead and fail back to the restarted old primary.
    cluster = FailoverCluster(root / "cluster", down_after_ms=args.down_after_ms,
                              failover_timeout_ms=args.failover_timeout_ms).start()
    prov = provider_env(root, extra={"MCQ_STATE_DIR": str(state)}, forge_timeout_s=3)
    os.environ["MCQ_STATE_DIR"] = str(state)
    url = cluster.url(replica_timeout_ms=args.replica_timeout_ms) if min_replicas is None else \
        cluster.url(min_replicas=min_replicas, replica_timeout_ms=args.replica_timeout_ms)
    logs = root / "logs"
    logs.mkdir()
    fleet = Fleet(prefix, url, prov.env, logs, sweeper_interval_s=0.5, restart=True)
    producer = Producer(url, prefix)
    ops = mc_queue.Client(url, prefix=prefix, actor="bench", track_replication="off")  # reads
    result: dict[str, Any] = {"mode": mode, "min_replicas": producer.ac.client.backend.min_replicas,
                              "url_names_min_replicas": min_replicas is not None}
    try:
        for _ in range(args.workers):
            fleet.worker()
        fleet.sweeper()
        keys = [f"issue-{prefix}-{i}" for i in range(args.tasks)]
        warm = keys[: args.tasks // 2]
        during = keys[args.tasks // 2:]
        for i, k in enumerate(warm):
            producer.send(k, i, args.think_s)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # some work done before the lag starts
            done = sum(1 for t in producer.acked.values() if ops.reads.get_task(t).state is TaskState.SUCCEEDED)
            if done >= max(1, len(warm) // 2):
                break
            time.sleep(0.2)
        if kind == "kill":
            log(f"{mode}: warm-up done, holding the replication link back for {args.lag_s}s")
            cluster.lag()
            t_lag = time.monotonic()
            for i, k in enumerate(during):
                producer.send(k, len(warm) + i, args.think_s)
                time.sleep(max(0.0, args.lag_s / max(1, len(during))))
            while time.monotonic() - t_lag < args.lag_s:
                time.sleep(0.05)
            primary = cluster.primary_info()
            replica = cluster.replica_info()
            result["lag_bytes"] = int(primary["master_repl_offset"]) - int(replica.get("master_repl_offset", 0))
            acked_before_kill = dict(producer.acked)
            cluster.kill_primary()
            t_kill = time.monotonic()
            cluster.wait_failover()
            t_failover = time.monotonic()
            wall_failover = time.time()
            log(f"{mode}: failover after {t_failover - t_kill:.1f}s; restarting the old primary")
            cluster.restart_old_primary()
            log(f"{mode}: the old primary is a replica of the new one; watching for a loss report")
        else:
            # SENTINEL FAILOVER while the producer keeps sending: the old primary takes writes until the
            # sentinels demote it (seconds later); what it took is gone then, unless WAIT refused it.
            log(f"{mode}: warm-up done, SENTINEL FAILOVER under load")
            stop = threading.Event()

            def send_during() -> None:
                for i, k in enumerate(during):
                    while not stop.is_set() and not producer.send(k, len(warm) + i, args.think_s):
                        time.sleep(0.05)
                    time.sleep(args.lag_s / max(1, len(during)))

            sender = threading.Thread(target=send_during, daemon=True)
            sender.start()
            time.sleep(args.lag_s / 3)
            t_kill = time.monotonic()
            cluster.planned_failover()
            t_failover = time.monotonic()
            wall_failover = time.time()
            cluster.wait_demoted()
            result["demoted_after_s"] = round(time.monotonic() - t_failover, 1)
            log(f"{mode}: promoted after {t_failover - t_kill:.1f}s, the old primary demoted "
                f"{result['demoted_after_s']}s later")
            sender.join(timeout=args.settle_timeout_s)
            stop.set()
            acked_before_kill = dict(producer.acked)
        new_primary = cluster.replica
        direct = new_primary.client()
        lost = [k for k, t in acked_before_kill.items() if not direct.exists(Keys(prefix).task(t).task)]
        result["acknowledged_before_kill"] = len(acked_before_kill)
        result["acknowledged_lost"] = len(lost)
        result["lost_keys"] = lost
        result["failover_s"] = round(t_failover - t_kill, 1)

        # Was the loss seen? Poll the namespace on the new primary.
        detected_at = None
        deadline = time.monotonic() + args.detect_timeout_s
        while time.monotonic() < deadline:
            meta = direct.hgetall(f"{Keys(prefix).tag}:meta")
            if meta.get("state") == "lost":
                detected_at = time.monotonic()
                break
            if producer.ac.client.backend.min_replicas and time.monotonic() - t_failover > args.quiet_s:
                break  # nothing to detect: stop waiting after a while
            fleet.reap("failover")
            for k in keys:  # the producer resends what was never acknowledged, with its key
                if k not in producer.acked:
                    producer.send(k, keys.index(k), args.think_s)
            time.sleep(0.25)
        nslog = direct.xrange(f"{Keys(prefix).tag}:nslog")
        losses = [(i, e) for i, e in nslog if e.get("type") == "state_loss_detected"]
        names = {str(p.pid): n for n, p in fleet.procs.items()} | {str(os.getpid()): "producer"}
        result["namespace_after_failover"] = direct.hget(f"{Keys(prefix).tag}:meta", "state")
        result["loss_events"] = [{"actor": e.get("actor"), "process": names.get(str(e.get("actor")).rpartition(":")[2]),
                                  "reason": e.get("reason"),
                                  # the event's id is Redis TIME in ms: when the loss was recorded
                                  "s_after_failover": round(int(i.split("-")[0]) / 1000 - wall_failover, 1)}
                                 for i, e in losses]
        result["detected"] = detected_at is not None
        fresh = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", new_primary.url, "--prefix", prefix,
                                "namespace", "--json"], env={**prov.env}, capture_output=True, text=True, timeout=60)
        try:
            fresh_state = json.loads(fresh.stdout).get("state")
        except ValueError:
            fresh_state = f"unreadable (exit {fresh.returncode}): {fresh.stderr.strip()[-200:]}"
        result["restarted_process_sees"] = {"state": fresh_state, "exit_code": fresh.returncode}

        if result["namespace_after_failover"] == "lost":
            log(f"{mode}: loss reported; running mcq recover, then resending every key")
            rec = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", url, "--prefix", prefix,
                                  "recover", "--reason", "bench: failover lost acknowledged writes"],
                                 env={**prov.env}, capture_output=True, text=True, timeout=120)
            result["recover_exit_code"] = rec.returncode
            producer.acked.clear()
        # Everything the producer was told, and everything it resends, must end succeeded.
        log(f"{mode}: settling (every task acknowledged and succeeded)")
        deadline = time.monotonic() + args.settle_timeout_s
        states: Counter[str] = Counter()
        while time.monotonic() < deadline:
            for i, k in enumerate(keys):
                if k not in producer.acked:
                    producer.send(k, i, args.think_s)
            states = Counter()
            for k in keys:
                tid = producer.acked.get(k)
                states[ops.reads.get_task(tid).state.value if tid else "not acknowledged"] += 1
            if states.get("succeeded", 0) == len(keys):
                break
            fleet.reap("settle")
            time.sleep(0.5)
        result["final_states"] = dict(states)
        result["recovered_s"] = round(time.monotonic() - t_failover, 1)  # failover to every task succeeded
        commits, push_keys, git_dups, pulls, forge_dups = provider_counts(prov.remote, prov.forge)
        result["providers"] = {"commits": commits, "push_keys": push_keys, "duplicate_pushes": git_dups,
                               "pull_requests": pulls, "duplicate_pull_requests": forge_dups}
        result["producer_errors"] = dict(producer.errors)
        result["namespace_final"] = ops.reads.namespace().state
        result["namespace_log_final"] = [
            {k: str(e.get(k, ""))[:300] for k in ("type", "actor", "reason")}
            for e in ops.reads.namespace_events() if e.get("type") in ("state_loss_detected", "recovery_started",
                                                                  "recovery_finished")]
        result["unexpected_exits"] = [{"process": e["process"], "exit_code": e["exit_code"],
                                       "last_log_line": e["last_log_line"][:160]} for e in fleet.unexpected_exits]
        direct.close()
    finally:
        fleet.stop_all()
        producer.close()
        ops.close()
        prov.stop()
        cluster.stop()
        os.environ.pop("MCQ_STATE_DIR", None)
    return result


# ---------------------------------------------------------------------- throughput


def throughput(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    primary = RedisServer(root / "tp-primary", appendfsync="always").start()
    replica = RedisServer(root / "tp-replica", appendfsync="always",
                          extra=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        r = replica.client()
        deadline = time.monotonic() + 30
        while r.info("replication").get("master_link_status") != "up" and time.monotonic() < deadline:
            time.sleep(0.05)
        r.close()
        modes = {"off": dict(track_replication="off"), "track": dict(track_replication="on"),
                 "min_replicas=1": dict(min_replicas=1, replica_timeout_ms=2000)}
        rates: dict[str, dict[str, list[float]]] = {m: {"enqueue": [], "cycle": []} for m in modes}
        for rep in range(args.repeat):
            for mode, kw in modes.items():
                q = mc_queue.Client(primary.url, prefix=f"tp-{rep}-{mode.replace('=', '')}", actor="bench",
                                    state_dir=str(root / "tp-state"), **kw)  # type: ignore[arg-type]
                q.backend.open_namespace()
                ids = []
                t0 = time.perf_counter()
                end = t0 + args.seconds
                while time.perf_counter() < end:
                    ids.append(q.producer.enqueue("tp", "noop", {"i": len(ids)}).id)
                rates[mode]["enqueue"].append(len(ids) / (time.perf_counter() - t0))
                n = 0
                t0 = time.perf_counter()
                end = t0 + args.seconds
                while time.perf_counter() < end and n < len(ids):
                    lease = q.leases.claim_attempt(ids[n], "w", 60_000)
                    q.leases.complete_quietly(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w")
                    n += 1
                rates[mode]["cycle"].append(n / (time.perf_counter() - t0))
                q.close()
        med = {m: {k: statistics.median(v) for k, v in d.items()} for m, d in rates.items()}
        return {"repeat": args.repeat, "seconds": args.seconds, "median": med, "runs": rates,
                "ratio_vs_off": {m: {k: med[m][k] / med["off"][k] for k in ("enqueue", "cycle")} for m in modes}}
    finally:
        replica.kill()
        primary.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--think-s", type=float, default=0.3, help="the example handler's pause between push and PR")
    ap.add_argument("--lag-s", type=float, default=2.0, help="how long the replication link is held back")
    ap.add_argument("--replica-timeout-ms", type=int, default=1000)
    ap.add_argument("--down-after-ms", type=int, default=3000, help="sentinel down-after-milliseconds")
    ap.add_argument("--failover-timeout-ms", type=int, default=10000, help="sentinel failover-timeout")
    ap.add_argument("--detect-timeout-s", type=float, default=30.0)
    ap.add_argument("--quiet-s", type=float, default=10.0,
                    help="with min_replicas >= 1: how long after the failover to watch for a loss report that "
                         "should not come")
    ap.add_argument("--settle-timeout-s", type=float, default=120.0)
    ap.add_argument("--seconds", type=float, default=3.0, help="throughput: seconds per measurement")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["scenario", "throughput"], default=None)
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--modes", default="kill:0,kill:default,planned:0,planned:default",
                    help="scenarios, <kill|planned>:<min_replicas|default> (default: the Sentinel URL's own, 1)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs) and print it")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    base = Path(tempfile.mkdtemp(prefix="mcq-failover-"))
    try:
        if args.only != "throughput":
            for m in args.modes.split(","):
                root = base / m.replace(":", "-")
                root.mkdir()
                out[m] = scenario(m, root, args)
                log(json.dumps(out[m], default=str))
        if args.only != "scenario":
            log("throughput: tracking off / tracking on / min_replicas=1, interleaved")
            out["throughput"] = throughput(base, args)
    finally:
        if args.keep:
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

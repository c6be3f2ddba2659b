"""``mcq demo``: the contracts at work, with a real worker process that is paused past its lease.

1. A producer enqueues a task (idempotently: sending it twice makes one task).
2. Worker A, a separate process, claims Attempt 1 (fence 1) and heartbeats.
3. Worker A is frozen with SIGSTOP for longer than its lease.
4. The sweeper step expires the lease: Attempt 1 turns suspect, the fence moves to 2.
5. Reconciliation finds no recorded side effect and settles Attempt 1 as failed (executor).
6. An operator retries with a reason: Attempt 2. Worker B claims it (fence 3) and completes.
7. Worker A is thawed (SIGCONT): its heartbeat and its completion are refused and audited.
8. The task's timeline is printed from the records alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from ..client import Client
from ..client.connect import connect
from ..contracts.errors import McqError
from ..ops.render import print_task
from ..policy.reconcile import reconcile_attempt
from ..store.urls import redacted

LEASE_MS = 1500


def _worker_a(url: str, prefix: str, task_id: str) -> None:
    """Worker A: claim, heartbeat every 300 ms for ~3 s of 'work', then try to complete."""
    q = connect(url, prefix=prefix)
    lease = q.leases.claim_attempt(task_id, "worker-A", lease_ms=LEASE_MS)
    print(json.dumps({"event": "claimed", "attempt": lease.attempt_id, "fence": lease.fence}), flush=True)
    outcome: dict[str, Any] = {}
    for _ in range(10):
        time.sleep(0.3)
        try:
            q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="worker-A")
        except McqError as exc:
            outcome["heartbeat"] = f"{type(exc).__name__}: {exc}"
            break
    try:
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"pull_request": "from worker A"},
                                  worker_id="worker-A")
        outcome["complete"] = "accepted"
    except McqError as exc:
        outcome["complete"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"event": "done", **outcome}), flush=True)


def run_demo(redis_url: str | None, home: str | None, *, keep_server: bool = False,
             after: Callable[[Client], None] | None = None) -> int:
    """The short contracts demo; ``after(client)`` runs at the end, before the server is stopped."""
    console = Console()
    q = connect(redis_url, prefix="demo", home=home)
    server = q.embedded
    if server is not None:
        how = "started" if server.started else "reused"
        console.print(f"[bold]embedded redis-server[/bold] {how}: {server.url} "
                      f"(AOF, appendfsync always; data in {server.home / 'redis'})")
    else:
        console.print(f"[bold]redis[/bold]: {redacted(redis_url or '')}")
    info = q.backend.open_namespace()
    if info.state != "ok":
        console.print(f"[red]namespace 'demo' is {info.state}: run `mcq --prefix demo recover` first[/red]")
        return 3

    run_key = f"demo-{int(time.time() * 1000)}"
    payload = {"repository": "example/app", "issue": 42, "instruction": "fix the failing test"}
    task = q.producer.enqueue("agents", "fix-issue", payload, idempotency_key=run_key, executor="codex", model="gpt-x",
                     base_sha="4f9c2a1")
    again = q.producer.enqueue("agents", "fix-issue", payload, idempotency_key=run_key)
    console.print(f"1. enqueued [bold]{task.id}[/bold]; sent again with the same key -> "
                  f"same task: {again.id == task.id}")

    url = q.url
    proc = subprocess.Popen(
        [sys.executable, "-c", f"from mc_queue.demo.zombie import _worker_a; _worker_a({url!r}, 'demo', {task.id!r})"],
        stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout is not None
    claimed = json.loads(proc.stdout.readline())
    console.print(f"2. worker A (pid {proc.pid}) claimed {claimed['attempt']} with fence {claimed['fence']}, "
                  f"lease {LEASE_MS} ms, heartbeating")
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGSTOP)
    console.print(f"3. worker A frozen with SIGSTOP for {2 * LEASE_MS} ms (its lease is {LEASE_MS} ms)")
    time.sleep(2 * LEASE_MS / 1000)
    expired = q.maintenance.expire_leases(actor="sweeper")
    for e in expired:
        console.print(f"4. sweeper: {e.attempt_id} suspect, fence {e.old_fence} -> {e.new_fence}")
    settled = reconcile_attempt(q, claimed["attempt"], actor="reconciler")
    console.print(f"5. reconciliation: no side effect recorded -> attempt {settled.number} {settled.state.value} "
                  f"({settled.failure.failure_class.value if settled.failure else ''})")
    attempt2 = q.operator.retry_task(task.id, "worker A stopped heartbeating and lost its lease",
                            "a healthy worker finishes the same plan", actor="operator")
    lease_b = q.leases.claim_attempt(task.id, "worker-B", lease_ms=10_000)
    q.leases.complete_attempt(lease_b.attempt_id, lease_b.fence, {"pull_request": "from worker B"},
                              worker_id="worker-B")
    console.print(f"6. operator retry -> {attempt2.id}; worker B claimed it with fence {lease_b.fence} and completed")
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=30)
    done = json.loads(out.strip().splitlines()[-1])
    console.print(f"7. worker A thawed: heartbeat -> {done.get('heartbeat', 'no refusal')}")
    console.print(f"   worker A complete -> {done.get('complete')}")
    final = q.reads.get_task(task.id)
    console.print(f"8. the records: task {final.state.value}, result {final.result}\n")
    print_task(final, console)
    refused = sum(1 for e in final.events if e.type == "stale_write_refused")
    ok = (final.state.value == "succeeded" and final.result == {"pull_request": "from worker B"}
          and refused >= 1 and done.get("complete") != "accepted")
    console.print(f"\nstale writes refused and audited: {refused}; stale writes accepted: "
                  f"{0 if done.get('complete') != 'accepted' else 1}")
    if after is not None:
        after(q)
    if server is not None and server.started and not keep_server:
        from ..store.embedded import stop_server

        stop_server(server.home)
        console.print(f"embedded redis-server stopped; its data stays in {server.home / 'redis'} for the next run")
    q.close()
    return 0 if ok else 1

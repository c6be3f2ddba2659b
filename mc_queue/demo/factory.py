"""``mcq demo``: an agent factory at work, with faults injected while it runs.

Tasks of the example agent app (``mc_queue.examples.agents``) each clone a local git remote into a
fresh workspace, commit a change, push it (``--force-with-lease``) and open a pull request at a local
HTTP provider. A pool of real worker processes and a sweeper process run them while the demo:

- kills a worker (SIGKILL) after its push and before its pull request;
- pauses a worker (SIGSTOP) past its lease, then lets it resume;
- makes the provider time out after it accepted a pull request.

At the end it prints, per task, its outcome, and the totals read from the records and from the
providers: pull requests and pushes (duplicates: 0), stale writes refused, leases expired and
reconciled, quarantined. It cleans up what it started.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..client import Client
from ..client.connect import connect
from ..contracts.models import Task, TaskState
from ..ops.render import mcq_invocation
from ..providers.git import TRAILER, git
from ..testing.forge import ForgeServer
from .fleet import Fleet, ProviderEnv, provider_env

FINAL = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.BLOCKED, TaskState.QUARANTINED, TaskState.CANCELED}


@dataclass
class Faults:
    killed: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    provider_timeouts: int = 0


def _running(client: Client, tasks: list[str]) -> list[Task]:
    out = []
    for tid in tasks:
        t = client.reads.get_task(tid)
        latest = t.latest
        if t.state is TaskState.RUNNING and latest is not None and latest.state.value == "running":
            out.append(t)
    return out


def _inject(client: Client, fleet: Fleet, tasks: list[str], faults: Faults, lease_s: float) -> None:
    """One step of the fault script, driven by what the records say is happening."""
    fleet.resume_due(lease_s + 4)  # well past its lease: let it resume and try to write
    running = [(t, t.latest.worker_id) for t in _running(client, tasks) if t.latest and t.latest.worker_id]
    running = [(t, w) for t, w in running if w is not None and fleet.alive(w)]
    if not faults.paused:
        for t, worker in running:  # freeze a worker in the middle of its task, for longer than its lease
            fleet.pause(worker)
            faults.paused.append(f"{worker} on {t.id}")
            return
    if not faults.killed:
        for t, worker in running:
            pushed = any(e.type == "effect_receipt" and e.fields.get("key", "").startswith("push:") for e in t.events)
            pr_started = any(e.type == "effect_intent" and e.fields.get("operation") == "open-pr" for e in t.events)
            if pushed and not pr_started:
                fleet.kill(worker)  # mid-task: after the push, before the pull request
                faults.killed.append(f"{worker} on {t.id}")
                fleet.worker(f"{worker}-r")  # a replacement joins the pool
                return


def run_factory_demo(redis_url: str | None, home: str | None, *, tasks: int = 8, workers: int = 3,
                     keep_server: bool = False, timeout_s: float = 180.0,
                     after: Callable[[Client], None] | None = None) -> int:
    """Run the factory; ``after(client)`` runs once the report is printed, while the namespace and its
    server are still there (``mcq demo`` keeps the console open in it until Enter)."""
    console = Console()
    q = connect(redis_url, prefix=f"factory-{int(time.time())}", home=home)
    server = q.embedded
    if server is not None:
        console.print(f"[bold]embedded redis-server[/bold] {'started' if server.started else 'reused'}: "
                      f"{server.url} (AOF, appendfsync always; data in {server.home / 'redis'})")
    tmp = Path(tempfile.mkdtemp(prefix="mcq-demo-"))
    providers: ProviderEnv | None = None
    fleet: Fleet | None = None
    story: str | None = None  # the task whose story the closing hint shows
    try:
        providers = provider_env(tmp)  # a git remote, a pull-request API (one PR per head), their env
        forge, remote = providers.forge, providers.remote
        from ..examples.agents import app
        from ..producer.dispatch import AppClient

        ac = AppClient(app, q)
        lease_s = app.spec("fix-issue").lease_ms / 1000
        forge.stall_next(1, 3.0)  # the first pull request is accepted, then the client times out
        ids = [ac.enqueue("fix-issue", {"repository": "example/app", "issue": 100 + i, "think_s": 2.0,
                                        "instruction": f"make test_{i} pass"}, idempotency_key=f"issue-{100 + i}").id
               for i in range(tasks)]
        console.print(f"{tasks} tasks enqueued on namespace [bold]{q.keys.prefix}[/bold]; git remote {remote}; "
                      f"pull-request API {forge.url}")
        fleet = Fleet(q.keys.prefix, q.url, providers.env, tmp)
        fleet.sweeper("sweeper")
        for i in range(workers):
            fleet.worker(f"demo-w{i + 1}")
        faults = Faults()
        deadline = time.monotonic() + timeout_s
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console) as bar:
            job = bar.add_task("tasks final", total=tasks)
            while time.monotonic() < deadline:
                done = sum(1 for t in ids if q.reads.get_task(t).state in FINAL)
                bar.update(job, completed=done,
                           description=f"tasks final (killed {len(faults.killed)}, paused {len(faults.paused)})")
                if done == tasks and not fleet.paused:
                    break
                _inject(q, fleet, ids, faults, lease_s)
                time.sleep(0.25)
        time.sleep(1.0)  # the thawed worker's refused writes land
        fleet.stop_all()
        faults.provider_timeouts = 1 - forge.stalls_left  # the stalls the provider actually served
        code = _report(console, q, ids, forge, remote, faults)
        story = max(ids, key=lambda t: len(q.reads.get_task(t).attempts))
        if after is not None:
            after(q)
        return code
    finally:
        if fleet is not None:
            fleet.stop_all()
        if providers is not None:
            providers.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        stopped = server is not None and server.started and not keep_server
        if server is not None and stopped:
            from ..store.embedded import stop_server

            stop_server(server.home)
            console.print(f"embedded redis-server stopped; its data stays in {server.home / 'redis'}")
        if story is not None:
            _hint(console, story, q.keys.prefix, redis_url, home, server_stopped=stopped)
        q.close()


def _hint(console: Console, task_id: str, prefix: str, redis_url: str | None, home: str | None, *,
          server_stopped: bool) -> None:
    """Commands that show a task's story, as they work typed here (mcq's path, the demo's home)."""
    mcq = mcq_invocation(redis_url=redis_url, home=home)
    lines = [f"{mcq} --prefix {prefix} show {task_id}"]
    if server_stopped:  # a read never starts the embedded server: start it on the demo's data, then stop it
        lines = [f"{mcq} server start", *lines, f"{mcq} server stop"]
    console.print("\nsee a task's story (the one with the most attempts; `tasks` lists the others):")
    for line in lines:
        console.print(f"  {line}", soft_wrap=True, highlight=False, markup=False)


def _report(console: Console, q: Client, ids: list[str], forge: ForgeServer, remote: Path, faults: Faults) -> int:
    table = Table(title="Tasks")
    # ids whole (the id column as wide as the longest), anything else folded onto more lines, never cut
    table.add_column("task", min_width=max(len(t) for t in ids), overflow="fold")
    for col in ("state", "attempts", "pull request", "how"):
        table.add_column(col, overflow="fold")
    events: Counter[str] = Counter()
    reconciled: Counter[str] = Counter()
    pushes = 0
    for tid in ids:
        t = q.reads.get_task(tid)
        events.update(e.type for e in t.events)
        for e in t.events:
            if e.type == "effect_receipt" and e.fields.get("source") == "reconcile":
                reconciled["effects found done at the provider"] += 1
            if e.type == "effect_replayed":
                reconciled["effects replayed, not repeated"] += 1
        how = ", ".join(sorted({f"{a.failure.failure_class.value}" for a in t.attempts if a.failure})) or "first try"
        result = t.result or {}
        table.add_row(tid, t.state.value, str(len(t.attempts)), str(result.get("pull_request", "")), how)
        branch = result.get("branch")
        if branch:
            log = git("log", "--format=%B", f"refs/heads/{branch}", cwd=remote)
            pushes += log.count(f"{TRAILER}: push:")
    console.print(table)
    dup = forge.duplicates()
    succeeded = sum(1 for t in ids if q.reads.get_task(t).state is TaskState.SUCCEEDED)
    totals = Table(title="Totals (from the records and the providers)")
    totals.add_column("what", overflow="fold")
    totals.add_column("count", justify="right", overflow="fold")
    for what, n in [
        ("tasks succeeded", f"{succeeded}/{len(ids)}"),
        ("pull requests at the provider", str(len(forge.pulls))),
        ("duplicate pull requests", str(sum(v - 1 for v in dup.values()))),
        ("pushes on the git remote (one commit per task)", str(pushes)),
        ("faults: workers killed mid-task", str(len(faults.killed))),
        ("faults: workers paused past their lease", str(len(faults.paused))),
        ("faults: provider timed out after accepting", str(faults.provider_timeouts)),
        ("leases expired", str(events["lease_expired"])),
        ("attempts reconciled", str(events["attempt_reconciled"])),
        *[(k, str(v)) for k, v in reconciled.items()],
        ("stale writes refused (audited)", str(events["stale_write_refused"])),
        ("claims refused (duplicate messages)", str(events["claim_refused"])),
        ("quarantined", str(events["task_quarantined"])),
    ]:
        totals.add_row(what, n)
    console.print(totals)
    for line in faults.killed:
        console.print(f"killed: {line}")
    for line in faults.paused:
        console.print(f"paused: {line}")
    ok = succeeded == len(ids) and not dup and pushes == len(ids)
    return 0 if ok else 1

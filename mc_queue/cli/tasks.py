"""``mcq``'s commands, until each group moves to a module of its own."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from ..client.connect import embedded_client
from ..client.core import Client
from ..contracts.errors import McqError, ReplicationUnconfirmed
from ..ops.render import print_status, print_task, task_json
from .errors import EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_UNREACHABLE, fail, handle_errors
from .options import ATTEMPT_ID, TASK_ID, Ctx, Finite, check_reason, duration_ms, load_app, redis_now_ms
from .output import emit_json, exit_if_lost
from .root import main

MIN_INTERVAL_S = 0.05  # the sweeper's shortest pause between passes (0 or less busy-looped)


@main.command()
@click.argument("handler")
@click.option("--app", "app_spec", envvar="MCQ_APP", required=True,
              help="The handlers' App, as package.module:app (or $MCQ_APP). The task goes through the same path "
                   "as app.connect().enqueue: an unknown handler is refused, the handler's queue, retry policy, "
                   "budget, lease and timeout are frozen into the task, and its RQ job gets the handler's timeout.")
@click.option("--payload", required=True, help="The task's payload: a JSON object.")
@click.option("--queue", default=None, help="Another queue than the handler's own.")
@click.option("--idempotency-key", default=None, help="Producer key: the same key returns the same task.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole task as JSON.")
@click.pass_obj
@handle_errors
def enqueue(obj: Ctx, handler: str, app_spec: str, payload: str, queue: str | None, idempotency_key: str | None,
            as_json: bool) -> None:
    """Create a task of an App's handler and hand it to the workers; prints its id."""
    from ..producer.dispatch import AppClient

    try:
        data = json.loads(payload)
    except RecursionError:
        raise click.BadParameter("the JSON is nested too deeply; flatten it", param_hint="--payload") from None
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON ({exc}); e.g. --payload '{{\"repo\": \"x\"}}'",
                                 param_hint="--payload") from None
    producer = AppClient(load_app(app_spec), obj.client)
    try:
        task = producer.enqueue(handler, data, idempotency_key=idempotency_key, queue=queue)
    finally:
        producer.close()
    if as_json:
        emit_json(task_json(task))
    else:
        click.echo(task.id)  # stdout: the id alone, for scripts (TASK=$(mcq enqueue ...))
        click.echo(f"follow it: {obj.again} show {task.id}  (all tasks: {obj.again} tasks)", err=True)


@main.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def show(obj: Ctx, task_id: str, as_json: bool) -> None:
    """A task, its Attempts and its whole timeline."""
    task = obj.reader.get_task(task_id)
    effects = obj.reader.effects(task_id)
    if as_json:
        emit_json(task_json(task, effects))
    else:
        print_task(task, effects=effects)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", type=Finite(0.1, 3600), default=None, metavar="SECONDS",
              help="Refresh every SECONDS (0.1 to 3600) until Ctrl-C.")
@click.pass_obj
@handle_errors
def status(obj: Ctx, as_json: bool, watch: float | None) -> None:
    """Per queue: tasks by state and queue age (the oldest claimable pending Attempt's wait)."""
    client = obj.reader
    if watch is not None and not as_json:
        import time

        from rich.live import Live

        from ..ops.render import status_table, text_console

        console = text_console()
        with Live(status_table(client.status(), client.overview(), console.width), console=console,
                  refresh_per_second=4) as live:
            while True:
                time.sleep(watch)
                live.update(status_table(client.status(), client.overview(), console.width))
    data = client.status()
    overview = client.overview()
    paused = client.paused_queues()
    if as_json:
        emit_json({"namespace": client.keys.prefix, "queues": data, "overview": overview, "paused": paused})
    else:
        print_status(data, overview)
        _echo_paused(paused)
    exit_if_lost(client.namespace())


@main.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--reason", required=True, help="Why another Attempt (at least ten characters).")
@click.option("--hypothesis", default=None, help="What is different this time.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def retry(obj: Ctx, task_id: str, reason: str, hypothesis: str | None, as_json: bool) -> None:
    """Append Attempt N+1 to a failed task (Mission Control's rules)."""
    if len(reason.strip()) < 10:
        raise click.BadParameter("a retry needs a reason of at least ten characters", param_hint="--reason")
    attempt = obj.client.retry_task(task_id, reason, hypothesis, actor="operator")
    if as_json:
        emit_json(attempt.model_dump(mode="json"))
    else:
        click.echo(attempt.id)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def expire(obj: Ctx, as_json: bool) -> None:
    """Turn every lease past its expiry into a suspect Attempt (once)."""
    expired = obj.client.expire_leases()
    if as_json:
        emit_json([dataclasses.asdict(e) for e in expired])
    else:
        for e in expired:
            click.echo(f"{e.attempt_id} suspect (fence {e.old_fence} -> {e.new_fence})")
        click.echo(f"{len(expired)} lease(s) expired")


@main.command()
@click.argument("attempt_id", type=ATTEMPT_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def reconcile(obj: Ctx, attempt_id: str, as_json: bool) -> None:
    """Settle a suspect Attempt from the evidence recorded."""
    from ..policy.reconcile import reconcile_attempt

    attempt = reconcile_attempt(obj.client, attempt_id, actor="operator")
    if as_json:
        emit_json(attempt.model_dump(mode="json"))
    else:
        click.echo(f"{attempt.id} {attempt.state.value}")


@main.command()
@click.option("--reason", default="operator ran mcq recover", show_default=True)
@click.option("--yes", is_flag=True,
              help="Confirm a recovery of a namespace that is ok (one that lost state or is recovering needs none).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def recover(obj: Ctx, reason: str, yes: bool, as_json: bool) -> None:
    """After Redis lost state: new epoch, fence floor raised, every live lease voided.

    On a namespace that is ok this voids leases that are live and well (their workers' next writes
    are refused, their Attempts turn suspect and are reconciled): it asks for --yes first."""
    from ..policy.recovery import recover as run_recovery

    client = obj.client
    info = client.namespace()
    if info.state == "ok" and not yes:
        live = client.overview()["leases_live"]
        fail(f"namespace {info.prefix!r} is ok: `mcq recover` would retire its epoch {info.epoch}, raise the "
             f"fence floor and void its {live} live lease(s) (their workers' next writes refused, their "
             "Attempts turned suspect and reconciled). Nothing was done; add --yes to recover it anyway",
             EXIT_BAD_INPUT)
    report = run_recovery(client, reason=reason, actor="operator")
    if as_json:
        emit_json(report)
    else:
        click.echo(f"recovered: epoch {report['epoch']}, fence floor {report['fence_floor']}, "
                   f"{len(report['voided_leases'])} lease(s) voided (now suspect)")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def namespace(obj: Ctx, as_json: bool) -> None:
    """The namespace's state (ok | lost | recovering | missing), epoch, claim sequence and fence floor.
    Read only: it never creates a namespace. Exit 3 when the namespace lost state."""
    client = obj.reader
    info = client.namespace()
    refused = client.refusals(count=100)
    data = {**dataclasses.asdict(info), "events": client.namespace_events(count=1000), "refused": refused}
    if as_json:
        emit_json(data)
    else:
        from ..ops.render import text_console, wrap

        width = text_console().width
        lines = wrap(f"{info.prefix}: {info.state} (epoch {info.epoch or '-'}, claims {info.seq}, "
                     f"fence floor {info.floor})" + (f": {info.reason}" if info.reason else ""), width)
        if refused:
            lines += wrap(f"{len(refused)}{'+' if len(refused) == 100 else ''} transport messages refused by "
                          f"workers, newest: {refused[0].get('reason', refused[0]['type'])}", width)
        click.echo("\n".join(lines))
    exit_if_lost(info)


EXIT_STOPPED_MIDWAY = 5  # `mcq worker` only: stopped before its Attempt finished (see its help)


@main.command()
@click.option("--app", "app_spec", required=True, help="The handlers' App, as package.module:app.")
@click.option("--queue", "queues", multiple=True, help="Queue(s) to serve (default: every queue of the app).")
@click.option("--burst", is_flag=True, help="Stop when the queues are empty.")
@click.option("--pool", type=click.IntRange(1, 64), default=None, help="Run N worker processes (RQ WorkerPool).")
@click.option("--kind", type=click.Choice(["fork", "simple"]), default="fork", show_default=True,
              help="fork: each Attempt in a fresh child process; simple: in the worker process.")
@click.option("--name", default=None,
              help="Worker name (default host.pid); with --pool N the workers are NAME-1 .. NAME-N (a respawned one "
                   "takes the next number).")
@click.option("--workspace-root", default=None,
              help="Root of per-Attempt workspaces (default <home>/workspaces/<prefix>, home: --home / $MCQ_HOME). "
                   "Several namespaces may share one: workspace names carry the namespace.")
@click.option("--grace", "grace_s", type=Finite(0, 86_400), default=30.0, show_default=True,
              help="Seconds a worker asked to stop (SIGTERM, SIGINT) gives its current Attempt to finish; then, or "
                   "at a second signal, it stops at once and leaves the Attempt to its lease and the sweeper.")
@click.option("--log-level", default="WARNING", show_default=True)
@click.pass_obj
@handle_errors
def worker(obj: Ctx, app_spec: str, queues: tuple[str, ...], burst: bool, pool: int | None, kind: str,
           name: str | None, workspace_root: str | None, grace_s: float, log_level: str) -> None:
    """Run Attempts of an app's handlers from RQ.

    SIGTERM or SIGINT stops an idle worker at once; a busy one first finishes its Attempt, for at
    most --grace seconds. A second signal, or the end of the grace period, stops it at once: the
    Attempt is not failed, its lease runs out and the sweeper reconciles it. Without --burst, a
    worker that loses Redis waits for it and comes back.

    \b
    Exit codes:
      0  stopped on request (SIGTERM/SIGINT) with no Attempt left running, or --burst
         and its queues are empty
      1  refused by a contract
      2  bad input: --app, --queue, --workspace-root, or a home folder (--home,
         $MCQ_HOME) that is not private
      3  the namespace lost state: run `mcq recover`
      4  Redis cannot be reached (with --burst; without it the worker waits)
      5  stopped before its Attempt finished (a second signal, or --grace over):
         its lease runs out and the sweeper reconciles it
    """
    import logging
    import os
    import signal
    import socket
    import time

    import redis as redis_errors
    from rq.exceptions import StopRequested

    from ..producer.transport import rq_connection, rq_queue_name
    from ..worker.runner import WORKER_CLASSES, McqBaseWorker, McqJob, configure, make_worker

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = load_app(app_spec)
    names = list(queues) or sorted({spec.queue for spec in app.handlers.values()})
    if not names:
        raise click.BadParameter("the app registers no handler and no --queue was given", param_hint="--app")
    client = obj.client
    configure(app, client, workspace_root, home=obj.home, grace_s=grace_s)  # refuses a home others can write
    base = name or f"{socket.gethostname()}.{os.getpid()}"
    if pool:
        from rq.serializers import JSONSerializer

        wp = _named_pool(base)([rq_queue_name(client.keys.prefix, q) for q in names],
                               connection=rq_connection(client), num_workers=pool, worker_class=WORKER_CLASSES[kind],
                               serializer=JSONSerializer, job_class=McqJob)
        wp.start(burst=burst, logging_level=log_level.upper())
        codes = wp.exit_codes + [d.process.exitcode for d in wp.worker_dict.values()]
        if EXIT_STOPPED_MIDWAY in codes:  # as a single worker says: a worker stopped before its Attempt finished
            sys.exit(EXIT_STOPPED_MIDWAY)
        return

    wlog = logging.getLogger("mc_queue.worker")

    class Stop(Exception):
        """A stop request while no RQ worker loop runs (building a worker, waiting to reconnect)."""

    def stop_now(signum: int, frame: Any) -> None:
        raise Stop(signum)

    def reachable() -> bool:
        try:
            return bool(client.redis.ping())
        except (redis_errors.ConnectionError, redis_errors.TimeoutError):
            return False

    delay, round_ = 0.5, 0
    while True:
        # RQ's loop installs its own handlers and leaves them behind when it returns: ours are back here.
        signal.signal(signal.SIGTERM, stop_now)
        signal.signal(signal.SIGINT, stop_now)
        # A reconnecting worker takes a new name: RQ may still hold the old one's registration.
        current = base if round_ == 0 else f"{base}.r{round_}"
        round_ += 1
        w: McqBaseWorker | None = None
        worked = False
        try:
            w = make_worker(app, client, names, kind=kind, name=current, workspace_root=workspace_root,
                            home=obj.home, grace_s=grace_s)
            worked = w.work(burst=burst, logging_level=log_level.upper())
        except (Stop, StopRequested):
            return
        except SystemExit:
            if w is not None and w.forced:
                fail("stopped before its Attempt finished: its lease runs out and the sweeper reconciles it",
                     EXIT_STOPPED_MIDWAY)
            raise
        except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
            if burst:
                raise  # exit 4
            wlog.warning("Redis unreachable (%s)", exc)
        except ReplicationUnconfirmed as exc:
            # Starting up while the primary has fewer replicas than min_replicas (right after a
            # failover, before the old primary rejoins): wait for them like for Redis itself.
            if burst:
                raise
            wlog.warning("waiting for replicas: %s", exc.message)
        if w is not None:
            if w.forced:
                fail("stopped before its Attempt finished: its lease runs out and the sweeper reconciles it",
                     EXIT_STOPPED_MIDWAY)
            if w.stop_signal is not None:
                return
            if burst and w.drained:
                return
            if burst and (w.redis_error or not reachable()):
                fail(f"cannot reach Redis: {w.redis_error or 'no answer to PING'}", EXIT_UNREACHABLE)
        # RQ's loop also returns after a Redis error or an unexpected one: the worker comes back once
        # Redis answers (its leases are safe meanwhile: an Attempt it held expires and is reconciled).
        wlog.warning("worker loop ended without a stop request; reconnecting in %.1fs", delay)
        try:
            time.sleep(delay)
        except (Stop, StopRequested):
            return
        delay = min(delay * 2, 10.0) if not worked else 0.5


def _named_pool(base: str) -> Any:
    """RQ's WorkerPool whose workers are named ``<base>-1`` .. ``<base>-N`` (RQ names them by uuid and has
    no option for it); a respawned worker takes the next number, since RQ may still hold a dead one's name."""
    from rq.worker_pool import WorkerData, WorkerPool

    class NamedWorkerPool(WorkerPool):
        spawned = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.exit_codes: list[int | None] = []  # of the workers that ended, for the pool's own exit code

        def handle_dead_worker(self, worker_data: WorkerData) -> None:
            self.exit_codes.append(worker_data.process.exitcode)
            super().handle_dead_worker(worker_data)

        def start_worker(self, count: int | None = None, burst: bool = True, _sleep: float = 0,
                         logging_level: str = "INFO") -> None:
            self.spawned += 1
            worker_name = f"{base}-{self.spawned}"
            process = self.get_worker_process(worker_name, burst=burst, _sleep=_sleep, logging_level=logging_level)
            process.start()
            self.worker_dict[worker_name] = WorkerData(name=worker_name, pid=process.pid or 0, process=process)

    return NamedWorkerPool


@main.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.option("--ack-timeout", type=Finite(0, 86_400), default=30.0, show_default=True,
              help="Seconds (0 to 86400) the executor has to acknowledge before its lease is voided.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def cancel(obj: Ctx, task_id: str, reason: str, ack_timeout: float, as_json: bool) -> None:
    """Cancel a task: prevent new work, signal the executor, reconcile, terminate as canceled."""
    if len(reason.strip()) < 10:
        raise click.BadParameter("a cancellation needs a reason of at least ten characters", param_hint="--reason")
    outcome = obj.client.cancel_task(task_id, reason, actor="operator", ack_timeout_ms=int(ack_timeout * 1000))
    if as_json:
        emit_json({"task_id": task_id, "outcome": outcome})
    else:
        click.echo(f"{task_id}: {outcome}" + (" (the executor is told at its next heartbeat; the sweeper "
                                             "finishes the protocol)" if outcome == "signaled" else ""))


@main.group()
def dlq() -> None:
    """Quarantined tasks: list, show, replay with a reason, purge."""


@dlq.command("list")
@click.option("--by", "by", type=click.Choice(["fingerprint"]), default=None,
              help="Group by the fingerprint of each task's last failure, with counts.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def dlq_list(obj: Ctx, by: str | None, as_json: bool) -> None:
    if by == "fingerprint":
        _dlq_by_fingerprint(obj, as_json)
        return
    client = obj.reader
    items = {i["task_id"]: i for i in client.attention_items()}
    rows = [{"task_id": t, "quarantined_at_ms": at, "why": items.get(t, {}).get("why_unsafe"),
             "summary": items.get(t, {}).get("summary")} for t, at in client.dlq()]
    if as_json:
        emit_json(rows)
        return
    from ..ops.render import print_dlq

    print_dlq(rows, again=obj.again)


@dlq.command("show")
@click.argument("task_id", type=TASK_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def dlq_show(obj: Ctx, task_id: str, as_json: bool) -> None:
    task = obj.reader.get_task(task_id)
    item = next((i for i in obj.reader.attention_items() if i.get("task_id") == task_id), None)
    if as_json:
        emit_json({**task_json(task), "attention": item})
        return
    print_task(task)
    if item:
        from ..ops.render import print_attention

        print_attention([item])


@dlq.command("replay")
@click.argument("task_id", required=False, type=TASK_ID)
@click.option("--fingerprint", default=None,
              help="Instead of TASK_ID: every quarantined task whose last failure has this fingerprint.")
@click.option("--reason", required=True, help="Why it may run again (at least ten characters).")
@click.option("--hypothesis", default=None, help="What is different now.")
@click.pass_obj
@handle_errors
def dlq_replay(obj: Ctx, task_id: str | None, fingerprint: str | None, reason: str, hypothesis: str | None) -> None:
    if len(reason.strip()) < 10:
        raise click.BadParameter("a replay needs a reason of at least ten characters", param_hint="--reason")
    if (task_id is None) == (fingerprint is None):
        raise click.BadParameter("give either TASK_ID or --fingerprint", param_hint="TASK_ID / --fingerprint")
    if fingerprint is not None:
        _dlq_replay_fingerprint(obj, fingerprint, reason, hypothesis)
        return
    assert task_id is not None
    attempt = obj.client.dlq_replay(task_id, reason, hypothesis, actor="operator")
    click.echo(f"{attempt.id} pending (the sweeper dispatches it)")


@dlq.command("purge")
@click.argument("task_id", required=False, type=TASK_ID)
@click.option("--older-than", default=None, metavar="DUR",
              help="Instead of TASK_ID: every task quarantined more than DUR ago (90s, 15m, 2h, 7d).")
@click.option("--reason", required=True, help="Why its history may go (at least ten characters).")
@click.option("--keep-key-for", "keep_days", type=Finite(0, 3650), default=30.0, show_default=True,
              help="Days during which the task id and its producer key stay refused (0: free them at once).")
@click.option("--yes", is_flag=True, help="Confirm: the task and its whole history are deleted.")
@click.pass_obj
@handle_errors
def dlq_purge(obj: Ctx, task_id: str | None, older_than: str | None, reason: str, keep_days: float,
              yes: bool) -> None:
    if (task_id is None) == (older_than is None):
        raise click.BadParameter("give either TASK_ID or --older-than", param_hint="TASK_ID / --older-than")
    if not yes:
        raise click.BadParameter("purging deletes the task and its history for good: add --yes", param_hint="--yes")
    if older_than is not None:
        _dlq_purge_older(obj, older_than, reason, keep_days)
        return
    assert task_id is not None
    n = obj.client.dlq_purge(task_id, reason=reason, actor="operator", keep_key_s=keep_days * 86_400)
    click.echo(f"{task_id} purged ({n} attempt(s)); its id and producer key are refused for {keep_days:g} day(s)")


@main.command()
@click.option("--once", is_flag=True, help="One pass, then print what it did.")
@click.option("--interval", type=Finite(MIN_INTERVAL_S, 3600), default=1.0, show_default=True,
              help=f"Seconds between passes ({MIN_INTERVAL_S:g} to 3600).")
@click.option("--app", "app_spec", default=None,
              help="package.module:app whose registered operations reconcile effects with their providers.")
@click.option("--archive", "archive_dir", default=None, metavar="DIR",
              help="Write each task retention deletes to this folder first (gzip JSON lines per queue and day).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def sweeper(obj: Ctx, once: bool, interval: float, app_spec: str | None, archive_dir: str | None,
            as_json: bool) -> None:
    """Expire leases, reconcile suspects, send due dispatches; pack, retire and archive ended tasks."""
    import logging

    from ..ops.archive import FileArchive
    from ..ops.sweeper import Sweeper

    app = load_app(app_spec) if app_spec else None
    if app is not None:
        app.publish_retention(obj.client)
    sw = Sweeper(obj.client, app=app, archive=FileArchive(archive_dir) if archive_dir else None)
    if once:
        report = sw.run_once().as_dict()
        if as_json:
            emit_json(report)
        else:
            click.echo(f"expired {len(report['expired'])}, reconciled {len(report['reconciled'])}, "
                       f"dispatched {len(report['dispatched'])}, packed {report['packed']}, "
                       f"retired {sum(report['retired'].values())}, errors {len(report['errors'])}")
        return
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sw.run(interval_s=interval)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def attention(obj: Ctx, as_json: bool) -> None:
    """Tasks stopped for a person: what was tried, what changed, why another Attempt is unsafe."""
    items = obj.reader.attention_items()
    if as_json:
        emit_json(items)
        return
    from ..ops.render import print_attention

    print_attention(items, quarantined={task_id for task_id, _ in obj.reader.dlq()})


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def workers(obj: Ctx, as_json: bool) -> None:
    """Live workers of this namespace: health probe (RQ heartbeat) and the leases each holds."""
    from ..worker.runner import live_workers

    rows = live_workers(obj.reader)
    if as_json:
        emit_json(rows)
        return
    from ..ops.render import print_workers

    print_workers(rows)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (localhost by default).")
@click.option("--port", type=click.IntRange(1, 65535), default=9464, show_default=True)
@click.option("--app", "app_spec", default=None,
              help="The handlers' App (package.module:app, or MCQ_APP): every (queue, handler) series is then "
                   "exported at 0 from the first scrape, before its first Attempt.")
@click.pass_obj
@handle_errors
def metrics(obj: Ctx, host: str, port: int, app_spec: str | None) -> None:
    """Serve Prometheus metrics of this namespace at http://HOST:PORT/metrics."""
    import os
    import time

    from ..ops.metrics import serve

    spec = app_spec or os.environ.get("MCQ_APP")
    client = obj.reader  # the exporter reads: it never starts the embedded server
    serve(client, host=host, port=port, app=load_app(spec) if spec else None)
    click.echo(f"serving metrics of namespace {client.keys.prefix!r} at http://{host}:{port}/metrics", err=True)
    while True:
        time.sleep(3600)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Every request needs the token (see --trust-loopback).")
@click.option("--port", type=click.IntRange(1, 65535), default=9465, show_default=True)
@click.option("--read-only", is_flag=True, help="Show everything, offer and accept no action.")
@click.option("--trust-loopback", is_flag=True,
              help="Requests from this machine (a loopback peer naming this machine, no proxy header) need no "
                   "token. Never with a proxy on this machine: it relays anyone's request from 127.0.0.1.")
@click.pass_obj
@handle_errors
def dashboard(obj: Ctx, host: str, port: int, read_only: bool, trust_loopback: bool) -> None:
    """The operator console: a web page of this namespace (overview, tasks, each task's story,
    attention, DLQ, workers) with retry, cancel, replay and purge under the CLI's rules.

    Every request needs the token ($MCQ_DASHBOARD_TOKEN, else one generated and printed here as an
    address that carries it), from this machine too: a proxy on this machine relays anyone's request
    from 127.0.0.1. With --trust-loopback, requests from this machine need none. Every form carries
    a CSRF token. Actions are recorded with the actor console:<client address>."""
    from ..ops.console import serve_forever, start

    client = obj.reader  # the console serves a namespace that runs: it never starts the embedded server
    running = start(client, host=host, port=port, read_only=read_only, trust_loopback=trust_loopback)
    click.echo(f"mc_queue console of namespace {client.keys.prefix!r} at {running.url}"
               + (" (read-only)" if read_only else ""), err=True)
    if running.token_from_env:
        click.echo(f"every request needs the token in MCQ_DASHBOARD_TOKEN: open {running.url}?token=... once "
                   "(it moves into a cookie), or send Authorization: Bearer ...", err=True)
    else:
        click.echo(f"open {running.token_url} (it carries the token, which moves into a cookie); scripts send "
                   f"Authorization: Bearer {running.token}", err=True)
    if trust_loopback:
        click.echo("--trust-loopback: requests from this machine need no token; never put a proxy on this "
                   "machine in front of it", err=True)
    if not running.loopback_only:
        click.echo(f"warning: listening on {host}, beyond this machine, over plain HTTP: put TLS in front of it "
                   "or reach it through an SSH tunnel", err=True)
    serve_forever(running)


@main.group()
def server() -> None:
    """The embedded redis-server (used when no --redis-url is given)."""


@server.command("stop")
@click.pass_obj
def server_stop(obj: Ctx) -> None:
    """Stop the embedded server (its data stays in the folder)."""
    from ..store.embedded import home_dir, stop_server

    outcome = stop_server(obj.home)
    click.echo("stopped" if outcome else str(outcome) or f"no embedded server running for {home_dir(obj.home)}")


@server.command("start")
@click.pass_obj
@handle_errors
def server_start(obj: Ctx) -> None:
    """Start the embedded server on its data (or find it running) and say where it is."""
    from ..store.embedded import ensure_server

    s = ensure_server(obj.home)
    click.echo(f"embedded redis-server {'started' if s.started else 'already running'}: pid {s.pid} at {s.url} "
               f"(data in {s.home / 'redis'}; `mcq server stop` stops it)")


@server.command("status")
@click.pass_obj
@handle_errors
def server_status(obj: Ctx) -> None:
    """Say whether the embedded server runs, and where. It never starts it (exit 4 when it does not
    run: `mcq server start`)."""
    client = embedded_client(obj.home, start=False)
    s = client.embedded
    client.close()
    click.echo(f"embedded redis-server pid {s.pid} at {s.url} (data in {s.home / 'redis'})")


@main.command()
@click.option("--tasks", type=click.IntRange(1, 100), default=8, show_default=True)
@click.option("--workers", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--contracts", is_flag=True, help="The short contracts demo instead (one task, one paused worker).")
@click.option("--keep-server", is_flag=True, help="Leave the embedded redis-server running afterwards.")
@click.option("--no-dashboard", is_flag=True,
              help="End at once. Without it, when standard input is a terminal, the demo ends by serving the "
                   "console (mcq dashboard) over its namespace until Enter.")
@click.pass_obj
@handle_errors
def demo(obj: Ctx, tasks: int, workers: int, contracts: bool, keep_server: bool, no_dashboard: bool) -> None:
    """An agent factory at work with faults injected (embedded default, or --redis-url)."""
    after = None if no_dashboard or not sys.stdin.isatty() else _demo_dashboard
    if contracts:
        from ..demo.zombie import run_demo

        sys.exit(run_demo(obj.redis_url, obj.home, keep_server=keep_server, after=after))
    from ..demo.factory import run_factory_demo

    sys.exit(run_factory_demo(obj.redis_url, obj.home, tasks=tasks, workers=workers, keep_server=keep_server,
                              after=after))


@main.group()
def providers() -> None:
    """Local providers to try an app against: a bare git remote and a pull-request API (the ones `mcq demo`
    runs), served by a background process until `mcq providers stop`.

    \b
    eval "$(mcq providers start)"   # exports MCQ_GIT_REMOTE, MCQ_FORGE_URL, MCQ_FORGE_TIMEOUT
    mcq providers stop
    """


def _providers_dir(obj: Ctx, folder: str | None) -> Any:
    from pathlib import Path

    from ..store.embedded import prepare_home

    root = Path(folder).resolve() if folder else prepare_home(obj.home) / "providers"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def _providers_serving(root: Any) -> int:
    """The pid of the process serving the providers of ``root`` (0: none). It holds ``root/serve.lock``
    while it serves: a pid file alone could name whatever process took that pid since."""
    import fcntl
    import os

    try:
        fd = os.open(root / "serve.lock", os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return int((root / "serve.pid").read_text())
        except (OSError, ValueError):
            return 0
    finally:
        os.close(fd)
    return 0


DIR_OPTION = click.option("--dir", "folder", default=None, metavar="DIR",
                          help="Where they live (default <home>/providers; home: --home / $MCQ_HOME).")


@providers.command("start")
@DIR_OPTION
@click.pass_obj
@handle_errors
def providers_start(obj: Ctx, folder: str | None) -> None:
    """Start them (or find them running) and print their environment as shell `export` lines."""
    import os
    import subprocess
    import time

    root = _providers_dir(obj, folder)
    env_file = root / "env"
    if not _providers_serving(root):
        env_file.unlink(missing_ok=True)
        with open(root / "serve.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "providers", "serve", "--dir", str(root)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                    cwd=os.getcwd())
        deadline = time.monotonic() + 30
        while not env_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"the providers did not start: see {root / 'serve.log'}", EXIT_REFUSED)
            time.sleep(0.05)
    click.echo(env_file.read_text(), nl=False)
    click.echo(f"providers in {root}, served by pid {_providers_serving(root)} (`mcq providers stop` stops them)",
               err=True)


@providers.command("serve", hidden=True)
@DIR_OPTION
@click.pass_obj
def providers_serve(obj: Ctx, folder: str | None) -> None:
    """What `mcq providers start` runs in the background: serve until SIGTERM."""
    import fcntl
    import os
    import shlex
    import shutil
    import signal

    from ..demo.fleet import provider_env

    root = _providers_dir(obj, folder)
    lock = open(root / "serve.lock", "w")  # held (and locked) until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fail(f"providers already served in {root}", EXIT_REFUSED)
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)  # fresh ones: the pull-request API keeps its pulls in memory
    run.mkdir(mode=0o700)
    env = provider_env(run, export=False)
    (root / "serve.pid").write_text(str(os.getpid()))
    lines = "".join(f"export {k}={shlex.quote(env.env[k])}\n"
                    for k in ("MCQ_GIT_REMOTE", "MCQ_FORGE_URL", "MCQ_FORGE_TIMEOUT"))
    (root / "env.tmp").write_text(lines)
    os.replace(root / "env.tmp", root / "env")  # whole, or not there: `start` waits for it
    stop = {"now": False}

    def done(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, done)
    signal.signal(signal.SIGINT, done)
    while not stop["now"]:
        signal.pause()
    env.stop()
    for name in ("env", "serve.pid"):
        (root / name).unlink(missing_ok=True)


@providers.command("stop")
@DIR_OPTION
@click.pass_obj
@handle_errors
def providers_stop(obj: Ctx, folder: str | None) -> None:
    """Stop them (the git remote stays in DIR/run until the next start)."""
    import os
    import signal
    import time

    root = _providers_dir(obj, folder)
    pid = _providers_serving(root)
    if not pid:
        click.echo(f"no providers are served in {root}")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _providers_serving(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    click.echo("stopped" if not _providers_serving(root) else f"pid {pid} did not stop within 15 s")


def _demo_dashboard(client: Client) -> None:
    """The end of `mcq demo` at a terminal: the console over the demo's namespace until Enter."""
    from ..ops.console import DEFAULT_PORT, start

    running = start(client, port=DEFAULT_PORT, background=True, fallback_port=True)
    click.echo(f"\nsee what happened and why in the console: {running.token_url}\n"
               "press Enter to stop it and end the demo")
    try:
        input()
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        running.stop()


@main.group()
def health() -> None:
    """Health checks for a container's HEALTHCHECK: exit 0 healthy, 1 not (3: the namespace lost
    state, 4: Redis cannot be reached)."""


@health.command("worker")
@click.option("--host", "hostname", default=None,
              help="The workers' host name as RQ records it (default: this host's, i.e. the container's own).")
@click.pass_obj
@handle_errors
def health_worker(obj: Ctx, hostname: str | None) -> None:
    """Healthy when at least one worker of this namespace on this host has a recent RQ heartbeat (and,
    on this host, its process is alive): what `mcq workers` shows, read from mc_queue's and RQ's records."""
    import os
    import socket

    from ..worker.runner import live_workers

    local = socket.gethostname()
    host = hostname or local

    def alive(pid: int | None) -> bool:
        if host != local:
            return True  # another host's process cannot be checked from here
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    client = obj.reader
    rows = [r for r in live_workers(client) if r["hostname"] == host]
    healthy = [r for r in rows if r["healthy"] and alive(r["pid"])]
    exit_if_lost(client.namespace())
    if not healthy:
        fail(f"no live worker of namespace {client.keys.prefix!r} on host {host!r} "
             f"({len(rows)} registered, none with a recent heartbeat and a running process)", 1)
    click.echo(f"{len(healthy)} healthy worker(s) of namespace {client.keys.prefix!r} on {host}: "
               + ", ".join(str(r["worker"]) for r in healthy))


def _echo_paused(paused: dict[str, dict[str, Any]]) -> None:
    """One line per paused queue (under `mcq status`)."""
    for q, info in paused.items():
        click.echo(f"queue {q} PAUSED by {info.get('actor', '?')}: {info.get('reason', '')} "
                   f"(claims refused, nothing dispatched; `mcq queue resume {q} --reason ..`)")


@main.group()
def queue() -> None:
    """Pause or resume a queue (recorded in the namespace log with who and why)."""


@queue.command("pause")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def queue_pause(obj: Ctx, queue_name: str, reason: str) -> None:
    """Claims of QUEUE's Attempts are refused (workers skip them, tasks stay pending) and the sweeper
    does not dispatch them, until `mcq queue resume`."""
    check_reason(reason)
    if obj.client.pause_queue(queue_name, reason=reason, actor="operator"):
        click.echo(f"queue {queue_name} paused")
    else:
        click.echo(f"queue {queue_name} was already paused")


@queue.command("resume")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.pass_obj
@handle_errors
def queue_resume(obj: Ctx, queue_name: str, reason: str) -> None:
    """Undo `mcq queue pause`: the sweeper dispatches QUEUE's pending Attempts again."""
    check_reason(reason)
    if obj.client.resume_queue(queue_name, reason=reason, actor="operator"):
        click.echo(f"queue {queue_name} resumed (the sweeper dispatches its pending Attempts)")
    else:
        click.echo(f"queue {queue_name} was not paused")


@main.group(invoke_without_command=True)
@click.option("--queue", "queue_name", default=None, help="Only this queue.")
@click.option("--state", "states", multiple=True,
              type=click.Choice(["pending", "backoff", "running", "succeeded", "canceled", "failed", "blocked",
                                 "quarantined"]),
              help="Only tasks in this state (repeatable), from the indexes: pending, backoff (the queues' "
                   "pending indexes), running (lease and suspect indexes), succeeded, canceled (the queues' "
                   "done indexes, newest first), failed, blocked, quarantined (the queues' held indexes).")
@click.option("--handler", default=None, help="Only tasks of this handler.")
@click.option("--older-than", default=None, metavar="DUR", help="Created more than DUR ago (90s, 15m, 2h, 7d).")
@click.option("--since", default=None, metavar="DUR", help="Created within the last DUR.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="Rows at most; at most 10 x LIMIT index entries are looked at.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def tasks(ctx: click.Context, queue_name: str | None, states: tuple[str, ...], handler: str | None,
          older_than: str | None, since: str | None, limit: int, as_json: bool) -> None:
    """Tasks found through the indexes (no scan of the keyspace); `mcq tasks purge` deletes ended ones."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    client = obj.reader  # (before redis_now_ms: a read never starts the embedded server)
    now = redis_now_ms(obj)
    older = duration_ms(older_than, "--older-than")
    newer = duration_ms(since, "--since")
    rows, truncated = client.list_tasks(
        queue=queue_name, states=list(states) or None, handler=handler, limit=limit,
        created_before_ms=None if older is None else now - older,
        created_after_ms=None if newer is None else now - newer)
    if as_json:
        emit_json({"tasks": rows, "truncated": truncated})
        return
    for r in rows:
        age_s = max(0, now - r["created_at_ms"]) / 1000
        click.echo(f"{r['task_id']}  {r['state']:<11} {r['handler']:<24} attempts {r['attempts']:<3} "
                   f"age {age_s:.0f}s")
    if truncated:
        click.echo(f"(the first {10 * limit} index entries looked at: more may match; narrow the filters)", err=True)


@tasks.command("purge")
@click.option("--queue", "queue_name", required=True, help="The queue whose ended tasks go.")
@click.option("--state", "states", multiple=True, required=True,
              type=click.Choice(["succeeded", "canceled", "failed", "blocked", "quarantined"]),
              help="Only tasks in this state (repeatable); never one with an Attempt that may still run.")
@click.option("--older-than", required=True, metavar="DUR", help="Ended more than DUR ago (90s, 15m, 2h, 7d).")
@click.option("--reason", required=True, help="Why their history may go (at least ten characters), recorded.")
@click.option("--keep-key-for", "keep_days", type=Finite(0, 3650), default=1.0, show_default=True,
              help="Days during which each task id and producer key stay refused by enqueue.")
@click.option("--archive", "archive_dir", default=None, metavar="DIR",
              help="Write each task to this archive folder (gzip JSON lines) before deleting it.")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=10_000, show_default=True,
              help="Tasks deleted at most by this command.")
@click.option("--yes", is_flag=True, help="Confirm: the tasks and their whole history leave Redis.")
@click.pass_obj
@handle_errors
def tasks_purge(obj: Ctx, queue_name: str, states: tuple[str, ...], older_than: str, reason: str, keep_days: float,
                archive_dir: str | None, limit: int, yes: bool) -> None:
    """Delete a queue's ended tasks older than DUR, each with every key and index entry (a tombstone stays)."""
    from ..ops.archive import FileArchive, archive_and_retire

    check_reason(reason)
    if not yes:
        raise click.BadParameter("purging deletes the tasks and their history for good: add --yes",
                                 param_hint="--yes")
    age = duration_ms(older_than, "--older-than")
    assert age is not None
    c = obj.client
    archive = FileArchive(archive_dir) if archive_dir else None
    cutoff = redis_now_ms(obj) - age
    done = 0
    kinds = [k for k, members in (("done", {"succeeded", "canceled"}), ("held", {"failed", "blocked", "quarantined"}))
             if members & set(states)]
    for kind in kinds:
        skipped: set[str] = set()
        while done < limit:
            rows = [r for r in c.ended_tasks(queue_name, kind, before_ms=cutoff, limit=min(500, limit - done)
                                             + len(skipped)) if r[0] not in skipped]
            if not rows:
                break
            now_states = c.task_states([t for t, _ in rows])
            wanted = [(t, sc) for t, sc in rows if now_states.get(t) in states]
            skipped.update(t for t, _ in rows)
            if not wanted:
                if len(rows) < 500:
                    break
                continue
            # Archived first (when asked), and deleted only as archived: an archive that fails deletes nothing.
            out = archive_and_retire(c, archive, wanted, states=states, reason=reason, tombstone_s=keep_days * 86_400,
                                     now_ms=redis_now_ms(obj), actor="operator", log_each=True)
            done += out["retired"]
    click.echo(f"{done} task(s) of queue {queue_name} purged ({', '.join(states)}, ended more than {older_than} "
               f"ago){'; archived in ' + archive_dir if archive_dir else ''}")


@main.group()
def archive() -> None:
    """Read tasks back from an archive folder (written by the sweeper's --archive or `mcq tasks purge`)."""


@archive.command("show")
@click.argument("task_id", type=TASK_ID)
@click.option("--dir", "archive_dir", required=True, metavar="DIR", help="The archive folder.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def archive_show(task_id: str, archive_dir: str, as_json: bool) -> None:
    """Show an archived task as `mcq show` showed it live (its last record, when written twice)."""
    from ..ops.archive import FileArchive
    from ..ops.render import print_task, task_json

    try:
        rec = FileArchive(archive_dir).find(task_id)
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
        return
    if rec is None:
        fail(f"task {task_id} is not in the archive under {archive_dir}", EXIT_REFUSED)
        return
    task, effects = rec.task(), rec.effects()
    if as_json:
        emit_json({**task_json(task, effects), "archived_at_ms": rec.archived_at_ms, "archive_reason": rec.reason})
        return
    click.echo(f"archived {rec.archived_at_ms} ms since the epoch: {rec.reason}")
    print_task(task, effects=effects)


@main.group()
def retention() -> None:
    """How long each queue's ended tasks stay in Redis (the sweeper deletes the rest)."""


@retention.command("show")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def retention_show(obj: Ctx, as_json: bool) -> None:
    rows = []
    client = obj.reader
    for q in client.queues():
        policy, source = client.retention(q)
        rows.append({"queue": q, "source": source, **policy.model_dump()})
    if as_json:
        emit_json(rows)
        return
    def fmt(v: Any, unit: str = "") -> str:
        return "forever" if v is None else f"{v:g}{unit}"
    for r in rows:
        click.echo(f"{r['queue']}: finished {fmt(r['done_s'], 's')}"
                   f"{'' if r['done_keep'] is None else ' / newest ' + str(r['done_keep'])}, held "
                   f"{fmt(r['held_s'], 's')}{'' if r['held_keep'] is None else ' / newest ' + str(r['held_keep'])}, "
                   f"tombstone {fmt(r['tombstone_s'], 's')} ({r['source']})")


@retention.command("set")
@click.argument("queue_name")
@click.option("--done", "done_for", default=None, metavar="DUR|forever",
              help="Keep succeeded and canceled tasks this long after they finished.")
@click.option("--done-keep", type=click.IntRange(0, 10**9), default=None, help="... and at most the newest N.")
@click.option("--held", "held_for", default=None, metavar="DUR|forever",
              help="Keep failed, blocked and quarantined tasks this long.")
@click.option("--held-keep", type=click.IntRange(0, 10**9), default=None, help="... and at most the newest N.")
@click.option("--tombstone", default=None, metavar="DUR", help="Refuse a deleted task's id and producer key this long.")
@click.option("--clear", is_flag=True, help="Drop the operator's policy (the App's or the default applies).")
@click.option("--reason", required=True, help="Why (at least ten characters), recorded.")
@click.pass_obj
@handle_errors
def retention_set(obj: Ctx, queue_name: str, done_for: str | None, done_keep: int | None, held_for: str | None,
                  held_keep: int | None, tombstone: str | None, clear: bool, reason: str) -> None:
    """The operator's retention policy of a queue (it wins over the App's); fields not given keep their value."""
    from ..contracts.config import Retention

    check_reason(reason)
    c = obj.client
    if clear:
        c.set_retention(queue_name, None, actor="operator", reason=reason)
        click.echo(f"queue {queue_name}: the operator's retention policy is dropped")
        return
    current, _ = c.retention(queue_name)
    update: dict[str, Any] = {}

    def secs(text: str, param: str) -> float | None:
        if text == "forever":
            return None
        ms = duration_ms(text, param)
        return None if ms is None else ms / 1000

    if done_for is not None:
        update["done_s"] = secs(done_for, "--done")
    if held_for is not None:
        update["held_s"] = secs(held_for, "--held")
    if done_keep is not None:
        update["done_keep"] = done_keep
    if held_keep is not None:
        update["held_keep"] = held_keep
    if tombstone is not None:
        update["tombstone_s"] = secs(tombstone, "--tombstone") or 0.0
    try:
        policy = Retention.model_validate({**current.model_dump(), **update})
    except ValueError as exc:
        fail(f"invalid retention policy: {exc}", EXIT_BAD_INPUT)
        return
    c.set_retention(queue_name, policy, actor="operator", reason=reason)
    click.echo(f"queue {queue_name}: retention set ({policy.model_dump()})")


def _dlq_by_fingerprint(obj: Ctx, as_json: bool) -> None:
    groups = obj.client.dlq_fingerprints()
    rows: list[dict[str, Any]] = [{"fingerprint": fp, "count": len(ids), "task_ids": ids}
                                  for fp, ids in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))]
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['fingerprint'] or '(none)':<16}  {r['count']:>5}  e.g. {r['task_ids'][0]}")


def _dlq_replay_fingerprint(obj: Ctx, fingerprint: str, reason: str, hypothesis: str | None) -> None:
    ids = obj.client.dlq_fingerprints().get(fingerprint, [])
    if not ids:
        fail(f"no quarantined task's last failure has fingerprint {fingerprint!r} (see `mcq dlq list --by "
             "fingerprint`)", EXIT_BAD_INPUT)
    # each replay recorded on its task, as a single replay is
    done = _each(ids, lambda tid: f"{obj.client.dlq_replay(tid, reason, hypothesis, actor='operator').id} pending",
                 "not replayed")
    click.echo(f"replayed {done} of {len(ids)} task(s) with fingerprint {fingerprint}")
    if done < len(ids):
        sys.exit(EXIT_REFUSED)


def _each(ids: list[str], act: Callable[[str], str], refused: str) -> int:
    """Act on each task; a refusal is reported and the others go on. Returns how many succeeded."""
    done = 0
    for tid in ids:
        try:
            click.echo(act(tid))
            done += 1
        except McqError as exc:
            click.echo(f"mcq: {tid}: {refused}: {exc}", err=True)
    return done


def _dlq_purge_older(obj: Ctx, older_than: str, reason: str, keep_days: float) -> None:
    age = duration_ms(older_than, "--older-than")
    assert age is not None
    cutoff = redis_now_ms(obj) - age
    ids = [tid for tid, at in obj.client.dlq() if at <= cutoff]

    def purge(tid: str) -> str:  # recorded (tombstone, namespace log) as a single purge is
        obj.client.dlq_purge(tid, reason=reason, actor="operator", keep_key_s=keep_days * 86_400)
        return f"{tid} purged"

    done = _each(ids, purge, "not purged")
    click.echo(f"purged {done} of {len(ids)} task(s) quarantined more than {older_than} ago")
    if done < len(ids):
        sys.exit(EXIT_REFUSED)

"""``mcq worker`` (one, or a pool) and ``mcq workers``."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..contracts.errors import ReplicationUnconfirmed
from .errors import EXIT_UNREACHABLE, fail, handle_errors
from .options import Ctx, Finite, load_app
from .output import emit_json
from .root import main

EXIT_STOPPED_MIDWAY = 5  # `mcq worker` only: stopped before its Attempt finished (see its help)


@main.command()
@click.option("--app", "app_spec", required=True, help="The handlers' App, as package.module:app.")
@click.option("--queue", "queues", multiple=True, help="Queue(s) to serve (default: every queue of the app).")
@click.option("--burst", is_flag=True, help="Stop when the queues are empty.")
@click.option("--pool", type=click.IntRange(1, 64), default=None, help="Run N worker processes (RQ WorkerPool).")
@click.option("--kind", type=click.Choice(["fork", "simple", "batch"]), default="fork", show_default=True,
              help="fork: each Attempt in a fresh child process; simple: in the worker process; batch: in the "
                   "worker process, up to --batch at a time (short tasks: one round trip per chunk of Attempts).")
@click.option("--batch", "batch", type=click.IntRange(1, 500), default=20, show_default=True,
              help="--kind batch: messages taken from RQ at once.")
@click.option("--chunk-ms", "chunk_ms", type=Finite(1, 60_000), default=100.0, show_default=True,
              help="--kind batch: a chunk of Attempts runs in about this, and a finished Attempt's completion waits "
                   "at most this long for the chunk's round trip (a crash strands at most one chunk's leases).")
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
def worker(obj: Ctx, app_spec: str, queues: tuple[str, ...], burst: bool, pool: int | None, kind: str, batch: int,
           chunk_ms: float, name: str | None, workspace_root: str | None, grace_s: float, log_level: str) -> None:
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

    from ..producer.transport import rq_connection
    from ..worker.batch import worker_class
    from ..worker.jobs import McqJob
    from ..worker.runner import McqBaseWorker, McqQueue, configure, make_worker, rq_names

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = load_app(app_spec)
    names = list(queues) or sorted({spec.queue for spec in app.handlers.values()})
    if not names:
        raise click.BadParameter("the app registers no handler and no --queue was given", param_hint="--app")
    client = obj.client
    configure(app, client, workspace_root, home=obj.home, grace_s=grace_s)  # refuses a home others can write
    base = name or f"{socket.gethostname()}.{os.getpid()}"
    cls = worker_class(kind, batch=batch, chunk_ms=chunk_ms)
    if pool:
        from rq.serializers import JSONSerializer

        from ..worker.pool import McqWorkerPool

        wp = McqWorkerPool(rq_names(client, names), base=base, connection=rq_connection(client),
                           num_workers=pool, worker_class=cls, serializer=JSONSerializer, job_class=McqJob,
                           queue_class=McqQueue)
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

    def ours() -> None:
        # RQ's loop installs its own handlers and leaves them behind when it returns: ours again at once, or a
        # stop while this process waits to reconnect went to the loop that had ended, was noted there and lost
        # (the next round's worker then ran on as if nothing was asked).
        signal.signal(signal.SIGTERM, stop_now)
        signal.signal(signal.SIGINT, stop_now)

    def stopped_midway() -> None:
        fail("stopped before its Attempt finished: its lease runs out and the sweeper reconciles it",
             EXIT_STOPPED_MIDWAY)

    ours()
    delay, round_ = 0.5, 0
    try:
        while True:
            # A reconnecting worker takes a new name: RQ may still hold the old one's registration.
            current = base if round_ == 0 else f"{base}.r{round_}"
            round_ += 1
            w: McqBaseWorker | None = None
            worked = False
            try:
                w = make_worker(app, client, names, name=current, workspace_root=workspace_root,
                                home=obj.home, grace_s=grace_s, worker_class=cls)
                worked = w.work(burst=burst, logging_level=log_level.upper())
            except SystemExit:
                if w is not None and w.forced:
                    stopped_midway()
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
            finally:
                ours()
            if w is not None:
                if w.forced:
                    stopped_midway()
                if w.stop_signal is not None or (burst and w.drained):
                    return
                if burst and (w.redis_error or not reachable()):
                    fail(f"cannot reach Redis: {w.redis_error or 'no answer to PING'}", EXIT_UNREACHABLE)
            # RQ's loop also returns after a Redis error or an unexpected one: the worker comes back once
            # Redis answers (its leases are safe meanwhile: an Attempt it held expires and is reconciled).
            wlog.warning("worker loop ended without a stop request; reconnecting in %.1fs", delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0) if not worked else 0.5
    except (Stop, StopRequested):  # a stop from ours (between rounds) or from RQ's loop
        return


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

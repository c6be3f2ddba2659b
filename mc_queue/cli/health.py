"""``mcq health``: checks for a container's HEALTHCHECK."""

from __future__ import annotations

import click

from .errors import fail, handle_errors
from .options import Ctx
from .output import exit_if_lost
from .root import main


@main.group()
def health() -> None:
    """Health checks for a container's HEALTHCHECK: exit 0 healthy, 1 not (3: the namespace lost
    state, 4: Redis cannot be reached)."""


@health.command("worker")
@click.option("--host", "hostname", default=None,
              help="The workers' host name as RQ records it (default: this host's, i.e. the container's own).")
@click.option("--probes", "probes", is_flag=True,
              help="Ready, not only alive: a worker counts only while every health probe it publishes passes "
                   "(app.probe). For a readiness check; a failing probe is a dependency's outage, which a "
                   "restart does not cure, so leave it out of a liveness check.")
@click.pass_obj
@handle_errors
def health_worker(obj: Ctx, hostname: str | None, probes: bool) -> None:
    """Healthy when at least one worker of this namespace on this host has a recent RQ heartbeat (and,
    on this host, its process is alive): what `mcq workers` shows, read from mc_queue's and RQ's records.
    With --probes, only a worker whose health probes all pass counts."""
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
    exit_if_lost(client.reads.namespace())
    failing = {str(r["worker"]): {k: v for k, v in r["probes"].items() if v != "ok"} for r in healthy}
    if probes:
        healthy = [r for r in healthy if not failing[str(r["worker"])]]
    if not healthy:
        said = "; ".join(f"{w}: {k} {v}" for w, bad in failing.items() for k, v in bad.items())
        fail(f"no live worker of namespace {client.keys.prefix!r} on host {host!r} "
             f"({len(rows)} registered, none with a recent heartbeat and a running process"
             + (f"{' whose probes pass' if probes else ''}; probes: {said}" if said else "") + ")", 1)
    click.echo(f"{len(healthy)} healthy worker(s) of namespace {client.keys.prefix!r} on {host}: "
               + ", ".join(str(r["worker"]) for r in healthy))

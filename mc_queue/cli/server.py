"""``mcq server``: the embedded redis-server."""

from __future__ import annotations

import click

from ..client.connect import embedded_client
from .errors import handle_errors
from .options import Ctx
from .root import main


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

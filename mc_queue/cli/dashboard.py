"""``mcq dashboard``: the operator console."""

from __future__ import annotations

import click

from .errors import handle_errors
from .options import Ctx
from .root import main


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

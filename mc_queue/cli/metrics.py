"""``mcq metrics``: the Prometheus exporter."""

from __future__ import annotations

import click

from .errors import handle_errors
from .options import Ctx, load_app
from .root import main


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

"""``mcq demo``: the agent factory and the contracts demo."""

from __future__ import annotations

import sys

import click

from ..client import Client
from .errors import handle_errors
from .options import Ctx
from .root import main


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

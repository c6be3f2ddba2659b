"""The root group ``mcq`` and its global options; each command module adds its commands to it."""

from __future__ import annotations

import click

from ..ops.render import mcq_invocation
from .options import Ctx, McqGroup


@click.group(cls=McqGroup)
@click.option("--redis-url", envvar="MCQ_REDIS_URL", default=None,
              help="redis://, rediss:// or unix:// URL (user:password@ for AUTH/ACL). Default: the embedded server.")
@click.option("--prefix", envvar="MCQ_PREFIX", default="mcq", show_default=True, help="Namespace (key prefix).")
@click.option("--home", envvar="MCQ_HOME", default=None, help="Data folder of the embedded server (default ./.mcq).")
@click.version_option(package_name="mc_queue")
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, prefix: str, home: str | None) -> None:
    """mc_queue: tasks with append-only attempts, fenced leases and an audit trail."""
    typed = {name for name in ("redis_url", "prefix", "home")
             if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}
    again = mcq_invocation(redis_url=redis_url if "redis_url" in typed else None,
                           prefix=prefix if "prefix" in typed else None, home=home if "home" in typed else None)
    ctx.obj = Ctx(redis_url, prefix, home, again)

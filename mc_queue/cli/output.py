"""What ``mcq`` prints besides its tables (mc_queue.ops.render, 80 columns): ``--json``, and the exit
when the namespace cannot be trusted."""

from __future__ import annotations

import json
from typing import Any

import click

from ..contracts.models import NamespaceInfo
from .errors import fail


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def exit_if_lost(info: NamespaceInfo) -> None:
    """Exit 3 when the namespace lost state (or is recovering): what was printed is not the truth."""
    if not info.usable:
        fail(f"namespace {info.prefix!r} is {info.state}: {info.reason}. Run `mcq recover`.", 3)

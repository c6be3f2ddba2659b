"""Layer 11, the command line: ``mcq``. Every read has ``--json``.

One module per command group; importing it adds its commands to the root group ``main``.
"""

from __future__ import annotations

from . import (  # noqa: F401  (each adds its commands to main)
    archive,
    caps,
    dashboard,
    demo,
    dlq,
    fair,
    health,
    limits,
    metrics,
    periodic,
    providers,
    queue,
    recovery,
    retention,
    server,
    slots,
    spend,
    sweeper,
    tasks,
    worker,
)
from .root import main

__all__ = ["main"]

"""Layer 11, the command line: ``mcq``. Every read has ``--json``.

One module per command group; importing it adds its commands to the root group ``main``.
"""

from __future__ import annotations

from . import tasks  # noqa: F401  (adds its commands to main)
from .root import main

__all__ = ["main"]

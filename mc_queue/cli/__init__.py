"""Layer 11, the command line: ``mcq``."""

from __future__ import annotations

from .tasks import main

__all__ = ["main"]

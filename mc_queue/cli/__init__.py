"""Layer 11, the command line: ``mcq``."""

from __future__ import annotations

from .main import main

__all__ = ["main"]

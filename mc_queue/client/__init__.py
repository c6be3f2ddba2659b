"""Layer 2, the client: typed calls on the scripts, one class per role that makes them, and the
``Client`` facade that hands those roles out (``connect()`` builds one)."""

from __future__ import annotations

from ..store.backend import DEFAULT_LEASE_MS
from .facade import Client

__all__ = ["DEFAULT_LEASE_MS", "Client"]

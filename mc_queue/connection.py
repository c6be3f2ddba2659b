"""``connect()``: a Client for a Redis URL, or for the embedded default when none is given."""

from __future__ import annotations

import os
from typing import Any

from .client import Client


def connect(url: str | None = None, *, prefix: str | None = None, home: str | None = None, **kw: Any) -> Client:
    """Connect to a namespace. ``url`` (or ``MCQ_REDIS_URL``) may be ``redis://``, ``rediss://``
    (TLS) or ``unix://``, with a password or ACL user. With neither, start or reuse the embedded
    private redis-server under ``home`` (``MCQ_HOME``, default ``./.mcq``).
    """
    url = url or os.environ.get("MCQ_REDIS_URL") or None
    prefix = prefix or os.environ.get("MCQ_PREFIX") or "mcq"
    if url:
        return Client(url, prefix=prefix, **kw)
    from .embedded import ensure_server

    server = ensure_server(home)
    client = Client(server.url, prefix=prefix, witness_path=server.witness, **kw)
    client.embedded = server
    return client

"""``connect()``: a Client for a Redis URL, or for the embedded default when none is given."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .client import Client


def state_dir(home: str | None = None) -> str:
    """Where a process keeps what must outlive it (the replication watermark's slot files):
    ``$MCQ_STATE_DIR``, else ``<home>/state`` (``$MCQ_HOME``, default ``./.mcq``)."""
    return os.environ.get("MCQ_STATE_DIR") or str(Path(home or os.environ.get("MCQ_HOME") or ".mcq") / "state")


def connect(url: str | None = None, *, prefix: str | None = None, home: str | None = None, **kw: Any) -> Client:
    """Connect to a namespace. ``url`` (or ``MCQ_REDIS_URL``) may be ``redis://``, ``rediss://``
    (TLS), ``unix://`` or ``redis+sentinel://host:port,host:port/service`` (see :mod:`mc_queue.urls`),
    with a password or ACL user, and ``?min_replicas=N&replica_timeout_ms=T``. With neither, start
    or reuse the embedded private redis-server under ``home`` (``MCQ_HOME``, default ``./.mcq``).
    Keyword arguments go to :class:`Client` (``min_replicas=``, ``replica_timeout_ms=``,
    ``track_replication=``, ``state_dir=`` default :func:`state_dir`).
    """
    url = url or os.environ.get("MCQ_REDIS_URL") or None
    prefix = prefix or os.environ.get("MCQ_PREFIX") or "mcq"
    kw.setdefault("state_dir", state_dir(home))
    if url:
        return Client(url, prefix=prefix, **kw)
    from .embedded import ensure_server

    server = ensure_server(home)
    client = Client(server.url, prefix=prefix, witness_path=server.witness, **kw)
    client.embedded = server
    return client

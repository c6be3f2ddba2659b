"""``connect()``: a Client for a Redis URL, or for the embedded default when none is given."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import redis

from ..contracts.errors import McqError
from .facade import Client


def state_dir(home: str | None = None) -> str:
    """Where a process keeps what must outlive it (the replication watermark's slot files):
    ``$MCQ_STATE_DIR``, else ``<home>/state`` (``$MCQ_HOME``, default ``./.mcq``)."""
    return os.environ.get("MCQ_STATE_DIR") or str(Path(home or os.environ.get("MCQ_HOME") or ".mcq") / "state")


class NoEmbeddedServer(McqError):
    """No Redis URL was given and the embedded server of the home is not running: a caller that only
    reads (``connect(start_embedded=False)``) does not start one."""

    def __init__(self, home: Path) -> None:
        super().__init__(f"no embedded server is running in {home} and no Redis URL was given (--redis-url, "
                         f"MCQ_REDIS_URL): nothing to read, nothing started. `mcq server start` starts it on the "
                         f"data it keeps in {home / 'redis'}; `mcq server stop` stops it again")
        self.home = home


def connect(url: str | None = None, *, prefix: str | None = None, home: str | None = None,
            start_embedded: bool = True, **kw: Any) -> Client:
    """Connect to a namespace. ``url`` (or ``MCQ_REDIS_URL``) may be ``redis://``, ``rediss://``
    (TLS), ``unix://`` or ``redis+sentinel://host:port,host:port/service`` (see :mod:`mc_queue.store.urls`),
    with a password or ACL user, and ``?min_replicas=N&replica_timeout_ms=T``. With neither, start
    or reuse the embedded private redis-server under ``home`` (``MCQ_HOME``, default ``./.mcq``);
    with ``start_embedded=False`` only reuse it: :class:`NoEmbeddedServer` when it does not run.
    Keyword arguments go to :class:`Client` (``min_replicas=``, ``replica_timeout_ms=``,
    ``track_replication=``, ``state_dir=`` default :func:`state_dir`).
    """
    url = url or os.environ.get("MCQ_REDIS_URL") or None
    prefix = prefix or os.environ.get("MCQ_PREFIX") or "mcq"
    kw.setdefault("state_dir", state_dir(home))
    if url:
        return Client(url, prefix=prefix, **kw)
    return embedded_client(home, prefix=prefix, start=start_embedded, **kw)


def embedded_client(home: str | None = None, *, prefix: str = "mcq", start: bool = True, **kw: Any) -> Client:
    """A Client of the embedded server of ``home`` (whatever Redis URL the environment names): the
    server is started when it does not run, or, without ``start``, :class:`NoEmbeddedServer`. Its
    ``embedded`` attribute says which server (``started``: by this call)."""
    from ..store.embedded import HOME_RULE, EmbeddedServer, check_private_dir, ensure_server, home_dir

    if start:
        kw.setdefault("state_dir", state_dir(home))
        server = ensure_server(home)
    else:
        root = home_dir(home)
        if os.path.lexists(root):  # the home's rule holds for readers too: a home others can change is refused
            check_private_dir(root, HOME_RULE)
        kw.setdefault("state_dir", state_dir(home))
        server = EmbeddedServer(root, root / "redis.sock", 0, started=False)
    client = Client(server.url, prefix=prefix, witness_path=server.witness, **kw)
    if not start:
        try:  # running is answering: a socket file a killed server left behind is not a server
            pid = int(client.redis.info("server")["process_id"])
        except (redis.ConnectionError, redis.TimeoutError):
            client.close()
            raise NoEmbeddedServer(server.home) from None
        server = dataclasses.replace(server, pid=pid)
    client.embedded = server
    return client

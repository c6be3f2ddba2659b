"""Redis URLs, and the one factory that builds every redis-py client mc_queue makes from one.

Accepted forms:

- ``redis://[user:password@]host:port[/db]``, ``rediss://...`` (TLS), ``unix:///path[?db=N]``: handed to
  redis-py's ``from_url`` (its own query parameters work as documented there);
- ``redis+sentinel://[user:password@]host:port,host:port,.../service[/db]`` (``rediss+sentinel://``
  for TLS to the data nodes and the sentinels): the primary of ``service`` as the sentinels name it,
  asked again after every connection error, so a client follows a failover without a restart. The
  credentials are the data nodes'; the sentinels' own are ``sentinel_username`` / ``sentinel_password``.
  A sentinel without a port is on 26379.

mc_queue's own query parameters, on any form (removed before redis-py sees the URL):

- ``min_replicas=N`` (0-16): a transition a caller acts on returns only once ``WAIT N`` confirmed it on N
  replicas (:class:`mc_queue.errors.ReplicationUnconfirmed` otherwise);
- ``replica_timeout_ms=T`` (1-60000, default 1000): how long ``WAIT`` may block;
- ``track_replication=auto|on|off``: keep the replication watermark (``auto``: with a sentinel URL,
  ``min_replicas`` > 0, or a primary that has replicas).

A sentinel URL also takes ``sentinel_username``, ``sentinel_password``, ``socket_timeout`` (seconds,
for the sentinels), and with TLS ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs`` (none | optional | required); anything else is refused with a message saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.connection import SSLConnection
from redis.retry import Retry
from redis.sentinel import SentinelManagedConnection

from .errors import ConfigurationError

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
DIRECT_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_REPLICA_TIMEOUT_MS = 1000
MAX_MIN_REPLICAS = 16
TRACK_MODES = ("auto", "on", "off")
_OWN = ("min_replicas", "replica_timeout_ms", "track_replication")
_SENTINEL_PARAMS = ("sentinel_username", "sentinel_password", "socket_timeout")
_TLS_PARAMS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")


@dataclass(frozen=True)
class RedisTarget:
    """A parsed URL: where the primary is and how to reach it, and mc_queue's own options from it
    (None where the URL does not set them)."""

    url: str  # as given
    sentinel: bool
    redis_url: str = ""  # direct forms: the URL redis-py gets (mc_queue's parameters removed)
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)
    tls_kwargs: dict[str, Any] = field(default_factory=dict)
    min_replicas: int | None = None
    replica_timeout_ms: int | None = None
    track_replication: str | None = None

    @property
    def where(self) -> str:
        """The URL without credentials, for messages and logs."""
        return redacted(self.url)


def redacted(url: str) -> str:
    """``url`` with its password (and any ``*password=`` parameter) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<an unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, hosts = netloc.rpartition("@")
        name = user.split(":", 1)[0]
        netloc = f"{name}:***@{hosts}" if ":" in user else f"{name}@{hosts}"
    query = urlencode([(k, "***" if "password" in k else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _bad(url: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"bad Redis URL {redacted(url)!r}: {why}")


def _int_param(url: str, name: str, value: str, low: int, high: int) -> int:
    if not value.isdigit() or (len(value) > 1 and value[0] == "0") or not low <= int(value) <= high:
        raise _bad(url, f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return int(value)


def _own_options(url: str, params: list[tuple[str, str]]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """mc_queue's parameters (validated), and the rest in order."""
    own: dict[str, Any] = {}
    rest: list[tuple[str, str]] = []
    for k, v in params:
        if k in own:
            raise _bad(url, f"parameter {k} is given twice")
        if k == "min_replicas":
            own[k] = _int_param(url, k, v, 0, MAX_MIN_REPLICAS)
        elif k == "replica_timeout_ms":
            own[k] = _int_param(url, k, v, 1, 60_000)
        elif k == "track_replication":
            if v not in TRACK_MODES:
                raise _bad(url, f"track_replication must be one of {', '.join(TRACK_MODES)}, not {v!r}")
            own[k] = v
        else:
            rest.append((k, v))
    return own, rest


def _host_port(url: str, text: str) -> tuple[str, int]:
    if text.startswith("["):  # [v6]:port
        host, sep, port = text[1:].partition("]")
        port = port[1:] if port.startswith(":") else ("" if not port else "x")
        if not sep:
            raise _bad(url, f"unclosed '[' in sentinel address {text!r}")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise _bad(url, f"sentinel address {text!r} has no host (write host:port, separated by commas)")
    if port == "":
        return host, DEFAULT_SENTINEL_PORT
    return host, _int_param(url, f"the port of sentinel {host}", port, 1, 65535)


def parse_url(url: str) -> RedisTarget:
    """Parse a Redis URL (see the module's docstring); ConfigurationError saying what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("the Redis URL is empty: give redis://host:port/db, rediss://..., unix:///path "
                                 "or redis+sentinel://host:port,host:port/service")
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise _bad(url, "it has no scheme (redis://, rediss://, unix:// or redis+sentinel://)")
    scheme = scheme.lower()
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _bad(url, str(exc)) from None
    params = parse_qsl(parts.query, keep_blank_values=True)
    own, rest = _own_options(url, params)
    if scheme in DIRECT_SCHEMES:
        plain = url if not own else urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest),
                                                 parts.fragment))
        return RedisTarget(url=url, sentinel=False, redis_url=plain, **own)
    if scheme not in SENTINEL_SCHEMES:
        raise _bad(url, f"unknown scheme {scheme}://; use redis://, rediss://, unix://, redis+sentinel:// or "
                        "rediss+sentinel://")
    tls = SENTINEL_SCHEMES[scheme]
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    if not hosts:
        raise _bad(url, "it names no sentinel (write redis+sentinel://host:port,host:port/service)")
    sentinels = tuple(_host_port(url, h.strip()) for h in hosts.split(","))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0]:
        raise _bad(url, "it names no service: the path is the name the sentinels monitor "
                        "(redis+sentinel://host:port/mymaster[/db])")
    if len(path) > 2 or (len(path) == 2 and path[1] == ""):
        raise _bad(url, "the path must be /service or /service/db")
    db = _int_param(url, "db", path[1], 0, 1_000_000) if len(path) == 2 else 0
    sentinel_kwargs: dict[str, Any] = {}
    tls_kwargs: dict[str, Any] = {}
    for k, v in rest:
        if k == "sentinel_username":
            sentinel_kwargs["username"] = v
        elif k == "sentinel_password":
            sentinel_kwargs["password"] = v
        elif k == "socket_timeout":
            try:
                timeout = float(v)
            except ValueError:
                timeout = -1.0
            if not 0 < timeout <= 3600:
                raise _bad(url, f"socket_timeout must be seconds in (0, 3600], not {v!r}")
            sentinel_kwargs["socket_timeout"] = timeout
        elif k in _TLS_PARAMS and tls:
            if k == "ssl_cert_reqs" and v not in ("none", "optional", "required"):
                raise _bad(url, f"ssl_cert_reqs must be none, optional or required, not {v!r}")
            tls_kwargs[k] = v
        else:
            allowed = ", ".join((*_OWN, *_SENTINEL_PARAMS, *(_TLS_PARAMS if tls else ())))
            hint = " (TLS options need rediss+sentinel://)" if k in _TLS_PARAMS else ""
            raise _bad(url, f"unknown parameter {k!r} for a sentinel URL{hint}; known: {allowed}")
    return RedisTarget(url=url, sentinel=True, sentinels=sentinels, service=path[0], db=db, username=username,
                       password=password, tls=tls, sentinel_kwargs=sentinel_kwargs, tls_kwargs=tls_kwargs, **own)


def sentinel_url(sentinels: list[tuple[str, int]], service: str, *, db: int = 0, username: str | None = None,
                 password: str | None = None, tls: bool = False, **params: Any) -> str:
    """Build a ``redis+sentinel://`` URL (tests and benches)."""
    auth = ""
    if username or password:
        auth = quote(username or "", safe="") + (":" + quote(password, safe="") if password else "") + "@"
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in sentinels)
    query = urlencode({k: v for k, v in params.items() if v is not None})
    scheme = "rediss+sentinel" if tls else "redis+sentinel"
    return f"{scheme}://{auth}{hosts}/{quote(service, safe='')}" + (f"/{db}" if db else "") + \
        (f"?{query}" if query else "")


class FollowingConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that asks the sentinels where the primary is on *every* reconnect.

    redis-py 8's ``send_command`` reconnects a dropped connection through ``connect_check_health``,
    which reuses the last address: after a failover, the first command on a pooled connection and all
    its retries went to the dead primary's address (only a connection taken anew from the pool asked
    the sentinels). Seen here with redis-py 8.1 (tests/faults/test_failover.py)."""

    _resolving = False

    def connect_to(self, address: Any) -> None:
        self._resolving = True  # connect_to's own connect_check_health: the address was just asked for
        try:
            super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._resolving = False

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self._sock and not self._resolving and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    """:class:`FollowingConnection` over TLS."""


def make_redis(target: RedisTarget | str, *, redis_class: type[redis.Redis] = redis.Redis,
               **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``target``'s primary; ``kwargs`` go to every connection it opens (timeouts,
    ``decode_responses``, ``retry`` ...). With a sentinel URL the connections ask the sentinels where the
    primary is whenever they (re)connect, so the client follows a failover."""
    t = parse_url(target) if isinstance(target, str) else target
    if not t.sentinel:
        return redis_class.from_url(t.redis_url, **kwargs)
    from redis.sentinel import Sentinel

    sentinel_kwargs = {"socket_timeout": kwargs.get("socket_timeout") or 5.0,
                       "socket_connect_timeout": kwargs.get("socket_connect_timeout") or 5.0,
                       **t.sentinel_kwargs}
    tls_kwargs: dict[str, Any] = {}
    if t.tls:
        tls_kwargs = {"ssl": True, **t.tls_kwargs}
        sentinel_kwargs.update(tls_kwargs)
    if "retry" not in kwargs:
        # What redis.Redis() gives a pool it builds itself; a pool built for Sentinel gets no retry at all,
        # so the first read after a failover failed on the connection the old primary closed.
        kwargs["retry"] = Retry(ExponentialBackoff(), 3)
    kwargs.setdefault("connection_class", FollowingSSLConnection if t.tls else FollowingConnection)
    manager: Any = Sentinel(list(t.sentinels), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    primary: redis.Redis = manager.master_for(t.service, redis_class=redis_class, db=t.db, username=t.username,
                                              password=t.password, **tls_kwargs, **kwargs)
    return primary

"""Redis URLs, and the one factory that builds every redis-py client mc_queue makes from one.

Accepted forms:

- ``redis://[user:password@]host:port[/db]``, ``rediss://...`` (TLS), ``unix://[user:password@]/path[?db=N]``:
  checked here, then handed to redis-py's ``from_url`` (the query parameters listed in :data:`DIRECT_PARAMS`
  work as documented there; anything else is refused);
- ``redis+sentinel://[user:password@]host:port,host:port,.../service[/db]`` (``rediss+sentinel://``
  for TLS to the data nodes and the sentinels): the primary of ``service`` as the sentinels name it,
  asked again after every connection error, so a client follows a failover without a restart. The
  credentials are the data nodes'; the sentinels' own are ``sentinel_username`` / ``sentinel_password``.
  A sentinel without a port is on 26379. An IPv6 host is written in brackets (``[::1]:26379``).

The URL is split here by hand, never by ``urllib.parse.urlsplit`` (Debian's Python 3.11.2 and current
CPython releases refuse a bracketed IPv6 host in a comma-separated host list). The user name and the
password are percent-decoded; a ``/``, ``?``, ``#`` or ``@`` after the host part is refused, since it
means a password that was not percent-encoded (``%2F``, ``%3F``, ``%23``, ``%40``). Every error is a
:class:`~mc_queue.contracts.errors.ConfigurationError` that names the part and what is allowed, and shows the URL
only as :func:`redacted` makes it.

mc_queue's own query parameters, on any form (removed before redis-py sees the URL):

- ``min_replicas=N`` (0-16): a transition a caller acts on returns only once ``WAIT N`` confirmed it on N
  replicas (:class:`mc_queue.contracts.errors.ReplicationUnconfirmed` otherwise);
- ``replica_timeout_ms=T`` (1-60000, default 1000): how long ``WAIT`` may block;
- ``track_replication=auto|on|off``: keep the replication watermark (``auto``: with a sentinel URL,
  ``min_replicas`` > 0, or a primary that has replicas).

A sentinel URL also takes ``sentinel_username``, ``sentinel_password``, ``socket_timeout`` (seconds,
for the sentinels), and with TLS ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs`` (none | optional | required); anything else is refused with a message saying so.
"""

from __future__ import annotations

import dataclasses
import inspect
import ipaddress
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, urlencode

import redis
from redis.backoff import ExponentialBackoff
from redis.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.retry import Retry
from redis.sentinel import SentinelManagedConnection

from ..contracts.errors import ConfigurationError

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
DIRECT_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_REPLICA_TIMEOUT_MS = 1000
MAX_MIN_REPLICAS = 16
MAX_DB = 1_000_000  # what the URL may say; the server refuses a db beyond its `databases` (explained on connect)
TRACK_MODES = ("auto", "on", "off")
CERT_REQS = ("none", "optional", "required")
_OWN = ("min_replicas", "replica_timeout_ms", "track_replication")
_SENTINEL_PARAMS = ("sentinel_username", "sentinel_password", "socket_timeout")
_TLS_PARAMS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
_BOOL_WORDS = ("true", "false", "yes", "no", "1", "0")

# redis-py's query parameters a direct URL may carry: name -> (kind, forms). kind: seconds | bool | text |
# name | (low, high) for a whole number | a tuple of words; forms: any, tcp (not unix://), tls (rediss:// only).
DIRECT_PARAMS: dict[str, tuple[Any, str]] = {
    "db": ((0, MAX_DB), "any"),
    "socket_timeout": ("seconds", "any"),
    "socket_connect_timeout": ("seconds", "any"),
    "socket_keepalive": ("bool", "tcp"),
    "retry_on_timeout": ("bool", "any"),
    "health_check_interval": ((0, 86_400), "any"),
    "max_connections": ((1, 1_000_000), "any"),
    "client_name": ("name", "any"),
    "protocol": (("2", "3"), "any"),
    "ssl_cert_reqs": (CERT_REQS, "tls"),
    "ssl_check_hostname": ("bool", "tls"),
    "ssl_ca_certs": ("text", "tls"),
    "ssl_ca_path": ("text", "tls"),
    "ssl_certfile": ("text", "tls"),
    "ssl_keyfile": ("text", "tls"),
    "ssl_password": ("text", "tls"),
}
_KNOWN_PARAMS = frozenset((*_OWN, *_SENTINEL_PARAMS, *DIRECT_PARAMS))
_HOSTNAME = re.compile(r"[A-Za-z0-9_~.%-]+")  # a DNS name or IPv4 address (%-escapes allowed)
_PRINTABLE = re.compile(r"[!-~]+")


@dataclass(frozen=True, repr=False)
class RedisTarget:
    """A parsed URL: where the primary is and how to reach it, and mc_queue's own options from it
    (None where the URL does not set them). Its repr shows the URL only :func:`redacted`."""

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
    password_from_file: bool = False  # the password came from $MCQ_REDIS_PASSWORD_FILE, not the URL

    @property
    def where(self) -> str:
        """The URL without credentials, for messages and logs."""
        return redacted(self.url)

    def __repr__(self) -> str:
        return (f"RedisTarget({self.where!r}, sentinel={self.sentinel}, sentinels={self.sentinels!r}, "
                f"service={self.service!r}, db={self.db}, tls={self.tls}, min_replicas={self.min_replicas!r}, "
                f"replica_timeout_ms={self.replica_timeout_ms!r}, track_replication={self.track_replication!r})")

    __str__ = __repr__


# --------------------------------------------------------------------------- redaction


def _authority_end(rest: str) -> int:
    """Where the authority (userinfo@hosts) of what follows ``scheme://`` ends: at the first /, ? or #."""
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    return min(ends) if ends else len(rest)


def _mask_query(query: str) -> str:
    """Every ``*password=`` value masked, and after one, any segment that is not a known parameter (an
    unencoded ``&`` in that password)."""
    out: list[str] = []
    after_secret = False
    for segment in query.split("&"):
        raw_name = segment.partition("=")[0]
        name = unquote_plus(raw_name)
        if "password" in name.lower():
            out.append(f"{raw_name}=***")
            after_secret = True
        else:
            out.append("***" if after_secret and name not in _KNOWN_PARAMS else segment)
    return "&".join(out)


def redacted(url: str) -> str:
    """``url`` for messages and logs, for any input (malformed ones included): its password, any
    ``*password=`` parameter and any fragment replaced by ``***``. When an ``@`` follows the host part (a
    password holding an unencoded ``/``, ``?`` or ``#``), or there is no ``scheme://``, everything up to the
    last ``@`` is masked; so is a userinfo without ``:`` (it may be a password)."""
    if not isinstance(url, str):
        return "<not a URL>"
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = _authority_end(rest) if sep else 0
    authority, tail = rest[:end], rest[end:]
    fragment = ""
    question, hashmark = tail.find("?"), tail.find("#")
    if question >= 0 and not 0 <= hashmark < question:  # a query: mask its secrets, and a fragment after it
        query, after, _ = tail[question + 1:].partition("#")
        tail = tail[:question + 1] + _mask_query(query)
        fragment = "#***" if after else ""
    joined = authority + tail
    last_at = joined.rfind("@")
    head = ""
    if last_at >= 0:
        user, colon, _ = joined[:last_at].partition(":")
        head = f"{user}:***@" if sep and colon and last_at < len(authority) else "***@"
        joined = joined[last_at + 1:]
    body, after, _ = joined.partition("#")  # a fragment before any query
    return (f"{scheme}://" if sep else "") + head + body + ("#***" if after else "") + fragment


def _bad(url: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"bad Redis URL {redacted(url)!r}: {why}")


# --------------------------------------------------------------------------- the parts


def _int_param(url: str, name: str, value: str, low: int, high: int) -> int:
    if not value.isdigit() or not value.isascii() or (len(value) > 1 and value[0] == "0") or \
            not low <= int(value) <= high:
        raise _bad(url, f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return int(value)


def _check_value(url: str, name: str, kind: Any, value: str) -> None:
    """Refuse a parameter value redis-py (or Redis) would fail on, saying what is allowed. A secret's
    value is never quoted."""
    shown = "that value" if "password" in name else repr(value)
    if kind == "seconds":
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and 0 < seconds <= 3600):
            raise _bad(url, f"{name} must be seconds in (0, 3600], not {shown}")
    elif kind == "bool":
        if value.lower() not in _BOOL_WORDS:
            raise _bad(url, f"{name} must be one of {', '.join(_BOOL_WORDS)}, not {shown}")
    elif kind == "text":
        if not value or not value.isprintable():
            raise _bad(url, f"{name} must be a non-empty value without control characters, not {shown}")
    elif kind == "name":
        if not _PRINTABLE.fullmatch(value):
            raise _bad(url, f"{name} must be printable characters without spaces, not {shown}")
    elif isinstance(kind, tuple) and isinstance(kind[0], int):
        _int_param(url, name, value, kind[0], kind[1])
    elif value not in kind:
        raise _bad(url, f"{name} must be {', '.join(kind[:-1])} or {kind[-1]}, not {shown}")


@dataclass(frozen=True)
class _Split:
    scheme: str
    userinfo: str | None  # raw, None without an '@'
    hosts: str  # raw
    path: str  # raw
    params: list[tuple[str, str, str]]  # (name, value, the raw segment), in order


def _split(url: str) -> _Split:
    """scheme://[userinfo@]hosts[/path][?query], by hand: the host list may hold bracketed IPv6 hosts."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad(url, "it has no scheme (redis://, rediss://, unix:// or redis+sentinel://)")
    end = _authority_end(rest)
    authority, tail = rest[:end], rest[end:]
    if "@" in tail:
        raise _bad(url, "it has an '@' after the host part: a user name or password holding '/', '?', '#' or '@' "
                        "must be percent-encoded (%2F, %3F, %23, %40), and so must an '@' in the path or a parameter")
    if "#" in tail:
        raise _bad(url, "a Redis URL has no #fragment (a '#' in a password is written %23)")
    path, _, query = tail.partition("?")
    userinfo, at, hosts = authority.rpartition("@")
    params: list[tuple[str, str, str]] = []
    for segment in query.split("&") if query else ():
        if segment:
            name, _, value = segment.partition("=")
            params.append((unquote_plus(name), unquote_plus(value), segment))
    seen: set[str] = set()
    for name, _, _ in params:
        if name in seen:
            raise _bad(url, f"parameter {name} is given twice")
        seen.add(name)
    return _Split(scheme.lower(), userinfo if at else None, hosts, path, params)


def _credentials(userinfo: str | None) -> tuple[str | None, str | None]:
    if userinfo is None:
        return None, None
    user, colon, password = userinfo.partition(":")
    return unquote(user) or None, unquote(password) if colon else None


def _host_port(url: str, text: str, what: str, default: int | None) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` (``what`` names it in messages)."""
    if text.startswith("["):
        inner, sep, after = text[1:].partition("]")
        if not sep:
            raise _bad(url, f"unclosed '[' in {what} {text!r}")
        host = unquote(inner)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _bad(url, f"{what} [{inner}] is not an IPv6 address (only an IPv6 address goes in brackets)") \
                from None
        if after and not after.startswith(":"):
            raise _bad(url, f"{what} {text!r}: write [address]:port")
        port: str | None = after[1:] if after else None
    else:
        host, colon, port_text = text.partition(":")
        if ":" in port_text:
            raise _bad(url, f"{what} {text!r} has more than one ':': an IPv6 address is written in brackets, "
                            "[address]:port")
        if host and not _HOSTNAME.fullmatch(host):
            raise _bad(url, f"{what} host {host!r} is not a host name or address (letters, digits, '-', '.'; "
                            "an IPv6 address in brackets)")
        host, port = unquote(host), port_text if colon else None
    if port is None:
        return host, default
    return host, _int_param(url, "port" if what == "the host" else f"the port of {what} {host}", port, 1, 65535)


def _unknown(url: str, params: list[tuple[str, str, str]], name: str, allowed: str,
             where: str = "") -> ConfigurationError:
    """An unknown parameter; after a password parameter it is not quoted (it may be the rest of a
    password holding an unencoded '&')."""
    names = [k for k, _, _ in params]
    if any("password" in k.lower() for k in names[:names.index(name)]):
        return _bad(url, f"an unknown parameter follows a password parameter{where}: an '&', '=' or '+' in a "
                         f"password is written %26, %3D, %2B; known parameters: {allowed}")
    return _bad(url, f"unknown parameter {name!r}{where}; known: {allowed}")


def _own_options(url: str, params: list[tuple[str, str, str]]) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """mc_queue's parameters (validated), and the rest in order."""
    own: dict[str, Any] = {}
    rest: list[tuple[str, str, str]] = []
    for k, v, raw in params:
        if k == "min_replicas":
            own[k] = _int_param(url, k, v, 0, MAX_MIN_REPLICAS)
        elif k == "replica_timeout_ms":
            own[k] = _int_param(url, k, v, 1, 60_000)
        elif k == "track_replication":
            if v not in TRACK_MODES:
                raise _bad(url, f"track_replication must be one of {', '.join(TRACK_MODES)}, not {v!r}")
            own[k] = v
        else:
            rest.append((k, v, raw))
    return own, rest


def parse_url(url: str) -> RedisTarget:
    """Parse a Redis URL (see the module's docstring); ConfigurationError saying what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("the Redis URL is empty: give redis://host:port/db, rediss://..., unix:///path "
                                 "or redis+sentinel://host:port,host:port/service")
    parts = _split(url)
    own, rest = _own_options(url, parts.params)
    if parts.scheme in DIRECT_SCHEMES:
        return _with_password_file(_direct(url, parts, own, rest))
    if parts.scheme not in SENTINEL_SCHEMES:
        raise _bad(url, f"unknown scheme {parts.scheme}://; use redis://, rediss://, unix://, redis+sentinel:// or "
                        "rediss+sentinel://")
    return _with_password_file(_sentinel(url, parts, own, rest))


PASSWORD_FILE_ENV = "MCQ_REDIS_PASSWORD_FILE"


def _with_password_file(t: RedisTarget) -> RedisTarget:
    """The data nodes' password from the file ``$MCQ_REDIS_PASSWORD_FILE`` names (a compose or Kubernetes
    secret), when it is set: the password then appears on no command line, in no URL and in no
    environment. One trailing newline is dropped; an empty file, or a URL with a password of its own
    too, is refused."""
    path = os.environ.get(PASSWORD_FILE_ENV)
    if not path:
        return t
    if t.password is not None:
        raise ConfigurationError(f"{PASSWORD_FILE_ENV} is set and the Redis URL {t.where!r} has a password too: "
                                 f"give it in one place (drop it from the URL, or unset {PASSWORD_FILE_ENV})")
    try:
        if not os.path.isfile(path):
            raise ConfigurationError(f"{PASSWORD_FILE_ENV}={path!r} is not a file: name the file that holds the "
                                     "Redis password (a secret mounted into the container)")
        with open(path, "rb") as fh:
            data = fh.read(65_537)
    except OSError as exc:
        raise ConfigurationError(f"{PASSWORD_FILE_ENV}={path!r} cannot be read ({exc.strerror})") from None
    text = data.decode("utf-8", "replace")
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text or len(data) > 65_536 or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigurationError(f"{PASSWORD_FILE_ENV}={path!r} must hold the password on one line (it is empty, "
                                 "longer than 64 KB or holds control characters)")
    return dataclasses.replace(t, password=text, password_from_file=True)


def _direct(url: str, parts: _Split, own: dict[str, Any], rest: list[tuple[str, str, str]]) -> RedisTarget:
    unix = parts.scheme == "unix"
    if unix:
        if parts.hosts:
            raise _bad(url, "a unix:// URL names no host: write unix:///path/to/redis.sock (three slashes)")
        if parts.path in ("", "/"):
            raise _bad(url, "it names no socket path (write unix:///path/to/redis.sock[?db=N])")
    else:
        _host_port(url, parts.hosts, "the host", None)
        if parts.path not in ("", "/"):
            db_text = unquote(parts.path[1:])
            if "/" in db_text:
                raise _bad(url, f"the path must be /db (a database number, e.g. /0), not {parts.path!r}")
            _int_param(url, "db", db_text, 0, MAX_DB)
            if any(k == "db" for k, _, _ in rest):
                raise _bad(url, "db is given twice (in the path and as ?db=)")
    for k, v, _ in rest:
        kind, forms = DIRECT_PARAMS.get(k, (None, ""))
        if kind is None:
            raise _unknown(url, rest, k, ", ".join((*_OWN, *DIRECT_PARAMS)))
        if forms == "tls" and parts.scheme != "rediss":
            raise _bad(url, f"parameter {k} is a TLS option: TLS options need rediss://")
        if forms == "tcp" and unix:
            raise _bad(url, f"parameter {k} does not apply to a unix socket")
        _check_value(url, k, kind, v)
    username, password = _credentials(parts.userinfo)
    auth = ""
    if parts.userinfo is not None:
        auth = quote(username or "", safe="") + (":" + quote(password, safe="") if password is not None else "") + "@"
    query = "&".join(raw for _, _, raw in rest)
    plain = f"{parts.scheme}://{auth}{parts.hosts}{parts.path}" + (f"?{query}" if query else "")
    return RedisTarget(url=url, sentinel=False, redis_url=plain, username=username, password=password,
                       tls=parts.scheme == "rediss", **own)


def _sentinel(url: str, parts: _Split, own: dict[str, Any], rest: list[tuple[str, str, str]]) -> RedisTarget:
    tls = SENTINEL_SCHEMES[parts.scheme]
    username, password = _credentials(parts.userinfo)
    if not parts.hosts:
        raise _bad(url, "it names no sentinel (write redis+sentinel://host:port,host:port/service)")
    sentinels: list[tuple[str, int]] = []
    for text in parts.hosts.split(","):
        host, port = _host_port(url, text.strip(), "sentinel", DEFAULT_SENTINEL_PORT)
        if not host:
            raise _bad(url, f"sentinel address {text!r} has no host (write host:port, separated by commas)")
        sentinels.append((host, port or DEFAULT_SENTINEL_PORT))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0]:
        raise _bad(url, "it names no service: the path is the name the sentinels monitor "
                        "(redis+sentinel://host:port/mymaster[/db])")
    if len(path) > 2 or (len(path) == 2 and path[1] == ""):
        raise _bad(url, "the path must be /service or /service/db")
    db = _int_param(url, "db", path[1], 0, MAX_DB) if len(path) == 2 else 0
    sentinel_kwargs: dict[str, Any] = {}
    tls_kwargs: dict[str, Any] = {}
    for k, v, _ in rest:
        if k in ("sentinel_username", "sentinel_password"):
            sentinel_kwargs[k.removeprefix("sentinel_")] = v
        elif k == "socket_timeout":
            _check_value(url, k, "seconds", v)
            sentinel_kwargs["socket_timeout"] = float(v)
        elif k in _TLS_PARAMS and tls:
            _check_value(url, k, DIRECT_PARAMS[k][0], v)
            tls_kwargs[k] = v
        else:
            allowed = ", ".join((*_OWN, *_SENTINEL_PARAMS, *(_TLS_PARAMS if tls else ())))
            hint = " (TLS options need rediss+sentinel://)" if k in _TLS_PARAMS else ""
            raise _unknown(url, rest, k, allowed, " for a sentinel URL" + hint)
    return RedisTarget(url=url, sentinel=True, sentinels=tuple(sentinels), service=path[0], db=db,
                       username=username, password=password, tls=tls, sentinel_kwargs=sentinel_kwargs,
                       tls_kwargs=tls_kwargs, **own)


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


# --------------------------------------------------------------------------- connections


class SelectExplained(AbstractConnection):
    """A connection whose refused ``SELECT`` (a db the server does not have: it keeps ``databases``
    of them, 16 by default) is a :class:`ConfigurationError` naming the URL, not a ResponseError."""

    url_where = "the Redis URL"

    def on_connect_check_health(self, check_health: bool = True) -> None:
        try:
            super().on_connect_check_health(check_health=check_health)
        except redis.AuthenticationError as exc:
            # A server with a password refuses HELLO, the handshake's first command, with a message about
            # HELLO's own options: say what is wrong, as Redis says it to any other first command.
            if not str(exc).startswith("HELLO must be called with the client already authenticated"):
                raise
            self.disconnect()  # type: ignore[no-untyped-call]
            raise redis.AuthenticationError(
                f"Authentication required: the server asks for a password and {self.url_where!r} gives none "
                "(put it in the URL, redis://[user]:password@host, or in the file $MCQ_REDIS_PASSWORD_FILE "
                "names)") from None
        except redis.ResponseError as exc:
            if "DB index" not in str(exc):
                raise
            self.disconnect()  # type: ignore[no-untyped-call]
            raise ConfigurationError(
                f"bad Redis URL {self.url_where!r}: db {self.db} does not exist on that server (Redis said: {exc}); "
                "it has as many as its `databases` setting says (CONFIG GET databases, 16 by default): use one of "
                "those (mc_queue keeps namespaces apart by --prefix, so db 0 does)") from None


_EXPLAINED: dict[tuple[type[Any], str], type[Any]] = {}


def _explained(base: type[Any], where: str) -> type[Any]:
    """``base`` with :class:`SelectExplained` in front, its messages naming ``where`` (one class per pair)."""
    key = (base, where)
    if key not in _EXPLAINED:
        if len(_EXPLAINED) > 256:
            _EXPLAINED.clear()
        mixed = base if issubclass(base, SelectExplained) else type(base.__name__, (SelectExplained, base), {})
        _EXPLAINED[key] = type(mixed.__name__, (mixed,), {"url_where": where})
    return _EXPLAINED[key]


# redis-py's own "no timeout given" marker (SentinelManagedConnection.read_response's default).
_READ_TIMEOUT_DEFAULT: Any = inspect.signature(SentinelManagedConnection.read_response).parameters["timeout"].default


class FollowingConnection(SelectExplained, SentinelManagedConnection):
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

    def read_response(self, disable_decoding: Any = False, *, timeout: float | object = _READ_TIMEOUT_DEFAULT,
                      disconnect_on_error: bool | None = True, push_request: bool | None = False) -> Any:
        """As a plain Connection does: a read that fails (a timeout, a signal interrupting a blocking
        BLPOP) disconnects, so the unread reply is not left for the next command on this connection.
        redis-py's SentinelManagedConnection keeps it (disconnect_on_error=False; redis/redis-py#4292):
        RQ's stop of an idle worker then waited out the BLPOP (~15 s) and read the stale reply as its
        pipeline's ("Wrong number of response items from pipeline execution")."""
        base: Any = super()  # typed differently across redis-py releases
        return base.read_response(disable_decoding, timeout=timeout, disconnect_on_error=disconnect_on_error,
                                  push_request=push_request)

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self._sock and not self._resolving and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    """:class:`FollowingConnection` over TLS."""


_DIRECT_CONNECTIONS: dict[str, type[Any]] = {
    "redis": Connection, "rediss": SSLConnection, "unix": UnixDomainSocketConnection}


def make_redis(target: RedisTarget | str, *, redis_class: type[redis.Redis] = redis.Redis,
               **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``target``'s primary; ``kwargs`` go to every connection it opens (timeouts,
    ``decode_responses``, ``retry`` ...). With a sentinel URL the connections ask the sentinels where the
    primary is whenever they (re)connect, so the client follows a failover."""
    t = parse_url(target) if isinstance(target, str) else target
    if not t.sentinel:
        if t.password_from_file:
            kwargs.setdefault("password", t.password)
        if redis_class.__init__ is redis.Redis.__init__:  # not a client that brings its own connections (fakeredis)
            base = _DIRECT_CONNECTIONS[t.redis_url.partition("://")[0]]
            kwargs.setdefault("connection_class", _explained(base, t.where))
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
    kwargs.setdefault("connection_class",
                      _explained(FollowingSSLConnection if t.tls else FollowingConnection, t.where))
    # (called through Any: redis-py's Sentinel is untyped before 8.2 and typed from it)
    make_sentinel: Any = Sentinel
    manager: Any = make_sentinel(list(t.sentinels), sentinel_kwargs=sentinel_kwargs)
    primary: redis.Redis = manager.master_for(t.service, redis_class=redis_class, db=t.db, username=t.username,
                                              password=t.password, **tls_kwargs, **kwargs)
    return primary

"""Who may use the console, and how a form proves it came from the console's own page.

- **The token, always.** Every request needs the console's token, given once as ``?token=...`` (it
  moves into an HttpOnly cookie and leaves the address bar) or as ``Authorization: Bearer ...`` on
  every request, wherever it comes from: a proxy on this machine (nginx's ``proxy_pass
  http://127.0.0.1:9465;``) relays anyone's request from 127.0.0.1, naming 127.0.0.1, and adds no
  header saying so, so a loopback peer proves nothing. The console prints an address that carries
  the token (Jupyter's rule).
- **Trusting loopback, when the operator says so** (``trust_loopback``, ``mcq dashboard
  --trust-loopback``): then a *local* request needs nothing more. Local: its peer address is a
  loopback address (127.0.0.0/8 or ::1, also as an IPv4-mapped IPv6 address), it carries no
  forwarding header (``Forwarded``, ``X-Forwarded-For``, ``X-Real-IP``, ``X-Forwarded-Host``) and its
  ``Host`` header names this machine (``localhost``, a 127.x address or ``[::1]``: a page of another
  site whose name was rebound to 127.0.0.1 sends its own name there). Only for a machine where no
  proxy forwards to the console and every local user may act on the queue. uvicorn runs with
  ``proxy_headers=False``, so the peer address is the TCP peer's, never a header's.
- **CSRF.** Every form carries a hidden ``csrf`` field, ``<nonce>.<HMAC(secret, nonce)>``, and the
  page sets the nonce in a SameSite=Strict cookie; a POST is refused unless the field's signature
  is the console's and its nonce is the cookie's, and unless its ``Origin`` (when sent) is the host
  it was sent to. The secret lives in the console's process: a restart refuses old forms.
- **Read-only.** With ``read_only`` every POST is refused and the pages show no form.
- **Redirects stay here.** Every redirect's target is :func:`local_path`: a path of this site.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip", "x-forwarded-host")
TOKEN_COOKIE = "mcq_token"
CSRF_COOKIE = "mcq_csrf"
FLASH_COOKIE = "mcq_flash"
MIN_TOKEN_CHARS = 16


def is_loopback_address(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and their IPv4-mapped forms; False for anything else (names included)."""
    if not host:
        return False
    try:
        addr = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def host_name(host_header: str) -> str:
    """The host of a ``Host`` header without its port: ``[::1]:9465`` -> ``::1``, ``localhost:80`` -> ``localhost``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def is_loopback_host_header(host_header: str | None) -> bool:
    """The ``Host`` header names this machine: ``localhost`` or a loopback address (any port)."""
    if not host_header:
        return False
    name = host_name(host_header)
    return name == "localhost" or is_loopback_address(name)


def local_path(path: str) -> str:
    """``path`` as a target of this site only: one leading ``/`` (never ``//`` or ``/\\``, which a
    browser takes for another host), backslashes read as the browser reads them (``/``), runs of
    slashes made one, everything else percent-encoded (no CR/LF, no space reaches a header)."""
    cleaned = re.sub(r"/{2,}", "/", "/" + path.replace("\\", "/"))
    return quote(cleaned, safe="/!$&'()*+,;=:@-._~")


@dataclass
class Guard:
    """The console's access rules (module docstring). ``token``: from ``MCQ_DASHBOARD_TOKEN``, else
    generated. ``trust_loopback``: a local request needs no token (the operator's explicit choice)."""

    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    read_only: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    trust_loopback: bool = False

    def __post_init__(self) -> None:
        if len(self.token) < MIN_TOKEN_CHARS:
            raise ValueError(f"the console's token must have at least {MIN_TOKEN_CHARS} characters "
                             f"(MCQ_DASHBOARD_TOKEN has {len(self.token)})")

    # ------------------------------------------------------------------ who

    @staticmethod
    def is_local(peer: str | None, headers: dict[str, str]) -> bool:
        """A loopback peer, no forwarding header, and a Host header naming this machine."""
        if not is_loopback_address(peer):
            return False
        if any(h in headers for h in FORWARDING_HEADERS):
            return False
        return is_loopback_host_header(headers.get("host"))

    def trusted(self, peer: str | None, headers: dict[str, str]) -> bool:
        """A request that needs no token: only a local one, and only with ``trust_loopback``."""
        return self.trust_loopback and self.is_local(peer, headers)

    def token_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(str(presented).encode(), self.token.encode())

    def presented_token(self, headers: dict[str, str], cookies: dict[str, str], query: dict[str, str]) -> str | None:
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return query.get("token") or cookies.get(TOKEN_COOKIE)

    # ------------------------------------------------------------------ CSRF

    def _sign(self, text: str) -> str:
        mac = hmac.new(self.secret, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(18)

    def csrf_field(self, nonce: str) -> str:
        """The hidden field's value for the page whose CSRF cookie is ``nonce``."""
        return f"{nonce}.{self._sign('csrf:' + nonce)}"

    def csrf_ok(self, field_value: str | None, cookie_nonce: str | None) -> bool:
        if not field_value or not cookie_nonce or "." not in field_value:
            return False
        nonce, _, mac = field_value.partition(".")
        return (hmac.compare_digest(nonce.encode(), cookie_nonce.encode())
                and hmac.compare_digest(mac.encode(), self._sign("csrf:" + nonce).encode()))

    @staticmethod
    def origin_ok(headers: dict[str, str]) -> bool:
        """A POST's ``Origin`` (browsers send it with every form POST) names the host it was sent to."""
        origin = headers.get("origin")
        if origin is None:
            return True  # not a browser's cross-site form (those send Origin): the CSRF token still decides
        if origin == "null":
            return False
        return urlsplit(origin).netloc.lower() == headers.get("host", "").lower()

    # ------------------------------------------------------------------ flash messages

    def flash_value(self, kind: str, message: str) -> str:
        body = base64.urlsafe_b64encode(json.dumps([kind, message[:2000]]).encode()).decode()
        return f"{body}.{self._sign('flash:' + body)}"

    def read_flash(self, value: str | None) -> tuple[str, str] | None:
        if not value or "." not in value:
            return None
        body, _, mac = value.partition(".")
        if not hmac.compare_digest(mac.encode(), self._sign("flash:" + body).encode()):
            return None
        try:
            kind, message = json.loads(base64.urlsafe_b64decode(body.encode()))
        except (ValueError, TypeError):
            return None
        return str(kind), str(message)


def cookie_kwargs() -> dict[str, Any]:
    """Every cookie of the console: HttpOnly, SameSite=Strict, the whole site."""
    return {"httponly": True, "samesite": "strict", "path": "/"}

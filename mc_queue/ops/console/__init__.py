"""The operator console: ``mcq dashboard``, a web app over the same Client and indexes as the CLI.

It sits on top of the package (it imports the client, the records, the renderers and the worker
registry reader; nothing below imports it). :func:`create_app` builds the ASGI app; :func:`start`
binds a socket and serves it (in this thread, or in a background thread for ``mcq demo``).
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from ...client import Client
from ...contracts.errors import ConfigurationError
from .app import create_app
from .security import MIN_TOKEN_CHARS, is_loopback_address

__all__ = ["DEFAULT_PORT", "Running", "create_app", "serve_forever", "start"]

DEFAULT_PORT = 9465


@dataclass
class Running:
    """A console being served: its address, its token, and how to stop it. ``token_url`` is the
    address to print and open: every request needs the token (unless ``trust_loopback``), and this
    one carries it (it moves into a cookie and leaves the address bar)."""

    url: str
    token: str
    token_from_env: bool
    loopback_only: bool
    server: Any
    sock: socket.socket
    thread: threading.Thread | None = None
    trust_loopback: bool = False

    @property
    def token_url(self) -> str:
        return f"{self.url}?token={self.token}"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (its sampler with it); a background console's thread is waited for, and forced
        to end when a connection still holds it after ``timeout``."""
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                self.server.force_exit = True
                self.thread.join(timeout)


def bind(host: str, port: int, *, fallback: bool = False) -> socket.socket:
    """A listening socket on (host, port); with ``fallback``, any free port when that one is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        if not fallback:
            sock.close()
            raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        sock.bind((host, 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def start(client: Client, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, read_only: bool = False,
          background: bool = False, fallback_port: bool = False, token: str | None = None,
          trust_loopback: bool = False, **app_options: Any) -> Running:
    """Serve the console of ``client``'s namespace. ``background``: in a daemon thread (returns at once;
    ``Running.stop()`` ends it); else serve it in this thread with :func:`serve_forever`.
    The token is ``token``, else ``MCQ_DASHBOARD_TOKEN``, else a new random one; every request needs it
    but, with ``trust_loopback`` (``mcq dashboard --trust-loopback``), a local one. ``app_options`` go
    to :func:`create_app` (``poll_ms``, ``sample_interval_s``, ``sampling``)."""
    import uvicorn

    env_token = os.environ.get("MCQ_DASHBOARD_TOKEN") or None
    chosen = token or env_token
    if chosen is not None and len(chosen) < MIN_TOKEN_CHARS:
        raise ConfigurationError(f"MCQ_DASHBOARD_TOKEN must have at least {MIN_TOKEN_CHARS} characters")
    app = create_app(client, read_only=read_only, token=chosen, trust_loopback=trust_loopback, **app_options)
    sock = bind(host, port, fallback=fallback_port)
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", access_log=False, proxy_headers=False, lifespan="on",
                            server_header=False, date_header=False)
    server = uvicorn.Server(config)
    running = Running(url=f"http://{shown}:{bound_port}/", token=app.state.console.guard.token,
                      token_from_env=chosen is not None and token is None,
                      loopback_only=is_loopback_address(str(sock.getsockname()[0])), server=server, sock=sock,
                      trust_loopback=trust_loopback)
    if background:
        running.thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="mcq-console",
                                          daemon=True)
        running.thread.start()
    return running


def serve_forever(running: Running) -> None:
    """Serve a console made by ``start(background=False)`` in this thread until Ctrl-C or SIGTERM."""
    running.server.run(sockets=[running.sock])

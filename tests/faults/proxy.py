"""A small TCP proxy between a client and redis-server that can drop responses.

``DropProxy`` listens on a free loopback port and forwards every connection to the upstream Redis.
``drop_responses(n, match=b"EVALSHA")`` arms it: the next ``n`` requests whose bytes contain
``match`` are forwarded to Redis as usual, but when Redis answers, the proxy closes the client's
connection (and its upstream one) instead of relaying the reply. Redis ran the command; the client
sees only a closed connection: "accepted, then the reply was lost".

Only requests that contain ``match`` arm a drop, so the handshake a client sends on reconnect
(``CLIENT SETINFO``, ``AUTH``, ...) is never dropped by accident. The proxy also counts the
requests it forwarded that contained ``match``.

Threads, blocking sockets: one accept thread, two pump threads per connection. Deterministic as
long as the client has at most one request in flight on a connection (as redis-py does without a
pipeline).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field


@dataclass
class _Conn:
    client: socket.socket
    upstream: socket.socket
    drop_pending: bool = False
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass


class DropProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed = 0
        self._match = b"EVALSHA"
        self._conns: list[_Conn] = []
        self._stopped = threading.Event()
        self.connections = 0  # connections accepted
        self.matched_requests = 0  # forwarded requests containing the match bytes
        self.dropped_responses = 0  # replies swallowed (connection closed instead)
        self._thread = threading.Thread(target=self._accept_loop, name="drop-proxy-accept", daemon=True)

    # ------------------------------------------------------------------ control

    def start(self) -> DropProxy:
        self._thread.start()
        return self

    def url(self, scheme: str = "redis", auth: str = "") -> str:
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def drop_responses(self, n: int = 1, match: bytes = b"EVALSHA") -> None:
        """Swallow the replies to the next ``n`` requests that contain ``match`` (case-insensitive)."""
        with self._lock:
            self._armed = n
            self._match = match.upper()

    @property
    def armed(self) -> int:
        with self._lock:
            return self._armed

    def close(self) -> None:
        self._stopped.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> DropProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ pumps

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, upstream)
            with self._lock:
                self._conns.append(conn)
                self.connections += 1
            threading.Thread(target=self._client_to_server, args=(conn,), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(conn,), daemon=True).start()

    def _client_to_server(self, conn: _Conn) -> None:
        try:
            while True:
                data = conn.client.recv(65536)
                if not data:
                    break
                with self._lock:
                    if self._match in data.upper():
                        self.matched_requests += 1
                        if self._armed > 0:
                            self._armed -= 1
                            conn.drop_pending = True  # set before Redis can possibly answer
                conn.upstream.sendall(data)
        except OSError:
            pass
        conn.close()

    def _server_to_client(self, conn: _Conn) -> None:
        try:
            while True:
                data = conn.upstream.recv(65536)
                if not data:
                    break
                if conn.drop_pending:
                    with self._lock:
                        self.dropped_responses += 1
                    break  # Redis answered; the client never hears it
                conn.client.sendall(data)
        except OSError:
            pass
        conn.close()

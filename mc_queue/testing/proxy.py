"""A TCP proxy in front of a redis-server that delays, holds back, drops and cuts what flows through it.

One proxy for every link fault the tests and the benchmarks inject: a slow link (``delay_s``), a
replication link that lags (``pause()`` / ``resume()``, ``hold_only``), a reply lost after Redis ran
the command (``drop_responses()``), and a link that goes away (``cut()``).

Threads, blocking sockets: one accept thread, two pump threads per connection. A drop is
deterministic as long as the client has at most one request in flight on a connection (as redis-py
does without a pipeline).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Conn:
    client: socket.socket
    upstream: socket.socket
    held: bool  # pause() applies to it (always, unless hold_only picks the connections)
    drop_pending: bool = False  # the next reply from upstream is swallowed
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> bool:
        """Close both sockets (shutdown first: it wakes the pump blocked on the other); False if already closed."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        return True


class TcpProxy:
    """A TCP proxy on a free loopback port in front of ``upstream`` (host, port); ``url`` is its
    ``redis://`` URL. Each fault is off until asked for:

    - ``delay_s``: seconds every chunk waits before it is relayed, both ways (a slow link; set it to
      0 to end the delay);
    - ``pause()`` stops relaying in both directions (what arrives meanwhile waits in the proxy and the
      kernel's buffers), ``resume()`` relays it. ``hold_only``: pause only the connections whose client
      sent these bytes (``b"REPLCONF"``: the replication link), and let every other connection through
      the same port flow. Put on a replica's replication link, it makes replication lag on demand;
    - ``drop_responses(n, match)``: the next ``n`` requests that contain ``match`` are relayed to Redis,
      but when Redis answers the proxy closes the connection instead of relaying the reply: "accepted,
      then the reply was lost". Only such requests arm a drop, so the handshake a client sends on
      reconnect (``CLIENT SETINFO``, ``AUTH``, ...) is never dropped by accident;
    - ``cut(refuse_s)`` closes every connection now, throws away whatever was not relayed yet (after
      killing a primary: the bytes a lagging replica missed are lost), and refuses new connections for
      ``refuse_s`` seconds. ``heal()`` ends a delay and a refusal at once.

    Counters: ``connections`` accepted and connected upstream, ``refused`` (during a cut, or with
    upstream down), ``closed_by_cut``, ``matched_requests`` (relayed requests containing the match
    bytes), ``dropped_responses``, ``relayed`` (bytes from upstream to the clients).
    """

    def __init__(self, upstream: tuple[str, int], *, hold_only: bytes | None = None) -> None:
        self.upstream = upstream
        self.hold_only = hold_only.upper() if hold_only else None
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self.delay_s = 0.0
        self._refuse_until = 0.0
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._conns: set[_Conn] = set()
        self._armed = 0
        self._match = b"EVALSHA"
        self._closed = False
        self.connections = 0
        self.refused = 0
        self.closed_by_cut = 0
        self.matched_requests = 0
        self.dropped_responses = 0
        self.relayed = 0
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ faults

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    @property
    def paused(self) -> bool:
        return not self._flowing.is_set()

    def drop_responses(self, n: int = 1, match: bytes = b"EVALSHA") -> None:
        """Swallow the replies to the next ``n`` requests that contain ``match`` (case-insensitive)."""
        with self._lock:
            self._armed = n
            self._match = match.upper()

    @property
    def armed(self) -> int:
        """Drops asked for with drop_responses that no request has armed yet."""
        with self._lock:
            return self._armed

    def cut(self, refuse_s: float = 0.0) -> None:
        """Close every connection now (nothing held back is relayed); refuse new ones for ``refuse_s``."""
        with self._lock:
            if refuse_s:
                self._refuse_until = time.monotonic() + refuse_s
        self.closed_by_cut += self._close_all()

    def heal(self) -> None:
        """End the delay and a cut's refusal now."""
        self.delay_s = 0.0
        with self._lock:
            self._refuse_until = 0.0

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_all()
        self._flowing.set()  # held pumps wake up, find their connection closed, and end
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _close_all(self) -> int:
        with self._lock:
            conns, self._conns = self._conns, set()
        return sum(c.close() for c in conns)

    # ------------------------------------------------------------------ pumps

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                # Closed (the proxy is closing), or one connection that failed before it was accepted
                # (ECONNABORTED: a client killed mid-handshake; EMFILE for a moment): the proxy goes on, or
                # every later client would connect into the backlog and wait for an answer that never comes.
                if self._closed:
                    return
                time.sleep(0.01)
                continue
            with self._lock:
                refusing = time.monotonic() < self._refuse_until
            upstream = None
            if not refusing:
                try:
                    upstream = socket.create_connection(self.upstream, timeout=5)
                    upstream.settimeout(None)
                except OSError:  # Redis is down or restarting
                    pass
            if upstream is None:
                with self._lock:
                    self.refused += 1
                with contextlib.suppress(OSError):
                    client.close()
                continue
            conn = _Conn(client, upstream, held=self.hold_only is None)
            try:
                for s in (client, upstream):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # the client went away already
                conn.close()
                continue
            with self._lock:
                self._conns.add(conn)
                self.connections += 1
            threading.Thread(target=self._pump, args=(conn, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(conn, True), daemon=True).start()

    def _pump(self, conn: _Conn, downstream: bool) -> None:
        src, dst = (conn.upstream, conn.client) if downstream else (conn.client, conn.upstream)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not conn.held and not downstream and self.hold_only and self.hold_only in data.upper():
                    conn.held = True
                if conn.held:
                    self._flowing.wait()
                if conn.closed:
                    break  # cut while held back: thrown away
                if self.delay_s:
                    time.sleep(self.delay_s)
                if downstream and conn.drop_pending:
                    with self._lock:
                        self.dropped_responses += 1
                    break  # Redis answered; the client never hears it
                if not downstream:
                    self._match_request(conn, data)
                dst.sendall(data)
                if downstream:
                    with self._lock:
                        self.relayed += len(data)
        except OSError:
            pass
        conn.close()
        with self._lock:
            self._conns.discard(conn)

    def _match_request(self, conn: _Conn, data: bytes) -> None:
        with self._lock:
            if self._match in data.upper():
                self.matched_requests += 1
                if self._armed > 0:
                    self._armed -= 1
                    conn.drop_pending = True  # set before Redis can possibly answer

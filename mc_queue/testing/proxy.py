"""A TCP proxy in front of a redis-server that holds back, and cuts, what flows through it."""

from __future__ import annotations

import contextlib
import socket


class PausableProxy:
    """A TCP proxy on a free loopback port in front of ``upstream`` (host, port) that can hold back
    what flows through it: ``pause()`` stops relaying in both directions (what arrives meanwhile waits
    in the proxy and the kernel's buffers), ``resume()`` relays it, ``cut()`` closes every connection
    and throws away whatever was not relayed yet. Put on a replica's replication link, it makes
    replication lag on demand, and ``cut()`` after killing the primary makes the lagging bytes lost.

    ``hold_only``: pause only the connections whose client sent these bytes (``b"REPLCONF"``: the
    replication link), and let every other connection through the same port flow."""

    def __init__(self, upstream: tuple[str, int], *, hold_only: bytes | None = None) -> None:
        import threading

        self.upstream = upstream
        self.hold_only = hold_only.upper() if hold_only else None
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._generation = 0  # bumped by cut(): a pump of an older generation never relays again
        self._closed = False
        self.relayed = 0  # bytes relayed from upstream to the client
        self._thread = threading.Thread(target=self._accept, name="pausable-proxy", daemon=True)

    def start(self) -> PausableProxy:
        self._thread.start()
        return self

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    @property
    def paused(self) -> bool:
        return not self._flowing.is_set()

    def cut(self) -> None:
        """Close every connection now; nothing held back is relayed."""
        with self._lock:
            self._generation += 1
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()
        self._flowing.set()

    def _accept(self) -> None:
        import threading

        while not self._closed:
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
            with self._lock:
                gen = self._generation
                self._socks += [client, upstream]
            held = [self.hold_only is None]  # shared by the connection's two pumps
            threading.Thread(target=self._pump, args=(client, upstream, gen, False, held), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, gen, True, held), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gen: int, downstream: bool, held: list[bool]) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not held[0] and not downstream and self.hold_only and self.hold_only in data.upper():
                    held[0] = True
                if held[0]:
                    self._flowing.wait()
                if gen != self._generation:
                    break  # cut while held back: thrown away
                dst.sendall(data)
                if downstream:
                    self.relayed += len(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.close()

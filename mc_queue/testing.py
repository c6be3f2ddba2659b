"""Helpers for testing code built on mc_queue against a real redis-server.

``RedisServer`` runs a private redis-server on a free loopback port with its data in a folder of
its own; it can be stopped, killed and restarted with or without its data, which is what fault
tests need. It never touches the machine's shared Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from .embedded import find_redis_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process owned by a test session."""

    def __init__(self, directory: str | os.PathLike[str], *, port: int | None = None, appendonly: bool = True,
                 appendfsync: str = "always", extra: list[str] | None = None, password: str | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra = list(extra or [])
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        args = [
            find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
            "--save", "", "--daemonize", "no", "--logfile", str(self.dir / "redis.log"),
            "--enable-debug-command", "local",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra

    def start(self, timeout: float = 15.0) -> RedisServer:
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.dir / 'redis.log'}")
            try:
                c = self.client()
                c.ping()
                # Wait until the AOF (if any) is loaded.
                while c.info("persistence").get("loading"):
                    time.sleep(0.02)
                c.close()
                return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start within {timeout}s")

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, decode_responses=True, **kw)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self, *, keep_data: bool = True, sig: int = signal.SIGKILL) -> RedisServer:
        """Stop (SIGKILL by default) and start again on the same port and folder.

        ``keep_data=False`` wipes the folder first: Redis comes back empty, as after a restart
        without persistence or a lost disk.
        """
        self.stop(sig)
        if not keep_data:
            for child in self.dir.iterdir():
                if child.name != "redis.log":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        return self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(signal.SIGKILL)


def unique_prefix(stem: str = "t") -> str:
    """A namespace prefix no other test uses: tests share a server, never FLUSHALL it."""
    return f"{stem}-{uuid.uuid4().hex[:10]}"


class TransitionRecorder:
    """Watches every script a Client runs (``client.runner.observers``) and records each change of a
    Task's or an Attempt's state it makes, as (entity, from, to, script); ``violations`` lists the
    changes :mod:`mc_queue.states` does not allow. Reads through its own connection, around each call.
    """

    def __init__(self, client: Any) -> None:
        self.redis = redis.Redis.from_url(client.url, decode_responses=True)
        self.seen: list[tuple[str, str, str, str]] = []
        self.violations: list[tuple[str, str, str, str]] = []
        client.runner.observers.append(self)

    def _read(self, task: str, attempts: str) -> tuple[str, dict[str, str]]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(task, "state")
        pipe.hgetall(attempts)
        state, att = pipe.execute()
        return state or "", {k.split(".", 1)[0]: v for k, v in att.items() if k.endswith(".state")}

    def before(self, name: str, keys: Any, argv: Any) -> Any:
        task, attempts = keys.get("task"), keys.get("attempts")
        if not task or not attempts:
            return None
        return name, task, attempts, self._read(task, attempts)

    def after(self, token: Any, reply: Any) -> None:
        if token is None:
            return
        from .states import allowed

        name, task, attempts, (t0, a0) = token
        t1, a1 = self._read(task, attempts)
        changes = [("task", t0, t1, name)] if t0 != t1 else []
        changes += [("attempt", a0.get(n, ""), a1.get(n, ""), name) for n in sorted(set(a0) | set(a1))
                    if a0.get(n) != a1.get(n)]
        for entity, src, dst, script in changes:
            self.seen.append((entity, src, dst, script))
            if not allowed("task" if entity == "task" else "attempt", src, dst, script):
                self.violations.append((entity, src, dst, script))

    def close(self) -> None:
        self.redis.close()


class ForgeServer:
    """A real local HTTP pull-request API (the protocol of ``mc_queue.providers.http``), for tests
    and the demo: it counts what it did per operation key, and injects the faults that matter.

    - ``honor_idempotency=False`` (default) ignores the ``Idempotency-Key`` header, like many real
      APIs: only mc_queue's reconciliation (a lookup by key) then stands between a retry and a
      duplicate pull request, which is what the tests must prove.
    - ``one_pr_per_head=True`` refuses (422) a second pull request for the same repository and head
      branch, as GitHub does: the provider-side fence against a zombie worker's late call.
    - ``enforce_fence=True`` refuses (409) a creation whose ``Mcq-Fence`` header is lower than a fence
      already seen for the same ``Idempotency-Key``: Kleppmann's fencing token checked at the storage,
      which closes the zombie's window even without a uniqueness rule. ``fenced_out`` counts them.
    - ``stall_next(n, seconds)``: the next n creations are committed, then the response is held
      for ``seconds`` (the client times out after the provider accepted: "accepted, then timed out").
    - ``fail_next(n, status, retry_after)``: the next n creations are refused with that status.
    - ``lookups_unavailable(n)``: the next n lookups answer 503 (the reconciler cannot tell).
    """

    def __init__(self, *, honor_idempotency: bool = False, one_pr_per_head: bool = False,
                 enforce_fence: bool = False) -> None:
        import threading
        from http.server import ThreadingHTTPServer

        self.honor_idempotency = honor_idempotency
        self.one_pr_per_head = one_pr_per_head
        self.enforce_fence = enforce_fence
        self.fences: dict[str, int] = {}  # idempotency key -> highest Mcq-Fence seen
        self.fenced_out = 0  # creations refused for a stale fence
        self.pulls: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._stall: list[float] = []
        self._fail: list[tuple[int, float | None]] = []
        self._lookup_fail = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="forge", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> ForgeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ForgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def stalls_left(self) -> int:
        """Stalls asked for with stall_next that no creation has served yet."""
        with self.lock:
            return len(self._stall)

    def stall_next(self, n: int = 1, seconds: float = 3.0) -> None:
        with self.lock:
            self._stall.extend([seconds] * n)

    def fail_next(self, n: int = 1, status: int = 503, retry_after: float | None = None) -> None:
        with self.lock:
            self._fail.extend([(status, retry_after)] * n)

    def lookups_unavailable(self, n: int = 1) -> None:
        with self.lock:
            self._lookup_fail += n

    def count_by_key(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for p in self.pulls:
                out[p["idempotency_key"]] = out.get(p["idempotency_key"], 0) + 1
            return out

    def duplicates(self) -> dict[str, int]:
        return {k: v for k, v in self.count_by_key().items() if v > 1}

    def _handler(self) -> Any:
        import json as _json
        from http.server import BaseHTTPRequestHandler
        from urllib.parse import parse_qs, urlparse

        forge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = _json.dumps(body).encode()
                try:
                    self.send_response(status)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timed out) after we accepted

            def do_POST(self) -> None:
                parts = urlparse(self.path).path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "repos" or parts[3] != "pulls":
                    return self._send(404, {"error": "not found"})
                body = _json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                key = self.headers.get("Idempotency-Key", "")
                fence_header = self.headers.get("Mcq-Fence", "")
                with forge.lock:
                    if forge.enforce_fence and key and fence_header.isdigit():
                        fence, seen = int(fence_header), forge.fences.get(key, 0)
                        if fence < seen:
                            forge.fenced_out += 1
                            return self._send(409, {"error": f"stale fence {fence}: fence {seen} already wrote "
                                                             f"with this key"})
                        forge.fences[key] = fence
                    if forge._fail:
                        status, retry_after = forge._fail.pop(0)
                        hdr = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                        return self._send(status, {"error": "injected failure"}, hdr)
                    if forge.honor_idempotency and key:
                        for p in forge.pulls:
                            if p["idempotency_key"] == key:
                                return self._send(200, p)
                    repo = f"{parts[1]}/{parts[2]}"
                    if forge.one_pr_per_head and any(p["repo"] == repo and p["head"] == body.get("head")
                                                     for p in forge.pulls):
                        return self._send(422, {"error": f"a pull request already exists for {body.get('head')}"})
                    pr = {"number": len(forge.pulls) + 1, "repo": f"{parts[1]}/{parts[2]}", "head": body.get("head"),
                          "base": body.get("base"), "title": body.get("title"), "body": body.get("body", ""),
                          "idempotency_key": key}
                    pr["url"] = f"{forge.url}/repos/{pr['repo']}/pulls/{pr['number']}"
                    forge.pulls.append(pr)
                    stall = forge._stall.pop(0) if forge._stall else 0.0
                if stall:
                    time.sleep(stall)
                return self._send(201, pr)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path != "/pulls":
                    return self._send(404, {"error": "not found"})
                key = parse_qs(url.query).get("idempotency_key", [""])[0]
                with forge.lock:
                    if forge._lookup_fail:
                        forge._lookup_fail -= 1
                        return self._send(503, {"error": "lookup unavailable"})
                    found = [p for p in forge.pulls
                             if p["idempotency_key"] == key or f"Mcq-Operation-Key: {key}" in p["body"]]
                if not found:
                    return self._send(404, {"error": "no pull request with that key"})
                return self._send(200, found[0])

        return Handler


def bare_git_remote(root: str | os.PathLike[str], *, branch: str = "main") -> Path:
    """A bare git repository under ``root`` whose ``branch`` holds one initial commit: a real remote
    for the git provider in tests and the demo."""
    from .providers.git import git

    base = Path(root)
    remote = base / "remote.git"
    git("init", "--quiet", "--bare", f"--initial-branch={branch}", str(remote))
    seed = base / "seed"
    git("init", "--quiet", f"--initial-branch={branch}", str(seed))
    (seed / "README.md").write_text("# example/app\n")
    git("add", "README.md", cwd=seed)
    git("-c", "user.name=mc_queue", "-c", "user.email=mc_queue@localhost", "commit", "--quiet", "-m", "initial",
        cwd=seed)
    git("push", "--quiet", str(remote), branch, cwd=seed)
    shutil.rmtree(seed)
    return remote

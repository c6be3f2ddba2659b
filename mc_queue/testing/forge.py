"""A real local HTTP pull-request API with fault injection, and bare git remotes: the providers the
tests and the demo run effects against."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any


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
      which closes the zombie's window even without a uniqueness rule; and one whose ``Mcq-Writer: <key>=
      <fence>`` is lower than a writer fence already seen for that concurrency key (a writer lease another
      Attempt took over since, whatever its task). ``fenced_out`` counts them.
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
        self.writers: dict[str, int] = {}  # concurrency key -> highest Mcq-Writer fence seen
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
                    wkey, _, wfence = self.headers.get("Mcq-Writer", "").rpartition("=")
                    if forge.enforce_fence and wkey and wfence.isdigit():
                        seen = forge.writers.get(wkey, 0)
                        if int(wfence) < seen:
                            forge.fenced_out += 1
                            return self._send(409, {"error": f"stale writer fence {wfence} of {wkey}: writer "
                                                             f"{seen} already wrote"})
                        forge.writers[wkey] = int(wfence)
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
    from ..providers.git import git

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

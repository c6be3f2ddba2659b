"""The console behind a real nginx on the same host, configured as its documentation's first example
(``proxy_pass http://127.0.0.1:PORT;``, nothing else): nginx sets ``Host`` to the upstream and adds no
``X-Forwarded-For``, so every request it relays arrives from 127.0.0.1 naming 127.0.0.1. Such a request
must need the token like any other (issue 15); the operator who wants the old rule says so with
``trust_loopback``. nginx is Debian's (``apt-get install nginx``), run here as a foreground process with
its own prefix, config, pid and log files, never the system's service."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mc_queue.contracts.models import TaskState
from mc_queue.ops.console import Running, start
from mc_queue.testing import free_port

from .conftest import REASON, Story, quarantine

TOKEN = "proxy-test-token-0123456789abcdef"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)

pytestmark = pytest.mark.skipif(NGINX is None, reason="no nginx binary (on PATH or /usr/sbin/nginx): "
                                "apt-get install nginx (./run test installs it where it can)")

CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
        }}
    }}
}}
"""


class Nginx:
    """nginx in front of ``upstream`` (a port on 127.0.0.1), on a free port of its own."""

    def __init__(self, directory: Path, upstream: int) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.conf = self.dir / "nginx.conf"
        self.conf.write_text(CONF.format(d=self.dir, port=self.port, upstream=upstream))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> Nginx:
        assert NGINX is not None
        args = [NGINX, "-p", str(self.dir), "-c", str(self.conf), "-e", str(self.dir / "error.log")]
        check = subprocess.run([*args, "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(self.url + "healthz", timeout=1)
                return self
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    log = (self.dir / "error.log").read_text(errors="replace")[-2000:]
                    raise AssertionError(f"nginx exited: {log}") from None
                assert time.monotonic() < deadline, "nginx did not answer within 10 s"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM to this nginx's own master (its pid, not a name)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def console(story: Story) -> Iterator[Running]:
    running = start(story.client, host="127.0.0.1", port=0, background=True, token=TOKEN, sampling=False)
    yield running
    running.stop()


@pytest.fixture
def proxy(console: Running, tmp_path: Path) -> Iterator[Nginx]:
    upstream = int(console.url.rstrip("/").rsplit(":", 1)[1])
    nginx = Nginx(tmp_path / "nginx", upstream).start()
    yield nginx
    nginx.stop()


def _csrf_form(client: httpx.Client, url: str) -> str:
    page = client.get(url)
    assert page.status_code == 200, page.text[:300]
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert m, "no CSRF field on the page"
    return m.group(1)


def test_same_host_proxy_needs_the_token(story: Story, console: Running, proxy: Nginx) -> None:
    q = story.client
    victim = quarantine(q, "behind-nginx")
    before = q.reads.task_record(victim)
    # nginx relays as 127.0.0.1 and names 127.0.0.1 (the upstream): nothing tells the console who asked
    with httpx.Client(base_url=proxy.url, timeout=10) as anyone:
        for path in ("/", "/tasks", f"/tasks/{victim}", "/dlq", "/attention", "/limits", "/static/console.js"):
            r = anyone.get(path)
            assert r.status_code == 401, (path, r.status_code)
            assert "needs its token" in r.text and q.keys.prefix not in r.text
        # a scripted replay (no page, no cookie, no token): refused before anything is read or written
        r = anyone.post("/actions/replay", data={"task_id": victim, "reason": REASON, "page": "task", "csrf": "x.y"})
        assert r.status_code == 401
        r = anyone.post("/actions/purge", data={"task_id": victim, "reason": REASON, "page": "dlq", "confirm": "yes",
                                                 "csrf": "x.y"})
        assert r.status_code == 401
    assert q.reads.task_record(victim) == before  # nothing changed in Redis
    assert victim in dict(q.reads.dlq())
    assert q.reads.get_task(victim).state is TaskState.QUARANTINED
    # with the token (once in the address: an HttpOnly cookie from then on) the same request goes through
    with httpx.Client(base_url=proxy.url, timeout=10) as operator:
        r = operator.get(f"/tasks/{victim}", params={"token": TOKEN}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"/tasks/{victim}"
        csrf = _csrf_form(operator, f"/tasks/{victim}")
        r = operator.post("/actions/replay", data={"task_id": victim, "reason": REASON, "page": "task", "csrf": csrf},
                          follow_redirects=True)
        assert r.status_code == 200 and f"{victim}/2 created (pending)" in r.text
    assert q.reads.get_task(victim).state is TaskState.PENDING
    # and with Authorization: Bearer
    q.caps.set_bytes("behind-nginx", 10_000, reason="the Limits page through the proxy shows it")
    q.fairness.set_weight("tenant:nginx", 3, reason="the Limits page through the proxy shows it")
    with httpx.Client(base_url=proxy.url, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"}) as script:
        assert script.get("/dlq").status_code == 200
        limits = script.get("/limits")  # the reliability controls, as an operator reads them through the proxy
        assert limits.status_code == 200 and "tenant:nginx" in limits.text, limits.text[:300]
        assert "of 10,000" in limits.text.split("<b>behind-nginx</b>")[1].split("</tr>")[0]


def test_the_console_on_loopback_needs_the_token_too(story: Story, console: Running) -> None:
    """Not only through a proxy: the console cannot tell a proxy's request from a browser's, so a
    request straight to 127.0.0.1 needs the token as well (Jupyter's rule); the address the console
    prints carries it."""
    with httpx.Client(base_url=console.url, timeout=10) as c:
        assert c.get("/").status_code == 401
        r = c.get(console.token_url.removeprefix(console.url.rstrip("/")), follow_redirects=True)
        assert r.status_code == 200 and "Namespace" in r.text and "token=" not in str(r.url)
        assert c.get("/tasks").status_code == 200  # the cookie from then on


def test_trust_loopback_is_the_operators_explicit_choice(story: Story, tmp_path: Path) -> None:
    running = start(story.client, host="127.0.0.1", port=0, background=True, token=TOKEN, sampling=False,
                    trust_loopback=True)
    try:
        with httpx.Client(base_url=running.url, timeout=10) as c:
            assert c.get("/").status_code == 200  # a loopback peer naming this machine: the old local rule
            assert c.get("/", headers={"X-Forwarded-For": "203.0.113.7"}).status_code == 401  # a proxy saying so
            assert c.get("/", headers={"Host": "evil.example"}).status_code == 401  # DNS rebinding
    finally:
        running.stop()

"""Every redirect of the console stays on the console: its ``Location`` is a path of this site (one
``/``, never ``//`` or ``/\\``, no scheme, no host), whatever the request's path held. Sent as raw
bytes to the real server (uvicorn), as an attacker's link would arrive."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from mc_queue.ops.console import Running, start
from mc_queue.ops.console.app import local_path

from .conftest import Story

TOKEN = "redirect-test-token-0123456789abc"


@pytest.fixture(scope="module")
def console(story: Story) -> Iterator[Running]:
    running = start(story.client, host="127.0.0.1", port=0, background=True, token=TOKEN, sampling=False)
    yield running
    running.stop()


def raw_get(running: Running, target: str) -> tuple[int, dict[str, str], list[str]]:
    """GET ``target`` exactly as written (no client normalises it); the status, the headers and the
    header lines as sent."""
    host, port = running.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode("latin-1"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
    return int(head[0].split()[1]), headers, head[1:]


def is_local(location: str) -> bool:
    return location.startswith("/") and not location.startswith(("//", "/\\")) and "://" not in location \
        and "\r" not in location and "\n" not in location


@pytest.mark.parametrize("target", [
    f"//attacker.example/x?token={TOKEN}",
    f"///attacker.example/x?token={TOKEN}",
    f"/\\attacker.example/x?token={TOKEN}",
    f"//\\attacker.example?token={TOKEN}",
    f"/%2F%2Fattacker.example/x?token={TOKEN}",
    f"/%5Cattacker.example/x?token={TOKEN}",
    f"/%0D%0ASet-Cookie:%20x=1?token={TOKEN}",
])
def test_open_redirect_the_token_s_redirect_stays_on_the_console(console: Running, target: str) -> None:
    status, headers, lines = raw_get(console, target)
    assert status == 303, (target, status)
    assert is_local(headers["location"]), (target, headers["location"])
    assert not [line for line in lines if line.lower().startswith("set-cookie: x=")], lines  # no header injected


def test_the_token_s_redirect_keeps_a_normal_address(console: Running, story: Story) -> None:
    status, headers, _ = raw_get(console, f"/tasks?token={TOKEN}&state=running&queue=agents")
    assert status == 303 and headers["location"] == "/tasks?state=running&queue=agents"
    assert "mcq_token=" in headers["set-cookie"] and "httponly" in headers["set-cookie"].lower()
    tid = story.quarantined[0]
    status, headers, _ = raw_get(console, f"/tasks/{tid}?token={TOKEN}")
    assert status == 303 and headers["location"] == f"/tasks/{tid}"
    status, headers, _ = raw_get(console, f"/?token={TOKEN}")
    assert status == 303 and headers["location"] == "/"


def test_local_path_of_anything_is_a_path_of_this_site() -> None:
    for path, want in (("/", "/"), ("", "/"), ("/tasks", "/tasks"), ("//evil.example/x", "/evil.example/x"),
                       ("/\\evil.example", "/evil.example"), ("\\\\evil", "/evil"),
                       ("https://evil.example/", "/https:/evil.example/"), ("/a b", "/a%20b"),
                       ("/x\r\nSet-Cookie: a=1", "/x%0D%0ASet-Cookie:%20a=1")):
        got = local_path(path)
        assert got == want, (path, got)
        assert is_local(got)

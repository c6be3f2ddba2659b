"""mc_queue against a Redis that wants a password, an ACL user, or TLS (each a private redis-server)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

import mc_queue
from mc_queue.store.scripts import RESENDS as _RESENDS
from mc_queue.testing import RedisServer, free_port


def _cycle(q: mc_queue.Client, queue: str = "sec") -> mc_queue.Task:
    """enqueue -> claim -> renew -> complete, and read it back."""
    t = q.producer.enqueue(queue, "noop", {"secure": True})
    lease = q.leases.claim_attempt(t.id, "w1", lease_ms=30_000)
    assert lease.fence == 1
    q.leases.renew_lease(lease.attempt_id, lease.fence, worker_id="w1")
    done = q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    assert done.state == mc_queue.AttemptState.SUCCEEDED
    task = q.reads.get_task(t.id)
    assert task.state == mc_queue.TaskState.SUCCEEDED and task.result == {"ok": True}
    with pytest.raises(mc_queue.StaleFence):
        q.leases.complete_attempt(lease.attempt_id, lease.fence - 1 if lease.fence > 1 else 0, {"x": 1})
    return task


def _auth_errors(r: redis.Redis) -> int:
    """Authentication errors the server has replied (INFO errorstats: WRONGPASS, NOAUTH)."""
    stats = r.info("errorstats")
    return sum(int(stats.get(f"errorstat_{code}", {}).get("count", 0)) for code in ("WRONGPASS", "NOAUTH"))


# --------------------------------------------------------------------------- requirepass


@pytest.fixture
def pw_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "pw", password="s3cret-pw") as server:
        yield server


def test_requirepass_url_with_password_works(pw_server: RedisServer, prefix: str) -> None:
    assert pw_server.url.startswith("redis://:s3cret-pw@")
    with mc_queue.connect(pw_server.url, prefix=prefix) as q:
        _cycle(q)
        assert q.reads.namespace().state == "ok"


@pytest.mark.parametrize("auth", [":wrong@", ""], ids=["wrong-password", "no-password"])
def test_requirepass_bad_or_missing_password_is_an_authentication_error(
    pw_server: RedisServer, prefix: str, auth: str
) -> None:
    url = f"redis://{auth}127.0.0.1:{pw_server.port}/0"
    admin = pw_server.client()
    before = _auth_errors(admin)
    with mc_queue.connect(url, prefix=prefix) as q, pytest.raises(redis.AuthenticationError) as exc:
        q.producer.enqueue("sec", "noop", {"n": 1})
    msg = str(exc.value).lower()
    assert ("invalid username-password pair" in msg) if auth else ("authentication required" in msg), msg
    refused = _auth_errors(admin) - before
    # mc_queue resends on ConnectionError, and redis-py's AuthenticationError is one: bounded, but > 1.
    assert 1 <= refused <= _RESENDS + 1
    print(f"\n{auth or 'no password'}: the server refused authentication {refused} time(s) for one enqueue")
    # Nothing reached the data: no namespace was created.
    assert admin.keys(f"{{{prefix}}}:*") == []
    admin.close()


# --------------------------------------------------------------------------- ACL users


class AclServer(RedisServer):
    """A redis-server whose default user is off; the harness logs in as ``login``."""

    def __init__(self, directory: Path, users: list[list[str]], login: tuple[str, str]) -> None:
        extra: list[str] = []
        for user in users:
            extra += ["--user", *user]
        extra += ["--user", "default", "off"]
        super().__init__(directory, extra=extra)
        self.login = login

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, username=self.login[0], password=self.login[1],
                           decode_responses=True, **kw)

    def url_for(self, user: str, password: str) -> str:
        return f"redis://{quote(user)}:{quote(password)}@127.0.0.1:{self.port}/0"


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[AclServer]:
    users = [
        ["alice", "on", ">secret", "~*", "&*", "+@all"],
        # bob may touch only the keys of namespace "bobns": every key mc_queue uses carries its tag.
        ["bob", "on", ">bobpw", "~{bobns}:*", "+@all"],
    ]
    with AclServer(tmp_path / "acl", users, ("alice", "secret")) as server:
        yield server


def test_acl_user_in_url_works(acl_server: AclServer, prefix: str) -> None:
    with mc_queue.connect(acl_server.url_for("alice", "secret"), prefix=prefix) as q:
        _cycle(q)
        assert q.redis.acl_whoami() == "alice"
        assert q.writer.acl_whoami() == "alice"  # the transition connection logs in as the same user


def test_acl_user_limited_to_its_namespace_keys(acl_server: AclServer) -> None:
    """Every key a script touches is passed in KEYS under the namespace's tag: a key-pattern ACL works."""
    with mc_queue.connect(acl_server.url_for("bob", "bobpw"), prefix="bobns") as q:
        _cycle(q)
    with mc_queue.connect(acl_server.url_for("bob", "bobpw"), prefix="otherns") as q, \
            pytest.raises(redis.exceptions.NoPermissionError):
        q.producer.enqueue("sec", "noop", {"n": 1})
    admin = acl_server.client()
    assert admin.keys("{otherns}:*") == []
    assert admin.keys("{bobns}:*")
    admin.close()


@pytest.mark.parametrize(("user", "password", "expect"), [
    ("alice", "wrong", "invalid username-password pair"),
    ("mallory", "secret", "invalid username-password pair"),
    ("", "", "authentication required"),  # the default user is off
])
def test_acl_bad_login_is_an_authentication_error(
    acl_server: AclServer, prefix: str, user: str, password: str, expect: str
) -> None:
    url = acl_server.url_for(user, password) if user else f"redis://127.0.0.1:{acl_server.port}/0"
    with mc_queue.connect(url, prefix=prefix) as q, pytest.raises(redis.AuthenticationError) as exc:
        q.leases.claim_attempt("sec:01M8P4Z1V4M4C3EETVHRYEMV6K", "w1")
    assert expect in str(exc.value).lower(), str(exc.value)


# --------------------------------------------------------------------------- TLS


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"openssl {' '.join(args)}: {out.stderr}"


def _make_certs(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=mcq test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                  "extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=mcq test {name}",
                 cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return {n: d / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


class TlsServer(RedisServer):
    """redis-server with no plain TCP port (--port 0), TLS on ``tls_port``."""

    def __init__(self, directory: Path, certs: dict[str, Path], *, auth_clients: bool) -> None:
        super().__init__(directory)
        self.certs = certs
        self.auth_clients = auth_clients
        self.tls_port = free_port()

    def args(self) -> list[str]:
        args = super().args()
        i = args.index("--port")
        args[i + 1] = "0"
        return [
            *args,
            "--tls-port", str(self.tls_port),
            "--tls-cert-file", str(self.certs["server.crt"]),
            "--tls-key-file", str(self.certs["server.key"]),
            "--tls-ca-cert-file", str(self.certs["ca.crt"]),
            "--tls-auth-clients", "yes" if self.auth_clients else "no",
        ]

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.tls_port, ssl=True, ssl_ca_certs=str(self.certs["ca.crt"]),
                           ssl_certfile=str(self.certs["client.crt"]), ssl_keyfile=str(self.certs["client.key"]),
                           decode_responses=True, **kw)

    def tls_url(self, **query: Path | str) -> str:
        q = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items())
        return f"rediss://127.0.0.1:{self.tls_port}/0" + (f"?{q}" if q else "")


def _start_tls(server: TlsServer) -> TlsServer:
    try:
        return server.start()
    except RuntimeError:
        log = (server.dir / "redis.log").read_text() if (server.dir / "redis.log").exists() else ""
        server.stop()
        low = log.lower()
        if "tls" in low and ("bad directive" in low or "not supported" in low or "failed finding tls support" in low):
            pytest.skip(f"this redis-server was built without TLS support: {log.strip().splitlines()[-1]}")
        raise


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_server(tmp_path: Path, certs: dict[str, Path]) -> Iterator[TlsServer]:
    server = _start_tls(TlsServer(tmp_path / "tls", certs, auth_clients=False))
    yield server
    server.stop()


@pytest.fixture
def mtls_server(tmp_path: Path, certs: dict[str, Path]) -> Iterator[TlsServer]:
    server = _start_tls(TlsServer(tmp_path / "mtls", certs, auth_clients=True))
    yield server
    server.stop()


def test_tls_claim_and_complete(tls_server: TlsServer, certs: dict[str, Path], prefix: str) -> None:
    url = tls_server.tls_url(ssl_ca_certs=certs["ca.crt"], ssl_cert_reqs="required")
    with mc_queue.connect(url, prefix=prefix) as q:
        _cycle(q)
        for conn_pool in (q.redis.connection_pool, q.writer.connection_pool):
            assert issubclass(conn_pool.connection_class, redis.SSLConnection)  # one that explains a bad db
    admin = tls_server.client()
    assert admin.config_get("port")["port"] == "0"  # no plaintext listener at all
    admin.close()


def test_tls_without_the_ca_or_in_plaintext_fails(tls_server: TlsServer, prefix: str) -> None:
    t0 = time.monotonic()
    with mc_queue.connect(tls_server.tls_url(), prefix=prefix, socket_timeout=3) as q, \
            pytest.raises(redis.ConnectionError, match=r"(?i)certificate verify failed"):
        q.producer.enqueue("sec", "noop", {"n": 1})
    plain = f"redis://127.0.0.1:{tls_server.tls_port}/0"
    with mc_queue.connect(plain, prefix=prefix, socket_timeout=3) as q, pytest.raises(redis.ConnectionError):
        q.producer.enqueue("sec", "noop", {"n": 1})
    assert time.monotonic() - t0 < 30


def test_mutual_tls_client_certificate(mtls_server: TlsServer, certs: dict[str, Path], prefix: str) -> None:
    url = mtls_server.tls_url(ssl_ca_certs=certs["ca.crt"], ssl_certfile=certs["client.crt"],
                              ssl_keyfile=certs["client.key"])
    with mc_queue.connect(url, prefix=prefix) as q:
        _cycle(q)
    no_cert = mtls_server.tls_url(ssl_ca_certs=certs["ca.crt"])
    with mc_queue.connect(no_cert, prefix=prefix, socket_timeout=3) as q, pytest.raises(redis.ConnectionError):
        q.producer.enqueue("sec", "noop", {"n": 1})


# --------------------------------------------------------------------------- issue 15: the password in a file


def test_the_password_comes_from_a_file_never_a_command_line_or_a_url(acl_server: AclServer, prefix: str,
                                                                      tmp_path: Path) -> None:
    """Issue 15 (compose): the password sat on redis-server's command line and in every container's URL.
    `MCQ_REDIS_PASSWORD_FILE` names a secret file; the URL names the user only. Through the CLI, a
    worker (RQ's connections too) and the Client."""
    import os
    import subprocess
    import sys

    secret = tmp_path / "redis_password"
    secret.write_text("secret\n")  # as `echo secret > file` writes it: one trailing newline is dropped
    url = f"redis://alice@127.0.0.1:{acl_server.port}/0"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}, "MCQ_REDIS_PASSWORD_FILE": str(secret),
           "MCQ_HOME": str(tmp_path / "home")}
    repo = Path(__file__).resolve().parents[2]

    def mcq(*args: str, with_url: str = url) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", with_url, "--prefix", prefix, *args],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=60)

    out = mcq("enqueue", "h", "--app", "tests.apps.cli_app:app", "--payload", "{}")
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip().splitlines()[0]
    worker = mcq("worker", "--app", "tests.apps.cli_app:app", "--burst", "--kind", "simple")
    assert worker.returncode == 0, worker.stderr[-2000:]
    shown = mcq("show", task_id, "--json")
    assert shown.returncode == 0 and '"succeeded"' in shown.stdout, shown.stderr
    # A password in the URL and in the file: refused, said so, nothing written.
    both = mcq("status", with_url=f"redis://alice:secret@127.0.0.1:{acl_server.port}/0")
    assert both.returncode == 2 and "MCQ_REDIS_PASSWORD_FILE is set" in both.stderr and "secret" not in both.stderr
    secret.write_text("")
    empty = mcq("status")
    assert empty.returncode == 2 and "one line" in empty.stderr, empty.stderr

"""workers/example.py against a real bare git repository and a real local HTTP provider, run by a
real worker process; and the docker-compose.yml that deploys it: its secrets made by ops/make-secrets.sh,
its redis-server command with that ACL file, its mcq commands as the image's entrypoint (mcq) runs them and its
health checks, run here in the compose start order against a redis-server started with that command."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

import mc_queue
from mc_queue.providers.git import TRAILER, git
from mc_queue.testing import ForgeServer, RedisServer, bare_git_remote, find_redis_server, free_port
from tests.apps import lifecycle_app

ROOT = Path(__file__).resolve().parents[2]


def test_example_app_commits_pushes_and_opens_one_pr_per_task(
        redis_server: RedisServer, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = bare_git_remote(tmp_path)
    with ForgeServer(enforce_fence=True) as forge:
        env = {**os.environ, "MCQ_GIT_REMOTE": str(remote), "MCQ_FORGE_URL": forge.url,
               "MCQ_HOME": str(tmp_path / "home")}
        monkeypatch.setenv("MCQ_GIT_REMOTE", str(remote))
        monkeypatch.setenv("MCQ_FORGE_URL", forge.url)
        from workers.example import app

        ac = app.connect(redis_server.url, prefix=prefix)
        tasks = [ac.enqueue("fix-issue", {"repository": "example/app", "issue": i, "instruction": f"fix {i}"})
                 for i in (1, 2, 3)]
        again = ac.enqueue("fix-issue", {"repository": "example/app", "issue": 1, "instruction": "fix 1"},
                           idempotency_key="issue-1")
        ac.enqueue("fix-issue", {"repository": "example/app", "issue": 1, "instruction": "fix 1"},
                   idempotency_key="issue-1")
        out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", prefix,
                              "worker", "--app", "workers.example:app", "--burst", "--kind", "fork"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        deadline = time.monotonic() + 30
        for t in [*tasks, again]:
            while ac.client.reads.get_task(t.id).state.value != "succeeded":
                assert time.monotonic() < deadline, mc_queue.ops.render.task_json(ac.client.reads.get_task(t.id))
                time.sleep(0.1)
        assert forge.duplicates() == {} and len(forge.pulls) == 4
        for t in tasks:
            done = ac.client.reads.get_task(t.id)
            branch = done.result["branch"]
            log = git("log", "--format=%B", f"refs/heads/{branch}", cwd=remote)
            push_key = next(k for k in ac.client.reads.effects(t.id) if k.startswith("push:"))
            assert log.count(f"{TRAILER}: {push_key}") == 1
            assert git("rev-parse", f"refs/heads/{branch}", cwd=remote).strip() == done.result["sha"]
            phases = [e.fields["phase"] for e in done.events if e.type == "checkpoint_recorded"]
            assert phases == ["workspace_prepared", "commit_done", "result_pending"]
        ac.close()


# ------------------------------------------------------------------ docker-compose.yml

_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``, ``$VAR`` and
    ``$$`` as docker compose substitutes them, in every string of a parsed compose file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4) or ""
        have = env.get(name)
        missing = have is None or (have == "" and op is not None and op.startswith(":"))
        if op in ("?", ":?") and missing:
            raise LookupError(f"required variable {name} is missing a value: {arg}")
        if op in ("-", ":-") and missing:
            return arg
        return have or ""

    return _VAR.sub(one, value)


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def seconds(duration: str) -> float:
    """A compose duration ("45s", "1m30s") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def test_docker_compose_pins_what_it_runs_and_has_no_default_password() -> None:
    raw = load_compose()
    services = raw["services"]
    assert set(services) == {"redis", "worker", "sweeper", "metrics"}
    assert services["metrics"]["ports"] == ["127.0.0.1:9464:9464"]
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text
    example = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert not any("PASSWORD" in k for k in example)  # no password in .env: it is a secret file
    compose = interpolate(raw, {})
    services = compose["services"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11\.\d+-slim-\w+$", dockerfile, re.M)
    assert "COPY lua" in dockerfile and "COPY workers" in dockerfile
    assert 'ENTRYPOINT ["mcq"]' in dockerfile
    assert os.access(ROOT / "ops" / "make-secrets.sh", os.X_OK)
    for name, svc in services.items():
        assert svc["restart"] == "unless-stopped", name
        assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name

    cmd = services["redis"]["command"]
    assert cmd[0] == "redis-server" and all(" " not in arg for arg in cmd)
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    assert cmd[cmd.index("--appendfsync") + 1] == "always"
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction"

    # The example's git remote is on a volume in every process that pushes or reconciles pushes.
    remote_dir = str(Path(services["worker"]["environment"]["MCQ_GIT_REMOTE"]).parent)
    for name in ("worker", "sweeper"):
        assert f"git-remote:{remote_dir}" in services[name]["volumes"], name
    assert "git-remote" in compose["volumes"]
    assert f"mkdir -p {remote_dir} && chown mcq {remote_dir}" in dockerfile  # a new volume takes this owner

    # mc_queue relies on RQ internals: the pin admits the installed RQ and no next minor release.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    rq_req = next(Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "rq")
    installed = Version(importlib.metadata.version("rq"))
    assert installed in rq_req.specifier
    assert Version(f"{installed.major}.{installed.minor + 1}") not in rq_req.specifier

    from click.testing import CliRunner

    from mc_queue.cli import main
    from mc_queue.cli.options import load_app

    for name in ("worker", "sweeper", "metrics"):
        cmd = services[name]["command"]
        assert CliRunner().invoke(main, [*cmd[:1], "--help"]).exit_code == 0
        if "--app" not in cmd:
            continue
        cwd = os.getcwd()
        try:
            os.chdir(ROOT)  # the image's WORKDIR holds workers/
            assert load_app(cmd[cmd.index("--app") + 1]).handlers
        finally:
            os.chdir(cwd)


# Redis 7.2 releases that fixed CVEs a user allowed to run Lua scripts (as mc_queue's user must) could use:
# 7.2.6 CVE-2024-31449 (Lua bit library stack overflow), 7.2.7 CVE-2024-46981 (Lua GC use-after-free),
# 7.2.11 CVE-2025-49844 (Lua parser use-after-free, remote code execution), CVE-2025-46817 (unpack integer
# overflow), CVE-2025-46818 (a script running in another user's context), CVE-2025-46819 (out-of-bound
# read); 7.2.12 (Nov 2025, urgency HIGH: a HyperLogLog overflow crash) is the newest 7.2 patch the
# release notes (redis/redis 7.2/00-RELEASENOTES) list.
REDIS_7_2_FLOOR = Version("7.2.12")


def test_compose_pins_a_redis_7_2_with_the_lua_cve_fixes() -> None:
    image = load_compose()["services"]["redis"]["image"]
    m = re.fullmatch(r"redis:(\d+\.\d+\.\d+)", image)
    assert m, f"{image}: pin an exact release"
    version = Version(m.group(1))
    assert version.release[:2] == (7, 2) and version >= REDIS_7_2_FLOOR, image


def test_compose_keeps_the_redis_password_off_command_lines_and_environments(tmp_path: Path) -> None:
    """The password was on redis-server's command line (visible in `ps`, /proc/<pid>/cmdline, `docker
    inspect`) and in every container's MCQ_REDIS_URL. Now it is a secret file: redis reads the mcq user
    (the password's SHA-256) from its ACL file, the mcq containers read the password from their secret."""
    secrets = make_secrets(tmp_path)
    password = (secrets / "mcq_redis_password").read_text().strip()
    raw = load_compose()
    compose = interpolate(raw, {"MCQ_SECRETS_DIR": str(secrets)})
    text = json.dumps(compose)
    assert password not in text and password not in (secrets / "redis_users.acl").read_text()
    assert "MCQ_REDIS_PASSWORD" not in re.sub(r"MCQ_REDIS_PASSWORD_FILE", "", (ROOT / "docker-compose.yml").read_text())
    files = {name: Path(spec["file"]) for name, spec in compose["secrets"].items()}
    assert files == {"mcq_redis_password": secrets / "mcq_redis_password",
                     "redis_users_acl": secrets / "redis_users.acl"}
    services = compose["services"]
    assert services["redis"]["secrets"] == ["redis_users_acl", "mcq_redis_password"]
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--aclfile") + 1] == "/run/secrets/redis_users_acl"
    assert "--user" not in redis_cmd and "--requirepass" not in redis_cmd
    assert "environment" not in services["redis"]
    for name in ("worker", "sweeper", "metrics"):
        env = services[name]["environment"]
        assert services[name]["secrets"] == ["mcq_redis_password"], name
        assert env["MCQ_REDIS_URL"] == "redis://mcq@redis:6379/0", name  # the user, no password
        assert env["MCQ_REDIS_PASSWORD_FILE"] == "/run/secrets/mcq_redis_password", name
    # mcq refuses a password file it cannot use, with exit 2 and a sentence, and no traceback.
    bad = tmp_path / "bad"
    bad.write_text("two\nlines\n")
    for extra, why in (({"MCQ_REDIS_PASSWORD_FILE": str(tmp_path / "none")}, "is not a file"),
                       ({"MCQ_REDIS_PASSWORD_FILE": str(bad)}, "on one line"),
                       ({"MCQ_REDIS_URL": "redis://mcq:other@redis:6379/0"}, "has a password too")):
        env = {**os.environ, "MCQ_REDIS_URL": "redis://mcq@redis:6379/0",
               "MCQ_REDIS_PASSWORD_FILE": str(secrets / "mcq_redis_password"), **extra}
        out = subprocess.run([sys.executable, "-m", "mc_queue", "namespace"], env=env, capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 2 and why in out.stderr and "Traceback" not in out.stderr, (extra, out)
        assert "other" not in out.stderr


# ------------------------------------------------------------------ the compose command lines, run here

OBSERVER = ("observer", "pw-" + uuid.uuid4().hex)  # a test-only admin user, to read ACL LOG


def make_secrets(tmp: Path) -> Path:
    """What the operator runs once: ops/make-secrets.sh."""
    out = subprocess.run(["sh", str(ROOT / "ops" / "make-secrets.sh"), "mcq", str(tmp / "secrets")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return tmp / "secrets"


class Deployment:
    """docker-compose.yml's services as this machine runs them: the files of the compose secrets where the
    containers see /run/secrets, redis-server started with the redis service's exact argv (only --port,
    --bind, --dir, --logfile added; its ACL file gets a test-only observer user appended, to read ACL LOG),
    the mcq services' commands through the image's entrypoint with their environment, `mcq` being this
    venv's. The mcq user's ACL line is the one ops/make-secrets.sh wrote, unchanged."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.secrets = make_secrets(tmp)
        compose = interpolate(load_compose(), {"MCQ_SECRETS_DIR": str(self.secrets)})
        self.services: dict[str, Any] = compose["services"]
        self.run_secrets = tmp / "run-secrets"
        self.run_secrets.mkdir()
        for name, spec in compose["secrets"].items():
            shutil.copy(spec["file"], self.run_secrets / name)
        (self.run_secrets / "redis_users_acl").write_text(
            (self.run_secrets / "redis_users_acl").read_text() + f"user {OBSERVER[0]} on >{OBSERVER[1]} ~* &* +@all\n")
        self.password = (self.secrets / "mcq_redis_password").read_text().strip()
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.remote = bare_git_remote(tmp)
        self.forge = ForgeServer().start()

    def local(self, value: Any) -> Any:
        """A service's path as this machine has it."""
        if isinstance(value, list):
            return [self.local(v) for v in value]
        if isinstance(value, str):
            return value.replace("/run/secrets/", f"{self.run_secrets}/")
        return value

    def start_redis(self) -> redis.Redis:
        argv = self.local(list(self.services["redis"]["command"]))
        assert argv[0] == "redis-server"
        argv[0] = find_redis_server()
        data = self.tmp / "redis"
        data.mkdir()
        argv += ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(data), "--logfile", str(data / "log")]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        observer = redis.Redis(host="127.0.0.1", port=self.port, username=OBSERVER[0], password=OBSERVER[1],
                               decode_responses=True)

        def up() -> bool:
            assert proc.poll() is None, (data / "log").read_text()[-2000:]
            try:
                return bool(observer.ping())
            except redis.ConnectionError:
                return False

        _wait("redis-server answers", up, 15)
        return observer

    def env_of(self, name: str) -> dict[str, str]:
        env = {k: self.local(v) for k, v in self.services[name]["environment"].items()}
        assert env["MCQ_REDIS_URL"] == "redis://mcq@redis:6379/0"
        env["MCQ_REDIS_URL"] = f"redis://mcq@127.0.0.1:{self.port}/0"
        assert env["MCQ_GIT_REMOTE"] == "/data/remote.git"  # on the git-remote volume in the containers
        env["MCQ_GIT_REMOTE"] = str(self.remote)
        env["MCQ_FORGE_URL"] = self.forge.url
        env["MCQ_HOME"] = str(self.tmp / f"home-{name}")
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
        inherited["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # mcq
        return {**inherited, **env}

    def command(self, name: str, *extra: str) -> list[str]:
        """The service's command as the image's entrypoint runs it (`mcq`, this venv's)."""
        return ["mcq", *self.services[name]["command"], *extra]

    def run(self, name: str, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=ROOT, env=self.env_of(name), capture_output=True, text=True, timeout=timeout)

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env_of(name), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def health(self, name: str) -> subprocess.CompletedProcess[str]:
        test = self.local(self.services[name]["healthcheck"]["test"])
        if test[0] == "CMD-SHELL":  # in the container it runs on 6379; here -p points it at this server
            shell = test[1].replace("redis-cli ", f"redis-cli -p {self.port} ", 1)
            redis_cli = Path(find_redis_server()).with_name("redis-cli")
            path = f"{redis_cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"
            return subprocess.run(["sh", "-c", shell], env={"PATH": path}, capture_output=True, text=True, timeout=30)
        assert test[0] == "CMD", test
        argv = [sys.executable, *test[2:]] if test[1] == "python" else test[1:]
        return self.run(name, argv, 30)

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(15)
        self.forge.stop()


def _replace_option(cmd: list[str], option: str, value: str) -> list[str]:
    out = list(cmd)
    out[out.index(option) + 1] = value
    return out


def _wait(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)


def test_docker_compose_commands_run_against_its_redis_in_the_compose_start_order(tmp_path: Path) -> None:
    """redis-server with the redis service's argv and the ACL file ops/make-secrets.sh wrote; once its
    health check passes, the worker pool, the sweeper and the metrics endpoint start together (as
    `docker compose up` starts them, before any producer ran); then a producer enqueues through the
    image's entrypoint; the task succeeds, every health check passes, and Redis denied the mcq user
    nothing (ACL LOG) while everything outside its keys and commands is refused."""
    d = Deployment(tmp_path)
    try:
        observer = d.start_redis()
        mcq_user = redis.Redis(host="127.0.0.1", port=d.port, username="mcq", password=d.password,
                               decode_responses=True)
        assert mcq_user.ping()
        for kw in ({}, {"username": "default", "password": d.password}, {"password": d.password}):
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(host="127.0.0.1", port=d.port, **kw).ping()  # type: ignore[arg-type]
        config = {k: observer.config_get(k)[k] for k in ("maxmemory-policy", "appendfsync", "appendonly", "save",
                                                           "hash-max-listpack-value", "stream-node-max-bytes")}
        assert config == {"maxmemory-policy": "noeviction", "appendfsync": "always", "appendonly": "yes",
                          "save": "", "hash-max-listpack-value": "1024", "stream-node-max-bytes": "1024"}
        assert "off" in observer.acl_getuser("default")["flags"]
        assert d.health("redis").returncode == 0
        (d.run_secrets / "mcq_redis_password").write_text("wrong\n")
        assert d.health("redis").returncode == 1  # a wrong password is not healthy
        (d.run_secrets / "mcq_redis_password").write_text(d.password + "\n")
        observer.acl_log_reset()  # the refused logins above

        # compose starts these three together once redis is healthy
        pool = d.start("worker", d.command("worker"))
        sweeper = d.start("sweeper", d.command("sweeper"))
        mport = free_port()
        metrics_cmd = _replace_option(_replace_option(d.services["metrics"]["command"], "--host", "127.0.0.1"),
                                      "--port", str(mport))
        metrics = d.start("metrics", ["mcq", *metrics_cmd])
        _wait("the worker's health check", lambda: d.health("worker").returncode == 0, 60)
        out = d.health("sweeper")
        assert out.returncode == 0 and re.search(r": (missing|ok) \(", out.stdout), out  # usable, not lost

        out = d.run("worker", ["mcq", "enqueue", "fix-issue", "--app", "workers.example:app", "--payload",
                               json.dumps({"repository": "example/app", "issue": 1})])
        assert out.returncode == 0, out.stderr
        task_id = out.stdout.strip().split()[-1]
        client = mc_queue.connect(f"redis://mcq:{d.password}@127.0.0.1:{d.port}/0")
        try:
            _wait("the task succeeds", lambda: client.reads.get_task(task_id).state.value == "succeeded", 90)
        finally:
            client.close()
        assert len(d.forge.pulls) == 1
        out = d.health("sweeper")
        assert out.returncode == 0 and ": ok (" in out.stdout, out

        mcheck = d.services["metrics"]["healthcheck"]["test"]
        mtest = [arg.replace("127.0.0.1:9464", f"127.0.0.1:{mport}") for arg in mcheck]
        assert mtest != mcheck
        _wait("the metrics health check",
              lambda: subprocess.run([sys.executable, *mtest[2:]], capture_output=True, timeout=30).returncode == 0)
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as resp:
            body = resp.read().decode()
        assert "mcq_namespace_ok 1.0" in body and 'mcq_tasks{queue="agents",state="succeeded"} 1.0' in body
        assert "mcq_redis_memory_used_bytes" in body  # INFO is allowed

        pool.send_signal(signal.SIGTERM)  # as docker-init forwards `docker compose stop`: to the pool only
        assert pool.wait(30) == 0
        assert d.health("worker").returncode == 1
        for p in (sweeper, metrics):
            p.terminate()
            p.wait(30)

        denied = observer.acl_log()
        assert denied == [], denied  # nothing the mcq user's processes did was refused
        # ... and what the mcq user must not do is refused: keys outside the namespace and RQ, dangerous commands
        for call in (lambda: mcq_user.set("elsewhere:key", "x"), lambda: mcq_user.get("{other}:meta"),
                     mcq_user.flushall, mcq_user.flushdb, lambda: mcq_user.config_get("*"), lambda: mcq_user.keys("*"),
                     lambda: mcq_user.acl_setuser("mcq", enabled=True), mcq_user.shutdown, mcq_user.client_list):
            with pytest.raises(redis.exceptions.NoPermissionError):
                call()  # type: ignore[no-untyped-call]
    finally:
        d.close()


def test_compose_stop_grace_period_covers_the_grace_of_a_busy_pool(tmp_path: Path) -> None:
    """`stop_grace_period: 45s` against `--grace 30` was too short for a pool (57 s were seen). A pool worker
    waiting on its work horse sees a stop signal only when it wakes up: when a second signal arrives with
    the first (a process group signalled, as Ctrl-C does), up to its job-monitoring interval later (RQ's 30 s;
    mc_queue's workers wake every JOB_MONITORING_INTERVAL_S).
    docker must wait the grace, that, and the few seconds a worker takes to end. Measured here with the
    worker service's command (its pool and kind; --grace 2 and an app whose handler runs long), every
    worker busy: SIGTERM to the pool alone, as docker-init forwards it, and to its whole process group."""
    from mc_queue.worker.runner import JOB_MONITORING_INTERVAL_S

    d = Deployment(tmp_path)
    try:
        d.start_redis()
        service = d.services["worker"]
        cmd = service["command"]
        grace = float(cmd[cmd.index("--grace") + 1])
        margin = seconds(service["stop_grace_period"]) - grace
        exit_s = 10.0  # killing the work horses, deregistering, on a loaded host
        assert margin >= JOB_MONITORING_INTERVAL_S + exit_s, (service["stop_grace_period"], grace)

        url = f"redis://mcq:{d.password}@127.0.0.1:{d.port}/0"
        producer = lifecycle_app.app.connect(url)
        size = int(cmd[cmd.index("--pool") + 1])
        test_cmd = _replace_option(_replace_option(cmd, "--grace", "2"), "--app", "tests.apps.lifecycle_app:app")
        for how in ("pool", "group"):
            pool = subprocess.Popen(["mcq", *test_cmd], cwd=ROOT, env=d.env_of("worker"),
                                    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            d.procs.append(pool)
            tasks = [producer.enqueue("sleeps", {"seconds": 120}) for _ in range(size)]
            _wait("every pool worker busy", lambda: all(
                producer.client.reads.get_task(t.id).state.value == "running" for t in tasks), 60)  # noqa: B023
            started = time.monotonic()
            if how == "pool":
                pool.send_signal(signal.SIGTERM)
            else:
                os.killpg(pool.pid, signal.SIGTERM)
            pool.wait(grace + margin + 30)
            took = time.monotonic() - started
            assert took - 2 <= margin, f"{how}: stopped {took:.1f} s after SIGTERM with --grace 2"
        producer.close()
    finally:
        d.close()

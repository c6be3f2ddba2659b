"""workers/example.py against a real bare git repository and a real local HTTP provider, run by a
real worker process; and the docker-compose.yml that deploys it: its redis-server command, its mcq
commands and its health checks run here against a redis-server started with that exact command."""

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
            while ac.client.get_task(t.id).state.value != "succeeded":
                assert time.monotonic() < deadline, mc_queue.render.task_json(ac.client.get_task(t.id))
                time.sleep(0.1)
        assert forge.duplicates() == {} and len(forge.pulls) == 4
        for t in tasks:
            done = ac.client.get_task(t.id)
            branch = done.result["branch"]
            log = git("log", "--format=%B", f"refs/heads/{branch}", cwd=remote)
            push_key = next(k for k in ac.client.effects(t.id) if k.startswith("push:"))
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
    # No silent default: without MCQ_REDIS_PASSWORD (unset or empty) compose refuses to start.
    for env in ({}, {"MCQ_REDIS_PASSWORD": ""}):
        with pytest.raises(LookupError, match=r"set MCQ_REDIS_PASSWORD in \.env"):
            interpolate(services["redis"]["command"], env)
        for name in ("worker", "sweeper", "metrics"):
            with pytest.raises(LookupError, match=r"set MCQ_REDIS_PASSWORD in \.env"):
                interpolate(services[name]["environment"], env)
    example = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert example["MCQ_REDIS_PASSWORD"] == ""  # an .env copied unchanged is refused too

    password = "pw-" + uuid.uuid4().hex
    compose = interpolate(raw, {"MCQ_REDIS_PASSWORD": password})
    services = compose["services"]
    assert re.fullmatch(r"redis:\d+\.\d+\.\d+", services["redis"]["image"])  # an exact release
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11\.\d+-slim-\w+$", dockerfile, re.M)
    assert "COPY lua" in dockerfile and "COPY workers" in dockerfile and 'ENTRYPOINT ["mcq"]' in dockerfile
    for name, svc in services.items():
        assert svc["restart"] == "unless-stopped", name
        assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        assert password not in json.dumps(svc["healthcheck"]), name
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == password

    cmd = services["redis"]["command"]
    assert cmd[0] == "redis-server" and all(" " not in arg for arg in cmd if not arg.startswith(">"))
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    assert cmd[cmd.index("--appendfsync") + 1] == "always"
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction"

    # A worker asked to stop gets its --grace; docker waits longer than that before SIGKILL.
    worker = services["worker"]["command"]
    assert seconds(services["worker"]["stop_grace_period"]) > float(worker[worker.index("--grace") + 1]) + 10
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

    from mc_queue.cli import load_app, main

    for name in ("worker", "sweeper", "metrics"):
        cmd = services[name]["command"]
        assert services[name]["environment"]["MCQ_REDIS_URL"] == f"redis://mcq:{password}@redis:6379/0"
        assert CliRunner().invoke(main, [*cmd[:1], "--help"]).exit_code == 0
        if "--app" not in cmd:
            continue
        cwd = os.getcwd()
        try:
            os.chdir(ROOT)  # the image's WORKDIR holds workers/
            assert load_app(cmd[cmd.index("--app") + 1]).handlers
        finally:
            os.chdir(cwd)


def _check_argv(test: list[str]) -> list[str]:
    """A CMD health check as this machine runs it: mcq as ``python -m mc_queue``, python as this one."""
    assert test[0] == "CMD", test
    argv = list(test[1:])
    if argv[0] == "mcq":
        return [sys.executable, "-m", "mc_queue", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    raise AssertionError(f"unexpected health check {test}")


def _replace_option(cmd: list[str], option: str, value: str) -> list[str]:
    out = list(cmd)
    out[out.index(option) + 1] = value
    return out


def _wait(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)


def test_docker_compose_commands_run_against_its_redis(tmp_path: Path) -> None:
    """The redis service's exact argv (only --port, --bind, --dir, --logfile added to run here) starts
    redis-server; the mcq user gets in, default does not; then the exact worker (--burst), sweeper
    (--once), metrics commands and every health check run against it, with the services' environment."""
    password = "pw-" + uuid.uuid4().hex
    services = interpolate(load_compose(), {"MCQ_REDIS_PASSWORD": password})["services"]
    port = free_port()
    redis_argv = list(services["redis"]["command"])
    assert redis_argv[0] == "redis-server"
    redis_argv[0] = find_redis_server()
    data = tmp_path / "redis"
    data.mkdir()
    redis_argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                   "--logfile", str(data / "redis.log")]
    procs: list[subprocess.Popen[bytes]] = []
    redis_proc = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(redis_proc)
    try:
        r = redis.Redis(host="127.0.0.1", port=port, username="mcq", password=password, decode_responses=True)

        def up() -> bool:
            assert redis_proc.poll() is None, (data / "redis.log").read_text()[-2000:]
            try:
                return bool(r.ping())
            except redis.ConnectionError:
                return False

        _wait("redis-server answers the mcq user", up, 15)
        for kw in ({}, {"username": "default", "password": password}, {"password": password}):
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(host="127.0.0.1", port=port, **kw).ping()  # type: ignore[arg-type]
        config = {k: r.config_get(k)[k] for k in ("maxmemory-policy", "appendfsync", "appendonly", "save",
                                                    "hash-max-listpack-value", "stream-node-max-bytes")}
        assert config == {"maxmemory-policy": "noeviction", "appendfsync": "always", "appendonly": "yes",
                          "save": "", "hash-max-listpack-value": "1024", "stream-node-max-bytes": "1024"}
        assert "off" in r.acl_getuser("default")["flags"]

        # redis's health check: redis-cli with REDISCLI_AUTH from the service's environment (in the
        # container it runs on 6379; here -p points it at this server).
        check = services["redis"]["healthcheck"]["test"]
        assert check[0] == "CMD-SHELL" and check[1].startswith("redis-cli ")
        shell = check[1].replace("redis-cli ", f"redis-cli -p {port} ", 1)
        redis_cli = Path(find_redis_server()).with_name("redis-cli")
        if redis_cli.exists() or shutil.which("redis-cli"):
            path = f"{redis_cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"
            for auth, healthy in ((services["redis"]["environment"]["REDISCLI_AUTH"], True), ("wrong", False)):
                out = subprocess.run(["sh", "-c", shell], env={"PATH": path, "REDISCLI_AUTH": auth},
                                     capture_output=True, text=True, timeout=30)
                assert (out.returncode == 0) is healthy, (auth, out)

        remote = bare_git_remote(tmp_path)
        with ForgeServer() as forge:
            inherited = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}

            def env_of(name: str) -> dict[str, str]:
                env = dict(services[name]["environment"])
                assert env["MCQ_REDIS_URL"].endswith("@redis:6379/0")
                env["MCQ_REDIS_URL"] = env["MCQ_REDIS_URL"].replace("@redis:6379/", f"@127.0.0.1:{port}/")
                assert env["MCQ_GIT_REMOTE"] == "/data/remote.git"  # on the git-remote volume in the containers
                env["MCQ_GIT_REMOTE"] = str(remote)
                env["MCQ_FORGE_URL"] = forge.url
                env["MCQ_HOME"] = str(tmp_path / f"home-{name}")
                return {**inherited, **env}

            def run(name: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
                return subprocess.run(argv, cwd=ROOT, env=env_of(name), capture_output=True, text=True,
                                      timeout=timeout)

            def mcq(*args: str) -> list[str]:
                return [sys.executable, "-m", "mc_queue", *args]

            def health(name: str) -> subprocess.CompletedProcess[str]:
                return run(name, _check_argv(services[name]["healthcheck"]["test"]), 30)

            worker_cmd = services["worker"]["command"]
            assert health("worker").returncode == 1  # no worker yet
            out = run("worker", mcq("enqueue", "fix-issue", "--app", "workers.example:app", "--payload",
                                    json.dumps({"repository": "example/app", "issue": 1})))
            assert out.returncode == 0, out.stderr
            task_id = out.stdout.strip()
            out = run("worker", mcq(*worker_cmd, "--burst"), 120)
            assert out.returncode == 0, out.stderr[-3000:]
            client = mc_queue.connect(env_of("worker")["MCQ_REDIS_URL"])
            try:
                assert client.get_task(task_id).state.value == "succeeded"
            finally:
                client.close()
            assert len(forge.pulls) == 1

            out = run("sweeper", mcq(*services["sweeper"]["command"], "--once"))
            assert out.returncode == 0 and out.stdout.startswith("expired 0,"), out
            out = health("sweeper")
            assert out.returncode == 0 and ": ok (" in out.stdout, out

            # The worker pool as the container runs it: healthy once registered, stops on SIGTERM (exit 0).
            wproc = subprocess.Popen(mcq(*worker_cmd), cwd=ROOT, env=env_of("worker"),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(wproc)
            _wait("the worker's health check", lambda: health("worker").returncode == 0, 45)
            wproc.send_signal(signal.SIGTERM)
            assert wproc.wait(30) == 0
            assert health("worker").returncode == 1

            # The metrics endpoint: the container's 0.0.0.0:9464, here a free loopback port.
            mport = free_port()
            metrics_cmd = _replace_option(_replace_option(services["metrics"]["command"], "--host", "127.0.0.1"),
                                          "--port", str(mport))
            mproc = subprocess.Popen(mcq(*metrics_cmd), cwd=ROOT, env=env_of("metrics"),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(mproc)
            mtest = [arg.replace("127.0.0.1:9464", f"127.0.0.1:{mport}") for arg in
                     services["metrics"]["healthcheck"]["test"]]
            assert mtest != services["metrics"]["healthcheck"]["test"]
            _wait("the metrics health check",
                  lambda: subprocess.run(_check_argv(mtest), capture_output=True, timeout=30).returncode == 0)
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as resp:
                body = resp.read().decode()
            assert "mcq_namespace_ok 1.0" in body and 'mcq_tasks{queue="agents",state="succeeded"} 1.0' in body
            mproc.terminate()
            mproc.wait(15)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(15)

"""workers/example.py against a real bare git repository and a real local HTTP provider, run by a
real worker process; and the docker-compose.yml that deploys it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import mc_queue
from mc_queue.providers.git import TRAILER, git
from mc_queue.testing import ForgeServer, RedisServer, bare_git_remote

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


def test_docker_compose_runs_redis_with_aof_a_worker_pool_and_the_sweeper() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "worker", "sweeper", "metrics"}
    assert services["metrics"]["ports"] == ["127.0.0.1:9464:9464"]
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert redis_cmd[redis_cmd.index("--appendfsync") + 1] == "always"
    from click.testing import CliRunner

    from mc_queue.cli import load_app, main

    for name in ("worker", "sweeper", "metrics"):
        cmd = services[name]["command"]
        assert services[name]["environment"]["MCQ_REDIS_URL"].startswith("redis://mcq:")
        # The command line parses, and the app it names imports (from the repo root, as in the image).
        assert CliRunner().invoke(main, [*cmd[:1], "--help"]).exit_code == 0
        if "--app" not in cmd:
            continue
        app_spec = cmd[cmd.index("--app") + 1]
        cwd = os.getcwd()
        try:
            os.chdir(ROOT)
            assert load_app(app_spec).handlers
        finally:
            os.chdir(cwd)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY lua" in dockerfile and "COPY workers" in dockerfile and 'ENTRYPOINT ["mcq"]' in dockerfile

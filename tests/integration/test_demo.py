"""The README's main job, `mcq demo`, on a fresh embedded server: real workers, a sweeper, faults."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_factory_demo_ends_with_every_task_done_and_no_duplicate(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MCQ_REDIS_URL", "MCQ_PREFIX")}
    env["COLUMNS"] = "120"
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--home", str(tmp_path / "home"), "demo"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    text = out.stdout

    def total(what: str) -> int:
        m = re.search(rf"{re.escape(what)}\s*│\s*(\d+)", text)
        assert m, f"{what!r} missing from the report:\n{text[-3000:]}"
        return int(m.group(1))

    assert "tasks succeeded" in text and "8/8" in text
    assert total("duplicate pull requests") == 0
    assert total("pull requests at the provider") == 8
    assert total("faults: workers killed mid-task") == 1
    assert total("faults: workers paused past their lease") == 1
    assert total("leases expired") >= 2 and total("attempts reconciled") >= 2
    assert total("stale writes refused (audited)") >= 1
    assert "embedded redis-server stopped" in text


def test_contracts_demo_still_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MCQ_REDIS_URL", "MCQ_PREFIX")}
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--home", str(tmp_path / "home"), "demo", "--contracts"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "stale writes accepted: 0" in out.stdout


def test_demo_prints_whole_ids_and_a_hint_that_works_as_typed(tmp_path: Path) -> None:
    """At 80 columns the demo's table cut its task ids (`agents:01M8SE9342NZ6XKW84…`), and its hint
    named `mcq` (not on PATH: `.venv/bin/mcq`) and TASK: every id is printed whole, and the hint's
    commands, typed as printed in the same folder, show a task's story."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["COLUMNS"] = "80"
    home = tmp_path / "home"
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--home", str(home), "demo", "--tasks", "4",
                          "--workers", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    table = out.stdout.split("Totals")[0]
    assert "…" not in table, table
    ids = set(re.findall(r"agents:[0-9A-Z]{26}", table))
    assert len(ids) == 4, table
    hint = out.stdout.split("see a task's story", 1)[1].splitlines()[1:]
    commands = [line.strip() for line in hint if line.startswith("  ")]
    assert len(commands) == 3 and "server start" in commands[0] and "server stop" in commands[2], out.stdout[-2000:]
    try:
        for command in commands:
            ran = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            assert ran.returncode == 0, (command, ran.stderr[-2000:])
            if " show " in command:
                shown = re.search(r"show (agents:[0-9A-Z]{26})$", command)
                assert shown and shown.group(1) in ids and f"task {shown.group(1)}" in ran.stdout, ran.stdout[:500]
    finally:
        from mc_queue.store.embedded import stop_server

        stop_server(home)

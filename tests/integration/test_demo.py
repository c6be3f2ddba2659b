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

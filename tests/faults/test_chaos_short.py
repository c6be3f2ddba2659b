"""The short chaos run (bench/chaos.py --short) in CI: workers SIGKILLed and SIGSTOPped, redis-server
restarted, the worker link delayed and cut, the provider timing out after accepting; it exits 0 only
when no task is lost, no effect is duplicated and no stale write is accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_chaos_run_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    # Settle long enough for the outbox to re-send a message lost in a fault (re-checked after 60 s).
    out = subprocess.run([sys.executable, "bench/chaos.py", "--short", "--seed", "3", "--settle-timeout", "100",
                          "--json", str(tmp_path / "chaos.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=400)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    assert "**PASS**" in out.stdout
    report = json.loads((tmp_path / "chaos.json").read_text())
    assert report["ok"] is True and report["lost"] == [] and report["stale_accepted"] == []
    assert report["forge_duplicates"] in ({}, 0, []) and report["git_duplicates"] in ({}, 0, [])
    assert report["stale_refused_stats"] == report["stale_refused_events"]
    assert set(report["faults"]) >= {"kill", "pause", "redis_restart", "link_delay", "link_cut", "provider_stall"}
    assert report["tasks"] > 0

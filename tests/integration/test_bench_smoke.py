"""Every benchmark in bench/ runs to its table at smoke size (issue 15: bench_workers.py crashed at its
steps section once ``WorkspaceRoot`` needed a namespace, and nobody ran the benchmarks between turns).

No figure is asserted: each script runs as a subprocess, as the README shows, with the smallest sizes
its options allow, and must end with the table or summary it prints (exit 0, no traceback). The whole
set takes about a minute on a 2-core machine."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

# script -> (smoke arguments, what its output ends with, exit codes it may give)
SMOKE: dict[str, tuple[list[str], str, tuple[int, ...]]] = {
    "bench_core.py": (["--seconds", "0.2", "--repeat", "1", "--fsync", "everysec", "--pin", "none", "--slice", "0.1",
                       "--tasks", "200", "--no-what-if", "--chunk", "200", "--settle", "0"],
                      "| 1. claim+complete cycles/s", (0,)),
    "bench_guards.py": (["--cycles", "50", "--rounds", "1"], '"ratio_cycles_per_s"', (0,)),
    "bench_ab.py": (["--baseline", "HEAD", "--rounds", "1", "--", "--seconds", "0.2", "--repeat", "1", "--fsync",
                     "everysec", "--pin", "none", "--slice", "0.1", "--tasks", "100", "--no-what-if", "--chunk", "100",
                     "--settle", "0"], "| Redis bytes finished task packed |", (0,)),
    "bench_memory.py": (["--sizes", "0,100", "--tasks", "20", "--settle", "0"], "| 100 B |", (0,)),
    "bench_peers.py": (["--jobs", "20", "--repeat", "1"], "| peer | jobs/s |", (0,)),
    "bench_ops.py": (["--idle", "100", "--passes", "2", "--expired", "2", "--due", "2", "--leases", "100",
                      "--seconds", "1"], "| redis-server CPU per renewal |", (0,)),
    "bench_periodic.py": (["--ticks", "40", "--every", "0.1", "--kill-every", "1", "--interval", "0.2"],
                          "exactly one task per tick: PASS", (0,)),
    "bench_priority.py": (["--tasks", "60", "--workers", "2", "--work-ms", "2", "--aging-ms", "200"],
                          "priorities: PASS", (0,)),
    # (fairness is a verdict a short drain can be held to: the share within 5 of 100 claims in any window)
    "bench_fair.py": (["--big", "300", "--small", "10", "--small-each", "20", "--weighted", "150", "--workers", "2"],
                      "fairness: PASS", (0,)),
    # a verdict (exit 1) on overshoot at the provider is the long run's to give, not a few seconds'
    "bench_limits.py": (["--tasks", "40", "--limit", "10", "--window-s", "1", "--pool", "2"], '"overshoot_at_claims"',
                        (0, 1)),
    "bench_breakers.py": (["--seconds", "8", "--outage", "2", "5", "--backlog", "40", "--workers", "2"],
                          '"claims_while_open"', (0, 1)),
    "bench_wait.py": (["--tasks", "300", "--group", "50"], "| wall time of the waits |", (0,)),
    # (over-admission is never a verdict a short run may fail: it must be 0 in any run)
    "bench_slots.py": (["--claims", "400", "--workers", "4", "--kill-every-s", "1.5"], "over-admission: 0 keys",
                       (0,)),
    # (overspend is never a verdict a short run may fail: it must be 0 in any run)
    "bench_spend.py": (["--seconds", "3", "--workers", "2", "--kill-every-s", "1.5"], "overspend: 0 keys", (0,)),
    "bench_schedule.py": (["--delayed", "200", "--probes", "10", "--spread-s", "0.5", "--fill-procs", "1"],
                          "mean_ms:", (0,)),
    "bench_recovery.py": (["--runs", "1", "--rq-runs", "0", "--lease-ms", "1500"], "## Recovery time", (0,)),
    # --failover (a RepeatableFailoverCluster, a failover or two): --short, the link faults, is
    # tests/faults/test_chaos_short.py's run; exit 1 is a verdict this short a run cannot be held to
    "chaos.py": (["--failover", "--minutes", "0.15", "--workers", "1", "--tasks-per-minute", "20", "--fault-min", "1",
                  "--fault-max", "2", "--settle-timeout", "40", "--seed", "5"], "**failovers injected**", (0, 1)),
    "bench_workers.py": (["--jobs", "20", "--repeat", "1", "--kinds", "simple,batch", "--workers", "1", "--sample", "0",
                          "--no-profile", "--steps", "10"], "| total of the steps |", (0,)),
    "failover.py": (["--tasks", "2", "--workers", "1", "--think-s", "0.05", "--lag-s", "0.5", "--modes", "kill:1",
                     "--quiet-s", "1", "--seconds", "0.3", "--repeat", "1"], '"throughput"', (0,)),
    # soak's exit code is its verdict on a figure (1: memory not flat), which a smoke run cannot judge
    "soak.py": (["--tasks", "300", "--retention", "1", "--pack-after", "0.5", "--after", "1", "--sample", "0.5"],
                "at the end:", (0, 1)),
}
BACKGROUND = {"chaos.py", "failover.py"}
CHAOS_SHORT = "tests/faults/test_chaos_short.py"  # bench/chaos.py --short, to its report
# Not benchmarks themselves: imported by the others.
ELSEWHERE = {"noop_app.py": "bench_workers.py's App",
             "controls_app.py": "bench_limits.py's and bench_breakers.py's App",
             "noop_jobs.py": "bench_workers.py's RQ jobs",
             "recovery_app.py": "bench_recovery.py's App and RQ job",
             "rq_baseline.py": "the bare-RQ worker classes of bench_workers.py, bench_peers.py, bench_recovery.py"}


def test_every_bench_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("*.py") if p.name != "__init__.py"}
    assert scripts == set(SMOKE) | set(ELSEWHERE), "a bench script without a smoke run (add it to SMOKE)"
    assert (ROOT / CHAOS_SHORT).exists()


def _run(script: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(BENCH / script), *SMOKE[script][0]], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def in_background(request: pytest.FixtureRequest) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """The failover scenarios mostly wait (for the sentinels, a lease, the old primary's resync): they run
    while the other scripts run one after the other, so the whole set stays near a minute."""
    wanted = {item.callspec.params.get("script") for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    procs = {script: _run(script) for script in BACKGROUND & wanted}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("script", sorted(SMOKE, key=lambda s: (s in BACKGROUND, s)))
def test_bench_script_runs_to_its_table_at_smoke_size(
        script: str, in_background: dict[str, subprocess.Popen[str]]) -> None:
    _, marker, codes = SMOKE[script]
    proc = in_background.get(script) or _run(script)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode in codes, stdout[-3000:] + stderr[-3000:]
    assert "Traceback (most recent call last)" not in stderr, stderr[-3000:]
    assert marker in stdout, stdout[-3000:] + stderr[-2000:]

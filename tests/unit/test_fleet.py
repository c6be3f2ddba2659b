"""The fleet's mapping from what a worker calls itself to the process the harness started (chaos.py's
kills, pauses and zombies go through it): a worker process that reconnected registers as
``<name>.r<round>`` (``mcq worker``'s loop), and a zombie it became must still be found and resumed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mc_queue.demo.fleet import Fleet


def test_a_reconnected_worker_is_still_its_process_and_a_pid_finds_it_too(tmp_path: Path) -> None:
    fleet = Fleet("p", "redis://127.0.0.1:1/0", {}, tmp_path)
    procs = {name: subprocess.Popen([sys.executable, "-c", "pass"]) for name in ("chaos-w2", "chaos-w12")}
    try:
        fleet.procs.update(procs)
        assert fleet.process_of("chaos-w2") == "chaos-w2"
        assert fleet.process_of("chaos-w2.r4") == "chaos-w2"
        assert fleet.process_of("chaos-w12.r2") == "chaos-w12"
        assert fleet.process_of("chaos-w1.r2") is None and fleet.process_of("chaos-w2.rx") is None
        assert fleet.process_of("anything", procs["chaos-w12"].pid) == "chaos-w12"
        fleet.adopt_pause(str(fleet.process_of("chaos-w2.r3")))
        assert set(fleet.paused) == {"chaos-w2"}
    finally:
        for p in procs.values():
            p.wait()

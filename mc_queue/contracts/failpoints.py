"""Fail points: named places in mc_queue's own code where a fault harness can stop or kill the process.

They are off unless the environment variable ``MCQ_FAILPOINTS_DIR`` names a directory when this
module is imported; then :func:`hit` costs one ``os.rename`` attempt per place passed. A harness
arms a point by writing a file ``<dir>/<point>`` (any operation) or ``<dir>/<point>@<operation>``
holding the action, ``stop`` (the process SIGSTOPs itself: a zombie in the making, for the harness
to resume later) or ``kill`` (SIGKILL). The first process that reaches the place renames the file
to ``<name>.fired.<pid>`` (atomic: exactly one process takes an armed point), writes what it was
doing into it (JSON: point, operation, attempt, worker, pid, time), then acts.

Points:

- ``attempt.before_claim``: in a worker, after RQ marked the job started and before the claim: a
  delivery that never reaches its claim (what a connection cut there leaves);
- ``effect.before_call``: in :meth:`mc_queue.Context.effect`, after the intent is recorded (fenced)
  and before the provider is called: the window only the provider can close (its fence check);
- ``effect.after_call``: after the provider answered, before the receipt is recorded;
- ``worker.between_jobs``: in a worker's main process, recording a job's success with RQ, the worker no
  longer busy and not yet waiting for the next job: where a stop signal once got lost.

The chaos run (``bench/chaos.py``) arms them to freeze a worker between its intent and its call.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

POINTS = ("attempt.before_claim", "effect.before_call", "effect.after_call", "worker.between_jobs")
ACTIONS = ("stop", "kill")
ENV = "MCQ_FAILPOINTS_DIR"

_DIR = Path(os.environ[ENV]) if os.environ.get(ENV) else None


def arm(directory: str | os.PathLike[str], point: str, action: str = "stop", *,
        operation: str | None = None) -> Path:
    """Arm ``point`` (for ``operation`` only, when given) in ``directory``; returns the armed file."""
    if point not in POINTS:
        raise ValueError(f"unknown fail point {point!r}; known: {', '.join(POINTS)}")
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
    path = Path(directory) / (point + (f"@{operation}" if operation else ""))
    path.write_text(action)
    return path


def fired(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What every fired point of ``directory`` recorded (oldest first); a record still being written
    is left out until it is complete."""
    out = []
    for path in sorted(Path(directory).glob("*.fired.*")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r.get("at", 0))


def hit(point: str, *, operation: str = "", attempt: str = "", worker: str = "") -> None:
    """Pass a fail point: nothing unless it is armed in ``$MCQ_FAILPOINTS_DIR`` (see the module doc)."""
    if _DIR is None:
        return
    for name in (f"{point}@{operation}", point):
        armed = _DIR / name
        taken = _DIR / f"{name}.fired.{os.getpid()}"
        try:
            os.rename(armed, taken)  # exactly one process wins an armed point
        except OSError:
            continue
        action = taken.read_text().strip()
        record = {"point": point, "operation": operation, "attempt": attempt, "worker": worker,
                  "pid": os.getpid(), "action": action, "at": time.time()}
        tmp = _DIR / f".record-{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, taken)
        os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        return

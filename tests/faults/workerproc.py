"""A real worker process for fault tests: claims one Attempt, then obeys commands on stdin.

The script (WORKER_SCRIPT) is written to a file by the test and run with the venv's Python. It
connects with ``mc_queue.connect(url, prefix=...)``, claims the task, prints a JSON line, and then
for each stdin line (``renew``, ``complete``, ``fail``, ``exit``) does that with the lease it holds and prints
one JSON line saying what it got: ``ok`` or the exception type, its code, presented and current
fence. Request/response, one line each, so a test can freeze it (SIGSTOP) at a known point.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

WORKER_SCRIPT = r'''
import json, os, sys
import mc_queue

url, prefix, task_id, worker, lease_ms, result = sys.argv[1:7]

def out(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()

def refused(op, exc):
    out(op=op, ok=False, error=type(exc).__name__, code=getattr(exc, "code", None),
        presented=getattr(exc, "presented_fence", None), current=getattr(exc, "current_fence", None),
        message=str(exc))

client = mc_queue.connect(url, prefix=prefix)
try:
    lease = client.leases.claim_attempt(task_id, worker, lease_ms=int(lease_ms))
except mc_queue.McqError as exc:
    refused("claim", exc)
    sys.exit(0)
out(op="claim", ok=True, attempt_id=lease.attempt_id, fence=lease.fence, number=lease.number,
    expires_at_ms=lease.expires_at_ms, pid=os.getpid())
for line in sys.stdin:
    cmd = line.strip()
    try:
        if cmd == "renew":
            exp = client.leases.renew_lease(lease.attempt_id, lease.fence, worker_id=worker)
            out(op="renew", ok=True, expires_at_ms=exp)
        elif cmd == "complete":
            att = client.leases.complete_attempt(lease.attempt_id, lease.fence, json.loads(result), worker_id=worker)
            out(op="complete", ok=True, state=str(att.state), fence=att.fence, result=att.result)
        elif cmd == "fail":
            att = client.leases.fail_attempt(lease.attempt_id, lease.fence,
                                      mc_queue.make_failure("provider", "Timeout", "upstream timed out"),
                                      worker_id=worker)
            out(op="fail", ok=True, state=str(att.state), fence=att.fence)
        elif cmd == "exit":
            break
        else:
            out(op=cmd, ok=False, error="unknown command")
    except mc_queue.McqError as exc:
        refused(cmd, exc)
client.close()
'''


class WorkerProc:
    """One worker subprocess; ``call(cmd)`` sends a command and returns its JSON answer."""

    def __init__(self, script: Path, url: str, prefix: str, task_id: str, worker: str, lease_ms: int,
                 result: Any) -> None:
        self.worker = worker
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), url, prefix, task_id, worker, str(lease_ms), json.dumps(result)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.claim = self.read(timeout=30)

    @staticmethod
    def write_script(directory: Path) -> Path:
        path = directory / "mcq_worker.py"
        path.write_text(WORKER_SCRIPT)
        return path

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def read(self, timeout: float = 15.0) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.worker}: no answer within {timeout}s") from None
        if line is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"{self.worker} exited ({self.proc.wait()}): {err}")
        data: dict[str, Any] = json.loads(line)
        return data

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def call(self, cmd: str, timeout: float = 15.0) -> dict[str, Any]:
        self.send(cmd)
        return self.read(timeout)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def state(self) -> str:
        """The process state letter from /proc (``T`` = stopped)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat[stat.rindex(")") + 2]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.cont()
            try:
                self.send("exit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f:
                try:
                    f.close()
                except OSError:
                    pass

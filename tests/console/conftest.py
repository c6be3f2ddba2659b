"""The console's tests: a namespace that holds every state a page must show, built through the real
Client and worker paths (a burst `mcq worker` process, leases that expire, a stale write refused, a
reconciliation), and helpers to drive the console with Starlette's TestClient."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import mc_queue
from mc_queue import Decision, FailureClass, StaleFence, make_failure, reconcile_attempt
from mc_queue.ops.console.security import TOKEN_COOKIE
from mc_queue.producer.dispatch import AppClient
from mc_queue.testing import RedisServer, unique_prefix
from tests.apps import basic

with warnings.catch_warnings():  # Starlette 1.x prefers httpx2 for its TestClient; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

REPO = Path(__file__).resolve().parents[2]
REASON = "the operator looked at it and the cause is fixed"
LOCAL = ("127.0.0.1", 40100)
LOCAL_URL = "http://127.0.0.1:9465"


@dataclass
class Story:
    """One namespace with a task in every state the pages show (ids by what they are)."""

    client: mc_queue.Client
    prefix: str
    pending: str = ""
    running: str = ""
    backoff: str = ""
    succeeded: str = ""
    reconciled: str = ""  # a stale write refused, reconciled with an unknown effect, now blocked
    quarantined: list[str] = field(default_factory=list)  # two with one fingerprint, one with another
    failed: str = ""
    job_description: str = ""  # the RQ job's description of the succeeded task, read before the worker ran

    def ids(self) -> dict[str, str]:
        return {"pending": self.pending, "running": self.running, "backoff": self.backoff,
                "succeeded": self.succeeded, "reconciled": self.reconciled, "quarantined": self.quarantined[0],
                "failed": self.failed}


def quarantine(q: mc_queue.Client, message: str, *, queue: str = "agents") -> str:
    task = q.producer.enqueue(queue, "fix-issue", {"repo": "example/app", "issue": message})
    lease = q.leases.claim_attempt(task.id, "worker-3", 60_000)
    why = "an internal failure means the platform or the handler is broken; repeating it cannot help"
    q.leases.fail_attempt(lease.attempt_id, lease.fence,
                   make_failure(FailureClass.INTERNAL, "KeyError", f"'{message}' missing from the plan"),
                   worker_id="worker-3",
                   decision=Decision("quarantine", "internal failures quarantine the task",
                                     attention={"task_id": task.id, "kind": "quarantined", "why_unsafe": why,
                                                "summary": f"fix-issue on {task.id}: internal failure ({message})",
                                                "tried": [{"attempt": 1, "state": "failed",
                                                           "failure_class": "internal"}]}))
    return task.id


def build_story(server: RedisServer, home: Path) -> Story:
    prefix = unique_prefix("console")
    q = mc_queue.connect(server.url, prefix=prefix)
    s = Story(q, prefix)
    # succeeded: dispatched to RQ by the producer and run by a real `mcq worker` process
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from mc_queue.producer.transport import job_id, rq_connection

    producer = AppClient(basic.app, q)
    task = producer.enqueue("noop", {"n": 1})
    rq = rq_connection(q)
    try:
        job = Job.fetch(job_id(prefix, f"{task.id}/1"), connection=rq, serializer=JSONSerializer)
        s.job_description = str(job.description)
    finally:
        rq.close()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")} | {"MCQ_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix, "worker",
                          "--app", "tests.apps.basic:app", "--burst", "--kind", "simple"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    s.succeeded = task.id
    assert q.reads.get_task(s.succeeded).state.value == "succeeded"

    # pending, running (a live lease), backoff (a retry decision with a wait), failed (waits for a person)
    s.pending = q.producer.enqueue("agents", "fix-issue", {"repo": "example/app", "issue": 1}).id
    s.running = q.producer.enqueue("agents", "fix-issue", {"repo": "example/app", "issue": 2}).id
    lease = q.leases.claim_attempt(s.running, "worker-7", 600_000)
    q.leases.heartbeat(lease.attempt_id, lease.fence, worker_id="worker-7", cost=0.12, tokens=3400)
    s.backoff = q.producer.enqueue("agents", "fix-issue", {"repo": "example/app", "issue": 3}).id
    lease = q.leases.claim_attempt(s.backoff, "worker-7", 60_000)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.CAPACITY, "RateLimited",
                                                                      "429 from the "
                   "model provider"), worker_id="worker-7",
                   decision=Decision("retry", "capacity failures back off", delay_s=600,
                                     next_reason="the provider was at capacity", next_hypothesis="it recovers"))
    s.failed = q.producer.enqueue("agents", "fix-issue", {"repo": "example/app", "issue": 4}).id
    lease = q.leases.claim_attempt(s.failed, "worker-7", 60_000)
    q.leases.fail_attempt(lease.attempt_id, lease.fence, make_failure(FailureClass.VALIDATION, "AssertionError",
                   "test_parser fails: expected 3, got 4"), worker_id="worker-7")

    # reconciled: worker-A's lease expires after its push intent; its late completion is refused
    # (a stale write), reconciliation cannot prove the push and stops the task for a person
    s.reconciled = q.producer.enqueue("agents", "fix-issue", {"repo": "example/app", "issue": 5}).id
    lease = q.leases.claim_attempt(s.reconciled, "worker-A", 300)
    q.leases.checkpoint(lease.attempt_id, lease.fence, "workspace_prepared", 1, {"repository": "example/app"},
                 worker_id="worker-A")
    q.leases.effect_begin(lease.attempt_id, lease.fence, f"push:{s.reconciled}:4f9c2a1",
                   {"operation": "push", "identity": "4f9c2a1"}, worker_id="worker-A")
    deadline = time.monotonic() + 5
    while not q.maintenance.expire_leases(actor="sweeper"):
        assert time.monotonic() < deadline, "the lease did not expire"
        time.sleep(0.05)
    with pytest.raises(StaleFence):
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"pull_request": 1}, worker_id="worker-A")
    reconcile_attempt(q, lease.attempt_id, actor="sweeper")

    s.quarantined = [quarantine(q, "base_sha"), quarantine(q, "base_sha"), quarantine(q, "repository")]
    mc_queue.Sweeper(q).run_once()  # the sweeper's record of its pass (fractional pass_ms) for the overview
    return s


@pytest.fixture(scope="session")
def story(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    """One namespace for every console test (tests add tasks of their own to it; none removes the story's)."""
    s = build_story(redis_server, tmp_path_factory.mktemp("console-home"))
    yield s
    s.client.close()


def local(app: Any, *, token: bool = True, **kw: Any) -> TestClient:
    """A TestClient whose requests come from 127.0.0.1 to the console's own address: a browser on this
    machine that opened the address the console printed (its token in the cookie); ``token=False``:
    one that did not."""
    c = TestClient(app, client=LOCAL, base_url=LOCAL_URL, **kw)
    if token:
        c.cookies.set(TOKEN_COOKIE, app.state.console.guard.token)
    return c


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field on the page"
    return m.group(1)


def alert_of(html: str) -> str:
    m = re.search(r'role="alert"[^>]*>([^<]+)<', html)
    return m.group(1).replace("&#39;", "'").replace("&quot;", '"') if m else ""


def hidden_fields(html: str, action: str, *, within: str = "") -> dict[str, str]:
    """The hidden fields of the page's form ``data-action=action`` (the first one after ``within``, a
    piece of the page such as a group's ``data-fingerprint="..."``), as a browser would send them."""
    import html as html_lib

    start = html.index(within) if within else 0
    m = re.search(rf'<form [^>]*data-action="{re.escape(action)}"[^>]*>(.*?)</form>', html[start:], re.S)
    assert m, f"no form {action!r} on the page"
    return {name: html_lib.unescape(value) for name, value in
            re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', m.group(1))}

"""A worker whose Redis link is cut while it runs an Attempt comes back as one worker, not one more each time.

RQ's loop quits when the link breaks in its bookkeeping after a job ("found an unhandled exception"), and its
teardown then tried to unsubscribe its command channel on the dead connection: the error stopped the teardown
before the channel's thread was stopped, so every such cut left a thread behind, reconnecting and
subscribing to the old worker's channel for as long as the process lived (seen in the chaos runs: two
worker names logging from one process). Through a real TCP proxy, a real worker process, cut mid-Attempt
three times: every task still succeeds, and Redis holds exactly one command channel subscription.

And the fault proxy itself (``mc_queue.testing.TcpProxy``, the chaos runs' link): one connection that failed
before it was accepted (a client killed mid-handshake) ended its accept loop, after which every client
connected into the backlog and waited for answers that never came.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import mc_queue
from mc_queue import Sweeper, TaskState
from mc_queue.producer.dispatch import AppClient
from mc_queue.testing import RedisServer, TcpProxy
from tests.apps import basic
from tests.harness import REPO, wait_for


@pytest.fixture
def proxy(own_redis: RedisServer) -> Iterator[TcpProxy]:
    with TcpProxy(("127.0.0.1", own_redis.port)) as p:
        yield p


def sweep(q: mc_queue.Client) -> bool:
    assert not Sweeper(q).run_once().errors
    return True


def channels(q: mc_queue.Client) -> list[str]:
    return sorted(str(c) for c in q.redis.pubsub_channels("rq:pubsub:*"))


def test_a_link_cut_mid_attempt_leaves_no_command_channel_thread_behind(own_redis: RedisServer, proxy: TcpProxy,
                                                                         prefix: str, tmp_path: Path) -> None:
    q = mc_queue.connect(own_redis.url, prefix=prefix)
    ac = AppClient(basic.app, q)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}, "MCQ_HOME": str(tmp_path / "home"),
           "PYTHONUNBUFFERED": "1"}
    (tmp_path / "home").mkdir(mode=0o700)
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", proxy.url, "--prefix", prefix,
                               "worker", "--app", "tests.apps.basic:app", "--kind", "simple"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: len(channels(q)) == 1, 20, "the worker's command channel")
        for round_ in range(3):
            task = ac.enqueue("long", {"seconds": 1.0, "n": round_})
            wait_for(lambda t=task: q.reads.get_task(t.id).state is TaskState.RUNNING, 20, "the Attempt to run")
            time.sleep(0.4)  # mid-Attempt: its completion, then RQ's bookkeeping, meet a link refused 2.5 s
            proxy.cut(refuse_s=2.5)
            # (its lease, 1.5 s, runs out: the sweeper reconciles the Attempt and sends the retry)
            wait_for(lambda t=task: sweep(q) and q.reads.get_task(t.id).state is TaskState.SUCCEEDED, 60,
                     f"round {round_}'s task to succeed after the cut")
        after = ac.enqueue("noop", {"after": True})
        wait_for(lambda: sweep(q) and q.reads.get_task(after.id).state is TaskState.SUCCEEDED, 30,
                 "a task after the cuts")
        time.sleep(3.0)  # a thread left behind would have reconnected and subscribed again by now
        assert worker.poll() is None
        log.flush()
        text = (tmp_path / "worker.log").read_text(errors="replace")
        assert len(channels(q)) == 1, (channels(q), text[-3000:])
    finally:
        worker.kill()
        worker.wait(10)
        log.close()
        ac.close()


class _FlakyListener:
    """A listening socket whose next accept fails as a client killed mid-handshake makes it fail."""

    def __init__(self, real: Any) -> None:
        self.real, self.failures = real, 1

    def accept(self) -> Any:
        if self.failures:
            self.failures -= 1
            self.real.accept()[0].close()  # (a connection was there; the kernel gave up on it)
            raise ConnectionAbortedError(103, "Software caused connection abort")
        return self.real.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_the_proxy_keeps_accepting_after_one_connection_failed_before_it_was_accepted(own_redis: RedisServer) -> None:
    proxy = TcpProxy(("127.0.0.1", own_redis.port))
    proxy._listener = _FlakyListener(proxy._listener)  # type: ignore[assignment]  # (the test's fault)
    with proxy:
        with contextlib.suppress(redis.RedisError):  # the one whose accept failed
            redis.Redis.from_url(proxy.url, socket_timeout=1).ping()
        assert redis.Redis.from_url(proxy.url, socket_timeout=2).ping()  # before the fix: a timeout, forever


def test_a_stop_signal_while_the_worker_waits_to_reconnect_stops_it(own_redis: RedisServer, proxy: TcpProxy,
                                                                     prefix: str, tmp_path: Path) -> None:
    """RQ's loop ended (Redis away) and the worker waits to reconnect: a SIGTERM then (what `docker stop`
    sends) stops it. Before, RQ's handler of the loop that had ended took the signal, noted it on that
    worker and returned, and the next round built a new worker that ran on as if nothing was asked."""
    q = mc_queue.connect(own_redis.url, prefix=prefix)
    q.backend.open_namespace()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}, "MCQ_HOME": str(tmp_path / "home"),
           "PYTHONUNBUFFERED": "1"}
    (tmp_path / "home").mkdir(mode=0o700)
    path = tmp_path / "worker.log"
    with open(path, "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", proxy.url, "--prefix", prefix,
                                   "worker", "--app", "tests.apps.basic:app", "--kind", "simple"],
                                  cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(channels(q)) == 1, 30, "the worker's command channel")
        proxy.cut(refuse_s=60)  # Redis unreachable for a minute: the loop ends, the worker waits to reconnect
        wait_for(lambda: "reconnecting in" in path.read_text(errors="replace"), 60, "the worker to wait to reconnect")
        worker.terminate()
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker ignored SIGTERM while waiting to reconnect:\n" + path.read_text(errors="replace"))
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        q.close()

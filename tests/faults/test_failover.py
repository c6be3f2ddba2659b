"""A failover to a lagging replica, with real processes: a primary (AOF, appendfsync always), one
replica whose replication link runs through a TCP proxy that holds the stream back, three
redis-sentinel processes (quorum 2), the primary SIGKILLed and the replica promoted.

- ``min_replicas=0``: what was acknowledged during the lag is gone on the new primary, and mc_queue
  says so: the client that follows the failover through Sentinel, and a process started afterwards
  on the new primary's plain URL (it finds the watermark slot files), both find the namespace lost,
  with a ``state_loss_detected`` event naming the missing replication offsets.
- ``min_replicas=1``: a write the replica did not confirm is an error to its caller
  (``ReplicationUnconfirmed``); every acknowledged task is on the new primary, the client follows the
  failover without a restart, a resend with the producer's key makes exactly one task, and nothing
  is reported lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mc_queue
from mc_queue.errors import ReplicationUnconfirmed
from mc_queue.keys import Keys
from mc_queue.testing import FailoverCluster

pytestmark = pytest.mark.timeout(120)
LONG = 60_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FailoverCluster]:
    # down-after 3 s: with 1 s a sentinel on a loaded machine took the just-promoted replica for dead
    # and failed back to the restarted old primary (seen in bench/failover.py).
    with FailoverCluster(tmp_path / "cluster", down_after_ms=3000, failover_timeout_ms=10000) as fc:
        yield fc


def _exists(fc: FailoverCluster, prefix: str, task_ids: list[str]) -> list[bool]:
    r = fc.replica.client()  # the new primary
    try:
        return [bool(r.exists(Keys(prefix).task(t).task)) for t in task_ids]
    finally:
        r.close()


def _fresh_process(url: str, prefix: str, state: Path) -> dict[str, str]:
    """A process started after the failover on the new primary's plain URL, as an operator would."""
    code = ("import json, sys, mc_queue\n"
            "q = mc_queue.connect(sys.argv[1], prefix=sys.argv[2], state_dir=sys.argv[3])\n"
            "info = q.open_namespace()\n"
            "print(json.dumps({'state': info.state, 'reason': info.reason}))\n")
    out = subprocess.run([sys.executable, "-c", code, url, prefix, str(state)], capture_output=True, text=True,
                         timeout=60, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_failover_to_a_lagging_replica_is_detected_with_min_replicas_0(cluster: FailoverCluster,
                                                                        tmp_path: Path) -> None:
    prefix, state = "fo0", tmp_path / "state"
    url = cluster.url(min_replicas=0)  # acknowledged when the primary has it (the Sentinel default is 1)
    producer = mc_queue.connect(url, prefix=prefix, state_dir=state)
    worker = mc_queue.connect(url, prefix=prefix, state_dir=state)
    try:
        assert producer.tracking and worker.tracking
        before = [producer.enqueue("q", "h", {"i": i}, f"k{i}").id for i in range(3)]
        worker.claim_attempt(before[0], "w1", LONG)
        cluster.lag()
        during = [producer.enqueue("q", "h", {"i": i}, f"k{i}").id for i in range(3, 6)]  # acknowledged
        lease = worker.claim_attempt(before[1], "w1", LONG)
        cluster.kill_primary()
        cluster.wait_failover()

        # The loss is real: the writes acknowledged during the lag are not on the new primary.
        assert _exists(cluster, prefix, before) == [True, True, True]
        assert _exists(cluster, prefix, during) == [False, False, False]

        # A process started now on the new primary's plain URL finds the watermark and says lost.
        fresh = _fresh_process(cluster.replica.url, prefix, state)
        assert fresh["state"] == "lost" and "a failover lost acknowledged writes" in fresh["reason"], fresh

        # The clients that follow the failover through Sentinel are refused, and say why.
        with pytest.raises(mc_queue.NamespaceLost, match="failover lost acknowledged writes"):
            producer.enqueue("q", "h", {"i": 9}, "k9")
        with pytest.raises(mc_queue.NamespaceLost):
            worker.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1")
        info = producer.namespace()
        assert info.state == "lost" and "acknowledged at offset" in info.reason
        losses = [e for e in producer.namespace_events() if e["type"] == "state_loss_detected"]
        assert len(losses) == 1 and "replication stream are missing" in losses[0]["reason"]
    finally:
        producer.close()
        worker.close()


def test_min_replicas_1_loses_no_acknowledged_task_and_follows_the_failover(cluster: FailoverCluster,
                                                                            tmp_path: Path) -> None:
    prefix, state = "fo1", tmp_path / "state"
    q = mc_queue.connect(cluster.url(min_replicas=1, replica_timeout_ms=300), prefix=prefix, state_dir=state)
    try:
        acked = [q.enqueue("q", "h", {"i": i}, f"k{i}").id for i in range(3)]
        lease = q.claim_attempt(acked[0], "w1", LONG)
        cluster.lag()
        t0 = time.monotonic()
        with pytest.raises(ReplicationUnconfirmed, match="same idempotency key"):
            q.enqueue("q", "h", {"i": 3}, "k3")  # on the primary only: an error, not an acknowledgement
        assert time.monotonic() - t0 < 2.5
        with pytest.raises(ReplicationUnconfirmed, match="do not run the Attempt"):
            q.claim_attempt(acked[1], "w1", LONG)
        cluster.kill_primary()
        cluster.wait_failover()
        cluster.restart_old_primary()  # a replica again, so that WAIT 1 can be confirmed

        # Every acknowledged write is on the new primary; the unconfirmed ones are not (they were
        # never acknowledged), and nothing is reported lost.
        assert _exists(cluster, prefix, acked) == [True, True, True]
        assert _fresh_process(cluster.replica.url, prefix, state)["state"] == "ok"
        # The same client goes on without a restart: the producer resends with its key, the claim
        # acknowledged before the failover still holds, the unconfirmed claim is made again.
        resent = q.enqueue("q", "h", {"i": 3}, "k3")
        assert q.enqueue("q", "h", {"i": 3}, "k3").id == resent.id
        assert q.complete_attempt(lease.attempt_id, lease.fence, {"ok": 1}, worker_id="w1").state.value == "succeeded"
        again = q.claim_attempt(acked[1], "w1", LONG)
        q.complete_attempt(again.attempt_id, again.fence, {"ok": 2}, worker_id="w1")
        assert q.namespace().state == "ok"
        assert [e for e in q.namespace_events() if e["type"] == "state_loss_detected"] == []
        r = cluster.replica.client()
        assert len(r.hgetall(Keys(prefix).idem)) == 4  # one task per producer key
        r.close()
    finally:
        q.close()

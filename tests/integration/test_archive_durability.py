"""Issue 15, "retention can delete tasks it did not archive": the archive is written whole and durably
before anything is deleted, and an archive that fails stops retention, loudly, never the sweeper.

Through what ships: `mcq sweeper --archive DIR` as a process, under a real file-size limit (`prlimit
--fsize`), with the archive folder under a file, on a read-only bind mount; the records read back with
`mcq archive show`. And "an audited refusal can vanish": a stale write refused between the archive's
read and retire's delete stays in Redis until it is archived too.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mc_queue
from mc_queue.contracts.config import Retention
from mc_queue.contracts.errors import StaleFence
from mc_queue.ops.archive import ArchivedTask, FileArchive, archive_and_retire
from mc_queue.ops.sweeper import Sweeper
from mc_queue.testing import RedisServer

REPO = Path(__file__).resolve().parents[2]
REASON = "retention of the durability test"


def _finished(q: mc_queue.Client, n: int, *, size: int = 2000) -> list[str]:
    ids = []
    for i in range(n):
        t = q.producer.enqueue("jobs", "h", {"i": i, "blob": os.urandom(size // 2).hex()})
        lease = q.leases.claim_attempt(t.id, "w1", 60_000)
        q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": i}, worker_id="w1")
        ids.append(t.id)
    return ids


def _sweeper(server: RedisServer, prefix: str, home: Path, *args: str,
             prefix_cmd: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    cmd = [*prefix_cmd, sys.executable, "-m", "mc_queue", "--redis-url", server.url, "--prefix", prefix,
           "sweeper", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _every_file_reads_whole(archive: Path) -> int:
    n = 0
    for path in archive.rglob("*.jsonl.gz"):
        with gzip.open(path, "rt") as fh:  # a torn member would raise here
            n += sum(1 for line in fh if line.strip())
    return n


def test_an_archive_under_a_file_size_limit_deletes_nothing_it_did_not_archive(
        q: mc_queue.Client, redis_server: RedisServer, tmp_path: Path) -> None:
    ids = _finished(q, 40)
    q.operator.set_retention("jobs", Retention(done_s=0.001), reason="the test archives everything")
    time.sleep(0.01)
    archive, home = tmp_path / "archive", tmp_path / "home"
    home.mkdir(mode=0o700)
    out = _sweeper(redis_server, q.keys.prefix, home, "--once", "--archive", str(archive),
                   prefix_cmd=("prlimit", "--fsize=4096", "--"))
    assert out.returncode == 0, out.stderr[-3000:]  # the sweeper did its pass; retention stopped, loudly
    assert "retention" in out.stderr and "nothing was deleted" in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert all(q.reads.task_states(ids).values()), "a task was deleted although its record was not written"
    assert _every_file_reads_whole(archive) == 0  # no torn file, and no file of the refused batch
    assert not [p for p in archive.rglob("*") if p.is_file()], list(archive.rglob("*"))  # the temporary file went
    # Without the limit the same pass archives and deletes; every record reads back.
    out = _sweeper(redis_server, q.keys.prefix, home, "--once", "--archive", str(archive), "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    assert sum(json.loads(out.stdout)["retired"].values()) == len(ids)
    assert not any(q.reads.task_states(ids).values())
    assert _every_file_reads_whole(archive) == len(ids)
    assert all(FileArchive(archive).find(t) is not None for t in ids)


@pytest.mark.parametrize("where", ["under-a-file", "read-only-mount"])
def test_an_archive_that_fails_stops_retention_never_the_sweeper(
        q: mc_queue.Client, redis_server: RedisServer, tmp_path: Path, where: str) -> None:
    ids = _finished(q, 5, size=100)
    q.operator.set_retention("jobs", Retention(done_s=0.001), reason="the test archives everything")
    if where == "under-a-file":
        (tmp_path / "file").write_text("not a folder")
        archive = tmp_path / "file" / "archive"
    else:
        src, archive = tmp_path / "src", tmp_path / "ro"
        src.mkdir()
        archive.mkdir()
        if subprocess.run(["mount", "--bind", str(src), str(archive)], capture_output=True).returncode != 0:
            pytest.skip("a read-only bind mount needs mount privileges (root)")
        subprocess.run(["mount", "-o", "remount,bind,ro", str(archive)], check=True)
    # A running Attempt with a short lease: the sweeper must still expire and reconcile it.
    running = q.producer.enqueue("jobs", "h", {"running": True})
    lease = q.leases.claim_attempt(running.id, "w-gone", 1000)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(home)
    log = open(tmp_path / "sweeper.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix",
                          q.keys.prefix, "sweeper", "--interval", "0.2", "--archive", str(archive)], cwd=REPO,
                         env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while q.reads.get_task(running.id).attempts[0].state.value not in ("succeeded", "failed", "canceled"):
            assert p.poll() is None, (tmp_path / "sweeper.log").read_text()[-3000:]
            assert time.monotonic() < deadline, q.reads.get_task(running.id).attempts[0].state
            time.sleep(0.1)
        time.sleep(0.5)
        assert p.poll() is None, (tmp_path / "sweeper.log").read_text()[-3000:]  # still sweeping
        assert all(q.reads.task_states(ids).values())  # nothing deleted unarchived
        text = (tmp_path / "sweeper.log").read_text()
        assert "retention is stopped" in text and "Traceback" not in text, text[-3000:]
        assert q.redis.hget(q.keys.sweeper, "retention_error")
        with pytest.raises(StaleFence):
            q.leases.complete_attempt(lease.attempt_id, lease.fence, {"late": True}, worker_id="w-gone")
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()
        if where == "read-only-mount":
            subprocess.run(["umount", str(archive)], check=False)


def test_a_damaged_member_of_an_earlier_archive_file_hides_no_later_record(tmp_path: Path) -> None:
    """The earlier layout appended one gzip member per batch to a day's file: a torn member (a write cut
    by a full disk) must not make the good members after it unreadable."""
    def rec(i: int) -> str:
        from mc_queue.contracts.packing import Packed
        t = ArchivedTask(task_id=f"jobs:01J0000000000000000000000{i}", queue="jobs", state="succeeded",
                         archived_at_ms=1, reason=REASON,
                         record=Packed(fields={"id": f"jobs:01J0000000000000000000000{i}", "state": "succeeded"},
                                       attempts={}, events=[], effects={}))
        return json.dumps(t.to_json()) + "\n"
    folder = tmp_path / "a" / "jobs"
    folder.mkdir(parents=True)
    good1, torn, good2 = gzip.compress(rec(1).encode()), gzip.compress(rec(2).encode()), gzip.compress(rec(3).encode())
    (folder / "2026-11-30.jsonl.gz").write_bytes(good1 + torn[: len(torn) // 2] + good2)
    found = [r.task_id[-1] for r in FileArchive(tmp_path / "a").records("jobs")]
    assert found == ["1", "3"]
    assert FileArchive(tmp_path / "a").find("jobs:01J00000000000000000000003") is not None


def test_an_audited_refusal_between_the_archive_and_the_delete_is_not_lost(q: mc_queue.Client, tmp_path: Path) -> None:
    """A stale write refused after the archive read the task and before retire deleted it: the task stays
    (retire sees it changed), and the next pass archives it with the refusal before deleting it."""
    task = q.producer.enqueue("jobs", "h", {"n": 1})
    lease = q.leases.claim_attempt(task.id, "w1", 60_000)
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="w1")
    rows = q.maintenance.ended_tasks("jobs", "done", before_ms=q.backend.redis_time_ms() + 1)
    archive = FileArchive(tmp_path / "a")

    class RefusalDuringWrite:
        """The archive's write, during which a zombie's late completion is refused (and audited)."""

        def write(self, tasks: list[ArchivedTask]) -> None:
            archive.write(tasks)
            with pytest.raises(mc_queue.WriteRefused):
                q.leases.complete_attempt(lease.attempt_id, lease.fence + 1, {"zombie": True}, worker_id="zombie")

    out = archive_and_retire(q, RefusalDuringWrite(), rows, states=["succeeded"], reason=REASON, tombstone_s=0,
                             now_ms=q.backend.redis_time_ms())
    assert out["retired"] == 0 and q.reads.task_states([task.id])[task.id] == "succeeded"
    out = archive_and_retire(q, archive, rows, states=["succeeded"], reason=REASON, tombstone_s=0,
                             now_ms=q.backend.redis_time_ms())
    assert out["retired"] == 1
    rec = archive.find(task.id)
    assert rec is not None and any(f.get("type") == "stale_write_refused" for _, f in rec.record.events)


def test_mcq_archive_show_reads_the_batch_files(q: mc_queue.Client, redis_server: RedisServer,
                                                tmp_path: Path) -> None:
    ids = _finished(q, 2, size=10)
    q.operator.set_retention("jobs", Retention(done_s=0.001), reason="the test archives everything")
    Sweeper(q, archive=FileArchive(tmp_path / "a")).run_once()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env["MCQ_HOME"] = str(tmp_path / "home")
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", redis_server.url, "--prefix", q.keys.prefix,
                          "archive", "show", ids[1], "--dir", str(tmp_path / "a"), "--json"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["task"]["id"] == ids[1]
    shutil.rmtree(tmp_path / "a")

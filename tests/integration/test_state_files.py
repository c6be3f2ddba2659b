"""Issue 15, "State files": what mc_queue keeps on disk (the lineage slot files under the state dir, the
embedded server's witness, its config, lock and pid files) is never written through a planted symlink,
lives in folders only this user can change (created 0700), and a state dir others can write to is
refused. Real Clients on a real redis-server, and the shipped CLI as a subprocess."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import mc_queue
from mc_queue.contracts.errors import ConfigurationError
from mc_queue.store.embedded import ensure_server, stop_server
from mc_queue.store.lineage import SlotStore
from mc_queue.testing import RedisServer, unique_prefix

REPO = Path(__file__).resolve().parents[2]


def _tracking(server: RedisServer) -> str:
    return f"{server.url}?track_replication=on"  # slot files are written only when replication is tracked


def _precious(tmp_path: Path, name: str = "precious.txt") -> Path:
    target = tmp_path / name
    target.write_text("keep me\n")
    return target


def test_state_files_a_symlink_planted_where_a_slot_file_goes_is_never_followed(
        redis_server: RedisServer, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    target = _precious(tmp_path)
    slots = SlotStore(state, prefix)
    slots.dir.mkdir(parents=True, mode=0o700)
    for d in (state, state / "lineage", slots.dir):
        os.chmod(d, 0o700)
    (slots.dir / "slot-000").symlink_to(target)
    caplog.set_level(logging.WARNING)
    with mc_queue.Client(_tracking(redis_server), prefix=prefix, state_dir=state) as q:
        q.producer.enqueue("q", "h", {"n": 1})
        assert q.backend.slot_error is None, q.backend.slot_error
    assert target.read_text() == "keep me\n", "an enqueue wrote through a symlink planted in the state dir"
    assert (slots.dir / "slot-000").is_symlink()
    assert any("slot-000" in r.getMessage() and "symbolic link" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert SlotStore(state, prefix).read_all().marks, "the watermark was not kept in another slot"


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770])
def test_state_files_a_state_dir_others_can_write_is_refused(redis_server: RedisServer, prefix: str,
                                                             tmp_path: Path, mode: int) -> None:
    state = tmp_path / "shared-state"
    state.mkdir()
    evil = tmp_path / "evil"
    evil.mkdir()
    (state / "lineage").symlink_to(evil)  # what another user could plant in a folder they may write to
    os.chmod(state, mode)
    with pytest.raises(ConfigurationError) as err:
        mc_queue.Client(_tracking(redis_server), prefix=prefix, state_dir=state)
    msg = str(err.value)
    assert "writable by" in msg and f"chmod go-w {state}" in msg and "MCQ_STATE_DIR" in msg, msg
    assert list(evil.iterdir()) == [] and stat.S_IMODE(state.stat().st_mode) == mode


def test_state_files_a_shared_state_dir_is_refused_by_the_cli(redis_server: RedisServer, tmp_path: Path) -> None:
    state = tmp_path / "shared-state"
    state.mkdir()
    os.chmod(state, 0o1777)  # MCQ_STATE_DIR=/tmp
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCQ_")}
    env.update(MCQ_HOME=str(tmp_path / "home"), MCQ_STATE_DIR=str(state))
    out = subprocess.run([sys.executable, "-m", "mc_queue", "--redis-url", _tracking(redis_server), "--prefix",
                          unique_prefix(), "enqueue", "h", "--app", "tests.apps.cli_app:app", "--payload", "{}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and "writable by" in out.stderr and "MCQ_STATE_DIR" in out.stderr
    assert list(state.iterdir()) == [], "mc_queue wrote into a state dir it refused"


def test_state_files_state_folders_mc_queue_creates_are_private_whatever_the_umask(
        redis_server: RedisServer, prefix: str, tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    old = os.umask(0)
    try:
        with mc_queue.Client(_tracking(redis_server), prefix=prefix, state_dir=state) as q:
            q.producer.enqueue("q", "h", {"n": 1})
            assert q.backend.slot_error is None, q.backend.slot_error
    finally:
        os.umask(old)
    slots = SlotStore(state, prefix)
    for d in (tmp_path / "new", state, state / "lineage", slots.dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, (d, oct(d.stat().st_mode))
    files = list(slots.dir.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)


def test_state_files_a_symlink_planted_where_the_witness_or_its_tmp_file_goes_is_never_followed(
        redis_server: RedisServer, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({prefix: "1700000000000.deadbeef"}))  # a witness that would say "lost"
    tmp_target = _precious(tmp_path)
    witness = home / "witness.json"
    witness.symlink_to(forged)
    (home / "witness.tmp").symlink_to(tmp_target)
    (home / "witness.json.tmp").symlink_to(tmp_target)
    caplog.set_level(logging.WARNING)
    with mc_queue.Client(redis_server.url, prefix=prefix, witness_path=witness) as q:
        task = q.producer.enqueue("q", "h", {"n": 1})  # a forged witness followed: the new namespace would be "lost"
        assert q.reads.namespace().state == "ok"
        epoch = q.reads.namespace().epoch
        assert q.reads.get_task(task.id).id == task.id
    assert tmp_target.read_text() == "keep me\n", "the witness's tmp file was written through a symlink"
    assert json.loads(forged.read_text()) == {prefix: "1700000000000.deadbeef"}
    assert witness.is_file() and not witness.is_symlink() and json.loads(witness.read_text()) == {prefix: epoch}
    assert stat.S_IMODE(witness.stat().st_mode) == 0o600
    assert any("witness.json" in r.getMessage() and "symbolic link" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


def test_state_files_the_embedded_server_never_writes_its_config_through_a_symlink(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    target = _precious(tmp_path)
    (home / "redis.conf").symlink_to(target)
    try:
        server = ensure_server(home)
        assert server.started and server.pid > 0
        assert target.read_text() == "keep me\n", "the embedded server's config was written through a symlink"
        conf = home / "redis.conf"
        assert conf.is_file() and not conf.is_symlink() and "appendfsync always" in conf.read_text()
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    finally:
        stop_server(home)


@pytest.mark.parametrize("name", [".lock", "redis"])
def test_state_files_the_embedded_server_refuses_a_symlinked_lock_or_data_folder(tmp_path: Path, name: str) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    target = _precious(tmp_path) if name == ".lock" else tmp_path / "elsewhere"
    if name == "redis":
        target.mkdir()
    (home / name).symlink_to(target)
    try:
        with pytest.raises(ConfigurationError, match="symbolic link"):
            ensure_server(home)
        if name == ".lock":
            assert target.read_text() == "keep me\n", "the lock file was truncated through a symlink"
        else:
            assert list(target.iterdir()) == [], "the server's data went through a symlink"
        assert not (home / "redis.sock").exists()
    finally:
        stop_server(home)

"""Workspaces owned per namespace and the home folder's rules, on the real filesystem (no Redis)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from mc_queue.contracts.errors import ConfigurationError
from mc_queue.contracts.keys import new_ulid
from mc_queue.store.embedded import prepare_home
from mc_queue.worker.workspace import WorkspaceError, WorkspaceRoot, default_root, namespace_tag


def test_names_carry_the_namespace_and_differ_between_namespaces(tmp_path: Path) -> None:
    a = WorkspaceRoot(tmp_path / "root", namespace="team-a")
    b = WorkspaceRoot(tmp_path / "root", namespace="team-b")
    aid = f"jobs:{new_ulid()}/3"
    assert a.name_for(aid) != b.name_for(aid)
    assert re.fullmatch(rf"task-{namespace_tag('team-a')}-{aid[5:31]}-3", a.name_for(aid))
    assert a.owns(a.name_for(aid)) and not b.owns(a.name_for(aid))
    assert namespace_tag("team-a") == namespace_tag("team-a") != namespace_tag("team-a.")


def test_cleanup_in_a_shared_root_removes_only_this_namespace_s_stale_workspaces(tmp_path: Path) -> None:
    root = tmp_path / "root"
    a = WorkspaceRoot(root, namespace="team-a")
    b = WorkspaceRoot(root, namespace="team-b")
    a_stale = a.create(f"jobs:{new_ulid()}/1")
    a_live = a.create(f"jobs:{new_ulid()}/1")
    b_any = b.create(f"jobs:{new_ulid()}/1")
    (b_any / "f.txt").write_text("b's work")
    legacy = root / f"task-{new_ulid()}-1"  # a name without a namespace (older mc_queue)
    legacy.mkdir()

    report = a.cleanup_stale(keep=lambda: {a_live.name})
    assert report.removed == [a_stale.name]
    assert report.others == [b_any.name]
    assert [name for name, _ in report.refused] == [legacy.name]
    assert a_live.is_dir() and (b_any / "f.txt").read_text() == "b's work" and legacy.is_dir()
    with pytest.raises(WorkspaceError):
        a.remove(b_any)  # never through another namespace's name
    assert b_any.is_dir()

    # B's own cleanup with nothing kept removes B's, and leaves A's live one.
    again = b.cleanup_stale()
    assert again.removed == [b_any.name] and again.others == [a_live.name]


def test_an_invalid_namespace_is_refused(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", "a b"):
        with pytest.raises(WorkspaceError):
            WorkspaceRoot(tmp_path / "r", namespace=bad)
        with pytest.raises(WorkspaceError):
            default_root(bad, tmp_path / "home")


def test_the_default_root_is_under_home_per_prefix(tmp_path: Path) -> None:
    assert default_root("team-a", tmp_path / "home") == (tmp_path / "home").resolve() / "workspaces" / "team-a"
    assert stat.S_IMODE((tmp_path / "home").stat().st_mode) == 0o700


def test_a_home_mc_queue_creates_is_700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        home = prepare_home(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o700, 0o1755])
def test_an_existing_home_others_cannot_write_is_used_as_it_is(tmp_path: Path, mode: int) -> None:
    home = tmp_path / "mine"
    home.mkdir()
    os.chmod(home, mode)
    assert prepare_home(home) == home.resolve()
    assert stat.S_IMODE(home.stat().st_mode) == mode


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o775, 0o770, 0o703, 0o1733])
def test_a_home_its_group_or_others_can_write_is_refused_and_left_as_it_is(tmp_path: Path, mode: int) -> None:
    home = tmp_path / "shared"
    home.mkdir()
    os.chmod(home, mode)
    with pytest.raises(ConfigurationError) as err:
        prepare_home(home)
    msg = str(err.value)
    assert "writable by" in msg and f"chmod go-w {home.resolve()}" in msg and "MCQ_HOME" in msg
    assert stat.S_IMODE(home.stat().st_mode) == mode
    assert list(home.iterdir()) == []


def test_a_home_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigurationError, match="not a directory"):
        prepare_home(f)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_state_files_a_home_another_user_owns_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "theirs"
    home.mkdir(mode=0o755)
    os.chown(home, 4242, 4242)  # mode 755, but its owner (not us) may plant anything there
    with pytest.raises(ConfigurationError, match="owned by uid 4242"):
        prepare_home(home)


def test_a_workspace_root_shared_by_two_redis_servers_names_carry_the_namespace_epoch(tmp_path: Path) -> None:
    here = WorkspaceRoot(tmp_path / "root", namespace="team-a", epoch="1796155584988539.28c15191")
    there = WorkspaceRoot(tmp_path / "root", namespace="team-a", epoch="1796155590000000.0a1b2c3d")
    legacy = WorkspaceRoot(tmp_path / "root", namespace="team-a")
    aid = f"jobs:{new_ulid()}/1"
    names = {here.name_for(aid), there.name_for(aid), legacy.name_for(aid)}
    assert len(names) == 3 and not here.owns(there.name_for(aid)) and not here.owns(legacy.name_for(aid))
    theirs = there.create(aid)
    report = here.cleanup_stale()
    assert report.removed == [] and report.others == [theirs.name] and theirs.is_dir()
    for bad in ("", "x", "1.", "1.a/b", "../1.a"):
        with pytest.raises(WorkspaceError, match="epoch"):
            WorkspaceRoot(tmp_path / "root", namespace="team-a", epoch=bad)

"""Fixtures of the reliability-control tests: a provider that counts what reaches it, and a harness whose
worker processes run ``tests.apps.controls_app`` against it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mc_queue.testing import ForgeServer, RedisServer
from tests.harness import Harness


@pytest.fixture
def forge() -> Iterator[ForgeServer]:
    with ForgeServer() as server:
        yield server


@pytest.fixture
def controls(redis_server: RedisServer, prefix: str, tmp_path: Path, forge: ForgeServer,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("MCQ_TEST_FORGE", forge.url)
    harness = Harness(redis_server, prefix, tmp_path / "home", {"MCQ_TEST_FORGE": forge.url})
    try:
        yield harness
    finally:
        harness.close()

"""Shared fixtures: a redis-server started by this test session (never the machine's 6379)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mc_queue
from mc_queue.testing import RedisServer, unique_prefix


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session (AOF, appendfsync always). Tests isolate by prefix."""
    server = RedisServer(tmp_path_factory.mktemp("redis-shared"))
    with server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone: for tests that restart, kill or pause it."""
    server = RedisServer(tmp_path / "redis")
    with server:
        yield server


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
def q(redis_server: RedisServer, prefix: str) -> Iterator[mc_queue.Client]:
    client = mc_queue.connect(redis_server.url, prefix=prefix)
    yield client
    client.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The house's sizes, so the figure stays visible (tests/unit/test_sizes.py holds the limits)."""
    from tests.unit.test_sizes import summary

    terminalreporter.section("sizes")
    for line in summary():
        terminalreporter.write_line(line)

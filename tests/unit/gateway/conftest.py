"""A real redis-server for the gateway's unit tests that need one (limits, budgets, runtime
keys): one per module, emptied and answering before each test. Each test runs in its own
directory, so that a runtime's default files store (./data/files, where the memory backend
keeps spend) is the test's own, not a later test's or the checkout's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_proc import RedisServer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis(redis_server: RedisServer) -> RedisServer:
    """The module's server, back up if a test paused or killed it, and empty."""
    if not redis_server.answers():
        redis_server.resume()
        if not redis_server.answers():
            redis_server.start()
    redis_server.command("FLUSHALL")
    return redis_server


@pytest.fixture(autouse=True)
def own_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

"""A batch's lease, in the file store and in a real redis-server: one holder at a time, kept by
renewing, taken over once it lapses, released only by its holder; a Redis that stops answering
leaves a lease its holder's until its term ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.jobs.filestore import FileStore
from gateway.jobs.leases import Leases, RedisLeases, StoreLeases, leases_for
from gateway.ratelimit import RateLimitConfig
from tests.redis_proc import RedisServer

NAME = "owner/batch_0001"
LAPSE_S = 0.05
DEADLINE_S = 5.0


@pytest.fixture(params=["store", "redis"])
async def leases(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[Leases]:
    files = FileStore(str(tmp_path), max_bytes=10)
    if request.param == "redis":
        redis_server.command("FLUSHALL")
        made = leases_for(RateLimitConfig(backend="redis", redis_url=redis_server.url), files)
        assert isinstance(made, RedisLeases)
    else:
        made = leases_for(RateLimitConfig(), files)
        assert isinstance(made, StoreLeases)
    yield made
    await made.aclose()


async def taken_over(leases: Leases, holder: str) -> bool:
    """Whether `holder` gets the lease once the one it waits on has lapsed."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if await leases.claim(NAME, holder, ttl_s=60):
            return True
        await asyncio.sleep(LAPSE_S / 5)
    return False


@pytest.mark.asyncio
async def test_one_holder_until_the_lease_lapses(leases: Leases) -> None:
    assert await leases.claim(NAME, "a", ttl_s=60)
    assert await leases.claim(NAME, "a", ttl_s=60)  # its own lease
    assert not await leases.claim(NAME, "b", ttl_s=60)
    assert not await leases.claim(NAME, "b", ttl_s=60)
    assert not await leases.renew(NAME, "b", ttl_s=60)
    assert await leases.claim("owner/batch_0002", "b", ttl_s=60)  # another batch: free
    assert await leases.renew(NAME, "a", ttl_s=LAPSE_S)  # a stops renewing: it lapses
    assert await taken_over(leases, "b")
    assert not await leases.renew(NAME, "a", ttl_s=60)
    await leases.release(NAME, "a")  # not a's any more: it stays b's
    assert not await leases.claim(NAME, "c", ttl_s=60)
    await leases.release(NAME, "b")
    assert await leases.claim(NAME, "c", ttl_s=60)


@pytest.mark.asyncio
async def test_a_silent_redis_leaves_the_lease_to_its_holder_for_its_term(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    redis_server.command("FLUSHALL")
    config = RateLimitConfig(backend="redis", redis_url=redis_server.url)
    leases = RedisLeases(config)
    try:
        assert await leases.claim(NAME, "a", ttl_s=60)
        redis_server.pause()
        try:
            assert await leases.renew(NAME, "a", ttl_s=60)  # unknown: still a's for its term
            assert not await leases.claim("owner/batch_0002", "a", ttl_s=60)
        finally:
            redis_server.resume()
        assert await leases.claim(NAME, "a", ttl_s=LAPSE_S)
        assert not await leases.claim(NAME, "b", ttl_s=60)
        redis_server.pause()
        try:
            await asyncio.sleep(LAPSE_S * 2)  # the term ends while nothing can be asked
            assert not await leases.renew(NAME, "a", ttl_s=60)
        finally:
            redis_server.resume()
    finally:
        await leases.aclose()

"""The Redis backend: one key per entry with its TTL, the entry compressed; shared by every
replica. Entries' keys are also in one sorted set by expiry, which counts them.

The client has no retries and short timeouts, and after a failure Redis is left alone for a
second: a dead Redis costs a request at most one timeout, then nothing, and the request is
served uncached (the caller never sees the failure; the metrics count it)."""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.config.caching import MAX_TTL_S, CacheConfig

COOLDOWN_S = 1.0  # after a failure, calls fail at once for this long
COUNT_EVERY_S = 5.0  # expired keys leave the count this often (a put that finds it due)
POOL_SIZE = 32
LEVEL = 1  # zlib's fastest: answers are text, which it halves already


class BackendDown(Exception):
    """Redis did not answer (or is being left alone after it did not)."""


class RedisStore:
    name = "redis"

    def __init__(self, cfg: CacheConfig, url: str, cluster: bool) -> None:
        self._timeout = cfg.timeout_ms / 1000
        self._client = _connect(url, cluster, self._timeout)
        self._prefix = cfg.key_prefix
        self._index = cfg.key_prefix + "index"
        self._limit = cfg.max_entry_bytes
        self._down_until = 0.0
        self._counted_at = 0.0

    async def get(self, key: bytes) -> bytes | None:
        """The entry's bytes; None when there is none (or it is not one this gateway reads)."""
        data = await self._call(self._client.get(self._prefix + key.hex()))
        return None if data is None else _inflated(data, self._limit)

    async def put(self, key: bytes, data: bytes, ttl_s: int) -> int | None:
        """The entry kept for ttl_s; the number of entries, when it was counted."""
        name, now = self._prefix + key.hex(), time.time()
        pipe = self._client.pipeline(transaction=False)
        pipe.set(name, zlib.compress(data, LEVEL), ex=ttl_s)
        pipe.zadd(self._index, {name: now + ttl_s})
        counting = now - self._counted_at >= COUNT_EVERY_S
        if counting:
            pipe.zremrangebyscore(self._index, "-inf", now)
            pipe.zcard(self._index)
            pipe.expire(self._index, MAX_TTL_S)
        replies = await self._call(pipe.execute())
        if not counting:
            return None
        self._counted_at = now
        return int(replies[3])

    async def _call(self, call: Any) -> Any:
        if time.monotonic() < self._down_until:
            call.close()  # the coroutine is never awaited: say so, quietly
            raise BackendDown("left alone after a failure")
        try:
            async with asyncio.timeout(self._timeout * 2):  # a connection, then the call
                return await call
        except (aioredis.RedisError, OSError, TimeoutError) as exc:
            self._down_until = time.monotonic() + COOLDOWN_S
            raise BackendDown(str(exc)) from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def _connect(url: str, cluster: bool, timeout: float) -> Any:
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if cluster:
        return aioredis.RedisCluster.from_url(url, max_connections=POOL_SIZE, **common)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=POOL_SIZE, timeout=timeout, **common
    )
    return aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))


def _inflated(data: bytes, limit: int) -> bytes | None:
    """The entry, inflated to at most `limit` bytes: anything else is not one of ours."""
    inflate = zlib.decompressobj()
    try:
        out = inflate.decompress(data, limit + 1)
    except zlib.error:
        return None
    if len(out) > limit or inflate.unconsumed_tail or not inflate.eof:
        return None
    return out

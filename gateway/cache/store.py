"""The cache as the pipeline uses it: entries got and put on the configured backend, and the
flights that collapse identical misses in this process (the first one calls the upstream; the
others wait for its entry)."""

from __future__ import annotations

import asyncio
import time

from gateway.cache.entries import Entry, decode
from gateway.cache.memory import MemoryBackend
from gateway.cache.redis_store import BackendDown, RedisStore
from gateway.config.caching import CacheConfig
from gateway.metrics import Metrics


class Cache:
    def __init__(
        self,
        cfg: CacheConfig,
        metrics: Metrics,
        redis_url: str,
        cluster: bool = False,
        memory: MemoryBackend | None = None,
    ) -> None:
        self.config = cfg
        self.where = (redis_url, cluster)  # the Redis it uses, when it does
        self._metrics = metrics
        self._memory: MemoryBackend | None = None
        self._redis: RedisStore | None = None
        if cfg.backend == "redis":
            self._redis = RedisStore(cfg, cfg.redis_url or redis_url, cluster)
        else:
            self._memory = memory or MemoryBackend(cfg.max_entries, cfg.max_bytes)
        # key → the entry its first miss will put, encoded (None: it made none): each waiter
        # decodes its own copy. One flight per key at once.
        self.flights: dict[bytes, asyncio.Future[bytes | None]] = {}

    async def get(self, key: bytes, max_age_s: float) -> Entry | None:
        """The key's entry if it is at most max_age_s old; None otherwise, and when the backend
        could not answer (counted)."""
        now = time.time()
        if self._memory is not None:
            data = self._memory.get(key, now)
        else:
            assert self._redis is not None
            try:
                data = await self._redis.get(key)
            except BackendDown:
                self._metrics.cache_backend_error("get")
                return None
        entry = None if data is None else decode(data)
        if entry is None or now - entry.stored_at > max_age_s:
            return None
        return entry

    async def put(self, key: bytes, entry: Entry, ttl_s: int) -> bytes | None:
        """The entry kept for ttl_s, and returned encoded; None when it was not (too large, or
        the backend failed)."""
        data = entry.encode()
        if len(data) > self.config.max_entry_bytes:
            return None
        if self._memory is not None:
            self._memory.put(key, data, entry.stored_at + ttl_s)
            self._metrics.cache_entries("memory", len(self._memory))
            return data
        assert self._redis is not None
        try:
            counted = await self._redis.put(key, data, ttl_s)
        except BackendDown:
            self._metrics.cache_backend_error("put")
            return None
        if counted is not None:
            self._metrics.cache_entries("redis", counted)
        return data

    def join(self, key: bytes) -> asyncio.Future[bytes | None] | None:
        """The flight under way for `key`, to wait on; None: there was none, and the caller
        now leads one, which it must `land`."""
        flight = self.flights.get(key)
        if flight is None:
            self.flights[key] = asyncio.get_running_loop().create_future()
        return flight

    def land(self, key: bytes, made: bytes | None) -> None:
        """The flight over: its waiters get the entry it made (None: they call the upstream)."""
        flight = self.flights.pop(key, None)
        if flight is not None and not flight.done():
            flight.set_result(made)

    def adapted(self, cfg: CacheConfig, redis_url: str, cluster: bool) -> Cache:
        """The cache for a reloaded config: this one while its settings hold; a memory cache
        under new bounds keeps its entries."""
        if cfg == self.config and (redis_url, cluster) == self.where:
            return self
        memory = self._memory
        if cfg.backend == "memory" and memory is not None:
            memory = memory.bounded(cfg.max_entries, cfg.max_bytes)
        successor = Cache(cfg, self._metrics, redis_url, cluster, memory)
        successor.flights = self.flights
        return successor

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

"""Who runs a batch: a lease per batch, held by one runner (of one process, of one replica) at a
time, renewed while it runs, lapsing when its holder stops renewing (a process killed) so that
another runner takes the batch over.

With the `redis` rate-limit backend the leases are Redis keys (SET NX PX, renewed and released
only by their holder, checked atomically on the server): the replicas of a scaled-out gateway
share them. Otherwise they are objects in the file store, created only if absent: enough for the
processes of one machine, and for object stores with conditional writes.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Protocol

import obstore
import orjson
from obstore.exceptions import AlreadyExistsError
from redis.exceptions import RedisError

from gateway.jobs.filestore import FileStore
from gateway.ratelimit import RateLimitConfig
from gateway.ratelimit.redis_backend import connect, drop_connections

LEASE_TIMEOUT_S = 1.0  # per Redis call: a lease is not on any request's path
# The holder's own key, extended or deleted: never another holder's (KEYS[1], ARGV holder, ms).
RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
)
RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


class Leases(Protocol):
    """`name`: what is leased (a batch: its owner and id)."""

    async def claim(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take the lease unless another holder's is good; True if `holder` has it now."""
        ...

    async def renew(self, name: str, holder: str, ttl_s: float) -> bool:
        """Keep it for `ttl_s` more; False if another holder has it now."""
        ...

    async def release(self, name: str, holder: str) -> None: ...

    async def aclose(self) -> None: ...


def leases_for(rate_limit: RateLimitConfig, files: FileStore) -> Leases:
    if rate_limit.backend == "redis":
        return RedisLeases(rate_limit)
    return StoreLeases(files)


class RedisLeases:
    def __init__(self, cfg: RateLimitConfig) -> None:
        self._client = connect(cfg, LEASE_TIMEOUT_S)
        self._prefix = "{" + cfg.key_prefix + "}:batch-lease:"
        self._renew = self._client.register_script(RENEW)
        self._release = self._client.register_script(RELEASE)
        self._until: dict[str, float] = {}  # what each lease held here was last renewed to

    async def claim(self, name: str, holder: str, ttl_s: float) -> bool:
        try:
            taken = await self._client.set(self._prefix + name, holder, nx=True, px=_ms(ttl_s))
            if not taken:
                taken = await self._client.get(self._prefix + name) == holder.encode()
        except RedisError:
            await drop_connections(self._client)
            return False  # not now: the runner looks again at its next poll
        if taken:
            self._until[name] = time.monotonic() + ttl_s
        return bool(taken)

    async def renew(self, name: str, holder: str, ttl_s: float) -> bool:
        try:
            kept = await self._renew(keys=[self._prefix + name], args=[holder, _ms(ttl_s)])
        except RedisError:
            await drop_connections(self._client)
            # Unknown: the lease is still ours until its term ends, then it may be another's.
            return time.monotonic() < self._until.get(name, 0.0)
        if kept:
            self._until[name] = time.monotonic() + ttl_s
        return bool(kept)

    async def release(self, name: str, holder: str) -> None:
        self._until.pop(name, None)
        try:
            await self._release(keys=[self._prefix + name], args=[holder])
        except RedisError:  # it lapses by itself
            await drop_connections(self._client)

    async def aclose(self) -> None:
        await self._client.aclose()
        await drop_connections(self._client)


class StoreLeases:
    """A lease object per batch beside its record: `{"holder", "until"}` (Unix time)."""

    def __init__(self, files: FileStore) -> None:
        self.files = files

    async def claim(self, name: str, holder: str, ttl_s: float) -> bool:
        path, lease = _path(name), _lease(holder, ttl_s)
        for _ in range(2):
            try:
                await obstore.put_async(self.files.store, path, lease, mode="create")
                return True
            except AlreadyExistsError:
                held = await self._held(path)
                if held is not None and (held["holder"] == holder or held["until"] > time.time()):
                    return bool(held["holder"] == holder)
                with contextlib.suppress(FileNotFoundError):
                    await obstore.delete_async(self.files.store, path)  # lapsed: take it
        return False

    async def renew(self, name: str, holder: str, ttl_s: float) -> bool:
        held = await self._held(_path(name))
        if held is None or held["holder"] != holder:
            return False
        await obstore.put_async(self.files.store, _path(name), _lease(holder, ttl_s))
        return True

    async def release(self, name: str, holder: str) -> None:
        held = await self._held(_path(name))
        if held is not None and held["holder"] == holder:
            with contextlib.suppress(FileNotFoundError):
                await obstore.delete_async(self.files.store, _path(name))

    async def aclose(self) -> None:
        return None

    async def _held(self, path: str) -> dict[str, Any] | None:
        try:
            found = await obstore.get_async(self.files.store, path)
        except FileNotFoundError:
            return None
        held: dict[str, Any] = orjson.loads(bytes(await found.bytes_async()))
        return held


def _path(name: str) -> str:
    return f"batches/{name}.lease"


def _lease(holder: str, ttl_s: float) -> bytes:
    return orjson.dumps({"holder": holder, "until": time.time() + ttl_s})


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))

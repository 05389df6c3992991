"""The runtime keys and teams in the rate limiter's Redis (same URL, cluster and prefix): two
hashes of JSON records and a version, all under the `{key_prefix}` hash tag (one slot).

The version is "<epoch>:<count>": every change counts up in the same script that writes it,
and a Redis that lost its data starts a new epoch, so a replica never takes an emptied Redis
for the version it last read. Each change is one script that writes only if the version is
still the one its caller decided on (compare-and-set); a read is one script too, so it sees
one version whole.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable
from typing import TypeVar

import orjson

from gateway.governance.storage import Changes, Snapshot
from gateway.ratelimit import RateLimitConfig
from gateway.ratelimit.redis_backend import connect, drop_connections

T = TypeVar("T")
TIMEOUT_S = 1.0  # per call: the admin API and the poll, never a request's path

# KEYS: the version, the keys' hash, the teams' hash. ARGV: the version the change was decided
# on, an epoch for a Redis that has none, then for each hash its count of changes and their
# (id, record) pairs, an empty record deleting. Returns the new version, or '' if stale.
COMMIT = """
local seen = redis.call('GET', KEYS[1]) or ''
if seen ~= ARGV[1] then return '' end
local i = 3
for h = 2, 3 do
  local count = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, count do
    if ARGV[i + 1] == '' then
      redis.call('HDEL', KEYS[h], ARGV[i])
    else
      redis.call('HSET', KEYS[h], ARGV[i], ARGV[i + 1])
    end
    i = i + 2
  end
end
local epoch, n = string.match(seen, '^(.*):(%d+)$')
if not epoch then epoch, n = ARGV[2], 0 end
local now = epoch .. ':' .. (tonumber(n) + 1)
redis.call('SET', KEYS[1], now)
return now
"""
SNAPSHOT = """
return {redis.call('GET', KEYS[1]) or '', redis.call('HGETALL', KEYS[2]),
        redis.call('HGETALL', KEYS[3])}
"""


class RedisStorage:
    def __init__(self, cfg: RateLimitConfig) -> None:
        self.where = f"Redis ({'cluster ' if cfg.cluster else ''}{cfg.redis_url})"
        self._client = connect(cfg, TIMEOUT_S)
        tag = "{" + cfg.key_prefix + "}:accounts:"
        self._keys = [tag + "version", tag + "keys", tag + "teams"]
        self._commit = self._client.register_script(COMMIT)
        self._snapshot = self._client.register_script(SNAPSHOT)

    async def version(self) -> str:
        return _text(await self._call(self._client.get(self._keys[0])))

    async def load(self) -> Snapshot:
        version, keys, teams = await self._call(self._snapshot(keys=self._keys))
        return Snapshot(_text(version), _records(keys), _records(teams))

    async def commit(self, base: Snapshot, changes: Changes) -> str | None:
        args: list[str | bytes] = [base.version, secrets.token_hex(4)]
        for table in (changes.keys, changes.teams):
            args.append(str(len(table)))
            for name, record in table.items():
                args += (name, b"" if record is None else orjson.dumps(record))
        version = _text(await self._call(self._commit(keys=self._keys, args=args)))
        return version or None

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except BaseException:
            await drop_connections(self._client)  # a restarted Redis: open fresh ones next
            raise

    async def aclose(self) -> None:
        await self._client.aclose()
        await drop_connections(self._client)


def _text(v: bytes | str | None) -> str:
    return v.decode() if isinstance(v, bytes) else (v or "")


def _records(flat: list[bytes]) -> dict[str, object]:
    """HGETALL's flat reply from a script: name, value, name, value…"""
    return {flat[i].decode(): _parsed(flat[i + 1]) for i in range(0, len(flat), 2)}


def _parsed(record: bytes) -> object:
    """A record's JSON; one that is not JSON stays text (and is left out when read)."""
    try:
        parsed: object = orjson.loads(record)
    except orjson.JSONDecodeError:
        return record.decode(errors="replace")
    return parsed

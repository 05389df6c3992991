"""The runtime keys and teams (made through the admin API, gateway.api.admin): kept where the
rate limits are shared (Redis) or, on the memory backend, in the files store, and seen by every
process within a poll (every POLL_S) of a change.

`Accounts` holds the set this process last read (`current`) and tells its listener (the
runtime in use: gateway.runtime) whenever it changes, by a poll or by a change made here. A
change (`change`) is decided on the newest set and written only if nothing changed meanwhile;
otherwise it is decided again on what is there now. When the storage cannot answer, admin
calls are a 503 and the last set read stays in use: a key is never refused because Redis is
down.

It outlives a config reload (gateway.reload.handover) while the storage's settings are the
same; a key or team id in both the YAML and this store is refused at start and at reload.
In Redis, the keys last as long as Redis keeps its data: a Redis for them persists (RDB or
AOF) and evicts no key without a TTL (maxmemory-policy noeviction or volatile-*).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from core.errors import ConfigError, GatewayError, ServiceUnavailable
from gateway.config import Config, KeyConfig, TeamConfig
from gateway.governance import records
from gateway.governance.file_storage import FileStorage
from gateway.governance.redis_storage import RedisStorage
from gateway.governance.storage import Changes, Snapshot, Storage

log = logging.getLogger("gateway.governance")
T = TypeVar("T")
POLL_S = 0.25
CHANGE_S = 5.0  # how long a change is decided again while other changes keep coming first
BACKOFF_S = 0.005  # the first wait before deciding again, doubled each time up to 0.2 s


@dataclass(frozen=True, slots=True)
class AccountSet:
    """The runtime keys and teams at one version of the store."""

    version: str = ""
    keys: Mapping[str, KeyConfig] = field(default_factory=dict)
    teams: Mapping[str, TeamConfig] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Edit(Generic[T]):
    """A change decided on one set: what to write, and what the caller gets once it is."""

    keys: Mapping[str, KeyConfig | None]
    teams: Mapping[str, TeamConfig | None]
    result: T


Listener = Callable[[AccountSet], None]


def storage_for(config: Config) -> Storage:
    if config.rate_limit.backend == "redis":
        return RedisStorage(config.rate_limit)
    return FileStorage(config.files.store)


def storage_settings(config: Config) -> tuple[object, ...]:
    """What decides where the store is: the same settings keep the running store on reload."""
    r = config.rate_limit
    if r.backend == "redis":
        return ("redis", r.redis_url, r.cluster, r.key_prefix)
    return ("files", config.files.store)


class Accounts:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.current = AccountSet()
        self._snapshot: Snapshot | None = None  # None: never read
        self._listener: Listener | None = None
        self._lock = asyncio.Lock()  # one read or change at a time: sets adopted in order
        self._poller: asyncio.Task[None] | None = None
        self._down = False

    @classmethod
    def for_config(cls, config: Config) -> Accounts:
        return cls(storage_for(config))

    def listen(self, listener: Listener) -> None:
        """`listener` hears every new set from now on (one listener: the runtime in use)."""
        self._listener = listener

    async def start(self) -> None:
        """Read the set (a storage that cannot answer: none yet, read at a later poll), then
        poll."""
        if self._poller is not None:
            return
        with contextlib.suppress(ServiceUnavailable):
            await self.sync()
        self._poller = asyncio.create_task(self._poll())

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        await self.storage.aclose()

    # ------------------------------------------------------------ reading

    async def sync(self) -> AccountSet:
        """The newest set (read again if it moved), or a 503."""
        async with self._lock:
            await self._refresh()
        return self.current

    async def _refresh(self) -> None:
        try:
            version = await self.storage.version()
            if self._snapshot is None or version != self._snapshot.version:
                self._adopt(await self.storage.load())
        except Exception as exc:  # any failure of the storage: the last set stays in use
            self._failed(exc)
            raise ServiceUnavailable(
                f"The store of runtime keys and teams, {self.storage.where}, could not answer "
                f"({type(exc).__name__}); try again shortly."
            ) from None
        if self._down:
            self._down = False
            log.warning("the store of runtime keys and teams answers again")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            with contextlib.suppress(ServiceUnavailable):
                await self.sync()

    def _failed(self, exc: Exception) -> None:
        if not self._down:
            self._down = True
            log.warning(
                "the store of runtime keys and teams, %s, cannot be read (%s: %s): the keys "
                "read last stay in use",
                self.storage.where,
                type(exc).__name__,
                exc,
            )

    def _adopt(self, snapshot: Snapshot) -> None:
        before, known = self._snapshot or Snapshot(), self.current
        self._snapshot = snapshot
        self.current = AccountSet(
            snapshot.version,
            _decoded(snapshot.keys, records.key_from_record, before.keys, known.keys),
            _decoded(snapshot.teams, records.team_from_record, before.teams, known.teams),
        )
        if self._listener is not None:
            self._listener(self.current)

    # ------------------------------------------------------------ changing

    async def change(self, decide: Callable[[AccountSet], Edit[T]]) -> T:
        """Decide a change on the newest set and write it, deciding again if another change
        came first. `decide` raises the caller's refusals (a 404, 409, …)."""
        async with self._lock:
            clock = asyncio.get_running_loop().time
            deadline, wait = clock() + CHANGE_S, BACKOFF_S
            while True:
                await self._refresh()
                assert self._snapshot is not None
                base = self._snapshot
                edit = decide(self.current)
                changes = _encoded(edit)
                version = await self._commit(base, changes)
                if version is not None:
                    self._adopt(base.applied(changes, version))
                    return edit.result
                if clock() >= deadline:
                    raise ServiceUnavailable(
                        "Other changes to the keys and teams keep coming first; retry."
                    )
                # replicas that lost together do not all try again at once
                await asyncio.sleep(random.uniform(0, wait))
                wait = min(wait * 2, 0.2)

    async def _commit(self, base: Snapshot, changes: Changes) -> str | None:
        try:
            return await self.storage.commit(base, changes)
        except GatewayError:
            raise
        except Exception as exc:
            self._failed(exc)
            raise ServiceUnavailable(
                f"The store of runtime keys and teams, {self.storage.where}, could not take the "
                f"change ({type(exc).__name__}); try again shortly."
            ) from None

    # ------------------------------------------------------------ the YAML beside it

    def check(self, config: Config) -> None:
        """A ConfigError naming the YAML path of an id this store holds too, or of a team that
        runtime keys still belong to."""
        clash(config, self.current)


def clash(config: Config, current: AccountSet) -> None:
    for i, k in enumerate(config.keys):
        if k.id in current.keys:
            raise ConfigError(
                f"auth.keys[{i}].id",
                f"the key '{k.id}' is a runtime key too (made through the admin API): rename "
                "one of them, or delete the runtime key first",
            )
    for team in config.teams:
        if team in current.teams:
            raise ConfigError(
                f"teams.{team}",
                f"the team '{team}' is a runtime team too (made through the admin API): rename "
                "one of them, or delete the runtime team first",
            )
    for k in current.keys.values():
        if k.team is not None and k.team not in config.teams and k.team not in current.teams:
            raise ConfigError(
                f"teams.{k.team}",
                f"runtime keys still belong to the team '{k.team}' (the key '{k.id}'): move or "
                "delete them first",
            )


def _decoded(
    found: Mapping[str, object],
    read: Callable[[str, Mapping[str, object]], T],
    before: Mapping[str, object],
    known: Mapping[str, T],
) -> dict[str, T]:
    """Every record this process can read (one unchanged since the set `before`: as it was
    read then); one it cannot (a newer gateway's, a damaged one) is left out, and said."""
    out: dict[str, T] = {}
    for name, record in found.items():
        if name in known and before.get(name) == record:
            out[name] = known[name]
            continue
        try:
            if not isinstance(record, Mapping):
                raise TypeError(f"a record is an object, not {type(record).__name__}")
            out[name] = read(name, record)
        except (ConfigError, KeyError, ValueError, TypeError) as exc:
            log.error("runtime key or team %r cannot be read, left out: %s", name, exc)
    return out


def _encoded(edit: Edit[T]) -> Changes:
    return Changes(
        {n: None if k is None else records.key_record(k) for n, k in edit.keys.items()},
        {n: None if t is None else records.team_record(t) for n, t in edit.teams.items()},
    )

"""The runtime that follows a reloaded config, built around the running one's parts: the same
metrics and circuit breakers, the same rate limiter while `rate_limit` is unchanged (its counts
go on), the same store of runtime keys and teams while where it is kept is unchanged, and the
running provider of every provider block that is unchanged (its connections go on). What the
new runtime adds is started before the swap; what it drops (`Leftovers`) closes once the old
runtime's requests are over.

A reload is refused (ConfigError, naming the YAML path) when a changed or new provider cannot be
built beside the running one (`Provider.reloadable`) or fails to start, and when a key or team
id it names is a runtime one too (made through the admin API), or it drops a team that runtime
keys belong to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace

from core.errors import ConfigError
from core.provider import Provider
from gateway.cache.store import Cache
from gateway.config import Config
from gateway.governance.store import Accounts, storage_settings
from gateway.observability.logfile import LogFile
from gateway.observability.tracing import Tracing
from gateway.ratelimit import Limiter
from gateway.runtime import Build, Runtime, build_provider, new_limiter, new_tracing, release

# Read once when the server starts: a reload keeps the running values until a restart.
PINNED: tuple[tuple[str, Callable[[Config], object]], ...] = (
    ("server.host", lambda c: c.server.host),
    ("server.port", lambda c: c.server.port),
    # the listener's limits: uvicorn's Config and each connection's protocol took them at start
    ("server.max_head_bytes", lambda c: c.server.max_head_bytes),
    ("server.max_headers", lambda c: c.server.max_headers),
    ("server.max_connections", lambda c: c.server.max_connections),
    ("server.timeouts", lambda c: c.server.timeouts),
    # which files the listener's TLS reads; what they hold is read again when it changes, in
    # each serving process (gateway.server.tls): renewing a certificate needs no reload
    ("server.tls", lambda c: c.server.tls),
    ("metrics", lambda c: c.metrics),  # its listener, its key, its renders' interval
)
# Config fields the reload's log line names as YAML sections; providers are reported apart.
SECTION_NAMES = {"keys": "auth.keys", "circuits": "circuit_breaker"}
NOT_SECTIONS = ("providers", "source")


@dataclass(slots=True)
class Leftovers:
    """What the old runtime used and the new one does not."""

    providers: list[Provider]
    limiter: Limiter | None
    accounts: Accounts | None = None
    request_log: LogFile | None = None  # the old runtime's: every runtime opens its own
    tracing: Tracing | None = None  # the old runtime's, when `telemetry` changed
    cache: Cache | None = None  # the old runtime's, when `cache` moved it elsewhere

    def __bool__(self) -> bool:
        return (
            bool(self.providers)
            or self.limiter is not None
            or self.accounts is not None
            or self.request_log is not None
            or self.tracing is not None
            or self.cache is not None
        )

    async def aclose(self) -> None:
        await release(self.providers, self.limiter, self.accounts)
        if self.request_log is not None:
            await self.request_log.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()
        if self.cache is not None:
            await self.cache.aclose()


@dataclass(frozen=True, slots=True)
class Handover:
    runtime: Runtime
    leftovers: Leftovers
    changed: tuple[str, ...]  # sections whose values changed (coarse: never a value)
    rebuilt: tuple[str, ...]  # providers built anew: changed or added blocks
    removed: tuple[str, ...]  # providers no longer configured
    pinned: tuple[str, ...]  # changed settings that wait for a restart
    fresh_limiter: bool  # rate_limit changed: a new limiter, its counts from zero
    fresh_accounts: bool  # the runtime keys and teams are read from another store


async def successor(old: Runtime, new: Config, build: Build = build_provider) -> Handover:
    providers = _providers(old, new, build)
    fresh = {n: p for n, p in providers.items() if old.providers.get(n) is not p}
    keep_limiter = new.rate_limit == old.config.rate_limit
    limiter = old.limiter if keep_limiter else new_limiter(new, old.metrics)
    keep_accounts = storage_settings(new) == storage_settings(old.config)
    accounts = old.accounts if keep_accounts else Accounts.for_config(new)
    added = Leftovers(
        list(fresh.values()),
        None if keep_limiter else limiter,
        None if keep_accounts else accounts,
    )
    config = _pin(old.config, new)
    cache = old.cache.adapted(new.cache, new.rate_limit.redis_url, new.rate_limit.cluster)
    try:
        await _start(fresh, added.limiter, added.accounts)
        accounts.check(config)
        runtime = Runtime.assemble(
            config, providers, limiter, old.metrics, old.circuits, accounts, cache
        )
        runtime.workers = old.workers
    except BaseException:
        await added.aclose()
        if cache is not old.cache:
            await cache.aclose()
        raise
    keep_tracing = new.telemetry == old.config.telemetry
    runtime.tracing = old.tracing if keep_tracing else new_tracing(config, old.metrics)
    if runtime.tracing is not None and not keep_tracing:
        runtime.tracing.start()
    runtime.adopt(accounts.current)
    accounts.listen(runtime.adopt)
    runtime.started = True
    gone = Leftovers(
        [p for n, p in old.providers.items() if providers.get(n) is not p],
        None if keep_limiter else old.limiter,
        None if keep_accounts else old.accounts,
        old.request_log,
        None if keep_tracing else old.tracing,
        None if cache is old.cache else old.cache,
    )
    return Handover(
        runtime,
        gone,
        changed=_changed_sections(old.config, config),
        rebuilt=tuple(fresh),
        removed=tuple(n for n in old.providers if n not in providers),
        pinned=tuple(path for path, read in PINNED if read(old.config) != read(new)),
        fresh_limiter=not keep_limiter,
        fresh_accounts=not keep_accounts,
    )


def _providers(old: Runtime, new: Config, build: Build) -> dict[str, Provider]:
    """The running provider of every unchanged block; one built anew for the others (nothing
    is started yet: building does no I/O)."""
    out: dict[str, Provider] = {}
    for name, block in new.providers.items():
        running = old.providers.get(name)
        if running is not None and block == old.config.providers.get(name):
            out[name] = running
            continue
        built = build(block)
        if not built.reloadable:
            raise ConfigError(f"providers.{name}", _NOT_RELOADABLE[running is not None])
        out[name] = built
    return out


_NOT_RELOADABLE = {
    True: "an in-process engine's settings change only with a restart "
    "(the running engine holds its model in memory)",
    False: "an in-process engine is added only with a restart",
}


async def _start(
    providers: Mapping[str, Provider], limiter: Limiter | None, accounts: Accounts | None
) -> None:
    """Start what the new runtime adds; a failure refuses the reload (the caller closes). A
    new store of runtime keys that cannot answer yet is read at its next poll."""
    names = list(providers)
    results = await asyncio.gather(*(providers[n].start() for n in names), return_exceptions=True)
    for name, result in zip(names, results, strict=True):
        if isinstance(result, BaseException):
            raise ConfigError(f"providers.{name}", f"failed to start: {result!r}")
    if limiter is not None:
        try:
            await limiter.start()
        except Exception as exc:
            raise ConfigError("rate_limit", f"failed to start: {exc!r}") from None
    if accounts is not None:
        await accounts.start()


def _pin(old: Config, new: Config) -> Config:
    """The new config with the running values of PINNED."""
    server = replace(
        new.server,
        host=old.server.host,
        port=old.server.port,
        max_head_bytes=old.server.max_head_bytes,
        max_headers=old.server.max_headers,
        max_connections=old.server.max_connections,
        timeouts=old.server.timeouts,
        tls=old.server.tls,
    )
    return replace(new, server=server, metrics=old.metrics)


def _changed_sections(old: Config, new: Config) -> tuple[str, ...]:
    return tuple(
        SECTION_NAMES.get(f.name, f.name)
        for f in fields(Config)
        if f.name not in NOT_SECTIONS and getattr(old, f.name) != getattr(new, f.name)
    )

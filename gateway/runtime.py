"""Everything built from one config, held as one object so a reload can swap it atomically:
the providers (built from their config blocks through the registry), the key check, the routing
plans, the rate limiter, the tries' needs (gateway.routing.attempts), and the stores of files
and of stored responses. The metrics and the circuit breakers outlive a runtime: a reload passes
them on (gateway.reload), with the rate limiter, the store of runtime keys and teams, and the
providers whose settings did not change.

The keys and teams are the YAML's and the runtime ones (gateway.governance.store): when the
runtime ones change, the runtime in use takes a new key check and rule book (`adopt`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from core.provider import Provider
from gateway.auth import Authenticator
from gateway.cache.store import Cache
from gateway.config import Config, KeyConfig, ProviderConfig
from gateway.governance.keeper import Keeper
from gateway.governance.pricing import PriceBook
from gateway.governance.store import Accounts, AccountSet
from gateway.jobs.filestore import FileStore
from gateway.jobs.responsestore import ResponseStore
from gateway.metrics import Metrics
from gateway.observability.logfile import LogFile
from gateway.observability.tracing import Tracing
from gateway.ratelimit import KeyLimits, Limiter, RuleBook, TeamLimits
from gateway.routing.attempts import Attempts
from gateway.routing.circuits import Board
from gateway.routing.plans import Router
from gateway.routing.trees import leaves
from providers import registry

# A provider from its config block (the registry's; tests bring their own).
Build = Callable[[ProviderConfig], Provider]


def new_tracing(config: Config, metrics: Metrics) -> Tracing | None:
    """The config's tracing (None: off); its export child starts with the runtime."""
    if not config.telemetry.on:
        return None
    t = config.telemetry
    exporter = {
        "endpoint": t.endpoint,
        "protocol": t.protocol if t.endpoint else None,
        "headers": dict(t.headers) or None,
    }
    return Tracing(exporter, t.sample_ratio, t.capture_content, metrics.spans_dropped)


def build_provider(config: ProviderConfig) -> Provider:
    return registry.build(config.name, config.settings, f"providers.{config.name}")


@dataclass(slots=True)
class Runtime:
    config: Config
    auth: Authenticator
    router: Router
    providers: dict[str, Provider]
    limiter: Limiter
    metrics: Metrics
    circuits: Board
    attempts: Attempts
    files: FileStore
    responses: ResponseStore  # the Responses API's stored responses, in the files store
    prices: PriceBook
    accounts: Accounts  # the runtime keys and teams: shared with the runtimes around it
    cache: Cache  # the response cache: a reload passes it on (its entries go on)
    created: int = field(default_factory=lambda: int(time.time()))
    started: bool = False
    inflight: int = 0  # requests begun on this runtime and not over (GatewayApp counts them)
    live: int = 0  # of those, inference requests: batch work yields to them (gateway.jobs.batches)
    workers: int = 1  # serving processes of `gateway serve`: limits on the memory backend need 1
    idle: asyncio.Event | None = None  # swapped out: set once `inflight` is 0 (drained())
    # Its own, opened anew by each runtime (a reload reopens a file logrotate moved): closed
    # once this runtime's requests are over.
    request_log: LogFile | None = None
    # Kept by a reload that leaves `telemetry` as it was (its export child with it).
    tracing: Tracing | None = None

    @classmethod
    def build(
        cls, config: Config, metrics: Metrics | None = None, build: Build = build_provider
    ) -> Runtime:
        metrics = metrics or Metrics(config.metrics.enabled)
        limiter = Limiter(config.rate_limit, rulebook(config), metrics)
        if limiter.memory is not None:  # its budgets and spend outlive the process
            limiter.keep(
                Keeper(limiter.memory, FileStore(config.files.store, config.files.max_bytes))
            )
        circuits = Board(config.circuits, metrics.circuit)
        providers = {name: build(block) for name, block in config.providers.items()}
        accounts = Accounts.for_config(config)
        cache = new_cache(config, metrics)
        runtime = cls.assemble(config, providers, limiter, metrics, circuits, accounts, cache)
        runtime.tracing = new_tracing(config, metrics)
        return runtime

    @classmethod
    def assemble(
        cls,
        config: Config,
        providers: Mapping[str, Provider],
        limiter: Limiter,
        metrics: Metrics,
        circuits: Board,
        accounts: Accounts,
        cache: Cache,
    ) -> Runtime:
        """A runtime around parts that may be a running one's: the board takes the config's
        policy and targets last, when nothing can fail any more."""
        auth, router = authenticator(config, accounts.current), Router(config)
        attempts = Attempts(circuits, metrics, router.pick, router.jitter)
        files = FileStore(config.files.store, config.files.max_bytes)
        responses = ResponseStore(files, config.responses.ttl_days)
        prices = PriceBook({name: p.pricing for name, p in config.providers.items()})
        runtime = cls(
            config, auth, router, dict(providers), limiter, metrics, circuits, attempts, files,
            responses, prices, accounts, cache,
        )  # fmt: skip
        circuits.configure(config.circuits, _targets(config))
        if config.request_log.path is not None:  # last: nothing after it can fail
            runtime.request_log = LogFile(config.request_log.path, metrics.request_log_dropped)
        return runtime

    async def start(self) -> None:
        """A runtime key or team id the YAML has too is a ConfigError (naming its YAML path)."""
        await self.accounts.start()
        try:
            self.accounts.check(self.config)
        except BaseException:
            await self.accounts.aclose()
            raise
        self.accounts.listen(self.adopt)
        self.adopt(self.accounts.current)
        await self.limiter.start()
        await asyncio.gather(*(p.start() for p in self.providers.values()))
        if self.tracing is not None:
            self.tracing.start()
        self.started = True

    async def aclose(self) -> None:
        self.started = False
        await release(self.providers.values(), self.limiter, self.accounts)
        await self.cache.aclose()
        if self.request_log is not None:
            await self.request_log.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()

    def adopt(self, accounts: AccountSet) -> None:
        """The runtime keys and teams as they are now: for new requests from here on."""
        self.auth = authenticator(self.config, accounts)
        self.limiter.use_rules(rulebook(self.config, accounts))

    async def drained(self) -> None:
        """Returns once no request is left on this runtime. Only for one that was swapped out:
        no new request comes to it, so once idle it stays idle."""
        if self.idle is None:
            self.idle = asyncio.Event()
            if not self.inflight:
                self.idle.set()
        await self.idle.wait()

    def ready(self) -> bool:
        """Providers only: the rate limiter's Redis is not a reason to leave the Service."""
        return self.started and all(p.ready() for p in self.providers.values())

    def model_label(self, model: str) -> str:
        """The metrics label of a requested model: configured aliases only (bounded)."""
        return model if model in self.config.models else "other"


def new_cache(config: Config, metrics: Metrics) -> Cache:
    """The config's response cache: on Redis, the rate limits' unless `cache.redis_url`."""
    return Cache(config.cache, metrics, config.rate_limit.redis_url, config.rate_limit.cluster)


def new_limiter(config: Config, metrics: Metrics) -> Limiter:
    """The limiter of a config; on the memory backend its budgets and spend outlive the
    process, in the files store."""
    limiter = Limiter(config.rate_limit, rulebook(config), metrics)
    if limiter.memory is not None:
        files = FileStore(config.files.store, config.files.max_bytes)
        limiter.keep(Keeper(limiter.memory, files))
    return limiter


def authenticator(config: Config, accounts: AccountSet) -> Authenticator:
    return Authenticator(config, accounts.keys.values(), accounts.teams)


def rulebook(config: Config, accounts: AccountSet | None = None) -> RuleBook:
    """The YAML's keys and teams, and the runtime ones (the YAML's win an id in both)."""
    runtime = accounts or AccountSet()
    keys = {**runtime.keys, **{k.id: k for k in config.keys}}
    teams = {**runtime.teams, **config.teams}
    return RuleBook(
        {key_id: key_limits(k) for key_id, k in keys.items()},
        {alias: m.limits for alias, m in config.models.items()},
        {t.id: TeamLimits(t.limits, t.budget, t.model_budgets) for t in teams.values()},
    )


def key_limits(k: KeyConfig) -> KeyLimits:
    """A key's limits with its team and budgets, as the rule book reads them."""
    return replace(k.limits, team=k.team, budget=k.budget, model_budgets=k.model_budgets)


async def release(
    providers: Iterable[Provider], limiter: Limiter | None, accounts: Accounts | None = None
) -> None:
    """Close providers (one failing does not keep the others open), then the limiter and the
    store of runtime keys."""
    await asyncio.gather(*(p.aclose() for p in providers), return_exceptions=True)
    if limiter is not None:
        await limiter.aclose()
    if accounts is not None:
        await accounts.aclose()


def _targets(config: Config) -> set[tuple[str, str]]:
    """Every (provider, model) the config names, its Portkey configs' included: each gets a
    breaker of its own."""
    named = {(t.provider, t.model) for m in config.models.values() for t in m.targets}
    for c in config.configs.values():
        for leaf in leaves(c.root) if c.root else ():
            if leaf.model:
                named.add((leaf.provider, leaf.model))
    return named

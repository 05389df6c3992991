"""Everything built from one config, held as one object so a reload can swap it atomically.
The metrics outlive a runtime: they are the app's, passed in."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gateway.auth import Authenticator
from gateway.circuits import Board
from gateway.config import Config
from gateway.metrics import Metrics
from gateway.ratelimit import Limiter, RuleBook
from gateway.routing import Router
from providers.base import Provider


@dataclass(slots=True)
class Runtime:
    config: Config
    auth: Authenticator
    router: Router
    providers: dict[str, Provider]
    limiter: Limiter
    metrics: Metrics
    circuits: Board
    created: int = field(default_factory=lambda: int(time.time()))
    started: bool = False

    @classmethod
    def build(cls, config: Config, metrics: Metrics | None = None) -> Runtime:
        metrics = metrics or Metrics(config.metrics.enabled)
        book = RuleBook(
            {k.id: k.limits for k in config.keys},
            {alias: m.limits for alias, m in config.models.items()},
        )
        limiter = Limiter(config.rate_limit, book, metrics)
        circuits = Board(config.circuits, metrics.circuit)
        circuits.configure(config.circuits, _targets(config))
        return cls(
            config,
            Authenticator(config),
            Router(config),
            dict(config.providers),
            limiter,
            metrics,
            circuits,
        )

    async def start(self) -> None:
        await self.limiter.start()
        await asyncio.gather(*(p.start() for p in self.providers.values()))
        self.started = True

    async def aclose(self) -> None:
        self.started = False
        await asyncio.gather(*(p.aclose() for p in self.providers.values()), return_exceptions=True)
        await self.limiter.aclose()

    def ready(self) -> bool:
        """Providers only: the rate limiter's Redis is not a reason to leave the Service."""
        return self.started and all(p.ready() for p in self.providers.values())

    def model_label(self, model: str) -> str:
        """The metrics label of a requested model: configured aliases only (bounded)."""
        return model if model in self.config.models else "other"


def _targets(config: Config) -> set[tuple[str, str]]:
    """Every (provider, model) the config names: each gets a breaker of its own."""
    return {(t.provider, t.model) for m in config.models.values() for t in m.targets}

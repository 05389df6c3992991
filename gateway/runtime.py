"""Everything built from one config, held as one object so a reload can swap it atomically."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gateway.auth import Authenticator
from gateway.config import Config
from gateway.routing import Router
from providers.base import Provider


@dataclass(slots=True)
class Runtime:
    config: Config
    auth: Authenticator
    router: Router
    providers: dict[str, Provider]
    created: int = field(default_factory=lambda: int(time.time()))
    started: bool = False

    @classmethod
    def build(cls, config: Config) -> Runtime:
        return cls(config, Authenticator(config), Router(config), dict(config.providers))

    async def start(self) -> None:
        await asyncio.gather(*(p.start() for p in self.providers.values()))
        self.started = True

    async def aclose(self) -> None:
        self.started = False
        await asyncio.gather(*(p.aclose() for p in self.providers.values()), return_exceptions=True)

    def ready(self) -> bool:
        return self.started and all(p.ready() for p in self.providers.values())

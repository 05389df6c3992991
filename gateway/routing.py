"""Alias → ordered targets. Strategies: single, fallback (next target on upstream failure
before the first byte), loadbalance (one target by weight); each target retried per the
alias's `retry` policy (gateway.retry) before the next is tried.

A virtual key (`x-portkey-virtual-key: NAME`) pins the provider: the alias's target on that
provider if it has one, otherwise the body's `model` as that provider's model id. A virtual key
never widens a key's aliases: a configured alias still needs the key's permission.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gateway.auth import Principal
from gateway.config import Config, ModelConfig
from gateway.errors import GatewayError, ModelNotFound, PermissionDenied
from gateway.retry import RetryPolicy
from providers.base import Target

# Upstream answers that mean "this target, not this request": worth the next target.
FALLBACK_STATUSES = frozenset({429, 500, 502, 503, 504})
NO_RETRY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class Plan:
    targets: tuple[Target, ...]
    fallback: bool
    retry: RetryPolicy = NO_RETRY

    def should_fall_back(self, err: GatewayError, attempt: int) -> bool:
        return self.fallback and attempt + 1 < len(self.targets) and err.status in FALLBACK_STATUSES


class Router:
    def __init__(self, config: Config, rng: random.Random | None = None) -> None:
        self._models = config.models
        self._rng = rng or random.Random()

    def jitter(self) -> float:
        return self._rng.random()

    def aliases(self) -> tuple[str, ...]:
        return tuple(self._models)

    def model(self, principal: Principal, alias: str) -> ModelConfig:
        model = self._models.get(alias)
        if model is None:
            raise ModelNotFound(
                f"The model `{alias}` does not exist or you do not have access to it.",
                param="model",
            )
        if not principal.may_use_model(alias):
            raise PermissionDenied(f"This API key may not use the model `{alias}`.", param="model")
        return model

    def plan(self, principal: Principal, alias: str, virtual_key: str | None) -> Plan:
        if virtual_key is not None:
            return Plan((self._virtual(principal, alias, virtual_key),), fallback=False)
        model = self.model(principal, alias)
        if model.strategy == "loadbalance":
            (pick,) = self._rng.choices(model.targets, weights=model.weights)
            return Plan((pick,), fallback=False, retry=model.retry)
        if model.strategy == "fallback":
            return Plan(model.targets, fallback=True, retry=model.retry)
        return Plan(model.targets[:1], fallback=False, retry=model.retry)

    def _virtual(self, principal: Principal, alias: str, name: str) -> Target:
        principal.check_virtual_key(name)  # a key lists only configured providers
        model = self._models.get(alias)
        if model is not None:
            self.model(principal, alias)  # 403 for an alias the key may not use
        for target in model.targets if model else ():
            if target.provider == name:
                return target
        return Target(alias=alias, provider=name, model=alias)

"""Alias → plan: the routing tree a request runs through (gateway.routing.trees), and how its leaves
become targets. gateway.routing.attempts runs it (retries, fallback, breakers).

A virtual key (`x-portkey-virtual-key: NAME`) pins the provider: the alias's target on that
provider if it has one, otherwise the body's `model` as that provider's model id. A Portkey
config (`x-portkey-config`) brings its own tree, whose targets name providers the same way. A
virtual key or a config never widens a key's rights: each provider it names must be among the
key's `providers`, and a configured alias still needs the key's permission.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from core.errors import InvalidRequest, ModelNotFound, PermissionDenied
from core.provider import Target
from gateway.auth import Principal
from gateway.config import Config, ModelConfig
from gateway.config.portkey import PortkeyConfig
from gateway.observability import jsonline
from gateway.routing.trees import Group, Leaf, Node, leaves


@dataclass(frozen=True, slots=True)
class Plan:
    root: Node
    resolve: Callable[[Leaf], Target]  # a leaf's target for this request
    portkey: bool = False  # a Portkey config chose it: answer with Portkey's response headers
    # targets(), found once: an alias's plan is made once with the config and serves every
    # request to it
    _targets: list[tuple[tuple[str, str], ...]] = field(
        default_factory=list, compare=False, repr=False
    )
    _scope: list[bytes] = field(default_factory=list, compare=False, repr=False)

    def first(self) -> tuple[Leaf, Target]:
        """The target tried first (a loadbalance's first child stands for the group): what
        the rate limiter's reservation is estimated for."""
        node = self.root
        while isinstance(node, Group):
            node = node.children[0]
        return node, self.resolve(node)

    def targets(self) -> tuple[tuple[str, str], ...]:
        """Every (provider, model) the plan may try: a budget reserves at the highest price
        among them."""
        if not self._targets:
            found = (self.resolve(leaf) for leaf in leaves(self.root))
            self._targets.append(tuple((t.provider, t.model) for t in found))
        return self._targets[0]

    def scope(self) -> bytes:
        """What of the plan shapes its answers, digested (found once, as targets() is): each
        target's provider, model, defaults and overrides. Two plans alike in these answer
        alike, whatever their retries, timeouts or weights."""
        if not self._scope:
            shaping = [
                [t.provider, t.model, dict(t.defaults), dict(leaf.overrides)]
                for leaf, t in ((leaf, self.resolve(leaf)) for leaf in leaves(self.root))
            ]
            self._scope.append(hashlib.sha256(jsonline.dumps(shaping, 0)).digest())
        return self._scope[0]


def _direct(node: Node) -> Node:
    """A group that can only ever use its first child is that child: a single target's alias
    runs no group at all. (An alias's paths are never shown to callers.)"""
    while isinstance(node, Group) and (node.mode == "single" or len(node.children) == 1):
        node = node.children[0]
    return node


COMPLETIONS, CHAT, EMBEDDINGS = "completions", "chat/completions", "embeddings"
RESPONSES = "responses"
# The endpoints an alias of each kind (`endpoint:` in its config) answers: a generative model
# serves completions, chat and responses.
SERVED: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {COMPLETIONS: (COMPLETIONS, CHAT, RESPONSES), EMBEDDINGS: (EMBEDDINGS,)}
)


def _serves(model: ModelConfig, endpoint: str) -> None:
    """A completion model called for embeddings, or the reverse, is the caller's mistake."""
    served = SERVED[model.endpoint]
    if endpoint not in served:
        raise InvalidRequest(
            f"The model `{model.alias}` serves {' and '.join(served)}, not {endpoint}: call "
            f"POST /v1/{served[0]} with it.",
            param="model",
            code="wrong_endpoint",
        )


def _configured(leaf: Leaf) -> Target:
    assert leaf.target is not None  # a model alias's leaves are built with their targets
    return leaf.target


class Router:
    def __init__(self, config: Config, rng: random.Random | None = None) -> None:
        self._models = config.models
        self._plans = {
            alias: Plan(_direct(m.tree), _configured) for alias, m in config.models.items()
        }
        self._rng = rng or random.Random()

    def jitter(self) -> float:
        return self._rng.random()

    def pick(self, weights: list[float]) -> int:
        """An index with probability weight / sum (Portkey's loadbalance)."""
        point = self._rng.random() * sum(weights)
        for i, w in enumerate(weights):
            if point < w:
                return i
            point -= w
        return max(range(len(weights)), key=weights.__getitem__)  # rounding at the very end

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

    def plan(
        self,
        principal: Principal,
        alias: str,
        virtual_key: str | None,
        config: PortkeyConfig | None = None,
        endpoint: str = COMPLETIONS,
    ) -> Plan:
        if config is None and virtual_key is None:
            _serves(self.model(principal, alias), endpoint)
            return self._plans[alias]
        root = self._root(principal, alias, virtual_key, config)
        if alias in self._models:
            _serves(self.model(principal, alias), endpoint)  # 403 for an alias not allowed

        def resolve(leaf: Leaf) -> Target:
            return leaf.target or self._target(alias, leaf.provider, leaf.model)

        return Plan(root, resolve, portkey=config is not None)

    def _root(
        self,
        principal: Principal,
        alias: str,
        virtual_key: str | None,
        config: PortkeyConfig | None,
    ) -> Node:
        """The config's tree, or the usual one (the virtual key's, else the alias's) with the
        config's modifiers; every provider it names checked against the key's."""
        if config is not None and config.root is not None:
            for leaf in leaves(config.root):
                principal.check_virtual_key(leaf.provider, param=leaf.path)
            return config.root
        if virtual_key is not None:
            principal.check_virtual_key(virtual_key)
            root: Node = Leaf(virtual_key, None, "virtual_key")
        else:
            root = self.model(principal, alias).tree
        return root if config is None else config.applied_to(root)

    def _target(self, alias: str, provider: str, model: str | None) -> Target:
        """The alias's target on `provider` (with that model, if one is named), else the
        provider's model `model` (default: the alias) with default settings."""
        configured = self._models.get(alias)
        for target in configured.targets if configured else ():
            if target.provider == provider and model in (None, target.model):
                return target
        return Target(alias=alias, provider=provider, model=model or alias)

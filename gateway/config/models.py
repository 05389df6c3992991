"""`models:`: each alias's routing tree (gateway.routing.trees), with retries, timeouts and
defaults.

models:
  llama:
    strategy: fallback            # or {mode: fallback, on_status: [429, 503]}
    retry: {attempts: 2}          # inherited by every target below, unless it has its own
    timeout: {connect_s: 2, first_byte_s: 10, total_s: 60}   # timeout_s: 60 = total_s
    targets:
      - {provider: vllm-a, model: meta-llama/Llama-3.1-8B}
      - strategy: loadbalance     # a group is a target too, and nests
        targets: [{provider: fw-1, weight: 3}, {provider: fw-2, weight: 1}]
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from core.completions import COMPLETIONS
from core.embeddings import EMBEDDINGS
from core.errors import ConfigError, InvalidRequest
from core.fields import Declaration
from core.provider import Target
from gateway.config.caching import CachePolicy, model_cache
from gateway.config.values import (
    integer,
    known,
    mapping,
    number,
    one_of,
    seq,
    statuses,
    text,
    weight,
)
from gateway.ratelimit import Limits
from gateway.routing.retry import MAX_ATTEMPTS, RetryPolicy
from gateway.routing.trees import FALLBACK_STATUSES, MODES, Group, Leaf, Node, leaves

POLICIES = ("reject", "drop")
MODEL_KEYS = ("endpoint", "defaults", "unsupported_params", "limits", "cache")
# What an alias serves: its requests come through that endpoint only.
ENDPOINT_FIELDS: Mapping[str, Declaration] = {
    "completions": COMPLETIONS,
    "embeddings": EMBEDDINGS,
}
NODE_KEYS = ("strategy", "targets", "weight", "retry", "timeout", "timeout_s")
LEAF_KEYS = ("provider", "model", "weight", "retry", "timeout", "timeout_s")
TIMEOUT_KEYS = ("connect_s", "first_byte_s", "total_s")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    alias: str
    tree: Node
    limits: Limits = field(default_factory=Limits)
    endpoint: str = "completions"  # or "embeddings"
    cache: CachePolicy | None = None  # None: its answers are cached only when a request asks

    @property
    def targets(self) -> tuple[Target, ...]:
        """Every target of the tree, in config order."""
        return tuple(leaf.target for leaf in leaves(self.tree) if leaf.target is not None)


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float | None = None
    first_byte_s: float | None = None
    total_s: float = 60.0


@dataclass(frozen=True, slots=True)
class TreeScope:
    """What a node inherits from its groups, and what its targets are built with."""

    alias: str
    providers: Collection[str]  # the configured providers' names
    policy: str
    defaults: Mapping[str, Any]
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)


def models(section: Mapping[str, Any], providers: Collection[str]) -> dict[str, ModelConfig]:
    return {
        alias: model(alias, mapping(m, f"models.{alias}"), providers)
        for alias, m in section.items()
    }


def model(alias: str, m: Mapping[str, Any], providers: Collection[str]) -> ModelConfig:
    path = f"models.{alias}"
    known(m, path, (*MODEL_KEYS, *NODE_KEYS))
    if "weight" in m:
        raise ConfigError(f"{path}.weight", "weights belong to targets")
    endpoint = one_of(m.get("endpoint", "completions"), f"{path}.endpoint", tuple(ENDPOINT_FIELDS))
    given = mapping(m.get("defaults", {}), f"{path}.defaults")
    scope = TreeScope(
        alias,
        providers,
        one_of(m.get("unsupported_params", "reject"), f"{path}.unsupported_params", POLICIES),
        defaults(given, f"{path}.defaults", ENDPOINT_FIELDS[endpoint]),
    )
    tree = node(m, path, scope, group=True)
    return ModelConfig(
        alias,
        tree,
        limits(m.get("limits", {}), f"{path}.limits"),
        endpoint,
        model_cache(m.get("cache"), f"{path}.cache"),
    )


def node(m: Mapping[str, Any], path: str, scope: TreeScope, group: bool) -> Node:
    """A group (it has `targets`) or a target, with what it inherits from `scope`."""
    known(m, path, (*MODEL_KEYS, *NODE_KEYS) if group else (*NODE_KEYS, *LEAF_KEYS))
    scope = replace(
        scope,
        retry=retry(m["retry"], f"{path}.retry") if "retry" in m else scope.retry,
        timeouts=timeouts(m, path, scope.timeouts),
    )
    share = weight(m.get("weight", 1), f"{path}.weight")
    if group or "targets" in m or "strategy" in m:
        return _group(m, path, scope, share)
    provider = text(m.get("provider"), f"{path}.provider")
    if provider not in scope.providers:
        raise ConfigError(f"{path}.provider", f"unknown provider {provider!r}")
    model_id = text(m.get("model", scope.alias), f"{path}.model")
    t = scope.timeouts
    target = Target(
        scope.alias, provider, model_id, t.total_s, scope.policy,  # type: ignore[arg-type]
        scope.defaults, t.connect_s, t.first_byte_s,
    )  # fmt: skip
    return Leaf(provider, model_id, path, share, scope.retry, target)


def _group(m: Mapping[str, Any], path: str, scope: TreeScope, share: float) -> Group:
    if "provider" in m or "model" in m:
        raise ConfigError(path, "a group has targets, not a provider or model of its own")
    mode, fall_on = strategy(m.get("strategy", "single"), f"{path}.strategy")
    raw = seq(m.get("targets"), f"{path}.targets")
    if not raw:
        raise ConfigError(f"{path}.targets", "at least one target is required")
    children = tuple(
        node(mapping(t, f"{path}.targets[{i}]"), f"{path}.targets[{i}]", scope, group=False)
        for i, t in enumerate(raw)
    )
    g = Group(mode, children, path, share, fall_on)
    if mode == "loadbalance" and not any(g.weights):
        raise ConfigError(f"{path}.targets", "a loadbalance group needs a target of weight > 0")
    return g


def strategy(v: Any, path: str) -> tuple[str, frozenset[int] | None]:
    """`fallback` or `{mode: fallback, on_status: [...]}`: the mode, and the statuses a
    fallback moves on after."""
    if isinstance(v, str):
        return one_of(v, path, MODES), FALLBACK_STATUSES
    s = mapping(v, path)
    known(s, path, ("mode", "on_status"))
    mode = one_of(s.get("mode"), f"{path}.mode", MODES)
    return mode, fall_on(s, mode, "on_status", path, FALLBACK_STATUSES)


def fall_on(
    s: Mapping[str, Any], mode: str, key: str, path: str, default: frozenset[int] | None
) -> frozenset[int] | None:
    """The statuses a fallback moves on after, from `key` (the YAML's and Portkey's spellings
    differ); only a fallback may list them."""
    if key not in s:
        return default
    if mode != "fallback":
        raise ConfigError(f"{path}.{key}", "only a fallback has statuses to fall back on")
    return statuses(s[key], f"{path}.{key}")


def timeouts(m: Mapping[str, Any], path: str, inherited: Timeouts) -> Timeouts:
    t = mapping(m.get("timeout", {}), f"{path}.timeout")
    known(t, f"{path}.timeout", TIMEOUT_KEYS)
    if "timeout_s" in m and "total_s" in t:
        raise ConfigError(f"{path}.timeout_s", "set timeout_s or timeout.total_s, not both")
    total = m.get("timeout_s", t.get("total_s"))
    return Timeouts(
        _seconds(t, "connect_s", path, inherited.connect_s),
        _seconds(t, "first_byte_s", path, inherited.first_byte_s),
        inherited.total_s if total is None else number(total, f"{path}.timeout.total_s"),
    )


def _seconds(t: Mapping[str, Any], key: str, path: str, inherited: float | None) -> float | None:
    return number(t[key], f"{path}.timeout.{key}") if key in t else inherited


def retry(v: Any, path: str) -> RetryPolicy:
    r = mapping(v, path)
    known(r, path, ("attempts", "on_status", "backoff_s", "max_backoff_s", "max_wait_s"))
    d = RetryPolicy()
    on = statuses(r["on_status"], f"{path}.on_status") if "on_status" in r else d.on_status
    return RetryPolicy(
        attempts=integer(r.get("attempts", d.attempts), f"{path}.attempts", 0, MAX_ATTEMPTS),
        on_status=on,
        backoff_s=number(r.get("backoff_s", d.backoff_s), f"{path}.backoff_s"),
        max_backoff_s=number(r.get("max_backoff_s", d.max_backoff_s), f"{path}.max_backoff_s"),
        max_wait_s=number(r.get("max_wait_s", d.max_wait_s), f"{path}.max_wait_s"),
    )


def defaults(d: Mapping[str, Any], path: str, fields: Declaration = COMPLETIONS) -> dict[str, Any]:
    """Request fields a model fills in when the caller did not (validated as a caller's)."""
    return params(d, path, "can have a default", fields)


def params(
    d: Mapping[str, Any], path: str, what: str, fields: Declaration = COMPLETIONS
) -> dict[str, Any]:
    for name, value in d.items():
        if name not in fields or name in ("model", "prompt", "stream", "input"):
            raise ConfigError(f"{path}.{name}", f"not a request parameter that {what}")
        try:
            fields.check(name, value)
        except InvalidRequest as exc:
            raise ConfigError(f"{path}.{name}", exc.message) from None
    return dict(d)


def limits(v: Any, path: str) -> Limits:
    m = mapping(v, path)
    known(m, path, ("rpm", "tpm", "max_parallel"))
    return Limits(**{k: integer(n, f"{path}.{k}", 1) for k, n in m.items()})

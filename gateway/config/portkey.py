"""Portkey configs → routing trees: `x-portkey-config` (inline JSON, or the name of a config in
the YAML's `configs:`), with Portkey's semantics: nested targets, each group `single`,
`fallback`, `loadbalance` or `conditional`.

    {"strategy": {"mode": "fallback", "on_status_codes": [429, 503]},
     "retry": {"attempts": 2},
     "targets": [{"virtual_key": "vllm-a", "override_params": {"temperature": 0}},
                 {"provider": "fireworks", "weight": 1, "request_timeout": 10000}]}

A target names a provider of this gateway's config (`virtual_key` or `provider`: its name), so
a config can route only to hosts the operator configured: `api_key` and `custom_host` are
refused, as is everything else the gateway does not do (a 400 naming the field, never silence).
Inheritance as Portkey's: `override_params` merge parent → child (the child wins), `retry` and
`request_timeout` pass down unless a child has its own. A config without targets or a provider
only modifies the request's usual routing (its retries, timeout, parameters).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from core.errors import ConfigError, InvalidRequest
from gateway.config.caching import portkey_cache
from gateway.config.models import fall_on, params
from gateway.config.values import (
    boolean,
    integer,
    known,
    mapping,
    one_of,
    seq,
    statuses,
    text,
    weight,
)
from gateway.routing.retry import MAX_ATTEMPTS, RETRY_STATUSES, RetryPolicy
from gateway.routing.trees import MODES, Group, Leaf, Node

ROOT = "config"  # Portkey's x-portkey-last-used-option-index is rooted here
MAX_DEPTH = 4
MAX_TARGETS = 32
MAX_TIMEOUT_MS = 3_600_000
# Portkey retries with async-retry: 1 s, doubling, no jitter; at most 60 s of waits in all.
PORTKEY_RETRY = RetryPolicy(
    attempts=0, backoff_s=1.0, max_backoff_s=16.0, max_wait_s=60.0,
    use_retry_after=False, jitter=False,
)  # fmt: skip
KEYS = (
    "strategy", "targets", "name", "provider", "virtual_key", "weight", "override_params",
    "retry", "request_timeout",
)  # fmt: skip
REFUSED = {
    "api_key": "this gateway calls providers with the credentials of its own config",
    "custom_host": "this gateway calls only the hosts of its own config",
    "cache": "a cache applies to the whole request: set it at the config's top level",
    "forward_headers": "forwarding caller headers is not supported by this gateway",
    "strict_open_ai_compliance": "answers are always OpenAI-compliant here",
    "before_request_hooks": "hooks are not supported by this gateway",
    "after_request_hooks": "hooks are not supported by this gateway",
    "input_guardrails": "guardrails are not supported by this gateway",
    "output_guardrails": "guardrails are not supported by this gateway",
}


@dataclass(frozen=True, slots=True)
class Inherited:
    retry: RetryPolicy = PORTKEY_RETRY
    overrides: Mapping[str, Any] = field(default_factory=dict)
    request_s: float | None = None


@dataclass(frozen=True, slots=True)
class PortkeyConfig:
    root: Node | None  # None: no targets; `modifiers` apply to the usual routing
    modifiers: Inherited = field(default_factory=Inherited)
    retry_given: bool = (
        False  # modifiers: replace the usual retry policy only if the config has one
    )
    cache_s: int | None = None  # its `cache`: the entries' max_age in seconds (None: none)

    def applied_to(self, tree: Node) -> Node:
        """The usual routing with this config's retry, timeout and parameters."""
        if isinstance(tree, Leaf):
            mods = self.modifiers
            return replace(
                tree,
                retry=mods.retry if self.retry_given else tree.retry,
                overrides={**tree.overrides, **mods.overrides},
                request_s=mods.request_s if mods.request_s is not None else tree.request_s,
            )
        return replace(tree, children=tuple(self.applied_to(c) for c in tree.children))


def with_timeout(config: PortkeyConfig, seconds: float) -> PortkeyConfig:
    """`x-portkey-request-timeout`: it beats the config's request_timeout everywhere."""
    if config.root is None:
        return replace(config, modifiers=replace(config.modifiers, request_s=seconds))
    return replace(config, root=_timed(config.root, seconds))


def _timed(node: Node, seconds: float) -> Node:
    if isinstance(node, Leaf):
        return replace(node, request_s=seconds)
    return replace(node, children=tuple(_timed(c, seconds) for c in node.children))


CONFIG_HEADER, TIMEOUT_HEADER = "x-portkey-config", "x-portkey-request-timeout"
HEADERS = (CONFIG_HEADER, TIMEOUT_HEADER)


def from_headers(
    headers: Mapping[str, str], named: Mapping[str, PortkeyConfig], providers: Collection[str]
) -> PortkeyConfig | None:
    """The request's Portkey config (x-portkey-config, x-portkey-request-timeout), if any; a
    400 naming the field that is wrong."""
    raw, timeout = headers.get(CONFIG_HEADER), headers.get(TIMEOUT_HEADER)
    if raw is None and timeout is None:
        return None
    try:
        config = PortkeyConfig(None)
        if raw is not None:
            config = from_header(raw, named, providers)
        if timeout is not None:
            config = with_timeout(config, _milliseconds(timeout))
    except ConfigError as err:
        if err.path.startswith(ROOT):
            raise InvalidRequest(f"Invalid x-portkey-config: {err}.", param=err.path) from None
        raise InvalidRequest(f"Invalid {err.path}: {err.message}.", param=err.path) from None
    return config


def _milliseconds(raw: str) -> float:
    if not raw.isdigit() or not 0 < int(raw) <= MAX_TIMEOUT_MS:
        raise ConfigError(
            "x-portkey-request-timeout",
            f"expected milliseconds, an integer from 1 to {MAX_TIMEOUT_MS}",
        )
    return int(raw) / 1000


def from_header(
    value: str, named: Mapping[str, PortkeyConfig], providers: Collection[str]
) -> PortkeyConfig:
    """The header's config: a JSON object, else the name of a configured one. Raises
    ConfigError with the path of what is wrong (`config.targets[0].weight`)."""
    if not value.lstrip().startswith("{"):
        config = named.get(value)
        if config is None:
            raise ConfigError(ROOT, f"there is no config named {value[:64]!r} here")
        return config
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ConfigError(ROOT, "not valid JSON") from None
    return parse(data, providers)


def parse(data: Any, providers: Collection[str], root: str = ROOT) -> PortkeyConfig:
    given = mapping(data, root)
    cache = portkey_cache(given["cache"], f"{root}.cache") if "cache" in given else None
    m = {k: v for k, v in given.items() if k != "cache"}  # the top level's only
    if not any(k in m for k in ("targets", "provider", "virtual_key")):
        _check(m, root, KEYS)
        for k in ("strategy", "weight"):
            if k in m:
                raise ConfigError(f"{root}.{k}", "needs targets (or a provider)")
        if cache is None and not any(k in m for k in MODIFIERS):
            raise ConfigError(
                root,
                "a config needs targets, a provider, retry, request_timeout, override_params "
                "or cache",
            )
        return PortkeyConfig(None, _inherit(m, root, Inherited()), "retry" in m, cache)
    counter = [0]
    return PortkeyConfig(_node(m, root, Inherited(), providers, 0, counter), cache_s=cache)


MODIFIERS = ("retry", "request_timeout", "override_params")


def _node(
    m: Mapping[str, Any],
    path: str,
    up: Inherited,
    providers: Collection[str],
    depth: int,
    counter: list[int],
) -> Node:
    _check(m, path, KEYS)
    here = _inherit(m, path, up)
    share = weight(m.get("weight", 1), f"{path}.weight")
    if "targets" in m:
        return _group(m, path, here, share, providers, depth, counter)
    if "strategy" in m:
        raise ConfigError(f"{path}.targets", "a strategy needs targets")
    counter[0] += 1
    if counter[0] > MAX_TARGETS:
        raise ConfigError(path, f"a config may have at most {MAX_TARGETS} targets")
    provider = _provider(m, path, providers)
    model = here.overrides.get("model")
    rest = {k: v for k, v in here.overrides.items() if k != "model"}
    return Leaf(provider, model, path, share, here.retry, None, rest, here.request_s)


def _group(
    m: Mapping[str, Any],
    path: str,
    here: Inherited,
    share: float,
    providers: Collection[str],
    depth: int,
    counter: list[int],
) -> Group:
    if "provider" in m or "virtual_key" in m:
        raise ConfigError(path, "a config has targets or a provider, not both")
    if depth >= MAX_DEPTH:
        raise ConfigError(path, f"configs nest at most {MAX_DEPTH} levels deep")
    if "strategy" not in m:
        raise ConfigError(f"{path}.strategy", "required with targets")
    mode, fall_on = _strategy(m["strategy"], f"{path}.strategy")
    raw = seq(m["targets"], f"{path}.targets")
    if not raw:
        raise ConfigError(f"{path}.targets", "at least one target is required")
    children = tuple(
        _node(mapping(t, f"{path}.targets[{i}]"), f"{path}.targets[{i}]", here, providers,
              depth + 1, counter)
        for i, t in enumerate(raw)
    )  # fmt: skip
    group = Group(mode, children, path, share, fall_on)
    if mode == "loadbalance" and not any(group.weights):
        raise ConfigError(f"{path}.targets", "a loadbalance needs a target of weight > 0")
    return group


def _strategy(v: Any, path: str) -> tuple[str, frozenset[int] | None]:
    """Portkey's fallback moves on after any failure, unless on_status_codes lists some."""
    s = mapping(v, path)
    _check(s, path, ("mode", "on_status_codes", "conditions", "default"))
    if s.get("mode") == "conditional" or "conditions" in s or "default" in s:
        raise ConfigError(f"{path}.mode", "conditional routing is not supported by this gateway")
    mode = one_of(s.get("mode"), f"{path}.mode", MODES)
    return mode, fall_on(s, mode, "on_status_codes", path, None)


def _provider(m: Mapping[str, Any], path: str, providers: Collection[str]) -> str:
    if "provider" in m and "virtual_key" in m:
        raise ConfigError(path, "set virtual_key or provider, not both")
    key = "virtual_key" if "virtual_key" in m else "provider"
    name = text(m[key], f"{path}.{key}")
    if name not in providers:
        raise ConfigError(f"{path}.{key}", f"no provider named {name[:64]!r} is configured here")
    return name


def _inherit(m: Mapping[str, Any], path: str, up: Inherited) -> Inherited:
    overrides = dict(up.overrides)
    if "override_params" in m:
        given = dict(mapping(m["override_params"], f"{path}.override_params"))
        if "model" in given:
            text(given["model"], f"{path}.override_params.model")
        rest = {k: v for k, v in given.items() if k != "model"}
        overrides |= params(rest, f"{path}.override_params", "can be overridden") | given
    timeout = m.get("request_timeout")
    return Inherited(
        _retry(m["retry"], f"{path}.retry") if "retry" in m else up.retry,
        overrides,
        up.request_s if timeout is None else _ms(timeout, f"{path}.request_timeout"),
    )


def _retry(v: Any, path: str) -> RetryPolicy:
    r = mapping(v, path)
    _check(r, path, ("attempts", "on_status_codes", "use_retry_after_header",
                     "use_retry_after_headers"))  # fmt: skip
    if "attempts" not in r:
        raise ConfigError(f"{path}.attempts", "required with retry")
    flag = r.get("use_retry_after_header", r.get("use_retry_after_headers", False))
    codes = r.get("on_status_codes")
    return replace(
        PORTKEY_RETRY,
        attempts=integer(r["attempts"], f"{path}.attempts", 0, MAX_ATTEMPTS),
        on_status=RETRY_STATUSES if codes is None else statuses(codes, f"{path}.on_status_codes"),
        use_retry_after=boolean(flag, f"{path}.use_retry_after_header"),
    )


def _ms(v: Any, path: str) -> float:
    return integer(v, path, 1, MAX_TIMEOUT_MS) / 1000


def _check(m: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for k in m:
        if k in REFUSED:
            raise ConfigError(f"{path}.{k}", REFUSED[k])
    known(m, path, allowed)

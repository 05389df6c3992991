"""YAML → typed Config. `${ENV}` / `${ENV:-default}` substitution; every error names its YAML path.

Providers are constructed here (through the registry, by `type:` tag) so that a bad provider
block fails `gateway check-config` exactly as it would fail at startup; nothing does I/O
until the app's lifespan calls `start()`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import ConfigError, InvalidRequest
from gateway.ratelimit import BreakerConfig, KeyLimits, Limits, RateLimitConfig
from gateway.retry import MAX_ATTEMPTS, RetryPolicy
from gateway.schemas import FIELDS, RequestLimits
from providers import registry
from providers.base import Provider, Target

DEV_KEY = "sk-local-dev"
STRATEGIES = ("single", "fallback", "loadbalance")
POLICIES = ("reject", "drop")
LIMIT_BACKENDS = ("memory", "redis")
BACKEND_MODES = ("local", "open", "closed")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 4 * 1024 * 1024
    limits: RequestLimits = field(default_factory=RequestLimits)


@dataclass(frozen=True, slots=True)
class KeyConfig:
    id: str
    sha256: bytes  # digest of the key; the plaintext is never kept
    models: tuple[str, ...]  # alias globs
    providers: tuple[str, ...]  # virtual keys this key may use
    limits: KeyLimits = field(default_factory=lambda: KeyLimits(Limits(), ()))


@dataclass(frozen=True, slots=True)
class ModelConfig:
    alias: str
    strategy: str
    targets: tuple[Target, ...]
    weights: tuple[float, ...]
    limits: Limits = field(default_factory=Limits)
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig
    keys: tuple[KeyConfig, ...]
    providers: Mapping[str, Provider]
    models: Mapping[str, ModelConfig]
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    source: str = ""

    def has_dev_key(self) -> bool:
        dev = hashlib.sha256(DEV_KEY.encode()).digest()
        return any(k.sha256 == dev for k in self.keys)


# ---------------------------------------------------------------- loading


def load(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read the config file ({exc.strerror})") from None
    return parse(text, source=str(p))


def parse(text: str, source: str = "<config>") -> Config:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"not valid YAML: {exc}") from None
    data = _substitute(raw if raw is not None else {}, "")
    top = _mapping(data, "")
    _known(top, "", ("server", "auth", "providers", "models", "rate_limit", "metrics"))
    providers = _providers(_mapping(top.get("providers", {}), "providers"))
    return Config(
        server=_server(_mapping(top.get("server", {}), "server")),
        keys=_keys(_mapping(top.get("auth", {}), "auth"), providers),
        providers=providers,
        models=_models(_mapping(top.get("models", {}), "models"), providers),
        rate_limit=_rate_limit(_mapping(top.get("rate_limit", {}), "rate_limit")),
        metrics=_metrics(_mapping(top.get("metrics", {}), "metrics")),
        source=source,
    )


def _substitute(node: Any, path: str) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, _join(path, str(k))) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, f"{path}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        return _ENV.sub(lambda m: _env(m, path), node)
    return node


def _env(match: re.Match[str], path: str) -> str:
    name, default = match.group(1), match.group(2)
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ConfigError(path, f"environment variable {name} is not set")
        return default
    return value


# ---------------------------------------------------------------- sections


def _server(s: Mapping[str, Any]) -> ServerConfig:
    _known(s, "server", ("host", "port", "max_body_bytes", "limits"))
    lim = _mapping(s.get("limits", {}), "server.limits")
    _known(lim, "server.limits", RequestLimits.__dataclass_fields__)
    return ServerConfig(
        host=_str(s.get("host", "127.0.0.1"), "server.host"),
        port=_int(s.get("port", 8080), "server.port", 0, 65535),
        max_body_bytes=_int(s.get("max_body_bytes", 4 << 20), "server.max_body_bytes", 1024),
        limits=RequestLimits(**{k: _int(v, f"server.limits.{k}", 1) for k, v in lim.items()}),
    )


def _keys(auth: Mapping[str, Any], providers: Mapping[str, Provider]) -> tuple[KeyConfig, ...]:
    _known(auth, "auth", ("keys",))
    out: list[KeyConfig] = []
    for i, entry in enumerate(_list(auth.get("keys", []), "auth.keys")):
        path = f"auth.keys[{i}]"
        k = _mapping(entry, path)
        _known(
            k, path, ("id", "key", "key_sha256", "models", "providers", "limits", "model_limits")
        )
        allowed = tuple(_str(p, f"{path}.providers") for p in _list(k.get("providers", []), path))
        for j, name in enumerate(allowed):
            if name not in providers:
                raise ConfigError(f"{path}.providers[{j}]", f"unknown provider {name!r}")
        out.append(
            KeyConfig(
                id=_str(k.get("id"), f"{path}.id"),
                sha256=_digest(k, path),
                models=tuple(
                    _str(m, f"{path}.models") for m in _list(k.get("models", ["*"]), path)
                ),
                providers=allowed,
                limits=_key_limits(k, path),
            )
        )
    _unique([k.id for k in out], "auth.keys", "id")
    _unique([k.sha256.hex() for k in out], "auth.keys", "key")
    return tuple(out)


def _digest(k: Mapping[str, Any], path: str) -> bytes:
    if ("key" in k) == ("key_sha256" in k):
        raise ConfigError(path, "set exactly one of 'key' and 'key_sha256'")
    if "key" in k:
        key = _str(k["key"], f"{path}.key")
        if not key:
            raise ConfigError(f"{path}.key", "empty key")
        return hashlib.sha256(key.encode()).digest()
    hexed = _str(k["key_sha256"], f"{path}.key_sha256").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", hexed):
        raise ConfigError(f"{path}.key_sha256", "expected 64 hex digits (gateway hash-key KEY)")
    return bytes.fromhex(hexed)


def _providers(section: Mapping[str, Any]) -> dict[str, Provider]:
    return {
        name: registry.build(name, _mapping(block, f"providers.{name}"), f"providers.{name}")
        for name, block in section.items()
    }


def _models(
    section: Mapping[str, Any], providers: Mapping[str, Provider]
) -> dict[str, ModelConfig]:
    return {
        alias: _model(alias, _mapping(m, f"models.{alias}"), providers)
        for alias, m in section.items()
    }


def _model(alias: str, m: Mapping[str, Any], providers: Mapping[str, Provider]) -> ModelConfig:
    path = f"models.{alias}"
    _known(
        m,
        path,
        ("strategy", "targets", "timeout_s", "defaults", "unsupported_params", "limits", "retry"),
    )
    strategy = _one_of(m.get("strategy", "single"), f"{path}.strategy", STRATEGIES)
    policy = _one_of(m.get("unsupported_params", "reject"), f"{path}.unsupported_params", POLICIES)
    timeout = _number(m.get("timeout_s", 60), f"{path}.timeout_s")
    defaults = _defaults(_mapping(m.get("defaults", {}), f"{path}.defaults"), f"{path}.defaults")
    targets, weights = [], []
    raw_targets = _list(m.get("targets"), f"{path}.targets")
    if not raw_targets:
        raise ConfigError(f"{path}.targets", "at least one target is required")
    for i, t in enumerate(raw_targets):
        tp = f"{path}.targets[{i}]"
        t = _mapping(t, tp)
        _known(t, tp, ("provider", "model", "weight"))
        provider = _str(t.get("provider"), f"{tp}.provider")
        if provider not in providers:
            raise ConfigError(f"{tp}.provider", f"unknown provider {provider!r}")
        model = _str(t.get("model", alias), f"{tp}.model")
        targets.append(Target(alias, provider, model, timeout, policy, defaults))  # type: ignore[arg-type]
        weights.append(_number(t.get("weight", 1), f"{tp}.weight"))
    limits = _limits(m.get("limits", {}), f"{path}.limits")
    retry = _retry(m.get("retry", {}), f"{path}.retry")
    return ModelConfig(alias, strategy, tuple(targets), tuple(weights), limits, retry)


def _retry(v: Any, path: str) -> RetryPolicy:
    r = _mapping(v, path)
    _known(r, path, ("attempts", "on_status", "backoff_s", "max_backoff_s", "max_wait_s"))
    d = RetryPolicy()
    statuses = d.on_status
    if "on_status" in r:
        raw = _list(r["on_status"], f"{path}.on_status")
        statuses = frozenset(_int(c, f"{path}.on_status[{i}]", 400, 599) for i, c in enumerate(raw))
    return RetryPolicy(
        attempts=_int(r.get("attempts", d.attempts), f"{path}.attempts", 0, MAX_ATTEMPTS),
        on_status=statuses,
        backoff_s=_number(r.get("backoff_s", d.backoff_s), f"{path}.backoff_s"),
        max_backoff_s=_number(r.get("max_backoff_s", d.max_backoff_s), f"{path}.max_backoff_s"),
        max_wait_s=_number(r.get("max_wait_s", d.max_wait_s), f"{path}.max_wait_s"),
    )


def _defaults(d: Mapping[str, Any], path: str) -> dict[str, Any]:
    for name, value in d.items():
        check = FIELDS.get(name)
        if check is None or name in ("model", "prompt", "stream"):
            raise ConfigError(f"{path}.{name}", "not a request parameter that can have a default")
        try:
            check(value, name)
        except InvalidRequest as exc:
            raise ConfigError(f"{path}.{name}", exc.message) from None
    return dict(d)


# ---------------------------------------------------------------- limits and metrics


def _limits(v: Any, path: str) -> Limits:
    m = _mapping(v, path)
    _known(m, path, ("rpm", "tpm", "max_parallel"))
    return Limits(**{k: _int(n, f"{path}.{k}", 1) for k, n in m.items()})


def _key_limits(k: Mapping[str, Any], path: str) -> KeyLimits:
    per_model = _mapping(k.get("model_limits", {}), f"{path}.model_limits")
    return KeyLimits(
        _limits(k.get("limits", {}), f"{path}.limits"),
        tuple(
            (str(glob), _limits(v, f"{path}.model_limits.{glob}")) for glob, v in per_model.items()
        ),
    )


def _rate_limit(r: Mapping[str, Any]) -> RateLimitConfig:
    path = "rate_limit"
    fields = RateLimitConfig.__dataclass_fields__
    _known(r, path, fields)
    d = RateLimitConfig()
    b = _mapping(r.get("breaker", {}), f"{path}.breaker")
    _known(b, f"{path}.breaker", BreakerConfig.__dataclass_fields__)
    return RateLimitConfig(
        backend=_one_of(r.get("backend", d.backend), f"{path}.backend", LIMIT_BACKENDS),  # type: ignore[arg-type]
        redis_url=_redis_url(r.get("redis_url", d.redis_url), f"{path}.redis_url"),
        cluster=_bool(r.get("cluster", d.cluster), f"{path}.cluster"),
        on_backend_error=_one_of(  # type: ignore[arg-type]
            r.get("on_backend_error", d.on_backend_error), f"{path}.on_backend_error", BACKEND_MODES
        ),
        replicas=_int(r.get("replicas", d.replicas), f"{path}.replicas", 1),
        key_prefix=_tag(r.get("key_prefix", d.key_prefix), f"{path}.key_prefix"),
        timeout_ms=_int(r.get("timeout_ms", d.timeout_ms), f"{path}.timeout_ms", 1, 60_000),
        pool_size=_int(r.get("pool_size", d.pool_size), f"{path}.pool_size", 1),
        lease_s=_number(r.get("lease_s", d.lease_s), f"{path}.lease_s"),
        breaker=BreakerConfig(
            failures=_int(b.get("failures", 3), f"{path}.breaker.failures", 1),
            cooldown_s=_number(b.get("cooldown_s", 5.0), f"{path}.breaker.cooldown_s"),
        ),
    )


def _redis_url(v: Any, path: str) -> str:
    url = _str(v, path)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(path, "expected a redis://, rediss:// or unix:// URL")
    return url


def _tag(v: Any, path: str) -> str:
    tag = _str(v, path)
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", tag):
        raise ConfigError(path, "expected 1-64 characters of letters, digits and ._:-")
    return tag


def _metrics(m: Mapping[str, Any]) -> MetricsConfig:
    _known(m, "metrics", ("enabled",))
    return MetricsConfig(enabled=_bool(m.get("enabled", True), "metrics.enabled"))


def _bool(v: Any, path: str) -> bool:
    if type(v) is not bool:
        raise ConfigError(path, "expected true or false")
    return v


# ---------------------------------------------------------------- scalar helpers


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _mapping(v: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(path or "<top>", f"expected a mapping, got {type(v).__name__}")
    return v


def _list(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise ConfigError(path, f"expected a list, got {type(v).__name__}")
    return v


def _str(v: Any, path: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(path, f"expected a string, got {type(v).__name__}")
    return v


def _int(v: Any, path: str, lo: int, hi: int | None = None) -> int:
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        raise ConfigError(path, f"expected an integer >= {lo}" + (f" and <= {hi}" if hi else ""))
    return v


def _number(v: Any, path: str) -> float:
    if type(v) not in (int, float) or v <= 0:
        raise ConfigError(path, "expected a positive number")
    return float(v)


def _one_of(v: Any, path: str, options: tuple[str, ...]) -> str:
    if v not in options:
        raise ConfigError(path, f"expected one of {', '.join(options)}, got {v!r}")
    return str(v)


def _known(m: Mapping[str, Any], path: str, keys: Any) -> None:
    for k in m:
        if k not in keys:
            raise ConfigError(_join(path, str(k)), "unknown key")


def _unique(values: list[str], path: str, what: str) -> None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise ConfigError(f"{path}[{i}].{what}", f"duplicate {what}")
        seen.add(v)

"""The response cache's settings: where entries are kept (`cache:`), which aliases cache their
answers (`models.<alias>.cache`), and a Portkey config's own `cache` block.

cache:
  backend: memory          # memory (per process, bounded) | redis (shared by every replica)
  max_entries: 100000      # memory: at most this many entries …
  max_bytes: 268435456     # … holding at most this many bytes of answers
  max_entry_bytes: 1048576 # a larger answer is not cached
  redis_url: redis://…     # redis: rate_limit.redis_url unless given
models:
  llama: {targets: [...], cache: {ttl_s: 600, when: deterministic}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from core.errors import ConfigError
from gateway.config.values import integer, known, mapping, one_of, text

Backend = Literal["memory", "redis"]
When = Literal["always", "deterministic"]
BACKENDS: tuple[Backend, ...] = ("memory", "redis")
WHEN: tuple[When, ...] = ("always", "deterministic")
MAX_TTL_S = 90 * 86400  # Portkey's longest max_age
PORTKEY_TTL_S = 7 * 86400  # Portkey's max_age when a config does not say
DEFAULT_TTL_S = 3600
PORTKEY_MODES = ("simple", "semantic")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Where the entries are kept. The memory backend's bounds are per serving process."""

    backend: Backend = "memory"
    max_entries: int = 100_000
    max_bytes: int = 256 * 1024 * 1024
    max_entry_bytes: int = 1024 * 1024
    redis_url: str | None = None  # None: rate_limit.redis_url
    key_prefix: str = "llmgw:cache:"
    timeout_ms: int = 100  # per Redis call; past it the request is served uncached


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """An alias's (or a Portkey config's) caching: how long an entry serves, and which
    requests are cached: `always`, or `deterministic` (greedy or seeded ones only)."""

    ttl_s: int = DEFAULT_TTL_S
    when: When = "always"


def cache_section(c: Mapping[str, Any], redis_url: str) -> CacheConfig:
    path = "cache"
    known(c, path, CacheConfig.__dataclass_fields__)
    d = CacheConfig()
    url = c.get("redis_url")
    if url is not None and not text(url, f"{path}.redis_url").startswith(
        ("redis://", "rediss://", "unix://")
    ):
        raise ConfigError(f"{path}.redis_url", "expected a redis://, rediss:// or unix:// URL")
    entry = integer(c.get("max_entry_bytes", d.max_entry_bytes), f"{path}.max_entry_bytes", 1)
    most = integer(c.get("max_bytes", d.max_bytes), f"{path}.max_bytes", 1)
    if entry > most:
        raise ConfigError(f"{path}.max_entry_bytes", f"at most max_bytes ({most})")
    return CacheConfig(
        backend=one_of(c.get("backend", d.backend), f"{path}.backend", BACKENDS),  # type: ignore[arg-type]
        max_entries=integer(c.get("max_entries", d.max_entries), f"{path}.max_entries", 1),
        max_bytes=most,
        max_entry_bytes=entry,
        redis_url=url if url is not None else redis_url,
        key_prefix=text(c.get("key_prefix", d.key_prefix), f"{path}.key_prefix"),
        timeout_ms=integer(c.get("timeout_ms", d.timeout_ms), f"{path}.timeout_ms", 1, 60_000),
    )


def model_cache(v: Any, path: str) -> CachePolicy | None:
    """`models.<alias>.cache`: `{ttl_s, when}`; absent: the alias does not cache."""
    if v is None:
        return None
    m = mapping(v, path)
    known(m, path, CachePolicy.__dataclass_fields__)
    d = CachePolicy()
    return CachePolicy(
        ttl_s=integer(m.get("ttl_s", d.ttl_s), f"{path}.ttl_s", 1, MAX_TTL_S),
        when=one_of(m.get("when", d.when), f"{path}.when", WHEN),  # type: ignore[arg-type]
    )


def portkey_cache(v: Any, path: str) -> int:
    """A Portkey config's `cache: {mode: simple, max_age}`: its entries' lifetime in seconds
    (Portkey's default when not given). Semantic caching is not done here: refused by name."""
    m = mapping(v, path)
    known(m, path, ("mode", "max_age"))
    mode = one_of(m.get("mode", "simple"), f"{path}.mode", PORTKEY_MODES)
    if mode == "semantic":
        raise ConfigError(f"{path}.mode", "semantic caching is not supported by this gateway")
    return integer(m.get("max_age", PORTKEY_TTL_S), f"{path}.max_age", 1, MAX_TTL_S)

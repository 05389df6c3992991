"""The cache's settings: the `cache:` section, an alias's `cache:`, and a Portkey config's
`cache` block; each error names its path."""

from __future__ import annotations

import pytest

from core.errors import ConfigError, InvalidRequest
from gateway import config
from gateway.config import portkey
from gateway.config.caching import PORTKEY_TTL_S, CacheConfig, CachePolicy

BASE = """
providers: {up: {type: openai-compatible, base_url: "http://127.0.0.1:9/v1"}}
rate_limit: {redis_url: "redis://limits:6379/0"}
"""


def parse(text: str) -> config.Config:
    return config.parse(BASE + text)


def test_defaults_and_an_alias_that_caches() -> None:
    c = parse("models: {m: {targets: [{provider: up}], cache: {ttl_s: 60, when: deterministic}}}")
    assert c.cache == CacheConfig(redis_url="redis://limits:6379/0")
    assert c.models["m"].cache == CachePolicy(60, "deterministic")
    plain = parse("models: {m: {targets: [{provider: up}]}}")
    assert plain.models["m"].cache is None


def test_the_section_is_read() -> None:
    c = parse(
        "cache: {backend: redis, redis_url: 'redis://cache:6379/1', max_entries: 5, "
        "max_bytes: 4096, max_entry_bytes: 1024, key_prefix: 'c:', timeout_ms: 50}"
    )
    assert c.cache == CacheConfig("redis", 5, 4096, 1024, "redis://cache:6379/1", "c:", 50)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("cache: {backend: disk}", "cache.backend"),
        ("cache: {max_entries: 0}", "cache.max_entries"),
        ("cache: {max_bytes: 10, max_entry_bytes: 11}", "cache.max_entry_bytes"),
        ("cache: {redis_url: 'http://x'}", "cache.redis_url"),
        ("cache: {semantic: true}", "cache.semantic"),
        ("models: {m: {targets: [{provider: up}], cache: {ttl_s: 0}}}", "models.m.cache.ttl_s"),
        ("models: {m: {targets: [{provider: up}], cache: {when: sometimes}}}",
         "models.m.cache.when"),
        ("models: {m: {targets: [{provider: up}], cache: true}}", "models.m.cache"),
        ("models: {m: {targets: [{provider: up, cache: {}}]}}", "models.m.targets[0].cache"),
    ],
)  # fmt: skip
def test_errors_name_the_path(text: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert info.value.path == path


def test_a_portkey_cache_block() -> None:
    assert portkey.parse({"cache": {"mode": "simple", "max_age": 60}}, ["up"]).cache_s == 60
    assert portkey.parse({"cache": {}}, ["up"]).cache_s == PORTKEY_TTL_S
    with_targets = portkey.parse({"provider": "up", "cache": {"mode": "simple"}}, ["up"])
    assert with_targets.root is not None and with_targets.cache_s == PORTKEY_TTL_S
    assert portkey.parse({"provider": "up"}, ["up"]).cache_s is None


@pytest.mark.parametrize(
    ("header", "param"),
    [
        ('{"cache": {"mode": "semantic"}}', "config.cache.mode"),
        ('{"cache": {"mode": "simple", "max_age": "60"}}', "config.cache.max_age"),
        ('{"cache": {"mode": "simple", "force": true}}', "config.cache.force"),
        ('{"cache": []}', "config.cache"),
        ('{"strategy": {"mode": "fallback"}, "targets": [{"provider": "up", "cache": {}}]}',
         "config.targets[0].cache"),
    ],
)  # fmt: skip
def test_a_bad_portkey_cache_is_a_400_naming_it(header: str, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        portkey.from_headers({"x-portkey-config": header}, {}, ["up"])
    assert info.value.param == param

"""`type:` tag → adapter factory. The gateway picks providers only through here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import ConfigError
from providers.base import Provider, ProviderFactory
from providers.openai_compat.adapter import OpenAICompatProvider
from providers.vllm_engine.adapter import VllmEngineProvider

FACTORIES: Mapping[str, ProviderFactory] = {
    tag: cls.from_config
    for cls in (OpenAICompatProvider, VllmEngineProvider)
    for tag in cls.type_tags
}


def known_types() -> tuple[str, ...]:
    return tuple(sorted(FACTORIES))


def build(name: str, settings: Mapping[str, Any], path: str) -> Provider:
    tag = settings.get("type")
    factory = FACTORIES.get(tag) if isinstance(tag, str) else None
    if factory is None:
        raise ConfigError(
            f"{path}.type", f"unknown provider type {tag!r} (known: {', '.join(known_types())})"
        )
    return factory(name, tag, settings, path)  # type: ignore[arg-type]

"""`type:` tag → adapter. The gateway picks providers only through here: it checks a provider's
config block when the config is read (`check`, no I/O, nothing built) and builds the provider
from it when a runtime is assembled (`build`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import ConfigError
from core.provider import Provider, ProviderClass, SharedCore
from providers.openai_compat.adapter import OpenAICompatProvider
from providers.vllm_engine.adapter import VllmEngineProvider

CLASSES: Mapping[str, ProviderClass] = {
    tag: cls for cls in (OpenAICompatProvider, VllmEngineProvider) for tag in cls.type_tags
}


def known_types() -> tuple[str, ...]:
    return tuple(sorted(CLASSES))


def adapter(settings: Mapping[str, Any], path: str) -> tuple[str, ProviderClass]:
    """The block's `type:` tag and the adapter that serves it; a ConfigError naming the tag."""
    tag = settings.get("type")
    cls = CLASSES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ConfigError(
            f"{path}.type", f"unknown provider type {tag!r} (known: {', '.join(known_types())})"
        )
    return tag, cls  # type: ignore[return-value]


def check(settings: Mapping[str, Any], path: str) -> None:
    """The block validated as building it would; a ConfigError naming the YAML path."""
    tag, cls = adapter(settings, path)
    cls.check_config(tag, settings, path)


def build(name: str, settings: Mapping[str, Any], path: str) -> Provider:
    """The provider of a block (nothing is started: no I/O)."""
    tag, cls = adapter(settings, path)
    return cls.from_config(name, tag, settings, path)


def shared_core(
    name: str, settings: Mapping[str, Any], path: str, workers: int
) -> SharedCore | None:
    """What `workers` worker processes share of the block's provider (launched by the serving
    process), or None."""
    tag, cls = adapter(settings, path)
    return cls.shared_core(name, tag, settings, path, workers)

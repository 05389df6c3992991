"""Dialects by `type:` tag: each a rule table derived from OpenAI's plus behaviour flags."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from providers.openai_compat.dialects import azure, fireworks, generic, openai, vllm
from providers.openai_compat.dialects.spec import DialectSpec

DIALECTS: Mapping[str, DialectSpec] = MappingProxyType(
    {spec.name: spec for spec in (openai.SPEC, fireworks.SPEC, vllm.SPEC, generic.SPEC, azure.SPEC)}
)

__all__ = ["DIALECTS", "DialectSpec"]

"""Upstream HTTP adapter for OpenAI, Fireworks, vLLM servers and other OpenAI-compatible APIs."""

from __future__ import annotations

from providers.openai_compat.adapter import OpenAICompatProvider

__all__ = ["OpenAICompatProvider"]

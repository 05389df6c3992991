"""OpenAI's own API as an upstream: its rule table (providers.rules.openai), no flags."""

from __future__ import annotations

from providers.openai_compat.dialects.spec import DialectSpec
from providers.rules.openai import RULES

SPEC = DialectSpec(name="openai", rules=RULES)

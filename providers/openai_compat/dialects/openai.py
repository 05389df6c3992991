"""OpenAI's own API as an upstream: its rule table (providers.rules.openai), no flags."""

from __future__ import annotations

from providers.openai_compat.dialects.spec import DialectSpec
from providers.openai_compat.responses import Native
from providers.rules.openai import RULES

# OpenAI keeps what it answers (store) and continues from its own ids; it reads only its own
# reasoning items and item ids.
SPEC = DialectSpec(
    name="openai",
    rules=RULES,
    responses=Native(chains=True, reasoning_inline=False, strip_ids=True),
)

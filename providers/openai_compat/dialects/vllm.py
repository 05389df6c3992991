"""vLLM's OpenAI-compatible server as an upstream: its rule table (providers.rules.vllm) and its
behaviour: it lowers `max_tokens` to fit the context window instead of failing, and has rules of
its own between fields, checked before the request is sent."""

from __future__ import annotations

from providers.openai_compat.dialects.spec import DialectSpec
from providers.openai_compat.responses import Native
from providers.rules import vllm_checks
from providers.rules.vllm import RULES

SPEC = DialectSpec(
    name="vllm-server",
    rules=RULES,
    clamps_max_tokens=True,
    request_checks=vllm_checks.check,
    chat_checks=vllm_checks.check_chat,
    answer_shapes=("vllm", "openai"),  # vLLM's own server's shape unless asked otherwise
    # Its server keeps no responses (unless started to, in memory): the conversation is sent
    # whole; it reads reasoning items' text back, and any item ids.
    responses=Native(chains=False, reasoning_inline=True, strip_ids=False),
)

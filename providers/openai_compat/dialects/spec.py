"""What a dialect is: its parameter table plus the behaviour flags the adapter acts on.

The flags describe upstream behaviour that is not a property of one request field, so they
cannot live in the rule table (providers.rules.params).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core.provider import AnswerShape
from providers.openai_compat.responses import Native
from providers.rules.params import Dialect


@dataclass(frozen=True, slots=True)
class DialectSpec:
    name: str  # the config `type:` tag
    rules: Dialect
    # Old Fireworks docs say the matched stop string is returned in the text: the adapter strips
    # a trailing stop string (and holds back possible stop prefixes while streaming).
    stop_may_be_included: bool = False
    # The upstream has no `stream_options`; usage rides on the last content chunk instead.
    # When False the adapter always asks for `{"include_usage": true}` (accounting needs usage).
    usage_on_last_chunk: bool = False
    # The upstream's default for context overflow is not OpenAI's ("error"), so the effective
    # `context_length_exceeded_behavior` is always sent.
    needs_explicit_context_behavior: bool = False
    # The upstream silently lowers max_tokens to what its context window leaves (vLLM's server
    # does) instead of failing. That is served as it is unless the caller asks for OpenAI's
    # "error", which needs the gateway to count the prompt itself, with the server's /tokenize
    # (context_guard.py).
    clamps_max_tokens: bool = False
    # The upstream's own rules between fields, checked before the request is sent (vLLM's, for
    # its server): a 400 naming the field instead of the upstream's answer.
    request_checks: Callable[[Mapping[str, Any]], None] | None = None
    chat_checks: Callable[[Mapping[str, Any]], None] | None = None  # the same, for chat
    # The shapes its answers may be written in (a provider's `answer_shape`), the default first.
    answer_shapes: tuple[AnswerShape, ...] = ("openai",)
    # Azure OpenAI's addressing: the key in an `api-key` header and, with an `api_version`, each
    # model at its deployment's path (the provider's `api_version` and `deployments` keys).
    azure_addressing: bool = False
    # What the upstream adds unasked to each choice, and to the answer, passed on as it came
    # (Azure's content filter results).
    choice_extras: tuple[str, ...] = ()
    answer_extras: tuple[str, ...] = ()
    # The upstream serves the Responses API itself, and how it takes a conversation; None: a
    # Responses request is served as the chat it means (core.chat_bridge).
    responses: Native | None = None

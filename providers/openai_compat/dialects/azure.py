"""Azure OpenAI as an upstream: OpenAI's API served by Microsoft, so OpenAI's tables (chat's in
providers.rules.chat, embeddings' in embeddings.py); its own addressing (deployments, the
api-version, the `api-key` header: settings.py); and its content filter's annotations, on each
choice and on the prompts, passed on to the caller as Azure wrote them.

A refusal by the content filter is Azure's 400 with `code: content_filter`, which the caller
gets as it is (providers.transport.errors keeps a 400's code and param); a completion the filter
cut short ends with `finish_reason: content_filter`, as OpenAI's do.
"""

from __future__ import annotations

from providers.openai_compat.dialects.spec import DialectSpec
from providers.rules.openai import RULES

# Per choice: the filter's verdicts on its text, and (asynchronous filter) which part of the
# text an annotation is about.
CHOICE_FILTER = ("content_filter_results", "content_filter_offsets")
# Per answer: the verdicts on each prompt (a stream's come on an event of their own, first).
PROMPT_FILTER = ("prompt_filter_results",)

SPEC = DialectSpec(
    name="azure-openai",
    rules=RULES,  # its completions API takes OpenAI's fields
    azure_addressing=True,
    choice_extras=CHOICE_FILTER,
    answer_extras=PROMPT_FILTER,
)

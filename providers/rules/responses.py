"""The Responses API's parameter rules, for the dialects whose upstreams serve `/v1/responses`
themselves (OpenAI, vLLM's server): which of a Responses request's fields each one takes. The
other dialects serve it as the chat it means (core.chat_bridge), by their chat tables.

OpenAI's table passes OpenAI's fields and refuses the extensions and vLLM's extras; vLLM's
server takes OpenAI's fields but those its ResponsesRequest lacks, the extensions it has, and
its own extras (unknown fields too: its server's to judge, as for chat)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from core.completions import CONTEXT
from core.fields import EXTENSION, OPENAI, VLLM
from core.responses import RESPONSES
from providers.rules.params import (
    DROP,
    UNKNOWN,
    Action,
    FieldRule,
    convert,
    derive,
    passes,
)

RANGES: Mapping[str, tuple[float | None, float | None]] = MappingProxyType(
    {
        f.name: (f.lo, f.hi)
        for f in RESPONSES.fields
        if f.family is OPENAI and (f.lo is not None or f.hi is not None)
    }
)
# What the adapter sends itself: the target's model, the conversation (the gateway's stored
# turns inline, or the upstream's own id of the turn before), whether it streams.
SELF_SET = ("model", "input", "previous_response_id", "stream")


def _refuse(names: tuple[str, ...], note: str) -> dict[str, FieldRule]:
    return {name: FieldRule(Action.REJECT, note=note) for name in names}


def truncation_for_openai(value: Any) -> Mapping[str, Any]:
    """OpenAI's Responses (and vLLM's) fails a request too long for the window unless
    `truncation` is "auto", which drops the conversation's oldest part to fit: "truncate" asks
    for that."""
    return {"truncation": "auto"} if value == "truncate" else {}


OPENAI_RULES: Mapping[str, FieldRule] = MappingProxyType(
    {
        **{name: passes(*RANGES.get(name, (None, None))) for name in RESPONSES.names(OPENAI)},
        **_refuse(RESPONSES.names(EXTENSION), "not an OpenAI parameter"),
        CONTEXT: convert(truncation_for_openai, '"truncate" is truncation "auto"'),
        **_refuse(RESPONSES.names(VLLM), "a vLLM parameter"),
        UNKNOWN: FieldRule(Action.REJECT, note="unknown to OpenAI's Responses API"),
    }
)

# OpenAI's fields that vLLM's ResponsesRequest does not have (its server would ignore them).
NOT_VLLM = ("safety_identifier", "prompt_cache_retention")
VLLM_RULES = derive(
    OPENAI_RULES,
    **_refuse(NOT_VLLM, "not served by vLLM's Responses API"),
    stream_options=DROP,  # an encoding option of OpenAI's streams (obfuscation) vLLM lacks
    top_k=passes(-1),
    min_p=passes(0.0, 1.0),
    repetition_penalty=passes(),
    ignore_eos=passes(),
    **_refuse(("mirostat_target", "mirostat_lr"), "vLLM has no mirostat"),
    **{name: passes() for name in RESPONSES.names(VLLM)},
    **{UNKNOWN: passes()},
)

# By dialect: the upstreams that serve the Responses API natively.
RULES: Mapping[str, Mapping[str, FieldRule]] = MappingProxyType(
    {"openai": OPENAI_RULES, "vllm-server": VLLM_RULES}
)

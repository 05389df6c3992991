"""Chat through OpenAI-compatible upstreams: each dialect's parameter table for
CreateChatCompletionRequest, derived from OpenAI's as the completions tables are.

OpenAI serves its own fields (audio, web search, stored completions, …) and refuses the
extensions; Fireworks serves the sampling extensions and the context-length behaviour, and none
of OpenAI's audio or storage fields; vLLM's server serves its extras; any other OpenAI-compatible
server gets what it is sent (such servers ignore what they do not know).
Azure OpenAI serves OpenAI's fields, but for its web search.
`context_length_exceeded_behavior` is served as for completions: sent to Fireworks, "truncate"
emulated by a retry elsewhere, and "error" checked first on vLLM's server, which clamps.
Messages in roles OpenAI does not have (a chat template's own) go to vLLM and to other
OpenAI-compatible servers; OpenAI and Fireworks refuse them, naming the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from core.chat import CHAT, VLLM_FIELDS
from core.completions import CONTEXT
from core.errors import UnsupportedParameter
from core.fields import EXTENSION, OPENAI
from core.messages import openai_roles_only
from providers.rules.openai import CONTINUOUS, usage_always
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, convert, derive, passes
from providers.rules.vllm import SEED, response_format_for_vllm, top_p_nonzero

# OpenAI's fields that only OpenAI serves: the others refuse them rather than ignore them.
OPENAI_ONLY = (
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "store",
    "metadata",
    "service_tier",
    "verbosity",
    "prompt_cache_key",
    "safety_identifier",
)
RANGES: Mapping[str, tuple[float | None, float | None]] = MappingProxyType(
    {
        f.name: (f.lo, f.hi)
        for f in CHAT.fields
        if f.family is OPENAI and (f.lo is not None or f.hi is not None)
    }
)


def for_openai(value: Any) -> Mapping[str, Any]:
    """OpenAI has no grammar format, and spells a JSON object with a schema `json_schema`
    (Fireworks' `{"type": "json_object", "schema": …}` would be refused by OpenAI)."""
    if value.get("type") == "grammar":
        raise UnsupportedParameter(
            "Invalid value for 'response_format.type': 'grammar' is served by Fireworks and "
            "vLLM targets only.",
            param="response_format.type",
        )
    return response_format_for_vllm(value)


def grammar_for_vllm(value: Any) -> Mapping[str, Any]:
    """vLLM's server takes a grammar as a structured output."""
    if value.get("type") == "grammar":
        return {"structured_outputs": {"grammar": value["grammar"]}}
    return response_format_for_vllm(value)


def openai_roles(value: Any) -> Mapping[str, Any]:
    """OpenAI and Fireworks know only OpenAI's roles; vLLM takes any (a template's own)."""
    openai_roles_only(value)
    return {"messages": value}


def _refuse(names: tuple[str, ...], note: str) -> dict[str, FieldRule]:
    return {name: FieldRule(Action.REJECT, note=note) for name in names}


OPENAI_RULES: Mapping[str, FieldRule] = MappingProxyType(
    {
        **{name: passes(*RANGES.get(name, (None, None))) for name in CHAT.names(OPENAI)},
        "messages": convert(openai_roles),
        "stream_options": convert(usage_always, "always include_usage upstream"),
        "response_format": convert(for_openai, "json_object+schema → json_schema"),
        CONTINUOUS: FieldRule(Action.REJECT, note="OpenAI's streams have no per-chunk usage"),
        **_refuse(CHAT.names(EXTENSION), "not an OpenAI parameter"),
        # OpenAI errors on overflow natively; "truncate" is emulated by a retry with less room.
        CONTEXT: EMULATE,
        **_refuse(VLLM_FIELDS, "a vLLM parameter"),
        UNKNOWN: FieldRule(Action.REJECT, note="unknown to OpenAI's chat completions API"),
    }
)

NOT_FIREWORKS = "Fireworks' chat completions API has no such parameter"
FIREWORKS_RULES = derive(
    OPENAI_RULES,
    top_k=passes(0, 100),
    min_p=passes(0.0, 1.0),
    repetition_penalty=passes(0.0, 2.0),
    top_logprobs=passes(0, 5),
    mirostat_target=passes(),
    mirostat_lr=passes(),
    ignore_eos=passes(),
    context_length_exceeded_behavior=passes(),  # always sent: Fireworks defaults to truncate
    stream_options=EMULATE,  # usage arrives on the last chunk regardless
    response_format=passes(),  # json_object (+schema), json_schema and grammar are native
    **_refuse(OPENAI_ONLY, NOT_FIREWORKS),
    **{CONTINUOUS: FieldRule(Action.REJECT, note="Fireworks reports usage once, at the end")},
    **{UNKNOWN: FieldRule(Action.REJECT, note=NOT_FIREWORKS)},
)

VLLM_RULES = derive(
    OPENAI_RULES,
    top_p=convert(top_p_nonzero, "0 becomes 1e-9: vLLM rejects top_p=0"),
    messages=passes(),  # any role: vLLM hands it to the chat template
    seed=SEED,
    top_k=passes(-1),
    min_p=passes(0.0, 1.0),
    repetition_penalty=passes(),
    ignore_eos=passes(),
    response_format=convert(grammar_for_vllm, "json_object+schema → json_schema"),
    reasoning_effort=passes(),
    **_refuse(("mirostat_target", "mirostat_lr"), "vLLM has no mirostat"),
    **_refuse(tuple(n for n in OPENAI_ONLY if n != "reasoning_effort"), "not served by vLLM"),
    **{name: passes() for name in VLLM_FIELDS},
    **{CONTINUOUS: passes(), UNKNOWN: passes()},
)

GENERIC_RULES = derive(
    OPENAI_RULES,
    messages=passes(),  # any role, as any other field: the server says what it serves
    response_format=passes(),
    top_k=passes(),
    min_p=passes(0.0, 1.0),
    repetition_penalty=passes(),
    ignore_eos=passes(),
    **_refuse(("mirostat_target", "mirostat_lr"), "not supported for generic servers"),
    **{name: passes() for name in VLLM_FIELDS},
    **{CONTINUOUS: passes(), UNKNOWN: passes()},
)

# Azure OpenAI serves OpenAI's chat API, but not its web search (Azure has it in its Responses
# API only).
AZURE_RULES = derive(
    OPENAI_RULES,
    **_refuse(("web_search_options",), "Azure OpenAI's chat completions have no web search"),
)

RULES: Mapping[str, Mapping[str, FieldRule]] = MappingProxyType(
    {
        "openai": OPENAI_RULES,
        "fireworks": FIREWORKS_RULES,
        "vllm-server": VLLM_RULES,
        "openai-compatible": GENERIC_RULES,
        "azure-openai": AZURE_RULES,
    }
)

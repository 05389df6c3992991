"""OpenAI's legacy /v1/completions: the base rule table every other table derives from (the
upstream dialects, the in-process engine).

Ranges are OpenAI's (its request schema); the gateway's own validation already enforces them, the
rules repeat them so a derived dialect can narrow them and a test can read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from core.checks import INT64_MAX, INT64_MIN
from core.completions import VLLM_FIELDS
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, convert, passes

CONTINUOUS = "stream_options.continuous_usage_stats"


def usage_always(value: Any) -> Mapping[str, Any]:
    """The gateway needs usage for accounting, whatever the caller asked; whether the caller
    sees the usage chunk is decided when rendering (`include_usage`). Per-chunk usage goes
    upstream only where the dialect passed it and the caller will see it (with include_usage,
    as vLLM reads it)."""
    options = {"include_usage": True}
    if value.get("include_usage") and value.get("continuous_usage_stats"):
        options["continuous_usage_stats"] = True
    return {"stream_options": options}


NOT_OPENAI = "not an OpenAI parameter"

RULES: Mapping[str, FieldRule] = MappingProxyType(
    {
        "model": passes(),
        "prompt": passes(),
        "best_of": passes(0, 20),
        "echo": passes(),
        "frequency_penalty": passes(-2.0, 2.0),
        "logit_bias": passes(),
        "logprobs": passes(0, 5),
        "max_tokens": passes(0),
        "n": passes(1, 128),
        "presence_penalty": passes(-2.0, 2.0),
        "seed": passes(INT64_MIN, INT64_MAX),  # checked here, not when parsed: core.completions
        "stop": passes(),
        "stream": passes(),
        "stream_options": convert(usage_always, "always include_usage upstream"),
        CONTINUOUS: FieldRule(Action.REJECT, note="OpenAI's streams have no per-chunk usage"),
        "suffix": passes(),
        "temperature": passes(0.0, 2.0),
        "top_p": passes(0.0, 1.0),
        "user": passes(),
        # OpenAI errors on overflow natively; "truncate" is emulated by a retry with less room.
        "context_length_exceeded_behavior": EMULATE,
        "ignore_eos": FieldRule(Action.REJECT, note=NOT_OPENAI),
        "mirostat_target": FieldRule(Action.REJECT, note=NOT_OPENAI),
        "mirostat_lr": FieldRule(Action.REJECT, note=NOT_OPENAI),
        "top_k": FieldRule(Action.REJECT, note=NOT_OPENAI),
        "repetition_penalty": FieldRule(Action.REJECT, note=NOT_OPENAI),
        "min_p": FieldRule(Action.REJECT, note=NOT_OPENAI),
        "response_format": FieldRule(
            Action.REJECT, note="legacy completions have no response_format"
        ),
        **{name: FieldRule(Action.REJECT, note="a vLLM parameter") for name in VLLM_FIELDS},
        UNKNOWN: FieldRule(Action.REJECT, note="unknown to OpenAI's completions API"),
    }
)

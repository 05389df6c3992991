"""vLLM's OpenAI-compatible server.

It accepts its own extras (`min_tokens`, `structured_outputs`, …), so unknown fields pass.
Current servers lower `max_tokens` to fit the context window instead of failing: that is the
"truncate" behaviour already, and what a request without `context_length_exceeded_behavior`
gets, as from vLLM itself; "error" (OpenAI's), when asked, is checked by the gateway first. Its
seed is an int64, refused outside that range in vLLM's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from core.checks import INT64_MAX, INT64_MIN, shown_number
from core.completions import VLLM_FIELDS
from core.errors import InvalidRequest
from providers.rules.openai import CONTINUOUS
from providers.rules.openai import RULES as OPENAI
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, convert, derive, passes

# vLLM requires top_p in (0, 1]; OpenAI's top_p=0 means "only the most likely token", which a
# tiny positive nucleus reproduces exactly.
TINY_TOP_P = 1e-9


def top_p_nonzero(value: Any) -> Mapping[str, Any]:
    return {"top_p": TINY_TOP_P if value == 0 else value}


def response_format_for_vllm(value: Any) -> Mapping[str, Any]:
    """Fireworks-style `{"type": "json_object", "schema": …}` is spelled `json_schema` in vLLM,
    which would otherwise ignore the schema silently."""
    if value.get("type") == "json_object" and value.get("schema") is not None:
        spec = {"name": "schema", "schema": value["schema"]}
        return {"response_format": {"type": "json_schema", "json_schema": spec}}
    return {"response_format": value}


def pydantic_bounds(name: str, value: Any, lo: float | None, hi: float | None) -> InvalidRequest:
    """A bound vLLM's request model declares (pydantic's `ge`/`le`), in vLLM's words: the check's
    type and message as vLLM's server answers them."""
    if lo is not None and value < lo:
        kind, words = "greater_than_equal", f"greater than or equal to {shown_number(lo)}"
    else:
        kind, words = "less_than_equal", f"less than or equal to {shown_number(hi or 0)}"
    return InvalidRequest(
        f"Invalid value for '{name}' ({kind}): Input should be {words}, got {value}.", param=name
    )


# vLLM's seed: an int64 (`ge`/`le` on its request model).
SEED = passes(INT64_MIN, INT64_MAX, pydantic_bounds)

RULES: Mapping[str, FieldRule] = MappingProxyType(
    derive(
        OPENAI,
        best_of=EMULATE,  # removed from current vLLM (silently ignored there)
        suffix=FieldRule(Action.REJECT, note="vLLM does not support suffix"),
        top_p=convert(top_p_nonzero, "0 becomes 1e-9: vLLM rejects top_p=0"),
        seed=SEED,
        top_k=passes(-1),
        min_p=passes(0.0, 1.0),
        repetition_penalty=passes(),
        ignore_eos=passes(),
        response_format=convert(response_format_for_vllm, "json_object+schema → json_schema"),
        mirostat_target=FieldRule(Action.REJECT, note="vLLM has no mirostat"),
        mirostat_lr=FieldRule(Action.REJECT, note="vLLM has no mirostat"),
        # Its own extras pass unchanged; the server checks logprobs against its --max-logprobs.
        **{name: passes() for name in VLLM_FIELDS},
        logprobs=passes(-1),
        **{CONTINUOUS: passes(), UNKNOWN: passes()},
    )
)

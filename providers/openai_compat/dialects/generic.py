"""Any other OpenAI-compatible server: OpenAI's table, but lenient about extensions.

Such servers (llama.cpp, TGI, SGLang, LM Studio, …) usually accept the common sampling
extras and ignore what they do not know, so unknown fields pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from core.completions import VLLM_FIELDS
from providers.openai_compat.dialects.spec import DialectSpec
from providers.rules.openai import CONTINUOUS
from providers.rules.openai import RULES as OPENAI
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, derive, passes

NO_MIROSTAT = "not supported for generic OpenAI-compatible servers"

RULES: Mapping[str, FieldRule] = MappingProxyType(
    derive(
        OPENAI,
        best_of=EMULATE,
        top_k=passes(),
        min_p=passes(0.0, 1.0),
        repetition_penalty=passes(),
        ignore_eos=passes(),
        response_format=passes(),
        mirostat_target=FieldRule(Action.REJECT, note=NO_MIROSTAT),
        mirostat_lr=FieldRule(Action.REJECT, note=NO_MIROSTAT),
        **{name: passes() for name in VLLM_FIELDS},  # many such servers are vLLM-based
        **{CONTINUOUS: passes(), UNKNOWN: passes()},
    )
)

SPEC = DialectSpec(name="openai-compatible", rules=RULES)

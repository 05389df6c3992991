"""Fireworks /inference/v1/completions: OpenAI plus sampling extensions.

Its schema is `additionalProperties: false`, so anything it does not document is not sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from core.completions import VLLM_FIELDS
from providers.openai_compat.dialects.spec import DialectSpec
from providers.rules.openai import CONTINUOUS
from providers.rules.openai import RULES as OPENAI
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, derive, passes

NOT_FIREWORKS = "Fireworks' completions API has no such parameter"

RULES: Mapping[str, FieldRule] = MappingProxyType(
    derive(
        OPENAI,
        best_of=EMULATE,
        suffix=FieldRule(Action.REJECT, note=NOT_FIREWORKS),
        stream_options=EMULATE,  # no such option: usage arrives on the last chunk regardless
        top_k=passes(0, 100),
        min_p=passes(0.0, 1.0),
        repetition_penalty=passes(0.0, 2.0),
        mirostat_target=passes(),
        mirostat_lr=passes(),
        ignore_eos=passes(),
        response_format=passes(),  # json_object (+schema) and json_schema are both native
        context_length_exceeded_behavior=passes(),  # always sent: Fireworks defaults to truncate
        logprobs=passes(0, 5),
        # vLLM's extras. Fireworks has return_token_ids too, but the gateway may cut a stop
        # string Fireworks included from the text, and its token ids would still carry it.
        **{name: FieldRule(Action.REJECT, note=NOT_FIREWORKS) for name in VLLM_FIELDS},
        **{CONTINUOUS: FieldRule(Action.REJECT, note="Fireworks reports usage once, at the end")},
        **{UNKNOWN: FieldRule(Action.REJECT, note=NOT_FIREWORKS)},
    )
)

SPEC = DialectSpec(
    name="fireworks",
    rules=RULES,
    stop_may_be_included=True,
    usage_on_last_chunk=True,
    needs_explicit_context_behavior=True,
)

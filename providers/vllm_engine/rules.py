"""The in-process engine's parameter table: vLLM's server table, with what the gateway does
itself for the engine.

Fields that reach `sampling.sampling_kwargs` pass; what the adapter carries out (best_of,
context fitting, usage in streams) is emulated; Mirostat passes to the engine's logits
processor. vLLM's own extras are not served by the engine yet, so unknown fields follow the
model's `unsupported_params` (400 or drop), never a silent no-op. vLLM's own extras are
refused the same way until the engine serves them (each row below turns to `passes` as it does).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.schemas import VLLM_FIELDS
from providers.openai_compat.dialects.vllm import RULES as VLLM_SERVER
from providers.params import EMULATE, UNKNOWN, Action, Rule, derive, passes
from providers.vllm_engine.sampling import VLLM_DIRECT

NOT_YET = "not served by the in-process vLLM engine yet"
# vLLM's extras the engine serves, as vLLM's server does.
# Read by the adapter, not by sampling: the prompts' tokenization, the request's priority.
ADAPTER_READS = (
    "add_special_tokens",
    "truncate_prompt_tokens",
    "truncation_side",
    "priority",
    "return_tokens_as_token_ids",  # the rendering of logprobs' tokens
)
SERVED = (*VLLM_DIRECT, "vllm_xargs", "structured_outputs", *ADAPTER_READS)

REFUSED = Rule(Action.REJECT, note=NOT_YET)

RULES: Mapping[str, Rule] = MappingProxyType(
    derive(
        VLLM_SERVER,
        # The engine's usage is exact from token counts; the gateway renders the usage chunk.
        stream_options=EMULATE,
        # Checked exactly with the engine's tokenizer before anything is generated.
        context_length_exceeded_behavior=EMULATE,
        response_format=passes(),  # sampling.structured_outputs takes all three forms
        mirostat_target=passes(),  # ranges: sampling.mirostat_args (both must be > 0)
        mirostat_lr=passes(),
        **{name: passes() if name in SERVED else REFUSED for name in VLLM_FIELDS},
        logprobs=passes(-1),  # the adapter checks the engine's own cap (max_logprobs)
        **{UNKNOWN: Rule(Action.REJECT, note="not supported by the in-process vLLM engine")},
    )
)

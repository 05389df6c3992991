"""The vLLM V1 logits processor for Mirostat v2; the maths is in `mirostat`.

Load it with the engine argument `logits_processors=[mirostat.LOGITS_PROCESSOR]`; vLLM imports
this module in its engine processes, so it must be importable there. A request turns it on with
`SamplingParams(extra_args={"mirostat_target": τ, "mirostat_lr": η})`; requests without a target
never reach it.

With n > 1, vLLM's front end fans the request out into n child requests, each added to the batch
on its own, so `new_req_logits_processor` runs once per sequence and every sequence gets its own
`MirostatState` (children may share one SamplingParams object, so no state lives on it).
"""

from __future__ import annotations

from vllm import SamplingParams
from vllm.logits_process import LogitsProcessor as RequestLogitsProcessor
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from providers.vllm_engine.mirostat import MirostatState, from_extra_args


class MirostatLP(AdapterLogitsProcessor):
    """Mirostat v2 for the requests whose `extra_args` carry `mirostat_target`."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        # vLLM turns this ValueError into a VLLMValidationError (HTTP 400 on its server).
        from_extra_args(sampling_params.extra_args)

    def is_argmax_invariant(self) -> bool:
        # Truncation always keeps the most probable token, so greedy picks are unchanged; vLLM
        # then runs it only for sampled rows, after penalties and temperature (as llama.cpp does).
        return True

    def new_req_logits_processor(self, params: SamplingParams) -> RequestLogitsProcessor | None:
        settings = from_extra_args(params.extra_args)
        return None if settings is None else MirostatState(*settings)

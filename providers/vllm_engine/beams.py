"""vLLM's beam search (`use_beam_search`) on the in-process engine, as vLLM's server runs it.

vLLM's server does not hand beam search to the engine as one request: its
`BeamSearchOnlineMixin.beam_search` (vllm/entrypoints/generate/beam_search/online.py) drives the
engine one token at a time, each beam a request asking for `2 * beam_width` logprobs, and yields
one final `RequestOutput` with the `n` best beams. The same code runs here, on the engine this
provider owns, so results are vLLM's. Only what `CompletionRequest.to_beam_search_params` reads
applies; the gateway refuses the fields beam search would ignore (`providers.rules.vllm_checks`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM


def beam_kwargs(body: Mapping[str, Any], n: int, max_tokens: int) -> dict[str, Any]:
    """`BeamSearchParams` fields for a request, as `to_beam_search_params` maps them: n beams,
    temperature 1.0 when unset."""
    temperature = body.get("temperature")
    return {
        "beam_width": n,
        "max_tokens": max_tokens,
        "ignore_eos": bool(body.get("ignore_eos", False)),
        "temperature": 1.0 if temperature is None else temperature,
        "length_penalty": body.get("length_penalty", 1.0),
        "include_stop_str_in_output": bool(body.get("include_stop_str_in_output", False)),
        "skip_special_tokens": body.get("skip_special_tokens", True),
    }


def search(
    llm: AsyncLLM, engine_input: Any, request_id: str, kwargs: Mapping[str, Any]
) -> AsyncGenerator[RequestOutput, None]:
    """The beam search of one rendered prompt: one final `RequestOutput`, outputs best first.
    Closing the generator early cancels the engine requests of the step in progress."""
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
    from vllm.sampling_params import BeamSearchParams

    searcher = BeamSearchOnlineMixin()
    searcher.engine_client = llm
    searcher.renderer = llm.renderer
    return searcher.beam_search(
        prompt=engine_input, request_id=request_id, params=BeamSearchParams(**kwargs)
    )

"""The engine's request building: a prepared completion (`EngineCompletion`) becomes one engine
request per prompt, as vLLM's server makes them. Prompts and embedding inputs are rendered by the
engine's own renderer, tokenized as vLLM's server tokenizes them; each prompt is fitted into the
window (`context.fit`) and gets its SamplingParams (`sampling`), or vLLM's beam search (`beams`).
What comes out is merged: the outputs of one caller's engine requests, as they come.

No length check happens while rendering: the callers check lengths with OpenAI's wording
(`context.fit` for completions, `pooling` for embeddings).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from core.completions import CompletionRequest
from core.errors import InvalidRequest
from providers.vllm_engine import beams, output
from providers.vllm_engine.fanout import Fanout
from providers.vllm_engine.sampling import Generation, build, sampling_kwargs
from providers.vllm_engine.window import Overflow, fit

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM

T = TypeVar("T")
LOGPROB_FIELDS = (("logprobs", "sample"), ("prompt_logprobs", "prompt"))  # vLLM's wording


@dataclass(frozen=True, slots=True)
class EngineCompletion:
    """A completion mapped for the engine: `Prepared.state`."""

    body: Mapping[str, Any]  # the fields `sampling` reads
    fan: Fanout
    shape: output.Rendering
    overflow: Overflow  # context_length_exceeded_behavior, vLLM's own when unset
    beam: bool  # vLLM's beam search (`beams`) instead of sampling
    request: CompletionRequest  # as validated: its prompts, max_tokens, echo


def check_request(request: CompletionRequest, max_logprobs: int) -> None:
    """What vLLM's server refuses before any work, as 400s naming the field: prompt
    embeddings (the engine serves text and token ids), logprobs and prompt_logprobs above the
    engine's cap. (An empty prompt alone is refused by vllm_checks, in vLLM's words; an empty
    one in a list is served, as vLLM's server serves it: its tokens are the special ones the
    tokenizer adds.)"""
    if "prompt_embeds" in request.fields:
        raise InvalidRequest(
            "'prompt_embeds' is not supported by the in-process vLLM engine: send the prompt "
            "as text or token ids.",
            param="prompt_embeds",
        )
    for name, kind in LOGPROB_FIELDS:
        asked = request.fields.get(name)
        if asked is not None and max_logprobs != -1 and not 0 <= asked <= max_logprobs:
            raise InvalidRequest(
                f"Requested {kind} logprobs of {asked}, which is greater than max allowed: "
                f"{max_logprobs}.",
                param=name,
            )


async def start(
    llm: AsyncLLM, plan: EngineCompletion, rid: str, *, stream: bool, trace: str = ""
) -> tuple[list[Any], list[AsyncGenerator[RequestOutput, None]]]:
    """Render the prompts, fit them in the window and make one engine request per prompt (each
    starts when its generator is first iterated)."""
    req = plan.request
    if req.prompt_is_tokens:  # before rendering: a 400 naming the prompt, as vLLM's server
        for ids in req.prompts:
            if isinstance(ids, list):
                llm.renderer.validate_token_ids(ids, parameter="prompt")
    window = llm.model_config.max_model_len
    inputs = await render(llm, req.prompts, completion_tokenizing(plan.body, req, window))
    lengths = [len(i["prompt_token_ids"]) for i in inputs]
    budgets = fit(lengths, req.max_tokens, window, plan.overflow)
    if plan.beam:
        n = plan.fan.generate
        return inputs, [
            beams.search(llm, inp, f"{rid}-{i}", beams.beam_kwargs(plan.body, n, budget))
            for i, (inp, budget) in enumerate(zip(inputs, budgets, strict=True))
        ]
    params: dict[int, Any] = {}
    for budget in budgets:
        if budget not in params:
            gen = Generation(plan.fan.generate, budget, stream)
            params[budget] = build(sampling_kwargs(plan.body, gen))
    priority = plan.body.get("priority", 0)
    generators = [
        llm.generate(
            inp, params[budget], f"{rid}-{i}", priority=priority, trace_headers=traced(trace)
        )
        for i, (inp, budget) in enumerate(zip(inputs, budgets, strict=True))
    ]
    return inputs, generators


def traced(trace: str) -> dict[str, str] | None:
    """vLLM's trace headers of a try's traceparent: a vLLM started with
    `otlp_traces_endpoint` records its request's span as the try's child."""
    return {"traceparent": trace} if trace else None


def truncation(body: Mapping[str, Any], room: int) -> int | None:
    """`truncate_prompt_tokens` as vLLM reads it: -1 is the room there is; more than that is a
    400 naming it."""
    keep = body.get("truncate_prompt_tokens")
    if keep == -1:
        return room
    if keep is not None and keep > room:
        raise InvalidRequest(
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = {room}. "
            "Please request a smaller truncation size.",
            param="truncate_prompt_tokens",
        )
    return keep


def completion_tokenizing(body: Mapping[str, Any], req: CompletionRequest, window: int) -> Any:
    """How vLLM's server tokenizes completion prompts (`CompletionRequest.build_tok_params`):
    special tokens as asked, the prompt's text kept for echo, truncation as asked (-1: to the
    window, less the one token generation needs)."""
    from vllm.renderers.params import TokenizeParams

    return TokenizeParams(
        max_total_tokens=None,
        add_special_tokens=body.get("add_special_tokens", True),
        needs_detokenization=req.echo,
        truncate_prompt_tokens=truncation(body, window - 1 if req.max_tokens else window),
        truncation_side=body.get("truncation_side"),
    )


def embedding_tokenizing(body: Mapping[str, Any], llm: AsyncLLM) -> Any:
    """How vLLM's server tokenizes embedding inputs (`EmbeddingTokenizeParamsMixin`): special
    tokens as asked, the model's lower-casing, truncation as asked (-1: to the window)."""
    from vllm.renderers.params import TokenizeParams

    config = llm.model_config
    return TokenizeParams(
        max_total_tokens=None,
        max_output_tokens=0,
        add_special_tokens=body.get("add_special_tokens", True),
        do_lower_case=(config.encoder_config or {}).get("do_lower_case", False),
        truncate_prompt_tokens=truncation(body, config.max_model_len),
        truncation_side=body.get("truncation_side"),
    )


async def render(llm: AsyncLLM, prompts: Sequence[Any], params: Any) -> list[Any]:
    """Engine inputs as vLLM's server renders completion prompts and embedding inputs."""
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    parsed = [parse_model_prompt(llm.model_config, p) for p in prompts]
    return list(await llm.renderer.render_cmpl_async(parsed, params))


def merge(generators: list[AsyncGenerator[T, None]]) -> AsyncGenerator[tuple[int, T], None]:
    """The outputs of several engine requests as they come, each with its request's index."""
    from vllm.utils.async_utils import merge_async_iterators

    return merge_async_iterators(*generators)


async def finals(generators: list[AsyncGenerator[T, None]]) -> list[T]:
    """The final output of each engine request, in request order (closing them all on the way
    out, which aborts any left unfinished)."""
    results: list[T | None] = [None] * len(generators)
    async with aclosing(merge(generators)) as merged:
        async for idx, result in merged:
            results[idx] = result
    return [r for r in results if r is not None]

"""Engine requests: what goes in (prompts and embedding inputs rendered by the engine's own
renderer, tokenized as vLLM's server tokenizes them) and what comes out (the outputs of one
caller's engine requests, merged).

No length check happens while rendering: the callers check lengths with OpenAI's wording
(`context.fit` for completions, `pooling` for embeddings).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.errors import InvalidRequest
from gateway.schemas import CompletionRequest

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

T = TypeVar("T")


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

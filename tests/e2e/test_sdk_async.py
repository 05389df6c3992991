"""The same gateway through `AsyncOpenAI`: plain and streamed completions, errors before and
after the first byte, and many concurrent streams that must not mix."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai.types import Completion

from tests.e2e.conftest import Env
from tests.e2e.support import (
    DIALECT_ALIASES,
    TARGET_LABEL,
    expect,
    outputs,
    prompt_tokens,
    streamed_texts,
)

pytestmark = pytest.mark.parametrize("alias", DIALECT_ALIASES)

PROMPTS = ["Once upon a time", "Write a poem about the sea"]
STOP = " eta"


async def collect(client: openai.AsyncOpenAI, **kw: object) -> list[Completion]:
    chunks = await client.completions.create(stream=True, **kw)  # type: ignore[call-overload]
    async with chunks:
        return [chunk async for chunk in chunks]


async def test_async_completion(async_sdk: openai.AsyncOpenAI, alias: str) -> None:
    resp = await async_sdk.completions.create(
        model=alias, prompt=PROMPTS, n=2, max_tokens=6, stop=STOP
    )
    expected = [expect(p, i, 6, STOP) for p in PROMPTS for i in range(2)]
    assert outputs(resp) == [(i, e.text, e.finish_reason) for i, e in enumerate(expected)]
    assert resp.model == alias and resp.id.startswith("cmpl-")
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == prompt_tokens(PROMPTS)
    assert resp.usage.completion_tokens == sum(e.completion_tokens for e in expected)


async def test_async_stream(async_sdk: openai.AsyncOpenAI, alias: str) -> None:
    chunks = await collect(
        async_sdk,
        model=alias,
        prompt=PROMPTS,
        n=2,
        max_tokens=6,
        stop=STOP,
        stream_options={"include_usage": True},
    )
    expected = [expect(p, i, 6, STOP) for p in PROMPTS for i in range(2)]
    *content, last = chunks
    assert streamed_texts(content) == {i: e.text for i, e in enumerate(expected)}
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == sum(e.completion_tokens for e in expected)
    assert all(c.usage is None for c in content)


async def test_async_error_before_the_first_byte(async_sdk: openai.AsyncOpenAI, alias: str) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        await collect(async_sdk, model=alias, prompt="__status_500__")
    assert info.value.status_code == 502
    assert TARGET_LABEL[alias] in info.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        await async_sdk.completions.create(model=alias, prompt="x", logprobs=9)
    assert bad.value.param == "logprobs"


async def test_async_midstream_error(async_sdk: openai.AsyncOpenAI, alias: str) -> None:
    texts: list[str] = []
    chunks = await async_sdk.completions.create(
        model=alias, prompt="__midstream_error__", stream=True
    )
    with pytest.raises(openai.APIError) as info:
        async with chunks:
            async for chunk in chunks:
                texts += [c.text for c in chunk.choices]
    assert not isinstance(info.value, openai.APIStatusError)
    assert TARGET_LABEL[alias] in info.value.message
    assert texts


async def test_concurrent_streams_do_not_mix(
    env: Env, async_sdk: openai.AsyncOpenAI, alias: str
) -> None:
    prompts = [f"request number {i} of the batch" for i in range(24)]

    async def one(prompt: str) -> str:
        chunks = await collect(async_sdk, model=alias, prompt=prompt, max_tokens=8, stop=STOP)
        return streamed_texts(chunks)[0]

    texts = await asyncio.gather(*(one(p) for p in prompts))
    assert texts == [expect(p, 0, 8, STOP).text for p in prompts]
    assert len(env.upstream(alias).requests()) == len(prompts)

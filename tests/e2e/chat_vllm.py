"""What the chat suites on vLLM share (tests/e2e/test_engine_chat.py through the in-process
engine, test_vllm_server_chat.py through vLLM's server as an upstream): the requests, and the
helpers that send them and read the answers, with the same openai SDK on either side."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam
from pydantic import BaseModel

from tests.e2e.vllm_stack import MODEL

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Hello, what is the weather?"}
]
OTHER: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a tiny model."},
    {"role": "user", "content": "Once upon a time"},
]
MAX_TOKENS = 12
SEEDED: dict[str, Any] = {"temperature": 0.9, "seed": 7}
# JSON whitespace and the tiny vocabulary's other blank tokens: without them a random model's
# constrained JSON has to move on.
NO_WHITESPACE = {str(i): -100 for i in (201, 202, 203, 204, 205, 224, 378)}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NAMED: dict[str, Any] = {"type": "function", "function": {"name": "get_weather"}}
# What a tool call takes: the hermes envelope and its JSON, byte by byte in the tiny vocabulary.
TOOL_TOKENS = 150
TOOLS: dict[str, Any] = {
    "tools": [TOOL],
    "parallel_tool_calls": False,
    "logit_bias": NO_WHITESPACE,
    "max_tokens": TOOL_TOKENS,
    "temperature": 0,
}


class Weather(BaseModel):
    city: Literal["Paris", "Rome"]
    rainy: bool


def chat(client: openai.OpenAI, **kw: Any) -> ChatCompletion:
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("max_tokens", MAX_TOKENS)
    resp: ChatCompletion = client.chat.completions.create(**kw)
    return resp


def both(
    engine: openai.OpenAI, direct: openai.OpenAI, **kw: Any
) -> tuple[ChatCompletion, ChatCompletion]:
    """The same request through the gateway's engine and straight to vLLM's server."""
    return chat(engine, **kw), chat(direct, **kw)


def answers(resp: ChatCompletion) -> list[tuple[int, str | None, str]]:
    return [(c.index, c.message.content, c.finish_reason) for c in resp.choices]


def counts(resp: ChatCompletion | ChatCompletionChunk) -> tuple[int, int, int]:
    usage = resp.usage
    assert usage is not None
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def assert_same(ours: ChatCompletion, theirs: ChatCompletion) -> None:
    assert answers(ours) == answers(theirs)
    assert counts(ours) == counts(theirs)
    for choice in ours.choices:
        assert choice.message.role == "assistant"
        assert choice.message.refusal is None


def stream(client: openai.OpenAI, **kw: Any) -> list[ChatCompletionChunk]:
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("max_tokens", MAX_TOKENS)
    with client.chat.completions.create(stream=True, **kw) as chunks:
        return list(chunks)


def streamed(chunks: list[ChatCompletionChunk]) -> dict[int, str]:
    """Each choice's content, its deltas joined."""
    parts: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            parts[choice.index].append(choice.delta.content or "")
    return {index: "".join(p) for index, p in sorted(parts.items())}


def finishes(chunks: list[ChatCompletionChunk]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                found[choice.index].append(choice.finish_reason)
    return dict(found)


def first_deltas(chunks: list[ChatCompletionChunk]) -> dict[int, Any]:
    seen: dict[int, Any] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            seen.setdefault(choice.index, choice.delta)
    return seen


def streamed_calls(chunks: list[ChatCompletionChunk]) -> list[dict[str, Any]]:
    """Tool call deltas put together by index, checking that id, type and name come first."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for piece in choice.delta.tool_calls or []:
                if piece.index not in calls:
                    assert piece.id and piece.type == "function"
                    assert piece.function is not None and piece.function.name
                    calls[piece.index] = {"name": piece.function.name, "arguments": ""}
                else:
                    assert piece.id is None
                if piece.function is not None and piece.function.arguments:
                    calls[piece.index]["arguments"] += piece.function.arguments
    return [calls[i] for i in sorted(calls)]


def extra(obj: Any, key: str) -> Any:
    """A vLLM extra the SDK keeps as `model_extra`."""
    return (obj.model_extra or {}).get(key)


def refusal(call: Any) -> tuple[int, str | None, str]:
    """A request's 400 as (status, param, message)."""
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    return caught.value.status_code, caught.value.param, caught.value.message


def prompt_tokens(direct: openai.OpenAI, messages: Sequence[Mapping[str, Any]]) -> int:
    return counts(chat(direct, messages=messages, max_tokens=1))[0]


def long_messages(direct: openai.OpenAI, words: int) -> tuple[list[dict[str, Any]], int]:
    messages = [{"role": "user", "content": "hello world " * words}]
    return messages, prompt_tokens(direct, messages)

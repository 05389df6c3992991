"""Chat through the gateway to vLLM's own OpenAI server as an upstream (`type: vllm-server`, the
stack's `server` path), compared with the same server called directly: the gateway adds its
checks, OpenAI's context-length error and the alias as `model`, and otherwise hands on vLLM's
answers (texts, logprobs, tool calls, vLLM's extras) as vLLM wrote them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.chat_vllm import (
    MESSAGES,
    NAMED,
    OTHER,
    SEEDED,
    TOOLS,
    Weather,
    answers,
    assert_same,
    both,
    chat,
    counts,
    extra,
    finishes,
    long_messages,
    refusal,
    stream,
    streamed,
    streamed_calls,
)
from tests.e2e.vllm_stack import ASK_ERROR, MODEL, WINDOW, Stack
from tests.vllm_proc import require_vllm

require_vllm()


@pytest.fixture(scope="module")
def server(vllm_stack: Stack) -> Iterator[openai.OpenAI]:
    with vllm_stack.client("server") as client:
        yield client


def test_greedy_and_seeded_answers_are_vllm_s(server: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(server, direct, temperature=0)
    assert_same(ours, theirs)
    assert ours.id.startswith("chatcmpl-") and ours.id != theirs.id
    assert ours.model == MODEL and ours.object == "chat.completion"
    assert_same(*both(server, direct, messages=OTHER, n=2, **SEEDED))


def test_extras_pass_and_come_back(server: openai.OpenAI, direct: openai.OpenAI) -> None:
    extras = {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2, "return_token_ids": True}
    ours, theirs = both(server, direct, **SEEDED, extra_body=extras)
    assert_same(ours, theirs)
    assert extra(ours, "prompt_token_ids") == extra(theirs, "prompt_token_ids")
    assert extra(ours.choices[0], "token_ids") == extra(theirs.choices[0], "token_ids")
    template = {"chat_template_kwargs": {"unused": 1}, "add_generation_prompt": False}
    assert_same(*both(server, direct, temperature=0, extra_body=template))


def test_logprobs_are_vllm_s(server: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(server, direct, temperature=0, logprobs=True, top_logprobs=2)
    mine, ref = ours.choices[0].logprobs, theirs.choices[0].logprobs
    assert mine is not None and ref is not None and mine.content and ref.content
    assert [(t.token, t.bytes, len(t.top_logprobs)) for t in mine.content] == [
        (t.token, t.bytes, 2) for t in ref.content
    ]
    assert [t.logprob for t in mine.content] == pytest.approx([t.logprob for t in ref.content])


def test_a_stream_is_vllm_s(server: openai.OpenAI, direct: openai.OpenAI) -> None:
    options = {"include_usage": True}
    ours = stream(server, **SEEDED, stream_options=options)
    theirs = stream(direct, **SEEDED, stream_options=options)
    assert streamed(ours) == streamed(theirs)
    assert finishes(ours) == finishes(theirs)
    assert ours[0].choices[0].delta.role == "assistant"
    assert ours[-1].choices == [] and counts(ours[-1]) == counts(theirs[-1])
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in ours)
    # Usage is always asked upstream (the limits need it); the caller sees it only when asked.
    assert all(c.usage is None for c in stream(server, **SEEDED))


@pytest.mark.parametrize(("choice", "finish"), [("required", "tool_calls"), (NAMED, "stop")])
def test_tool_calls_are_vllm_s(
    server: openai.OpenAI, direct: openai.OpenAI, choice: Any, finish: str
) -> None:
    ours, theirs = both(server, direct, **TOOLS, tool_choice=choice)
    call, ref = ours.choices[0].message.tool_calls, theirs.choices[0].message.tool_calls
    assert call is not None and ref is not None and len(call) == 1
    assert call[0].type == ref[0].type == "function"
    assert (call[0].function.name, call[0].function.arguments) == (
        ref[0].function.name,
        ref[0].function.arguments,
    )
    assert ours.choices[0].finish_reason == theirs.choices[0].finish_reason == finish
    chunks = stream(server, **TOOLS, tool_choice=choice)
    assert streamed_calls(chunks) == streamed_calls(stream(direct, **TOOLS, tool_choice=choice))


def test_parse_with_a_pydantic_model(server: openai.OpenAI) -> None:
    kw = {k: v for k, v in TOOLS.items() if k not in ("tools", "parallel_tool_calls")}
    parsed = server.chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=Weather, **kw
    )
    weather = parsed.choices[0].message.parsed
    assert isinstance(weather, Weather)
    assert json.loads(parsed.choices[0].message.content or "") == weather.model_dump()


def test_the_gateway_refuses_before_the_call(server: openai.OpenAI) -> None:
    assert refusal(lambda: chat(server, messages=[{"role": 7, "content": "x"}]))[:2] == (
        400,
        "messages[0].role",
    )
    assert refusal(lambda: chat(server, extra_body={"mirostat_target": 5.0}))[:2] == (
        400,
        "mirostat_target",
    )
    min_tokens = {"min_tokens": 20}
    assert refusal(lambda: chat(server, max_tokens=5, extra_body=min_tokens))[:2] == (
        400,
        "min_tokens",
    )


def test_context_overflow_is_openai_s_error_and_truncate_vllm_s(
    server: openai.OpenAI, direct: openai.OpenAI
) -> None:
    """vLLM's server fits max_tokens into its window silently (what the gateway serves unasked:
    test_vllm_shape); when OpenAI's "error" is asked for, the gateway counts the rendered
    prompt with the server's /tokenize first."""
    messages, prompt = long_messages(direct, 160)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(server, messages=messages, max_tokens=100, extra_body=ASK_ERROR)
    err = caught.value
    assert (err.code, err.param) == ("context_length_exceeded", "messages")
    assert f"({prompt} in the messages, 100 in the completion)" in err.message
    resp = chat(
        server,
        model="tiny-trunc",
        messages=messages,
        max_tokens=100,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert counts(resp) == (prompt, WINDOW - prompt, WINDOW)
    assert answers(chat(server, messages=messages, max_tokens=WINDOW - prompt, temperature=0))

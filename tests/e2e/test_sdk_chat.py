"""`POST /v1/chat/completions` with the openai SDK (sync, async, the `stream` and `parse`
helpers) and raw HTTP, through the session gateway, on the OpenAI, Fireworks and generic
aliases: the caller sees OpenAI's chat behaviour whatever the upstream. Expected values come
from the scripted upstreams' fake model (tests/upstreams/chat_fake.py, fakegen.py)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import httpx
import openai
import pydantic
import pytest
import yaml
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.e2e.conftest import Env
from tests.e2e.metrics_text import scrape
from tests.e2e.support import (
    CONTEXT_WINDOW,
    DIALECT_ALIASES,
    DROP,
    FIREWORKS_MODEL,
    FULL_KEY,
    FW,
    FW_TRUNC,
    GENERIC,
    OA,
    OA_THEN_FW,
    OA_TRUNC,
    OPENAI_MODEL,
    RETRY,
    TARGET_LABEL,
    UPSTREAM_OF,
    RawStream,
    auth,
    expect,
    scripted_gateway,
    scripted_providers,
)
from tests.gateway_proc import GatewayProcess
from tests.upstreams.chat_fake import (
    chat_prompt,
    compact,
    fake_arguments,
    fake_json_object,
    fake_value,
    pieces,
)
from tests.upstreams.chat_validate import CHAT_DEFAULT_MAX_TOKENS
from tests.upstreams.fakegen import WORDS, alternatives, token_logprob
from tests.upstreams.procs import FIREWORKS_TEST_KEY, OPENAI_TEST_KEY, ScriptedUpstream

Json = dict[str, Any]
CHAT_PATH = {"openai": "/v1/chat/completions", "fireworks": "/inference/v1/chat/completions"}
UPSTREAM_KEY = {"openai": OPENAI_TEST_KEY, "fireworks": FIREWORKS_TEST_KEY}
UPSTREAM_MODEL = {"openai": OPENAI_MODEL, "fireworks": FIREWORKS_MODEL}

MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a poet."},
    {"role": "user", "content": "Write about the sea"},
]
PROMPT = chat_prompt(MESSAGES)  # "You are a poet.\nWrite about the sea": 8 tokens
PROMPT_TOKENS = 8
STOP = " gamma"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
            },
            "required": ["city"],
        },
    },
}
CLOCK: Any = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
WEATHER_ARGS = fake_arguments(WEATHER["function"]["parameters"])
CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")
TOOL_MARKED: list[Any] = [{"role": "user", "content": "What is the weather in Paris? __tool__"}]
TWO_TOOLS: list[Any] = [{"role": "user", "content": "Weather and time, please __tools_2__"}]


def upstream_of(env: Env, alias: str) -> ScriptedUpstream:
    return env.upstream(alias)


def dialect(alias: str) -> str:
    return UPSTREAM_OF[alias]


def chat_logprobs(text: str, candidate: int, top: int) -> list[Json]:
    """OpenAI's `logprobs.content` for a generated text of the fake model."""
    out = []
    for k, word in enumerate(text.split()):
        token = " " + word
        lp = token_logprob(candidate, k)
        alts = alternatives(WORDS.index(token), lp, top)
        tops = [(token, lp), *((t, v) for t, _, v in alts)][:top]
        out.append(
            {
                "token": token,
                "logprob": lp,
                "bytes": list(token.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in tops
                ],
            }
        )
    return out


def texts(chunks: Sequence[ChatCompletionChunk]) -> dict[int, str]:
    parts: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            parts[choice.index].append(choice.delta.content or "")
    return {i: "".join(p) for i, p in sorted(parts.items())}


def by_choice(chunks: Sequence[ChatCompletionChunk]) -> dict[int, list[Any]]:
    found: dict[int, list[Any]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            found[choice.index].append(choice)
    return dict(sorted(found.items()))


def stream(sdk: openai.OpenAI, **kw: Any) -> list[ChatCompletionChunk]:
    with sdk.chat.completions.create(stream=True, **kw) as chunks:
        return list(chunks)


def raw_chat(http: httpx.Client, body: Json, key: str = FULL_KEY) -> RawStream:
    resp = http.post("/v1/chat/completions", json=body, headers=auth(key))
    return RawStream(resp.status_code, resp.headers, resp.content)


def merged_calls(chunks: Sequence[ChatCompletionChunk]) -> list[Json]:
    """The tool calls of choice 0 as the deltas build them, with what each first delta said."""
    calls: dict[int, Json] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                if delta.index not in calls:
                    assert delta.function is not None
                    calls[delta.index] = {
                        "id": delta.id,
                        "type": delta.type,
                        "name": delta.function.name,
                        "first_arguments": delta.function.arguments,
                        "arguments": "",
                    }
                if delta.function is not None and delta.function.arguments:
                    calls[delta.index]["arguments"] += delta.function.arguments
    return [calls[i] for i in sorted(calls)]


# ---------------------------------------------------------------- plain answers


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_fields_texts_and_usage(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.create(model=alias, messages=MESSAGES, n=2, max_tokens=5)
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    assert resp.model == alias and type(resp.created) is int
    expected = [expect(PROMPT, i, 5) for i in range(2)]
    assert [
        (c.index, c.message.role, c.message.content, c.finish_reason) for c in resp.choices
    ] == [(i, "assistant", e.text, "length") for i, e in enumerate(expected)]
    assert all(c.message.tool_calls is None and c.logprobs is None for c in resp.choices)
    assert all(c.message.refusal is None for c in resp.choices)
    fingerprint = "fp_scripted01" if dialect(alias) == "openai" else None
    assert resp.system_fingerprint == fingerprint
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (
        PROMPT_TOKENS,
        10,
        PROMPT_TOKENS + 10,
    )
    sent = upstream_of(env, alias).last_request()
    assert sent["path"] == CHAT_PATH[dialect(alias)]
    assert sent["body"]["model"] == UPSTREAM_MODEL[dialect(alias)]
    assert (sent["body"]["messages"], sent["body"]["n"], sent["body"]["max_tokens"]) == (
        MESSAGES,
        2,
        5,
    )
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY[dialect(alias)]}"
    assert FULL_KEY not in str(sent["headers"])


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_ids_are_unique(sdk: openai.OpenAI, alias: str) -> None:
    ids = {
        sdk.chat.completions.create(model=alias, messages=MESSAGES, max_tokens=1).id for _ in "ab"
    }
    assert len(ids) == 2


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_no_bound_is_the_upstream_s_default(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    """Without max_tokens the gateway adds none: the upstream's own default applies."""
    resp = sdk.chat.completions.create(model=alias, messages=MESSAGES)
    assert resp.choices[0].message.content == expect(PROMPT, 0, CHAT_DEFAULT_MAX_TOKENS).text
    body = upstream_of(env, alias).last_request()["body"]
    assert "max_tokens" not in body and "max_completion_tokens" not in body


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_stop(sdk: openai.OpenAI, alias: str) -> None:
    """OpenAI leaves the stop string out of the content; so must every target."""
    resp = sdk.chat.completions.create(model=alias, messages=MESSAGES, n=2, stop=STOP, max_tokens=9)
    expected = [expect(PROMPT, i, 9, STOP) for i in range(2)]
    assert {e.finish_reason for e in expected} == {"stop"}
    assert [(c.message.content, c.finish_reason) for c in resp.choices] == [
        (e.text, e.finish_reason) for e in expected
    ]
    assert resp.usage is not None
    assert resp.usage.completion_tokens == sum(e.completion_tokens for e in expected)


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_max_completion_tokens(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.create(model=alias, messages=MESSAGES, max_completion_tokens=3)
    assert (resp.choices[0].message.content, resp.choices[0].finish_reason) == (
        expect(PROMPT, 0, 3).text,
        "length",
    )
    assert upstream_of(env, alias).last_request()["body"]["max_completion_tokens"] == 3


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_max_completion_tokens_wins_over_max_tokens(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.create(
        model=alias, messages=MESSAGES, max_tokens=9, max_completion_tokens=3
    )
    assert resp.choices[0].message.content == expect(PROMPT, 0, 3).text
    assert resp.usage is not None and resp.usage.completion_tokens == 3


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_seed_reaches_the_upstream(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.create(model=alias, messages=MESSAGES, seed=5, max_tokens=6)
    assert resp.choices[0].message.content == expect(PROMPT, 0, 6, seed=5).text
    assert expect(PROMPT, 0, 6, seed=5).text != expect(PROMPT, 0, 6).text
    assert upstream_of(env, alias).last_request()["body"]["seed"] == 5


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_logprobs_shape(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.create(
        model=alias, messages=MESSAGES, n=2, max_tokens=4, logprobs=True, top_logprobs=2
    )
    for choice in resp.choices:
        text = expect(PROMPT, choice.index, 4).text
        assert choice.message.content == text
        assert choice.logprobs is not None
        # exactly OpenAI's keys: no provider extras (token ids, offsets) leak through
        assert choice.logprobs.model_dump() == {
            "content": chat_logprobs(text, choice.index, 2),
            "refusal": None,
        }


# ---------------------------------------------------------------- streams


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_stream_matches_the_answer(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(sdk, model=alias, messages=MESSAGES, n=2, max_tokens=5)
    assert texts(chunks) == {i: expect(PROMPT, i, 5).text for i in range(2)}
    for choices in by_choice(chunks).values():
        assert choices[0].delta.role == "assistant"
        assert [c.delta.role for c in choices[1:]] == [None] * (len(choices) - 1)
        assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + ["length"]
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert {(c.object, c.model) for c in chunks} == {("chat.completion.chunk", alias)}
    assert [c.usage for c in chunks] == [None] * len(chunks)


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_stream_with_stop(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(sdk, model=alias, messages=MESSAGES, n=2, stop=STOP, max_tokens=9)
    expected = [expect(PROMPT, i, 9, STOP) for i in range(2)]
    assert texts(chunks) == {i: e.text for i, e in enumerate(expected)}
    assert [cs[-1].finish_reason for cs in by_choice(chunks).values()] == ["stop", "stop"]


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_stream_include_usage(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(
        sdk,
        model=alias,
        messages=MESSAGES,
        n=2,
        max_tokens=4,
        stream_options={"include_usage": True},
    )
    *content, last = chunks
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        PROMPT_TOKENS,
        8,
        PROMPT_TOKENS + 8,
    )
    assert all(c.choices and c.usage is None for c in content)
    assert texts(content) == {i: expect(PROMPT, i, 4).text for i in range(2)}


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_usage_is_asked_upstream_but_not_shown(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    """The gateway needs usage for accounting: OpenAI(-like) upstreams are asked for it even
    when the caller is not (Fireworks sends it anyway), and the caller gets no usage chunk."""
    chunks = stream(sdk, model=alias, messages=MESSAGES, max_tokens=3)
    assert all(c.choices for c in chunks) and [c.usage for c in chunks] == [None] * len(chunks)
    body = upstream_of(env, alias).last_request()["body"]
    if dialect(alias) == "fireworks":
        assert "stream_options" not in body
    else:
        assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_raw_sse_framing(env: Env, alias: str) -> None:
    body = {"model": alias, "messages": MESSAGES, "max_tokens": 2, "stream": True}
    raw = raw_chat(env.http, body)
    assert raw.status == 200
    assert raw.headers["content-type"].split(";")[0] == "text/event-stream"
    *events, done = raw.data()
    assert done == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" and "usage" not in e for e in events)
    assert all(e["id"] == events[0]["id"] and e["model"] == alias for e in events)
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0]["role"] == "assistant" and not deltas[0].get("content")
    assert "".join(d.get("content") or "" for d in deltas) == expect(PROMPT, 0, 2).text
    finishes = [e["choices"][0]["finish_reason"] for e in events]
    assert finishes == [None] * (len(events) - 1) + ["length"]
    with_usage = raw_chat(env.http, {**body, "stream_options": {"include_usage": True}})
    *content, usage, done = with_usage.data()
    assert done == "[DONE]" and usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 2
    assert all(e["choices"] and e["usage"] is None for e in content)


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_stream_logprobs(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(
        sdk, model=alias, messages=MESSAGES, max_tokens=3, logprobs=True, top_logprobs=1
    )
    entries = [
        e.model_dump()
        for c in chunks
        for ch in c.choices
        if ch.logprobs is not None and ch.logprobs.content
        for e in ch.logprobs.content
    ]
    assert entries == chat_logprobs(expect(PROMPT, 0, 3).text, 0, 1)


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_stream_helper(sdk: openai.OpenAI, alias: str) -> None:
    """The SDK's `stream` helper (it raises on a "length" finish: the answer stops instead)."""
    messages: list[Any] = [
        {"role": "user", "content": "__eos_4__"},
        *MESSAGES,
    ]  # EOS after 4 tokens
    text = expect(chat_prompt(messages), 0, 4).text
    with sdk.chat.completions.stream(model=alias, messages=messages, max_tokens=9) as events:
        seen = list(events)
        final = events.get_final_completion()
    assert "".join(e.delta for e in seen if e.type == "content.delta") == text
    assert [e.content for e in seen if e.type == "content.done"] == [text]
    assert {e.type for e in seen} == {"chunk", "content.delta", "content.done"}
    assert final.model == alias and final.id.startswith("chatcmpl-")
    assert (final.choices[0].message.content, final.choices[0].finish_reason) == (text, "stop")
    assert final.choices[0].message.parsed is None


# ---------------------------------------------------------------- tools


def named(name: str) -> Json:
    return {"type": "function", "function": {"name": name}}


# (the tools, tool_choice, messages, OpenAI's finish_reason); Fireworks says "tool_calls".
TOOL_CASES = {
    "required": ([WEATHER], "required", MESSAGES, "tool_calls"),
    "auto": ([WEATHER], None, TOOL_MARKED, "tool_calls"),
    "named": ([CLOCK, WEATHER], named("get_weather"), MESSAGES, "stop"),
}


def tool_kw(case: str) -> Json:
    tools, choice, messages, _ = TOOL_CASES[case]
    kw: Json = {"tools": tools, "messages": messages}
    if choice is not None:
        kw["tool_choice"] = choice
    return kw


def tool_finish(alias: str, case: str) -> str:
    return "tool_calls" if dialect(alias) == "fireworks" else TOOL_CASES[case][3]


@pytest.mark.parametrize("case", TOOL_CASES)
@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_tool_call(env: Env, sdk: openai.OpenAI, alias: str, case: str) -> None:
    resp = sdk.chat.completions.create(model=alias, **tool_kw(case))
    choice = resp.choices[0]
    assert choice.finish_reason == tool_finish(alias, case)
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert CALL_ID.match(call.id) and call.type == "function"
    assert (call.function.name, call.function.arguments) == ("get_weather", WEATHER_ARGS)
    assert json.loads(call.function.arguments)["city"] in [w.strip() for w in WORDS]
    assert resp.usage is not None and resp.usage.completion_tokens == len(pieces(WEATHER_ARGS))
    sent = upstream_of(env, alias).last_request()["body"]
    assert sent["tools"] == TOOL_CASES[case][0]


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_text_when_auto_chooses_no_tool(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.create(
        model=alias, messages=MESSAGES, tools=[WEATHER], max_tokens=3
    )
    choice = resp.choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (
        expect(PROMPT, 0, 3).text,
        None,
        "length",
    )


@pytest.mark.parametrize("case", TOOL_CASES)
@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_tool_call_streamed(sdk: openai.OpenAI, alias: str, case: str) -> None:
    chunks = stream(sdk, model=alias, **tool_kw(case))
    (call,) = merged_calls(chunks)
    assert CALL_ID.match(call.pop("id"))
    assert call == {
        "type": "function",
        "name": "get_weather",
        "first_arguments": "",
        "arguments": WEATHER_ARGS,
    }
    (choices,) = by_choice(chunks).values()
    assert choices[0].delta.role == "assistant"
    assert [c.finish_reason for c in choices][-1] == tool_finish(alias, case)
    assert all(c.delta.content in (None, "") for c in choices)


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_two_tool_calls(sdk: openai.OpenAI, alias: str) -> None:
    kw: Json = {"model": alias, "messages": TWO_TOOLS, "tools": [WEATHER, CLOCK]}
    resp = sdk.chat.completions.create(**kw)
    calls = resp.choices[0].message.tool_calls
    assert calls is not None
    assert [(c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("get_weather", WEATHER_ARGS),
        ("get_time", "{}"),
    ]
    assert calls[0].id != calls[1].id
    streamed = merged_calls(stream(sdk, **kw))
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        ("get_weather", WEATHER_ARGS),
        ("get_time", "{}"),
    ]


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_a_tool_answer_goes_back(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    first = sdk.chat.completions.create(model=alias, messages=TOOL_MARKED, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    history: list[Any] = [
        *TOOL_MARKED,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    resp = sdk.chat.completions.create(model=alias, messages=history, tools=[WEATHER], max_tokens=3)
    prompt = chat_prompt(history)
    assert resp.choices[0].message.content == expect(prompt, 0, 3).text
    sent = upstream_of(env, alias).last_request()["body"]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call.id and sent[2]["tool_call_id"] == call.id


# ---------------------------------------------------------------- structured outputs


class Forecast(pydantic.BaseModel):
    city: str
    days: int
    temperatures: list[float]
    sunny: bool


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_parse_with_a_pydantic_model(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.parse(
        model=alias, messages=MESSAGES, response_format=Forecast, max_tokens=200
    )
    sent = upstream_of(env, alias).last_request()["body"]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Forecast"
    expected = Forecast.model_validate(fake_value(sent["json_schema"]["schema"]))
    message = resp.choices[0].message
    assert message.parsed == expected
    assert message.content == compact(fake_value(sent["json_schema"]["schema"]))


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_parse_tool_arguments(sdk: openai.OpenAI, alias: str) -> None:
    tool = openai.pydantic_function_tool(Forecast)
    resp = sdk.chat.completions.parse(
        model=alias, messages=MESSAGES, tools=[tool], tool_choice="required", max_tokens=200
    )
    calls = resp.choices[0].message.tool_calls
    assert calls is not None
    schema = tool["function"]["parameters"]
    assert calls[0].function.parsed_arguments == Forecast.model_validate(fake_value(schema))


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_json_object(sdk: openai.OpenAI, alias: str) -> None:
    messages: list[Any] = [{"role": "user", "content": "Answer in JSON"}]
    resp = sdk.chat.completions.create(
        model=alias, messages=messages, response_format={"type": "json_object"}
    )
    content = resp.choices[0].message.content
    assert content == fake_json_object("Answer in JSON")
    assert json.loads(content)["answer"] in [w.strip() for w in WORDS]


# ---------------------------------------------------------------- async


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
async def test_async_chat_and_stream(async_sdk: openai.AsyncOpenAI, alias: str) -> None:
    resp = await async_sdk.chat.completions.create(model=alias, messages=MESSAGES, max_tokens=4)
    assert resp.choices[0].message.content == expect(PROMPT, 0, 4).text
    chunks = await async_sdk.chat.completions.create(
        model=alias,
        messages=MESSAGES,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    async with chunks:
        got = [c async for c in chunks]
    assert texts(got[:-1]) == {0: expect(PROMPT, 0, 4).text}
    assert got[-1].usage is not None and got[-1].usage.completion_tokens == 4


# ---------------------------------------------------------------- the caller's mistakes


TOOL_MSG_WITHOUT_ID: list[Any] = [*MESSAGES, {"role": "tool", "content": "x"}]
BAD: list[tuple[Json, str]] = [
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": 7, "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": TOOL_MSG_WITHOUT_ID}, "messages[2].tool_call_id"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": -0.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": named("get_time")}, "tool_choice.function.name"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
@pytest.mark.parametrize(("fields", "param"), BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD)])
def test_bad_input_is_a_400_before_any_upstream_call(
    env: Env, alias: str, fields: Json, param: str
) -> None:
    resp = env.http.post(
        "/v1/chat/completions",
        json={"model": alias, "messages": MESSAGES, **fields},
        headers=auth(),
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert env.openai.requests() == [] and env.fireworks.requests() == []


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_a_role_of_a_templates_own_goes_only_where_templates_take_it(env: Env, alias: str) -> None:
    """OpenAI and Fireworks know only OpenAI's roles: refused before any call, naming the
    message. Another OpenAI-compatible server gets it, as it gets any field (vLLM's paths too:
    tests/e2e/test_vllm_shape.py)."""
    env.openai.reset()
    env.fireworks.reset()
    messages = [*MESSAGES, {"role": "ipython", "content": "42"}]
    resp = env.http.post(
        "/v1/chat/completions", json={"model": alias, "messages": messages}, headers=auth()
    )
    sent = env.upstream(alias).requests()
    if alias == GENERIC:
        assert [r["body"]["messages"] for r in sent] == [messages]
        return
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == f"messages[{len(MESSAGES)}].role" and '"ipython"' in error["message"]
    assert sent == []


def test_missing_messages(env: Env, sdk: openai.OpenAI) -> None:
    resp = env.http.post("/v1/chat/completions", json={"model": OA}, headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    robot: list[Any] = [{"role": "robot", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=OA, messages=robot)
    assert info.value.param == "messages[0].role"
    assert env.openai.requests() == []


UNSERVABLE = [  # (alias, fields, the param named)
    (FW, {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    (FW, {"modalities": ["text", "audio"]}, "modalities"),
    (FW, {"web_search_options": {}}, "web_search_options"),
    (FW, {"store": True}, "store"),
    (OA, {"top_k": 5}, "top_k"),
    (OA, {"repetition_penalty": 1.1}, "repetition_penalty"),
    (
        OA,
        {"response_format": {"type": "grammar", "grammar": "root ::= 'x'"}},
        "response_format.type",
    ),
]


@pytest.mark.parametrize(("alias", "fields", "param"), UNSERVABLE, ids=[u[2] for u in UNSERVABLE])
def test_what_a_target_cannot_serve_is_a_400(
    env: Env, sdk: openai.OpenAI, alias: str, fields: Json, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=alias, messages=MESSAGES, extra_body=fields)
    assert (info.value.param, info.value.code) == (param, "unsupported_parameter")
    if param != "response_format.type":  # that one says which targets serve it instead
        assert TARGET_LABEL[alias] in info.value.message
    assert env.openai.requests() == [] and env.fireworks.requests() == []


def test_drop_policy_drops_and_says_so(env: Env, sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model=DROP, messages=MESSAGES, max_tokens=3, extra_body={"top_k": 5, "min_p": 0.1}
    )
    assert raw.headers["x-gateway-dropped-params"] == "top_k,min_p"
    resp: ChatCompletion = raw.parse()
    assert resp.choices[0].message.content == expect(PROMPT, 0, 3).text
    body = env.openai.last_request()["body"]
    assert "top_k" not in body and "min_p" not in body
    streamed = sdk.chat.completions.with_raw_response.create(
        model=DROP, messages=MESSAGES, max_tokens=3, stream=True, extra_body={"top_k": 5}
    )
    assert streamed.headers["x-gateway-dropped-params"] == "top_k"
    assert texts(list(streamed.parse())) == {0: expect(PROMPT, 0, 3).text}


def test_openai_fields_pass_to_openai(env: Env, sdk: openai.OpenAI) -> None:
    fields: Json = {
        "user": "u-1",
        "metadata": {"team": "e2e"},
        "store": True,
        "service_tier": "auto",
        "prompt_cache_key": "k",
    }
    resp = sdk.chat.completions.create(model=OA, messages=MESSAGES, max_tokens=2, **fields)
    assert resp.choices[0].message.content == expect(PROMPT, 0, 2).text
    assert resp.system_fingerprint == "fp_scripted01"
    body = env.openai.last_request()["body"]
    assert {k: body[k] for k in fields} == fields


@pytest.mark.parametrize("alias", [OA, FW])
def test_json_object_with_a_schema(env: Env, alias: str) -> None:
    """Fireworks' `{"type": "json_object", "schema": …}`: served, or refused before any call."""
    schema: Json = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_object", "schema": schema}
    messages: list[Any] = [{"role": "user", "content": "Answer in JSON"}]
    body = {"model": alias, "messages": messages, "response_format": fmt}
    resp = env.http.post("/v1/chat/completions", json=body, headers=auth())
    if resp.status_code == 200:
        content = resp.json()["choices"][0]["message"]["content"]
        assert json.loads(content) == fake_value(schema)
    else:
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "response_format.schema"
        assert upstream_of(env, alias).requests() == []


@pytest.mark.parametrize("alias", [OA])
def test_parallel_tool_calls_without_tools(env: Env, alias: str) -> None:
    body = {"model": alias, "messages": MESSAGES, "parallel_tool_calls": False}
    resp = env.http.post("/v1/chat/completions", json=body, headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "parallel_tool_calls"
    assert upstream_of(env, alias).requests() == []


def test_fireworks_extensions_pass(env: Env, sdk: openai.OpenAI) -> None:
    extras = {"top_k": 40, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": True}
    resp = sdk.chat.completions.create(model=FW, messages=MESSAGES, max_tokens=3, extra_body=extras)
    assert resp.choices[0].message.content == expect(PROMPT, 0, 3).text
    body = env.fireworks.last_request()["body"]
    assert {k: body[k] for k in extras} == extras


# ---------------------------------------------------------------- context length

LONG: list[Any] = [
    {"role": "user", "content": " ".join(["word"] * (CONTEXT_WINDOW - 8))}
]  # room for 8


def test_fireworks_is_told_to_error(env: Env, sdk: openai.OpenAI) -> None:
    sdk.chat.completions.create(model=FW, messages=MESSAGES, max_tokens=1)
    assert env.fireworks.last_request()["body"]["context_length_exceeded_behavior"] == "error"


OVERFLOW = {
    "openai": "Upstream oai/gpt-3.5-turbo-instruct returned 400: This model's maximum context "
    "length is 2048 tokens. However, you requested 2056 tokens (2040 in the messages, 16 in the "
    "completion). Please reduce the length of the messages or completion.",
    "fireworks": f"Upstream {TARGET_LABEL[FW]} returned 400: The prompt plus max_tokens is too "
    "long: 2040 + 16 = 2056 tokens, the model's maximum context length is 2048 tokens.",
}


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_context_overflow_is_an_error(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=alias, messages=LONG, max_tokens=16)
    assert (info.value.code, info.value.type) == (
        "context_length_exceeded",
        "invalid_request_error",
    )
    message = OVERFLOW[dialect(alias)].replace(TARGET_LABEL[OA], TARGET_LABEL[alias])
    assert info.value.message == f"Error code: 400 - {message}"
    assert len(upstream_of(env, alias).requests()) == 1


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_context_overflow_names_the_messages(sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=alias, messages=LONG, max_tokens=16)
    assert info.value.param == "messages"


@pytest.mark.parametrize("alias", [OA_TRUNC, FW_TRUNC])
def test_context_truncate_from_model_defaults(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.chat.completions.create(model=alias, messages=LONG, max_tokens=16)
    assert resp.choices[0].message.content == expect(chat_prompt(LONG), 0, 8).text
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    chunks = stream(sdk, model=alias, messages=LONG, max_tokens=16)
    assert texts(chunks) == {0: expect(chat_prompt(LONG), 0, 8).text}
    upstream = env.fireworks if alias == FW_TRUNC else env.openai
    sent = [r["body"] for r in upstream.requests()]
    if alias == FW_TRUNC:  # Fireworks truncates itself when told to
        assert {b["context_length_exceeded_behavior"] for b in sent} == {"truncate"}
    else:  # OpenAI refuses, and the gateway asks again with what the window leaves
        assert [b["max_tokens"] for b in sent] == [16, 8, 16, 8]


# ---------------------------------------------------------------- upstream failures


def test_fallback_on_a_503(env: Env, sdk: openai.OpenAI) -> None:
    env.openai.script({"status": 503, "times": 2})
    resp = sdk.chat.completions.create(model=OA_THEN_FW, messages=MESSAGES, max_tokens=4)
    assert resp.choices[0].message.content == expect(PROMPT, 0, 4).text
    assert resp.model == OA_THEN_FW
    chunks = stream(sdk, model=OA_THEN_FW, messages=MESSAGES, max_tokens=4)
    assert texts(chunks) == {0: expect(PROMPT, 0, 4).text}
    assert [r["outcome"] for r in env.openai.requests()] == ["error", "error"]
    assert [(r["path"], r["outcome"]) for r in env.fireworks.requests()] == [
        ("/inference/v1/chat/completions", "ok"),
        ("/inference/v1/chat/completions", "completed_stream"),
    ]


def test_retry_on_a_503(env: Env, sdk: openai.OpenAI) -> None:
    env.openai.script({"status": 503})
    resp = sdk.chat.completions.create(model=RETRY, messages=MESSAGES, max_tokens=2)
    assert resp.choices[0].message.content == expect(PROMPT, 0, 2).text
    assert [r["outcome"] for r in env.openai.requests()] == ["error", "ok"]


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_upstream_500_is_a_502_naming_the_target(sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        sdk.chat.completions.create(
            model=alias, messages=[{"role": "user", "content": "__status_500__"}]
        )
    assert info.value.status_code == 502 and TARGET_LABEL[alias] in info.value.message


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_midstream_error(sdk: openai.OpenAI, alias: str) -> None:
    got: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in sdk.chat.completions.create(
            model=alias, messages=[{"role": "user", "content": "__midstream_error__"}], stream=True
        ):
            got += [c.delta.content or "" for c in chunk.choices]
    assert not isinstance(info.value, openai.APIStatusError)
    assert TARGET_LABEL[alias] in info.value.message
    assert "".join(got) == expect("__midstream_error__", 0, 1).text  # role, then 1 token


# ---------------------------------------------------------------- endpoint and metrics

EMB_KEY = "sk-chat-emb"


def emb_config(openai_url: str, fireworks_url: str, dead_port: int) -> str:
    doc: Json = {
        "server": {"host": "127.0.0.1"},
        "auth": {"keys": [{"id": "k", "key": EMB_KEY, "models": ["*"]}]},
        "providers": scripted_providers(openai_url, fireworks_url),
        "models": {
            "emb": {
                "endpoint": "embeddings",
                "targets": [{"provider": "oai", "model": "text-embedding-3-small"}],
            },
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


emb_gateway = scripted_gateway(emb_config, "emb_gateway")


def test_an_embeddings_model_refuses_chat(emb_gateway: GatewayProcess) -> None:
    with (
        openai.OpenAI(base_url=emb_gateway.url + "/v1", api_key=EMB_KEY, max_retries=0) as sdk,
        pytest.raises(openai.BadRequestError) as info,
    ):
        sdk.chat.completions.create(model="emb", messages=MESSAGES)
    assert (info.value.code, info.value.param) == ("wrong_endpoint", "model")
    assert "/v1/embeddings" in info.value.message


@pytest.mark.parametrize("stream_it", [False, True], ids=["json", "stream"])
def test_metrics_count_chat(env: Env, sdk: openai.OpenAI, stream_it: bool) -> None:
    before = scrape(env.url)
    kw: Json = {"model": OA, "messages": MESSAGES, "max_tokens": 3}
    if stream_it:
        stream(sdk, **kw)
    else:
        sdk.chat.completions.create(**kw)
    after = scrape(env.url)
    flag = "true" if stream_it else "false"
    labels = {"model": OA, "operation": "chat", "status": "200", "stream": flag}
    assert after.delta(before, "gateway_requests_total", **labels) == 1
    assert after.delta(before, "gateway_requests_total", operation="text_completion") == 0
    usage = {"gen_ai_operation_name": "chat", "gen_ai_request_model": OA}
    assert (
        after.delta(before, "gen_ai_client_token_usage_sum", **usage, gen_ai_token_type="input")
        == PROMPT_TOKENS
    )
    assert (
        after.delta(before, "gen_ai_client_token_usage_sum", **usage, gen_ai_token_type="output")
        == 3
    )

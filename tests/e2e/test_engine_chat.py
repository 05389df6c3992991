"""Chat on the in-process engine (`type: vllm`), compared with vLLM's own OpenAI server.

The gateway serves POST /v1/chat/completions from its engine (the stack's `engine` path,
tests/e2e/vllm_stack.py) and vLLM's server answers the same request directly, with the same SDK:
both run the tiny model with the same flags (hermes tool parser, auto tool choice, trusted
request templates), so wherever the output is deterministic (temperature 0 or a fixed seed) the
texts, token counts, logprobs and tool calls must be vLLM's. What the gateway adds on top
(OpenAI's context-length error and "truncate", greedy n > 1, a grammar response_format,
Mirostat) is tested on the engine alone.

The tiny model is random: its JSON runs on in whitespace, so the tool and structured-output
tests take the whitespace tokens away with logit_bias (NO_WHITESPACE) to let it finish.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from core.chat import validate_chat
from core.completions import RequestLimits
from core.errors import InvalidRequest
from core.provider import Target
from providers.vllm_engine.adapter import VllmEngineProvider
from tests.e2e.chat_vllm import (
    MAX_TOKENS,
    MESSAGES,
    NAMED,
    NO_WHITESPACE,
    OTHER,
    SEEDED,
    TOOL,
    TOOLS,
    Weather,
    answers,
    assert_same,
    both,
    chat,
    counts,
    extra,
    finishes,
    first_deltas,
    long_messages,
    prompt_tokens,
    refusal,
    stream,
    streamed,
    streamed_calls,
)
from tests.e2e.vllm_stack import (
    ASK_ERROR,
    METERED_KEY,
    METERED_TPM,
    MODEL,
    PATHS,
    VIRTUAL_KEY,
    WINDOW,
    Stack,
)
from tests.vllm_proc import MODEL_DIR, require_vllm

require_vllm()

# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def engine(vllm_stack: Stack) -> Iterator[openai.OpenAI]:
    with vllm_stack.client("engine") as client:
        yield client


# ---------------------------------------------------------------- sampling


def test_greedy_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(engine, direct, temperature=0)
    assert_same(ours, theirs)
    assert ours.object == "chat.completion" and ours.model == MODEL
    assert ours.id.startswith("chatcmpl-")
    assert ours.choices[0].message.tool_calls is None
    assert ours.choices[0].logprobs is None
    other = both(engine, direct, messages=OTHER, temperature=0)
    assert_same(*other)
    assert other[0].choices[0].message.content != ours.choices[0].message.content


def test_seeded_sampling_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(engine, direct, **SEEDED)
    assert_same(ours, theirs)
    reseeded = chat(engine, **{**SEEDED, "seed": 8})
    assert answers(reseeded) != answers(ours)


def test_a_seeded_answer_is_cached_and_replayed(engine: openai.OpenAI) -> None:
    """The engine's seeded answer (and its stream, in vLLM's shape) served again from the
    cache: the same text and usage, with fresh ids; unseeded sampling is not cached."""
    body = {**SEEDED, "model": "tiny-cached", "messages": OTHER, "max_tokens": MAX_TOKENS}
    miss = engine.chat.completions.with_raw_response.create(**body)
    hit = engine.chat.completions.with_raw_response.create(**body)
    statuses = [r.headers["x-portkey-cache-status"] for r in (miss, hit)]
    assert statuses == ["MISS", "HIT"]
    first, again = miss.parse(), hit.parse()
    assert answers(again) == answers(first) and again.usage == first.usage
    assert again.id != first.id
    with engine.chat.completions.with_streaming_response.create(
        **body, stream=True, stream_options={"include_usage": True}
    ) as response:
        assert response.headers["x-portkey-cache-status"] == "HIT"
        replayed = list(response.parse())
    assert streamed(replayed) == {0: first.choices[0].message.content}
    assert replayed[-1].usage == first.usage
    unseeded = engine.chat.completions.with_raw_response.create(**{**body, "seed": None})
    assert unseeded.headers["x-portkey-cache-status"] == "DISABLED"


def test_sampling_extensions_match_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    extensions = {
        "top_k": 5,
        "min_p": 0.05,
        "repetition_penalty": 1.3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "top_p": 0.9,
    }
    assert_same(*both(engine, direct, **SEEDED, max_tokens=20, extra_body=extensions))


def test_n_sampled_choices_match_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(engine, direct, n=3, **SEEDED)
    assert_same(ours, theirs)
    assert [c.index for c in ours.choices] == [0, 1, 2]
    assert len({c.message.content for c in ours.choices}) > 1


def test_greedy_n_repeats_the_one_answer(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    """vLLM refuses n > 1 when greedy; OpenAI answers n identical choices, and so does the
    gateway: one sequence, repeated, each copy counted."""
    with pytest.raises(openai.BadRequestError):
        chat(direct, n=2, temperature=0)
    one = chat(engine, temperature=0)
    three = chat(engine, n=3, temperature=0)
    assert [c.message.content for c in three.choices] == [one.choices[0].message.content] * 3
    prompt, completion, _ = counts(one)
    assert counts(three) == (prompt, 3 * completion, prompt + 3 * completion)


def test_stop_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    text = chat(direct, messages=OTHER, temperature=0, max_tokens=20).choices[0].message.content
    assert text is not None and len(text) > 4
    stop = text[2:4]
    ours, theirs = both(engine, direct, messages=OTHER, temperature=0, max_tokens=20, stop=[stop])
    assert_same(ours, theirs)
    assert ours.choices[0].finish_reason == "stop"
    assert ours.choices[0].message.content == text[: text.index(stop)]
    assert extra(ours.choices[0], "stop_reason") == stop == extra(theirs.choices[0], "stop_reason")


def test_max_tokens_ends_with_length(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    for bound in ({"max_tokens": 3}, {"max_completion_tokens": 3, "max_tokens": None}):
        ours, theirs = both(engine, direct, **bound, temperature=0, extra_body={"ignore_eos": True})
        assert_same(ours, theirs)
        assert ours.choices[0].finish_reason == "length"
        assert counts(ours)[1] == 3


def test_without_max_tokens_the_window_bounds_it(
    engine: openai.OpenAI, direct: openai.OpenAI
) -> None:
    ours, theirs = both(engine, direct, max_tokens=None, temperature=0)
    assert_same(ours, theirs)


def test_mirostat_is_served_by_the_engine(engine: openai.OpenAI) -> None:
    """A near-zero surprise target leaves only the most probable token: sampling turns greedy."""
    greedy = chat(engine, messages=OTHER, temperature=0, max_tokens=20)
    tight = {"mirostat_target": 0.001, "mirostat_lr": 0.1}
    resp = chat(engine, messages=OTHER, **SEEDED, max_tokens=20, extra_body=tight)
    assert answers(resp) == answers(greedy)
    assert answers(chat(engine, messages=OTHER, **SEEDED, max_tokens=20)) != answers(greedy)
    bad = refusal(lambda: chat(engine, extra_body={"mirostat_target": 3.0, "mirostat_lr": 0}))
    assert bad[:2] == (400, "mirostat_lr")


# ---------------------------------------------------------------- logprobs


def test_logprobs_match_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(engine, direct, temperature=0, logprobs=True, top_logprobs=3)
    assert_same(ours, theirs)
    mine, ref = ours.choices[0].logprobs, theirs.choices[0].logprobs
    assert mine is not None and ref is not None and mine.content and ref.content
    assert mine.refusal is None
    assert len(mine.content) == counts(ours)[1]
    for token, expected in zip(mine.content, ref.content, strict=True):
        assert (token.token, token.bytes) == (expected.token, expected.bytes)
        assert token.logprob == pytest.approx(expected.logprob, rel=1e-5, abs=1e-6)
        assert len(token.top_logprobs) == 3
        assert [t.token for t in token.top_logprobs] == [t.token for t in expected.top_logprobs]
        for alt, alt_ref in zip(token.top_logprobs, expected.top_logprobs, strict=True):
            assert alt.bytes == alt_ref.bytes
            assert alt.logprob == pytest.approx(alt_ref.logprob, rel=1e-5, abs=1e-6)


def test_logprobs_without_top_logprobs(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(engine, direct, temperature=0, logprobs=True)
    mine, ref = ours.choices[0].logprobs, theirs.choices[0].logprobs
    assert mine is not None and ref is not None and mine.content and ref.content
    assert [(t.token, t.top_logprobs) for t in mine.content] == [
        (t.token, t.top_logprobs) for t in ref.content
    ]
    assert all(t.top_logprobs == [] for t in mine.content)


def test_streamed_logprobs_match_the_answer(engine: openai.OpenAI) -> None:
    whole = chat(engine, temperature=0, logprobs=True, top_logprobs=2)
    chunks = stream(engine, temperature=0, logprobs=True, top_logprobs=2)
    tokens = [
        t.token
        for c in chunks
        for ch in c.choices
        if ch.logprobs
        for t in ch.logprobs.content or []
    ]
    assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.content
    assert tokens == [t.token for t in whole.choices[0].logprobs.content]


# ---------------------------------------------------------------- streams


def test_stream_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"n": 2, **SEEDED, "stream_options": {"include_usage": True}}
    ours, theirs = stream(engine, **kw), stream(direct, **kw)
    assert streamed(ours) == streamed(theirs)
    assert finishes(ours) == finishes(theirs) == {0: ["length"], 1: ["length"]}
    whole = chat(engine, n=2, **SEEDED)
    assert streamed(ours) == {c.index: c.message.content for c in whole.choices}
    for delta in first_deltas(ours).values():
        assert delta.role == "assistant" and delta.content == ""
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in ours)
    assert len({c.id for c in ours}) == 1 and ours[0].id.startswith("chatcmpl-")
    # include_usage: every chunk has usage null but the last, which has no choices.
    last = ours[-1]
    assert last.choices == [] and counts(last) == counts(theirs[-1]) == counts(whole)
    assert all(c.usage is None for c in ours[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(engine: openai.OpenAI) -> None:
    chunks = stream(engine, temperature=0)
    assert all(c.choices and c.usage is None for c in chunks)
    assert finishes(chunks) == {0: ["stop"]}


def test_continuous_usage_stats(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    """Each chunk carries the usage so far: the tokens sent up to it (counted here by their
    logprobs). How tokens group into chunks depends on the engine's timing, on both sides."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    kw: dict[str, Any] = {"temperature": 0, "logprobs": True, "stream_options": options}
    ours, theirs = stream(engine, **kw), stream(direct, **kw)
    assert streamed(ours) == streamed(theirs)
    assert counts(ours[-1]) == counts(theirs[-1])
    prompt = counts(ours[-1])[0]
    sent = 0
    for chunk in ours[:-1]:
        choice = chunk.choices[0]
        sent += len(choice.logprobs.content or []) if choice.logprobs else 0
        assert counts(chunk) == (prompt, sent, prompt + sent)
    assert sent == counts(ours[-1])[1]


def test_the_sdk_stream_helper(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    with engine.chat.completions.stream(**kw, temperature=0) as events:
        pieces = [e.delta for e in events if e.type == "content.delta"]
        final = events.get_final_completion()
    expected = chat(direct, temperature=0).choices[0].message.content
    assert "".join(pieces) == final.choices[0].message.content == expected


def test_raw_stream_ends_with_done(vllm_stack: Stack) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST",
        vllm_stack.gateway.url + "/v1/chat/completions",
        json=body,
        headers=vllm_stack.headers("engine"),
        timeout=60.0,
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0][len("data:") :])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


# ---------------------------------------------------------------- structured outputs


def test_parse_with_a_pydantic_model(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "response_format": Weather,
        "temperature": 0,
        "max_tokens": 100,
        "logit_bias": NO_WHITESPACE,
    }
    ours = engine.chat.completions.parse(**kw)
    theirs = direct.chat.completions.parse(**kw)
    parsed = ours.choices[0].message.parsed
    assert isinstance(parsed, Weather)
    assert parsed == theirs.choices[0].message.parsed
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    beta = engine.beta.chat.completions.parse(**kw)
    assert beta.choices[0].message.parsed == parsed


def test_json_object_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(
        engine, direct, temperature=0, max_tokens=30, response_format={"type": "json_object"}
    )
    assert_same(ours, theirs)
    assert (ours.choices[0].message.content or "").startswith("{")


def test_structured_outputs_extra_matches_vllm(
    engine: openai.OpenAI, direct: openai.OpenAI
) -> None:
    so = {"structured_outputs": {"choice": ["yes", "no"]}}
    ours, theirs = both(engine, direct, temperature=0, extra_body=so)
    assert_same(ours, theirs)
    assert ours.choices[0].message.content in ("yes", "no")


def test_grammar_response_format(engine: openai.OpenAI) -> None:
    grammar = {"type": "grammar", "grammar": 'root ::= "yes" | "no"'}
    resp = chat(engine, temperature=0, extra_body={"response_format": grammar})
    assert resp.choices[0].message.content in ("yes", "no")
    assert resp.choices[0].finish_reason == "stop"


# ---------------------------------------------------------------- tools


@pytest.mark.parametrize(("choice", "finish"), [("required", "tool_calls"), (NAMED, "stop")])
def test_tool_choice_makes_a_tool_call(
    engine: openai.OpenAI, direct: openai.OpenAI, choice: Any, finish: str
) -> None:
    """vLLM's structured outputs force the call; vLLM 0.32 ends a required call with
    "tool_calls" and a named function's with "stop"."""
    ours, theirs = both(engine, direct, **TOOLS, tool_choice=choice)
    assert counts(ours) == counts(theirs)
    for resp in (ours, theirs):
        message = resp.choices[0].message
        assert resp.choices[0].finish_reason == finish
        assert message.tool_calls is not None and len(message.tool_calls) == 1
    calls, refs = ours.choices[0].message.tool_calls, theirs.choices[0].message.tool_calls
    assert calls is not None and refs is not None
    call, ref = calls[0], refs[0]
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert ref.type == "function"
    assert call.function.name == ref.function.name == "get_weather"
    assert call.function.arguments == ref.function.arguments
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    assert ours.choices[0].message.content == theirs.choices[0].message.content


@pytest.mark.parametrize(("choice", "finish"), [("required", "tool_calls"), (NAMED, "stop")])
def test_streamed_tool_calls(
    engine: openai.OpenAI, direct: openai.OpenAI, choice: Any, finish: str
) -> None:
    ours = stream(engine, **TOOLS, tool_choice=choice)
    theirs = stream(direct, **TOOLS, tool_choice=choice)
    calls = streamed_calls(ours)
    assert calls == streamed_calls(theirs)
    assert [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"])["city"] in ("Paris", "Rome")
    assert finishes(ours) == finishes(theirs) == {0: [finish]}
    assert first_deltas(ours)[0].role == "assistant"


def test_the_stream_helper_with_tools(engine: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, **TOOLS}
    with engine.chat.completions.stream(**kw, tool_choice="required") as events:
        done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
        final = events.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["get_weather"]
    assert [e.name for e in done] == ["get_weather"]
    assert json.loads(done[0].arguments) == json.loads(calls[0].function.arguments)


def test_auto_tool_choice_answers_in_text(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    """With tools and no tool_choice (auto), the tiny model writes text: vLLM's hermes parser
    finds no call."""
    ours, theirs = both(engine, direct, tools=[TOOL], temperature=0)
    assert_same(ours, theirs)
    assert ours.choices[0].message.tool_calls is None
    none = both(engine, direct, tools=[TOOL], tool_choice="none", temperature=0)
    assert_same(*none)


def test_tool_results_render_in_the_conversation(
    engine: openai.OpenAI, direct: openai.OpenAI
) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
    ]
    ours, theirs = both(engine, direct, messages=messages, tools=[TOOL], temperature=0)
    assert_same(ours, theirs)
    assert counts(ours)[0] > prompt_tokens(direct, MESSAGES)


# ---------------------------------------------------------------- vLLM's chat extras


def test_template_extras_match_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    prefill = [*OTHER, {"role": "assistant", "content": "There was"}]
    for extras in (
        {"add_generation_prompt": False},
        {"add_generation_prompt": False, "continue_final_message": True, "echo": True},
        {"add_special_tokens": True},
        {"chat_template": "{% for m in messages %}{{ m['content'] }}|{% endfor %}"},
        {"documents": [{"title": "t", "text": "x"}], "chat_template_kwargs": {"x": 1}},
    ):
        ours, theirs = both(engine, direct, messages=prefill, temperature=0, extra_body=extras)
        assert_same(ours, theirs)
    echoed = chat(
        engine,
        messages=prefill,
        temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True, "echo": True},
    )
    assert (echoed.choices[0].message.content or "").startswith("There was")


def test_streamed_echo_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    prefill = [*OTHER, {"role": "assistant", "content": "There was"}]
    extras = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
    ours = stream(engine, messages=prefill, temperature=0, extra_body=extras)
    theirs = stream(direct, messages=prefill, temperature=0, extra_body=extras)
    assert streamed(ours) == streamed(theirs)
    assert streamed(ours)[0].startswith("There was")


def test_sampling_extras_match_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    greedy = chat(direct, messages=OTHER, temperature=0, max_tokens=20)
    first = (greedy.choices[0].logprobs, greedy.choices[0].message.content)
    assert first[1]
    for extras in (
        {"min_tokens": 15, "stop_token_ids": [2]},
        {"bad_words": ["er"]},
        {"allowed_token_ids": [262, 263, 264, 2]},
        {"include_stop_str_in_output": True, "stop": ["e"]},
        {"skip_special_tokens": False, "spaces_between_special_tokens": False},
        {"priority": 0, "truncate_prompt_tokens": 5, "truncation_side": "left"},
        {"vllm_xargs": {"unused": 1}},
    ):
        body = dict(extras)
        stop = body.pop("stop", None)
        ours, theirs = both(
            engine,
            direct,
            messages=OTHER,
            temperature=0,
            max_tokens=20,
            stop=stop,
            extra_body=body,
        )
        assert_same(ours, theirs)


def test_return_token_ids_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(engine, direct, temperature=0, extra_body={"return_token_ids": True})
    assert extra(ours, "prompt_token_ids") == extra(theirs, "prompt_token_ids")
    assert len(extra(ours, "prompt_token_ids")) == counts(ours)[0]
    assert extra(ours.choices[0], "token_ids") == extra(theirs.choices[0], "token_ids")
    assert len(extra(ours.choices[0], "token_ids")) == counts(ours)[1]
    plain = chat(engine, temperature=0)
    assert extra(plain, "prompt_token_ids") is None
    assert extra(plain.choices[0], "token_ids") is None


def test_prompt_logprobs_match_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours, theirs = both(engine, direct, temperature=0, extra_body={"prompt_logprobs": 2})
    mine, ref = extra(ours, "prompt_logprobs"), extra(theirs, "prompt_logprobs")
    assert mine[0] is None and ref[0] is None and len(mine) == len(ref) == counts(ours)[0]
    for position, expected in zip(mine[1:], ref[1:], strict=True):
        assert list(position) == list(expected)
        for token_id, entry in position.items():
            assert entry["rank"] == expected[token_id]["rank"]
            assert entry["decoded_token"] == expected[token_id]["decoded_token"]
            assert entry["logprob"] == pytest.approx(expected[token_id]["logprob"], abs=1e-5)


def test_return_tokens_as_token_ids(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    extras = {"return_tokens_as_token_ids": True}
    ours, theirs = both(
        engine, direct, temperature=0, logprobs=True, top_logprobs=1, extra_body=extras
    )
    mine, ref = ours.choices[0].logprobs, theirs.choices[0].logprobs
    assert mine is not None and ref is not None and mine.content and ref.content
    assert [t.token for t in mine.content] == [t.token for t in ref.content]
    assert all(t.token.startswith("token_id:") for t in mine.content)


def test_logprob_token_ids_match_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    extras = {"logprob_token_ids": [262, 263]}
    ours, theirs = both(
        engine,
        direct,
        temperature=0,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body=extras,
    )
    mine, ref = ours.choices[0].logprobs, theirs.choices[0].logprobs
    assert mine is not None and ref is not None and mine.content and ref.content
    assert [[a.token for a in t.top_logprobs] for t in mine.content] == [
        [a.token for a in t.top_logprobs] for t in ref.content
    ]


def test_beam_search_matches_vllm(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    extras = {"use_beam_search": True, "length_penalty": 1.0}
    ours, theirs = both(engine, direct, n=2, temperature=0, max_tokens=6, extra_body=extras)
    assert_same(ours, theirs)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "extras",
    [
        {"continue_final_message": True, "add_generation_prompt": True},
        {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
        {"structured_outputs": {"regex": "([a-z"}},
        {"truncate_prompt_tokens": WINDOW + 1},
        {"allowed_token_ids": [100000]},
        {"stop_token_ids": [100000]},
        {"min_tokens": 50},
        {"chat_template": "{% for m in messages %}"},
        {"logprob_token_ids": [1]},
        {"tools": []},
        {"prompt_logprobs": 21},
    ],
    ids=lambda e: ",".join(e),
)
def test_vllm_refusals_match(
    engine: openai.OpenAI, vllm_stack: Stack, extras: dict[str, Any]
) -> None:
    """What vLLM refuses is a 400 on the engine too, naming the same field where vLLM does.
    (A client of its own for vLLM's server: after its answer to a broken chat template, vLLM
    0.32's server resets the connection the next request comes on.)"""
    kw: dict[str, Any] = {"max_tokens": 10, "extra_body": extras}
    status, param, _ = refusal(lambda: chat(engine, **kw))
    with vllm_stack.direct() as direct:
        theirs = refusal(lambda: chat(direct, **kw))
    assert status == theirs[0] == 400
    if theirs[1] is not None:
        assert param == theirs[1]


def test_logprobs_above_the_engines_cap(engine: openai.OpenAI) -> None:
    """Above max_logprobs (20): a 400 naming the field, in vLLM's words, before any work."""
    status, param, message = refusal(lambda: chat(engine, extra_body={"prompt_logprobs": 21}))
    assert (status, param) == (400, "prompt_logprobs")
    assert "prompt logprobs of 21" in message


def test_stream_refusals_match(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"extra_body": {"prompt_logprobs": 1}}
    ours, theirs = refusal(lambda: stream(engine, **kw)), refusal(lambda: stream(direct, **kw))
    assert ours[:2] == (400, "prompt_logprobs") and theirs[0] == 400


def test_unknown_fields_are_refused_by_name(engine: openai.OpenAI) -> None:
    status, param, message = refusal(lambda: chat(engine, extra_body={"bogus": 1}))
    assert (status, param) == (400, "bogus")
    assert "engine" in message


# ---------------------------------------------------------------- the context window


def test_context_overflow_is_openais_chat_error(
    engine: openai.OpenAI, direct: openai.OpenAI
) -> None:
    messages, prompt = long_messages(direct, 160)
    room = WINDOW - prompt
    assert 0 < room < 100
    # vLLM lowers max_tokens silently (and so does the engine, unasked: test_vllm_shape);
    # OpenAI's error, when asked for, is the engine's.
    assert counts(chat(direct, messages=messages, max_tokens=100, temperature=0))[1] <= room
    with pytest.raises(openai.BadRequestError) as caught:
        chat(engine, messages=messages, max_tokens=100, extra_body=ASK_ERROR)
    err = caught.value
    assert (err.code, err.param) == ("context_length_exceeded", "messages")
    assert err.message.endswith(
        f"This model's maximum context length is {WINDOW} tokens. However, you requested "
        f"{prompt + 100} tokens ({prompt} in the messages, 100 in the completion). Please "
        "reduce the length of the messages or completion."
    )


def test_truncate_lowers_max_tokens(engine: openai.OpenAI, direct: openai.OpenAI) -> None:
    messages, prompt = long_messages(direct, 160)
    room = WINDOW - prompt
    resp = chat(
        engine,
        model="tiny-trunc",
        messages=messages,
        max_tokens=100,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.model == "tiny-trunc"
    assert resp.choices[0].finish_reason == "length"
    assert counts(resp) == (prompt, room, WINDOW)
    expected = chat(
        direct, messages=messages, max_tokens=room, temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.choices[0].message.content == expected.choices[0].message.content


def test_messages_longer_than_the_window(engine: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello world " * 200}]
    for model in (MODEL, "tiny-trunc"):
        with pytest.raises(openai.BadRequestError) as caught:
            chat(engine, model=model, messages=messages, max_tokens=None)
        assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "messages")


def test_the_reservation_counts_the_rendered_prompt(vllm_stack: Stack) -> None:
    """The rate limiter reserves the prompt as the engine renders it (tools included), plus
    max_tokens: the engine's count (`count_chat_tokens`), not an estimate from the messages."""
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": [TOOL],
        "tool_choice": "none",
        "max_tokens": 7,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {METERED_KEY}", VIRTUAL_KEY: "engine"}
    url = vllm_stack.gateway.url + "/v1/chat/completions"
    resp = httpx.post(url, json=body, headers=headers, timeout=60)
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert usage["completion_tokens"] == 7
    reserved = usage["prompt_tokens"] + 7
    assert int(resp.headers["x-ratelimit-remaining-tokens"]) == METERED_TPM - reserved


# ---------------------------------------------------------------- without the stack's HTTP


def test_a_pooling_engine_refuses_chat_naming_the_model() -> None:
    """An engine running a pooling (embedding) model serves no chat: a 400 naming `model`."""
    provider = VllmEngineProvider.from_config(
        "pool", "vllm", {"type": "vllm", "model": str(MODEL_DIR)}, "providers.pool"
    )
    provider.engine.tasks = frozenset({"embed"})
    request = validate_chat({"model": MODEL, "messages": MESSAGES}, RequestLimits())
    with pytest.raises(InvalidRequest) as caught:
        provider.chat(request, Target(MODEL, "pool", "tiny"))
    assert caught.value.param == "model"
    assert "not chat completions" in caught.value.message


def test_an_image_on_a_text_only_model_is_a_400_naming_the_part(vllm_stack: Stack) -> None:
    parts: list[Any] = [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]
    for path in PATHS:
        with vllm_stack.client(path) as client:
            status, param, message = refusal(lambda: chat(client, messages=messages))
        assert (status, param) == (400, "messages[1].content[1]")
        assert "text-only" in message if path == "engine" else "not a multimodal" in message

"""The scenario suite: the same calls through every dialect (openai, fireworks,
openai-compatible), and the caller sees exactly OpenAI's behaviour whatever the upstream."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types import Completion

from tests.e2e.conftest import Env
from tests.e2e.support import (
    DIALECT_ALIASES,
    FULL_KEY,
    UPSTREAM_OF,
    Expected,
    chunk_finishes,
    expect,
    expected_logprobs,
    outputs,
    prompt_tokens,
    raw_stream,
    streamed_texts,
    token_prompt_text,
)
from tests.upstreams.procs import FIREWORKS_TEST_KEY, OPENAI_TEST_KEY

pytestmark = pytest.mark.parametrize("alias", DIALECT_ALIASES)

UPSTREAM_PATH = {"openai": "/v1/completions", "fireworks": "/inference/v1/completions"}
UPSTREAM_KEY = {"openai": OPENAI_TEST_KEY, "fireworks": FIREWORKS_TEST_KEY}

# Chosen so that the 4 choices end differently with stop=" gamma", max_tokens=5: length,
# stop after 4 words, stop after 1 word, stop on the first token (empty text).
PROMPTS = ["Say this is a test", "The quick brown fox"]
STOP = " gamma"
MAX_TOKENS = 5
N = 2


def expected_choices(max_tokens: int = MAX_TOKENS, stop: str | None = STOP) -> list[Expected]:
    return [expect(p, i, max_tokens, stop) for p in PROMPTS for i in range(N)]


def as_outputs(expected: list[Expected]) -> list[tuple[int, str, str]]:
    return [(i, e.text, e.finish_reason) for i, e in enumerate(expected)]


def base_request(alias: str, **kw: Any) -> dict[str, Any]:
    return {"model": alias, "prompt": PROMPTS, "n": N, "max_tokens": MAX_TOKENS, "stop": STOP, **kw}


# ---------------------------------------------------------------- non-stream


def test_fields_order_texts_and_usage(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(**base_request(alias))
    expected = expected_choices()
    ends = {(e.finish_reason, e.text == "") for e in expected}  # the prompts cover every case
    assert ends == {("length", False), ("stop", False), ("stop", True)}
    assert resp.id.startswith("cmpl-")
    assert resp.object == "text_completion"
    assert resp.model == alias
    assert type(resp.created) is int
    assert outputs(resp) == as_outputs(expected)
    assert [c.logprobs for c in resp.choices] == [None] * 4
    assert resp.usage is not None
    completion = sum(e.completion_tokens for e in expected)
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (9, completion)
    assert resp.usage.total_tokens == 9 + completion
    assert completion == 5 + 5 + 2 + 1
    sent = env.upstream(alias).last_request()
    assert sent["path"] == UPSTREAM_PATH[UPSTREAM_OF[alias]]
    assert (sent["body"]["stop"], sent["body"]["max_tokens"]) == (STOP, MAX_TOKENS)
    # the provider's credentials go upstream, never the caller's key or headers
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY[UPSTREAM_OF[alias]]}"
    assert FULL_KEY not in str(sent["headers"])
    assert not any(h.startswith(("x-stainless", "x-portkey")) for h in sent["headers"])


def test_ids_are_unique(sdk: openai.OpenAI, alias: str) -> None:
    first = sdk.completions.create(model=alias, prompt="hi", max_tokens=1)
    second = sdk.completions.create(model=alias, prompt="hi", max_tokens=1)
    assert first.id != second.id


def test_max_tokens_default_is_16(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(model=alias, prompt=PROMPTS[0])
    assert outputs(resp) == [(0, expect(PROMPTS[0], 0, 16).text, "length")]
    assert env.upstream(alias).last_request()["body"]["max_tokens"] == 16


def test_token_array_prompts(sdk: openai.OpenAI, alias: str) -> None:
    ids = [[11, 22, 33], [44, 55]]
    resp = sdk.completions.create(model=alias, prompt=ids, max_tokens=4)
    texts = [expect(token_prompt_text(p), 0, 4).text for p in ids]
    assert outputs(resp) == [(0, texts[0], "length"), (1, texts[1], "length")]
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (5, 8)
    single = sdk.completions.create(model=alias, prompt=ids[0], max_tokens=4)
    assert outputs(single) == [(0, texts[0], "length")]


def test_echo(sdk: openai.OpenAI, alias: str) -> None:
    prompt = PROMPTS[1]
    resp = sdk.completions.create(model=alias, prompt=prompt, echo=True, max_tokens=3)
    assert outputs(resp) == [(0, prompt + expect(prompt, 0, 3).text, "length")]
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 3  # the echo is not billed


def test_echo_with_stop(sdk: openai.OpenAI, alias: str) -> None:
    prompt = PROMPTS[0]
    resp = sdk.completions.create(model=alias, prompt=prompt, echo=True, stop=STOP, max_tokens=8)
    assert outputs(resp) == [(0, prompt + expect(prompt, 0, 8, STOP).text, "stop")]


def test_echo_never_cuts_the_prompt(sdk: openai.OpenAI, alias: str) -> None:
    """The model stops at once (EOS) after a prompt that ends with the stop string: OpenAI only
    matches stop strings in generated text, so the echoed prompt comes back whole."""
    prompt = "__eos_0__ alpha gamma"
    kw: dict[str, Any] = {"model": alias, "prompt": prompt, "echo": True, "stop": STOP}
    assert outputs(sdk.completions.create(**kw)) == [(0, prompt, "stop")]
    assert streamed_texts(stream(sdk, **kw)) == {0: prompt}


def test_seed_reaches_the_upstream(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(model=alias, prompt=PROMPTS[0], seed=42, max_tokens=6)
    assert outputs(resp) == [(0, expect(PROMPTS[0], 0, 6, seed=42).text, "length")]
    assert expect(PROMPTS[0], 0, 6, seed=42).text != expect(PROMPTS[0], 0, 6).text


def test_logprobs_legacy_shape(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(**base_request(alias, logprobs=2))
    for choice, exp in zip(resp.choices, expected_choices(), strict=True):
        assert choice.logprobs is not None
        got = choice.logprobs.model_dump()
        assert got == expected_logprobs(exp.text, choice.index % N, 2)


@pytest.mark.parametrize(("n", "winners"), [(1, [2]), (2, [2, 1])])
def test_best_of_returns_the_best_candidates(
    env: Env, sdk: openai.OpenAI, alias: str, n: int, winners: list[int]
) -> None:
    resp = sdk.completions.create(model=alias, prompt=PROMPTS, n=n, best_of=3, max_tokens=4)
    texts = [expect(p, c, 4).text for p in PROMPTS for c in winners]
    expected = [(i, text, "length") for i, text in enumerate(texts)]
    assert outputs(resp) == expected
    assert [c.logprobs for c in resp.choices] == [None] * len(expected)
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 2 * 3 * 4  # every candidate was generated
    sent = env.upstream(alias).last_request()["body"]
    native = alias == "oa-instruct"
    assert (sent.get("best_of"), sent.get("n")) == ((3, n) if native else (None, 3))


def test_best_of_with_logprobs_keeps_the_winner_s(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(
        model=alias, prompt=PROMPTS[0], best_of=3, logprobs=1, max_tokens=8, stop=STOP
    )
    winner = expect(PROMPTS[0], 2, 8, STOP)
    assert outputs(resp) == [(0, winner.text, winner.finish_reason)]
    assert resp.choices[0].logprobs is not None
    assert resp.choices[0].logprobs.model_dump() == expected_logprobs(winner.text, 2, 1)


# ---------------------------------------------------------------- streaming


def stream(sdk: openai.OpenAI, **kw: Any) -> list[Completion]:
    with sdk.completions.create(stream=True, **kw) as chunks:
        return list(chunks)


def test_stream_matches_the_completion(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(sdk, **base_request(alias))
    expected = expected_choices()
    assert streamed_texts(chunks) == {i: e.text for i, e in enumerate(expected)}
    finishes = chunk_finishes(chunks)
    for index, exp in enumerate(expected):
        assert finishes[index][-1] == exp.finish_reason
        assert set(finishes[index][:-1]) <= {None}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("cmpl-")
    assert {(c.object, c.model, c.created) for c in chunks} == {
        ("text_completion", alias, chunks[0].created)
    }
    assert [c.usage for c in chunks] == [None] * len(chunks)


def test_stream_chunks_carry_the_system_fingerprint(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(model=alias, prompt=PROMPTS[0], max_tokens=2)
    expected = "fp_scripted01" if UPSTREAM_OF[alias] == "openai" else None
    assert resp.system_fingerprint == expected
    chunks = stream(sdk, model=alias, prompt=PROMPTS[0], max_tokens=2)
    assert [c.system_fingerprint for c in chunks] == [expected] * len(chunks)


def test_stream_include_usage(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(sdk, **base_request(alias), stream_options={"include_usage": True})
    *content, last = chunks
    assert last.choices == []
    completion = sum(e.completion_tokens for e in expected_choices())
    assert last.usage is not None
    assert last.usage.model_dump(
        include={"prompt_tokens", "completion_tokens", "total_tokens"}
    ) == {
        "prompt_tokens": prompt_tokens(PROMPTS),
        "completion_tokens": completion,
        "total_tokens": prompt_tokens(PROMPTS) + completion,
    }
    assert all(c.choices and c.usage is None for c in content)
    assert streamed_texts(content) == {i: e.text for i, e in enumerate(expected_choices())}


def test_raw_sse_framing_without_usage(env: Env, alias: str) -> None:
    raw = raw_stream(env.http, {**base_request(alias), "stream": True})
    assert raw.status == 200
    assert raw.headers["content-type"].split(";")[0] == "text/event-stream"
    *events, done = raw.data()
    assert done == "[DONE]"
    assert events and all("usage" not in e for e in events)
    assert all(e["choices"] for e in events)


def test_raw_sse_framing_with_usage(env: Env, alias: str) -> None:
    body = {**base_request(alias), "stream": True, "stream_options": {"include_usage": True}}
    raw = raw_stream(env.http, body)
    *events, usage, done = raw.data()
    assert done == "[DONE]"
    assert usage["choices"] == []
    completion = sum(e.completion_tokens for e in expected_choices())
    assert {k: usage["usage"][k] for k in ("prompt_tokens", "completion_tokens")} == {
        "prompt_tokens": prompt_tokens(PROMPTS),
        "completion_tokens": completion,
    }
    assert events and all(e["choices"] and e["usage"] is None for e in events)


def test_stream_logprobs_concatenate(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(sdk, **base_request(alias, logprobs=2))
    merged: dict[int, dict[str, list[Any]]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            assert choice.logprobs is not None
            part = choice.logprobs.model_dump()
            into = merged.setdefault(choice.index, {k: [] for k in part})
            for key, values in part.items():
                into[key] += values
    for index, exp in enumerate(expected_choices()):
        assert merged[index] == expected_logprobs(exp.text, index % N, 2)


def test_stream_echo(sdk: openai.OpenAI, alias: str) -> None:
    prompt = PROMPTS[1]
    chunks = stream(sdk, model=alias, prompt=prompt, echo=True, max_tokens=3)
    assert streamed_texts(chunks) == {0: prompt + expect(prompt, 0, 3).text}


def test_stream_token_array_prompt(sdk: openai.OpenAI, alias: str) -> None:
    chunks = stream(sdk, model=alias, prompt=[[7, 8], [9]], max_tokens=3)
    assert streamed_texts(chunks) == {
        0: expect(token_prompt_text([7, 8]), 0, 3).text,
        1: expect(token_prompt_text([9]), 0, 3).text,
    }

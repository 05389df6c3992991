"""Provider extensions through the SDK's `extra_body`: passed to Fireworks, rejected (400 naming
the parameter and the target) or dropped (and said so) for OpenAI; and
`context_length_exceeded_behavior`, which every dialect must honour the OpenAI way."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.e2e.conftest import Env
from tests.e2e.support import (
    CONTEXT_WINDOW,
    DIALECT_ALIASES,
    DROP,
    FW,
    FW_TRUNC,
    OA,
    OA_TRUNC,
    TARGET_LABEL,
    expect,
    outputs,
)

FIREWORKS_EXTRAS: dict[str, Any] = {
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "ignore_eos": True,
    "mirostat_target": 5.0,
    "mirostat_lr": 0.1,
}
PROMPT = "Once upon a time"


def test_extensions_reach_fireworks(env: Env, sdk: openai.OpenAI) -> None:
    resp = sdk.completions.create(
        model=FW, prompt=PROMPT, max_tokens=3, extra_body=FIREWORKS_EXTRAS
    )
    assert outputs(resp) == [(0, expect(PROMPT, 0, 3).text, "length")]
    body = env.fireworks.last_request()["body"]
    assert {k: body.get(k) for k in FIREWORKS_EXTRAS} == FIREWORKS_EXTRAS
    assert body["model"] == "accounts/fireworks/models/llama-v3p1-8b-instruct"


def test_fireworks_always_gets_an_explicit_context_behavior(env: Env, sdk: openai.OpenAI) -> None:
    sdk.completions.create(model=FW, prompt=PROMPT, max_tokens=2)
    with sdk.completions.create(model=FW, prompt=PROMPT, max_tokens=2, stream=True) as chunks:
        list(chunks)
    sent = [r["body"] for r in env.fireworks.requests()]
    assert [b["context_length_exceeded_behavior"] for b in sent] == ["error", "error"]
    assert all("stream_options" not in b and "best_of" not in b for b in sent)


@pytest.mark.parametrize("name", ["top_k", "min_p", "repetition_penalty", "mirostat_target"])
def test_extension_rejected_on_openai(env: Env, sdk: openai.OpenAI, name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(
            model=OA, prompt=PROMPT, max_tokens=2, extra_body={name: FIREWORKS_EXTRAS[name]}
        )
    err = info.value
    assert err.status_code == 400
    assert err.param == name
    assert err.code == "unsupported_parameter"
    assert name in err.message and TARGET_LABEL[OA] in err.message
    assert env.openai.requests() == []  # refused before any upstream call


def test_unknown_field_rejected_on_fireworks(env: Env, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model=FW, prompt=PROMPT, extra_body={"frobnicate": 1})
    assert info.value.param == "frobnicate"
    assert TARGET_LABEL[FW] in info.value.message
    assert env.fireworks.requests() == []


def test_drop_policy_drops_and_says_so(env: Env, sdk: openai.OpenAI) -> None:
    raw = sdk.completions.with_raw_response.create(
        model=DROP, prompt=PROMPT, max_tokens=3, extra_body={"top_k": 5, "min_p": 0.1}
    )
    assert raw.status_code == 200
    assert raw.headers["x-gateway-dropped-params"] == "top_k,min_p"
    resp = raw.parse()
    assert outputs(resp) == [(0, expect(PROMPT, 0, 3).text, "length")]
    assert resp.model == DROP
    body = env.openai.last_request()["body"]
    assert "top_k" not in body and "min_p" not in body


def test_no_dropped_header_when_nothing_is_dropped(sdk: openai.OpenAI) -> None:
    raw = sdk.completions.with_raw_response.create(model=DROP, prompt=PROMPT, max_tokens=1)
    assert "x-gateway-dropped-params" not in raw.headers


def test_drop_policy_in_a_stream(sdk: openai.OpenAI) -> None:
    raw = sdk.completions.with_raw_response.create(
        model=DROP, prompt=PROMPT, max_tokens=3, stream=True, extra_body={"top_k": 5}
    )
    assert raw.headers["x-gateway-dropped-params"] == "top_k"
    texts = "".join(c.choices[0].text for c in raw.parse() if c.choices)
    assert texts == expect(PROMPT, 0, 3).text


def test_out_of_range_for_fireworks_is_a_400_not_clamped(env: Env, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model=FW, prompt=PROMPT, extra_body={"top_k": 101})
    assert info.value.param == "top_k"
    assert TARGET_LABEL[FW] in info.value.message
    assert env.fireworks.requests() == []


# ---------------------------------------------------------------- context length

LONG_PROMPT = " ".join(["word"] * (CONTEXT_WINDOW - 8))  # room for 8 tokens


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_context_overflow_is_an_error_by_default(sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model=alias, prompt=LONG_PROMPT, max_tokens=16)
    assert info.value.code == "context_length_exceeded"
    assert info.value.type == "invalid_request_error"


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_context_overflow_truncate(sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(
        model=alias,
        prompt=LONG_PROMPT,
        max_tokens=16,
        extra_body={"context_length_exceeded_behavior": "truncate"},
    )
    assert outputs(resp) == [(0, expect(LONG_PROMPT, 0, 8).text, "length")]
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (CONTEXT_WINDOW - 8, 8)


@pytest.mark.parametrize("alias", [OA_TRUNC, FW_TRUNC])
def test_truncate_from_model_defaults(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.completions.create(model=alias, prompt=LONG_PROMPT, max_tokens=16)
    assert outputs(resp) == [(0, expect(LONG_PROMPT, 0, 8).text, "length")]
    assert resp.model == alias


@pytest.mark.parametrize("alias", [OA_TRUNC, FW_TRUNC])
def test_caller_overrides_model_defaults(sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(
            model=alias,
            prompt=LONG_PROMPT,
            max_tokens=16,
            extra_body={"context_length_exceeded_behavior": "error"},
        )
    assert info.value.code == "context_length_exceeded"


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_stream_context_overflow(sdk: openai.OpenAI, alias: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model=alias, prompt=LONG_PROMPT, max_tokens=16, stream=True)
    assert info.value.code == "context_length_exceeded"
    with sdk.completions.create(
        model=alias,
        prompt=LONG_PROMPT,
        max_tokens=16,
        stream=True,
        extra_body={"context_length_exceeded_behavior": "truncate"},
    ) as chunks:
        got = list(chunks)
    assert "".join(c.choices[0].text for c in got if c.choices) == expect(LONG_PROMPT, 0, 8).text
    assert [c.choices[0].finish_reason for c in got if c.choices][-1] == "length"

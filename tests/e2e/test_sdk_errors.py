"""Errors the gateway raises itself, as the SDK sees them: the exception class, status, `code`,
`param`; authentication, permissions, unknown models, validation, body limits."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.e2e.conftest import Env
from tests.e2e.support import (
    FULL_KEY,
    FW,
    MAX_BODY_BYTES,
    OA,
    auth,
    error_body,
    expect,
    outputs,
)

PROMPT = "Say this is a test"


# ---------------------------------------------------------------- caller errors


def test_bad_key_is_401(env: Env) -> None:
    with env.client("sk-wrong") as client, pytest.raises(openai.AuthenticationError) as info:
        client.completions.create(model=OA, prompt=PROMPT)
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"
    assert error_body(info.value)["type"] == "invalid_request_error"
    assert env.openai.requests() == []


def test_missing_key_is_401(env: Env) -> None:
    resp = env.http.post("/v1/completions", json={"model": OA, "prompt": "x"})
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "missing_api_key"


def test_portkey_api_key_header_authenticates(env: Env) -> None:
    headers = {"x-portkey-api-key": FULL_KEY}
    with env.client("not-a-key", default_headers=headers) as client:
        resp = client.completions.create(model=OA, prompt=PROMPT, max_tokens=2)
    assert outputs(resp) == [(0, expect(PROMPT, 0, 2).text, "length")]


def test_model_the_key_may_not_use_is_403(env: Env, limited: openai.OpenAI) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        limited.completions.create(model=FW, prompt=PROMPT)
    assert info.value.status_code == 403
    assert info.value.param == "model"
    assert env.fireworks.requests() == []
    ok = limited.completions.create(model=OA, prompt=PROMPT, max_tokens=1)
    assert ok.model == OA


def test_virtual_key_the_key_may_not_use_is_403(env: Env, limited: openai.OpenAI) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        limited.completions.create(
            model=OA, prompt=PROMPT, extra_headers={"x-portkey-virtual-key": "oai"}
        )
    assert info.value.param == "x-portkey-virtual-key"
    assert env.openai.requests() == []


def test_unknown_model_is_404(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.completions.create(model="no-such-model", prompt=PROMPT)
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    assert "no-such-model" in info.value.message


BAD_PARAMS: list[tuple[dict[str, Any], str]] = [
    ({"temperature": 3}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"logprobs": 6}, "logprobs"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"best_of": 2, "stream": True}, "best_of"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, -2]}, "prompt[1]"),
    ({"logit_bias": {"abc": 1}}, "logit_bias.abc"),
    ({"echo": "yes"}, "echo"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_PARAMS, ids=[p for _, p in BAD_PARAMS])
def test_bad_params_are_400_naming_the_param(
    env: Env, sdk: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    kw: dict[str, Any] = {"model": OA, "prompt": PROMPT, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(**kw)
    assert info.value.param == param
    assert error_body(info.value)["type"] == "invalid_request_error"
    assert env.openai.requests() == []


def test_invalid_json_is_400(env: Env) -> None:
    resp = env.http.post(
        "/v1/completions",
        content=b'{"model": "oa-instruct", "prompt": ',
        headers={**auth(), "content-type": "application/json"},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_json"


def test_oversized_body_is_413(env: Env) -> None:
    body = {"model": OA, "prompt": "x" * (MAX_BODY_BYTES + 1)}
    resp = env.http.post("/v1/completions", json=body, headers=auth())
    assert resp.status_code == 413
    assert resp.json()["error"]["param"] == "body"
    assert env.openai.requests() == []


def test_wrong_content_type_is_415(env: Env) -> None:
    resp = env.http.post(
        "/v1/completions",
        content=b'{"model": "oa-instruct", "prompt": "x"}',
        headers={**auth(), "content-type": "text/plain"},
    )
    assert resp.status_code == 415
    assert resp.json()["error"]["param"] == "content-type"


@pytest.mark.parametrize("header", ["x-portkey-provider", "x-portkey-custom-host"])
def test_unimplemented_portkey_headers_are_refused(
    env: Env, sdk: openai.OpenAI, header: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model=OA, prompt=PROMPT, extra_headers={header: "x"})
    assert info.value.param == header
    assert env.openai.requests() == []


def test_wrong_method_is_405_in_openai_shape(env: Env) -> None:
    resp = env.http.get("/v1/completions", headers=auth())
    assert resp.status_code == 405
    assert resp.json()["error"]["code"] == "method_not_allowed"


def test_completions_without_the_v1_prefix(env: Env) -> None:
    with openai.OpenAI(base_url=env.url, api_key=FULL_KEY, max_retries=0) as client:
        resp = client.completions.create(model=OA, prompt=PROMPT, max_tokens=2)
    assert outputs(resp) == [(0, expect(PROMPT, 0, 2).text, "length")]

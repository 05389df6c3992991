"""Models endpoints, request and trace ids, and `x-portkey-virtual-key` routing, through the
SDK."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import Env
from tests.e2e.support import (
    ALL_ALIASES,
    FIREWORKS_MODEL,
    FW,
    LIMITED_ALIASES,
    OA,
    OPENAI_MODEL,
    SLASHY,
    auth,
    expect,
    outputs,
)
from tests.upstreams.procs import FIREWORKS_TEST_KEY

PROMPT = "Tell me a story"


def test_list_models_shows_every_alias_of_the_key(sdk: openai.OpenAI) -> None:
    page = sdk.models.list()
    assert [m.id for m in page.data] == list(ALL_ALIASES)
    assert {(m.object, m.owned_by) for m in page.data} == {("model", "gateway")}
    assert all(type(m.created) is int for m in page.data)


def test_list_models_of_a_restricted_key(limited: openai.OpenAI) -> None:
    assert [m.id for m in limited.models.list().data] == list(LIMITED_ALIASES)


def test_retrieve_a_model_with_slashes(sdk: openai.OpenAI) -> None:
    model = sdk.models.retrieve(SLASHY)
    assert (model.id, model.object) == (SLASHY, "model")


def test_retrieve_a_model_with_raw_slashes(env: Env) -> None:
    resp = env.http.get("/v1/models/" + SLASHY, headers=auth())
    assert resp.status_code == 200
    assert resp.json()["id"] == SLASHY


def test_retrieve_unknown_model_is_404(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.models.retrieve("accounts/nobody/models/none")
    assert info.value.code == "model_not_found"


def test_retrieve_a_model_the_key_may_not_use_is_403(limited: openai.OpenAI) -> None:
    with pytest.raises(openai.PermissionDeniedError):
        limited.models.retrieve(FW)


def test_models_need_a_key(env: Env) -> None:
    with env.client("sk-wrong") as client, pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_completion_on_a_slashed_alias(sdk: openai.OpenAI) -> None:
    resp = sdk.completions.create(model=SLASHY, prompt=PROMPT, max_tokens=2)
    assert resp.model == SLASHY
    assert outputs(resp) == [(0, expect(PROMPT, 0, 2).text, "length")]


# ---------------------------------------------------------------- ids


def test_every_response_has_a_request_id(env: Env, sdk: openai.OpenAI) -> None:
    ids = [
        sdk.completions.create(model=OA, prompt=PROMPT, max_tokens=1)._request_id,
        sdk.models.list()._request_id,
        sdk.models.retrieve(OA)._request_id,
    ]
    with pytest.raises(openai.NotFoundError) as info:
        sdk.completions.create(model="nope", prompt=PROMPT)
    ids.append(info.value.request_id)
    raw = sdk.completions.with_raw_response.create(
        model=OA, prompt=PROMPT, max_tokens=1, stream=True
    )
    ids.append(raw.headers.get("x-request-id"))
    raw.parse().close()
    for path in ("/livez", "/readyz", "/nowhere"):
        ids.append(env.http.get(path).headers.get("x-request-id"))
    assert all(i is not None and i.startswith("req_") for i in ids), ids
    assert len(set(ids)) == len(ids)


def test_a_sent_request_id_is_echoed(sdk: openai.OpenAI) -> None:
    resp = sdk.completions.create(
        model=OA, prompt=PROMPT, max_tokens=1, extra_headers={"x-request-id": "my-req-42"}
    )
    assert resp._request_id == "my-req-42"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(
            model=OA, prompt=PROMPT, temperature=9, extra_headers={"x-request-id": "my-req-43"}
        )
    assert info.value.request_id == "my-req-43"


def test_an_unsafe_request_id_is_replaced(sdk: openai.OpenAI) -> None:
    resp = sdk.completions.create(
        model=OA, prompt=PROMPT, max_tokens=1, extra_headers={"x-request-id": "a b<c>" * 40}
    )
    assert resp._request_id is not None and resp._request_id.startswith("req_")


def test_trace_id_is_echoed(sdk: openai.OpenAI) -> None:
    raw = sdk.completions.with_raw_response.create(
        model=OA, prompt=PROMPT, max_tokens=1, extra_headers={"x-portkey-trace-id": "trace-7"}
    )
    assert raw.headers["x-portkey-trace-id"] == "trace-7"
    streamed = sdk.completions.with_raw_response.create(
        model=OA,
        prompt=PROMPT,
        max_tokens=1,
        stream=True,
        extra_headers={"x-portkey-trace-id": "trace-8"},
    )
    assert streamed.headers["x-portkey-trace-id"] == "trace-8"
    streamed.parse().close()
    with pytest.raises(openai.NotFoundError) as info:
        sdk.completions.create(
            model="nope", prompt=PROMPT, extra_headers={"x-portkey-trace-id": "trace-9"}
        )
    assert info.value.response.headers["x-portkey-trace-id"] == "trace-9"


# ---------------------------------------------------------------- virtual keys


def test_virtual_key_routes_to_the_named_provider(env: Env, sdk: openai.OpenAI) -> None:
    resp = sdk.completions.create(
        model=OA, prompt=PROMPT, max_tokens=2, extra_headers={"x-portkey-virtual-key": "fw"}
    )
    assert resp.model == OA
    assert outputs(resp) == [(0, expect(PROMPT, 0, 2).text, "length")]
    assert env.openai.requests() == []
    (sent,) = env.fireworks.requests()
    assert sent["body"]["model"] == OA  # no target of the alias on fw: the alias is the model
    assert sent["headers"]["authorization"] == f"Bearer {FIREWORKS_TEST_KEY}"


def test_virtual_key_uses_the_alias_target_on_that_provider(env: Env, sdk: openai.OpenAI) -> None:
    sdk.completions.create(
        model=FW, prompt=PROMPT, max_tokens=2, extra_headers={"x-portkey-virtual-key": "fw"}
    )
    assert env.fireworks.last_request()["body"]["model"] == FIREWORKS_MODEL
    sdk.completions.create(
        model=OA, prompt=PROMPT, max_tokens=2, extra_headers={"x-portkey-virtual-key": "oai"}
    )
    assert env.openai.last_request()["body"]["model"] == OPENAI_MODEL
    assert len(env.fireworks.requests()) == 1


def test_virtual_key_of_another_dialect_maps_the_params(env: Env, sdk: openai.OpenAI) -> None:
    with sdk.completions.create(
        model=FW,
        prompt=PROMPT,
        max_tokens=2,
        stream=True,
        stop=" zeta",
        extra_headers={"x-portkey-virtual-key": "generic"},
    ) as chunks:
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expect(PROMPT, 0, 2, " zeta").text
    assert env.fireworks.requests() == []
    (sent,) = env.openai.requests()
    assert sent["body"]["model"] == FW
    assert "context_length_exceeded_behavior" not in sent["body"]


def test_restricted_key_with_its_virtual_key(env: Env, limited: openai.OpenAI) -> None:
    resp = limited.completions.create(
        model=OA, prompt=PROMPT, max_tokens=2, extra_headers={"x-portkey-virtual-key": "fw"}
    )
    assert outputs(resp) == [(0, expect(PROMPT, 0, 2).text, "length")]
    assert env.openai.requests() == []
    assert env.fireworks.last_request()["body"]["model"] == OA


def test_virtual_key_does_not_unlock_a_forbidden_alias(env: Env, limited: openai.OpenAI) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        limited.completions.create(
            model=FW, prompt=PROMPT, max_tokens=2, extra_headers={"x-portkey-virtual-key": "fw"}
        )
    assert info.value.param == "model"
    assert env.fireworks.requests() == []

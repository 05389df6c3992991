"""The scripted Azure OpenAI upstream keeps Azure's documented behaviour: its addresses
(deployments with an api-version, the v1 API), the `api-key` header, its error bodies and its
content filter's verdicts and refusal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.upstreams.fakegen import expected_text
from tests.upstreams.procs import AZURE_TEST_KEY, ScriptedUpstream

Json = dict[str, Any]
VERSION = {"api-version": "2024-10-21"}
KEY = {"api-key": AZURE_TEST_KEY}
MESSAGES = [{"role": "user", "content": "Say this is a test"}]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0, trust_env=False) as c:
        yield c


def post(
    client: httpx.Client,
    up: ScriptedUpstream,
    path: str,
    body: Json,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return client.post(
        up.root + path,
        json=body,
        params=VERSION if params is None else params,
        headers=KEY if headers is None else headers,
    )


def events(resp: httpx.Response) -> list[Any]:
    datas = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    return [d if d == "[DONE]" else orjson.loads(d) for d in datas]


def test_a_deployment_answers_with_the_filter_s_verdicts(
    client: httpx.Client, scripted_azure: ScriptedUpstream
) -> None:
    r = post(client, scripted_azure, "/openai/deployments/dep/completions", {"prompt": "a b"})
    assert r.status_code == 200
    body = r.json()
    choice = body["choices"][0]
    assert choice["text"] == expected_text("a b", 0, 16)
    assert choice["content_filter_results"]["hate"] == {"filtered": False, "severity": "safe"}
    (verdict,) = body["prompt_filter_results"]
    assert verdict["prompt_index"] == 0 and "jailbreak" in verdict["content_filter_results"]
    assert r.headers["apim-request-id"]
    sent = scripted_azure.last_request()
    assert (sent["path"], sent["query"]) == (
        "/openai/deployments/dep/completions",
        "api-version=2024-10-21",
    )


@pytest.mark.parametrize(
    ("path", "params", "status", "code"),
    [
        ("/openai/deployments/dep/completions", {}, 404, "404"),
        ("/openai/deployments/dep/completions", {"api-version": "2099-01-01"}, 400, "BadRequest"),
        ("/openai/v1/completions", {"api-version": "2024-10-21"}, 400, "BadRequest"),
        ("/v1/completions", {}, 404, "404"),
        ("/openai/deployments/dep/extra/completions", VERSION, 404, "404"),
    ],
)
def test_addresses_azure_does_not_have(
    client: httpx.Client,
    scripted_azure: ScriptedUpstream,
    path: str,
    params: dict[str, str],
    status: int,
    code: str,
) -> None:
    r = post(client, scripted_azure, path, {"prompt": "x", "model": "dep"}, params=params)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "headers", [{}, {"api-key": "wrong"}, {"Authorization": f"Bearer {AZURE_TEST_KEY}"}]
)
def test_the_key_goes_in_api_key(
    client: httpx.Client, scripted_azure: ScriptedUpstream, headers: dict[str, str]
) -> None:
    r = post(
        client,
        scripted_azure,
        "/openai/deployments/d/completions",
        {"prompt": "x"},
        headers=headers,
    )
    assert r.status_code == 401
    error = r.json()["error"]
    assert error["code"] == "401" and error["message"].startswith("Access denied")


def test_the_v1_api_takes_the_model_in_the_body(
    client: httpx.Client, scripted_azure: ScriptedUpstream
) -> None:
    body = {"model": "dep", "messages": MESSAGES, "max_tokens": 3}
    r = post(client, scripted_azure, "/openai/v1/chat/completions", body, params={})
    assert r.status_code == 200
    assert r.json()["choices"][0]["content_filter_results"]["sexual"]["filtered"] is False
    r = post(
        client, scripted_azure, "/openai/v1/embeddings", {"model": "e", "input": "x"}, params={}
    )
    assert len(r.json()["data"][0]["embedding"]) == 16


def test_a_stream_sends_the_prompt_s_verdicts_first(
    client: httpx.Client, scripted_azure: ScriptedUpstream
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2, "stream": True}
    r = post(client, scripted_azure, "/openai/deployments/dep/chat/completions", body)
    got = events(r)
    assert got[0]["choices"] == [] and got[0]["prompt_filter_results"][0]["prompt_index"] == 0
    assert got[-1] == "[DONE]"
    chunks = got[1:-1]
    assert chunks[0]["choices"][0]["content_filter_results"] == {}  # the role's
    assert chunks[1]["choices"][0]["content_filter_results"]["hate"]["filtered"] is False
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_the_content_filter_refuses_a_prompt(
    client: httpx.Client, scripted_azure: ScriptedUpstream
) -> None:
    body = {"messages": [{"role": "user", "content": "x __content_filter__"}]}
    r = post(client, scripted_azure, "/openai/deployments/dep/chat/completions", body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["code"], error["param"], error["status"]) == ("content_filter", "prompt", 400)
    assert error["innererror"]["code"] == "ResponsibleAIPolicyViolation"
    assert error["innererror"]["content_filter_result"]["hate"]["filtered"] is True


def test_the_content_filter_cuts_an_answer(
    client: httpx.Client, scripted_azure: ScriptedUpstream
) -> None:
    body = {"prompt": ["x __filtered_output__", "y"], "max_tokens": 2}
    r = post(client, scripted_azure, "/openai/deployments/dep/completions", body)
    flagged, clean = r.json()["choices"]
    assert flagged["finish_reason"] == "content_filter"
    assert flagged["content_filter_results"]["hate"]["filtered"] is True
    assert clean["finish_reason"] == "length"
    r = post(
        client, scripted_azure, "/openai/deployments/dep/completions", {**body, "stream": True}
    )
    ends = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in events(r)[1:-1]}
    assert ends == {0: "content_filter", 1: "length"}


def test_other_errors_in_azure_s_shape(
    client: httpx.Client, scripted_azure: ScriptedUpstream
) -> None:
    r = post(
        client, scripted_azure, "/openai/deployments/dep/completions", {"prompt": "__status_429__"}
    )
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["code"] == "429"

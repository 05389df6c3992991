"""The Responses API on vLLM, both of the gateway's ways, compared with vLLM's own
`/v1/responses` on the same tiny model and seed (the stack of tests/e2e/vllm_stack.py):

    server   the gateway passes the request through to vLLM's server's `/v1/responses`
    engine   the in-process engine serves it with vLLM's own Responses classes

Whole answers are compared with vLLM's, ids and times masked (and the model: the gateway's
answer names the caller's alias)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.vllm_stack import MODEL, PATHS, Stack
from tests.vllm_proc import require_vllm

require_vllm()

PROMPT = "Once upon a time"
SEEDED: dict[str, Any] = {"temperature": 1.0, "seed": 7, "max_output_tokens": 16}
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 16}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
MASKED = ("id", "created_at", "model")


@pytest.fixture(scope="module", params=PATHS)
def path(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture(scope="module")
def http(vllm_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120.0, trust_env=False) as client:
        yield client


def direct(stack: Stack, http: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return http.post(stack.server.url + "/responses", json={"model": MODEL, **body})


def through(stack: Stack, http: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    return http.post(
        stack.gateway.url + "/v1/responses",
        json={"model": MODEL, "store": False, **body},
        headers=stack.headers(path),
    )


def masked(doc: dict[str, Any]) -> dict[str, Any]:
    """A response with its ids (its own and its items'), time and model masked."""
    out = {k: v for k, v in doc.items() if k not in MASKED}
    out["output"] = [{k: v for k, v in item.items() if k != "id"} for item in doc["output"]]
    out.pop("store", None)  # the gateway's own (vLLM's server answers none)
    return out


@pytest.mark.parametrize(
    "body",
    [
        {"input": PROMPT, **GREEDY},
        {"input": PROMPT, "instructions": "Be brief.", **SEEDED},
        {"input": PROMPT, "include": ["message.output_text.logprobs"], "top_logprobs": 2, **GREEDY},
        {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}],
            **GREEDY,
        },
    ],
    ids=["greedy", "seeded", "logprobs", "parts"],
)
def test_a_whole_answer_is_vllms(
    vllm_stack: Stack, http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    theirs = direct(vllm_stack, http, body)
    ours = through(vllm_stack, http, path, body)
    assert theirs.status_code == ours.status_code == 200, ours.text
    assert ours.json()["id"].startswith("resp_") and ours.json()["model"] == MODEL
    assert masked(ours.json()) == masked(theirs.json())


def events(r: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for block in r.text.split("\n\n"):
        if block.strip():
            data = block.split("\ndata: ", 1)[1]
            out.append(orjson.loads(data))
    return out


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """The events' types, each run of text deltas as one."""
    out: list[str] = []
    for e in events:
        if not (out and e["type"] == out[-1] == "response.output_text.delta"):
            out.append(e["type"])
    return out


def test_a_stream_is_vllms(vllm_stack: Stack, http: httpx.Client, path: str) -> None:
    body = {"input": PROMPT, "stream": True, **GREEDY}
    theirs = events(direct(vllm_stack, http, body))
    ours = events(through(vllm_stack, http, path, body))
    # How many tokens a delta holds is the engine's timing (its outputs batch under load).
    assert kinds(ours) == kinds(theirs)
    assert [e["sequence_number"] for e in ours] == list(range(len(ours)))
    assert masked(ours[-1]["response"]) == masked(theirs[-1]["response"])
    text = "".join(e["delta"] for e in ours if e["type"] == "response.output_text.delta")
    assert text == ours[-1]["response"]["output"][0]["content"][0]["text"]


def test_a_conversation_continues_through_the_gateway(
    vllm_stack: Stack, http: httpx.Client, path: str
) -> None:
    """vLLM's server keeps no responses: the gateway sends the earlier turn inline, and the
    answer is vLLM's for the whole conversation sent at once."""
    first = http.post(
        vllm_stack.gateway.url + "/v1/responses",
        json={"model": MODEL, "input": PROMPT, **GREEDY},
        headers=vllm_stack.headers(path),
    ).json()
    said = first["output"][0]["content"][0]["text"]
    second = http.post(
        vllm_stack.gateway.url + "/v1/responses",
        json={"model": MODEL, "input": "And then?", "previous_response_id": first["id"], **GREEDY},
        headers=vllm_stack.headers(path),
    )
    assert second.status_code == 200, second.text
    whole = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "And then?"},
    ]
    theirs = direct(vllm_stack, http, {"input": whole, **GREEDY}).json()
    assert (
        second.json()["output"][0]["content"][0]["text"]
        == theirs["output"][0]["content"][0]["text"]
    )
    assert second.json()["previous_response_id"] == first["id"]

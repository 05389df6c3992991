"""The scripted OpenAI upstream's Responses API (`…/responses`): OpenAI's response object, stream
events, checks and stored responses over the chat fake model, with the openai SDK where it can
tell, and the completions machinery (markers, scripts, log) on the route."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.responses import Response
from pydantic import BaseModel

from tests.upstreams.chat_fake import (
    chat_prompt,
    fake_arguments,
    fake_json_object,
    fake_value,
    pieces,
)
from tests.upstreams.fakegen import expected_text, token_logprob
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream
from tests.upstreams.responses_render import OPENING, message_kinds
from tests.upstreams.responses_request import (
    RESPONSES_DEFAULT_MAX_OUTPUT_TOKENS,
    responses_prompt,
)

Json = dict[str, Any]
HEADERS = {"Authorization": f"Bearer {OPENAI_TEST_KEY}"}
INPUT: list[Json] = [
    {"role": "developer", "content": "Be terse."},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Say this"},
            {"type": "input_text", "text": "is a test"},
        ],
    },
]
BODY: Json = {"model": "gpt-4o", "instructions": "You are a bot.", "input": INPUT}
PROMPT = "You are a bot.\nBe terse.\nSay this\nis a test"
WEATHER: Json = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
CLOCK: Json = {"type": "function", "name": "get_time", "parameters": None}
RESP_ID = re.compile(r"^resp_[0-9a-f]{48}$")


class Forecast(BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as c:
        yield c


@pytest.fixture
def sdk(scripted_openai: ScriptedUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=scripted_openai.url, api_key=OPENAI_TEST_KEY, max_retries=0) as c:
        yield c


def create(sdk: openai.OpenAI, **body: Any) -> Response:
    """`responses.create` with bodies typed loosely (the SDK's TypedDicts are unions of dozens)."""
    made: Response = sdk.responses.create(**body)
    return made


def post(client: httpx.Client, up: ScriptedUpstream, body: Json) -> httpx.Response:
    return client.post(up.url + "/responses", json={**BODY, **body}, headers=HEADERS)


def events(resp: httpx.Response) -> list[Json]:
    """The stream's events; each `event:` line names its data's type."""
    out = []
    for block in resp.text.split("\n\n"):
        if block:
            name, data = block.split("\n")
            event = orjson.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            out.append(event)
    return out


def error_of(resp: httpx.Response, status: int = 400) -> Json:
    assert resp.status_code == status, resp.text
    error: Json = resp.json()["error"]
    return error


def test_prompt_is_chat_prompt_of_the_same_messages() -> None:
    assert responses_prompt(BODY) == PROMPT
    parts = [{"type": "text", "text": "Say this"}, {"type": "text", "text": "is a test"}]
    same: list[Json] = [
        {"role": "system", "content": "You are a bot."},
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": parts},
    ]
    assert chat_prompt(same) == PROMPT
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    turn = {"input": [call, {"type": "function_call_output", "call_id": "c", "output": "sunny"}]}
    assert responses_prompt(turn, history=[{"role": "user", "content": "hi"}]) == "hi\nsunny"
    assert responses_prompt({"input": "plain", "instructions": ""}) == "plain"


# ----------------------------------------------------------------------------- the answer


def test_response_object(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = post(client, scripted_openai, {})
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("req_")
    body = r.json()
    assert RESP_ID.match(body["id"]) and body["object"] == "response"
    (message,) = body.pop("output")
    assert re.fullmatch(r"msg_[0-9a-f]{48}", message.pop("id"))
    text = expected_text(PROMPT, 0, RESPONSES_DEFAULT_MAX_OUTPUT_TOKENS)
    assert message == {
        "type": "message",
        "status": "completed",
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
        "role": "assistant",
    }
    assert isinstance(body.pop("created_at"), int) and isinstance(body.pop("completed_at"), int)
    assert {k: v for k, v in body.items() if k != "id"} == {
        "object": "response",
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": "You are a bot.",
        "max_output_tokens": None,
        "max_tool_calls": None,
        "model": "gpt-4o",
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": None,
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 11,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 31,
        },
        "user": None,
        "metadata": {},
    }


def test_sdk_create_and_bounds(sdk: openai.OpenAI) -> None:
    r = create(sdk, model="m", input="Say this is a test", temperature=0.5, top_p=0.9)
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output_text == expected_text("Say this is a test", 0, 20)
    assert (r.temperature, r.top_p) == (0.5, 0.9)
    cut = create(sdk, model="m", input="Say this is a test", max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[0].model_dump()["status"] == "incomplete" and cut.max_output_tokens == 16
    assert cut.output_text == expected_text("Say this is a test", 0, 16)
    eos = create(sdk, model="m", input="stop early __eos_3__", max_output_tokens=16)
    assert eos.status == "completed" and eos.usage is not None and eos.usage.output_tokens == 3


def test_stream_events(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = post(client, scripted_openai, {"stream": True, "max_output_tokens": 16})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    evs = events(r)
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    kinds = [e["type"] for e in evs]
    assert kinds == [*OPENING, *message_kinds(16), "response.incomplete"]
    created, final = evs[0]["response"], evs[-1]["response"]
    assert (created["status"], created["output"], created["usage"]) == ("in_progress", [], None)
    assert created["id"] == final["id"] and final["status"] == "incomplete"
    text = expected_text(PROMPT, 0, 16)
    deltas = [e for e in evs if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == text
    assert [e["delta"] for e in deltas] == [" " + w for w in text.split()]  # one per token
    item = final["output"][0]
    assert all(e["item_id"] == item["id"] and e["output_index"] == 0 for e in deltas)
    assert all(e["obfuscation"] and e["logprobs"] == [] for e in deltas)
    assert evs[2]["item"] == {**item, "status": "in_progress", "content": []}
    assert evs[-2]["item"] == item and evs[-3]["part"] == item["content"][0]
    assert evs[-4]["text"] == text
    plain = events(
        post(
            client,
            scripted_openai,
            {"stream": True, "stream_options": {"include_obfuscation": False}},
        )
    )
    assert plain[-1]["type"] == "response.completed"
    assert all("obfuscation" not in e for e in plain)


def test_sdk_stream_helper(sdk: openai.OpenAI) -> None:
    body: Any = {"model": "m", "input": INPUT, "instructions": "You are a bot."}
    with sdk.responses.stream(**body) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(texts) == expected_text(PROMPT, 0, 20)


def test_sdk_parse(sdk: openai.OpenAI, scripted_openai: ScriptedUpstream) -> None:
    parsed = sdk.responses.parse(model="m", input="the weather", text_format=Forecast)
    sent = scripted_openai.last_request()["body"]["text"]["format"]
    assert sent["type"] == "json_schema"
    assert parsed.output_parsed == Forecast(**fake_value(sent["schema"]))
    doc = json.dumps(fake_value(sent["schema"]), separators=(",", ":"))
    assert parsed.usage is not None and parsed.usage.output_tokens == len(pieces(doc))
    plain = create(sdk, model="m", input="answer in JSON", text={"format": {"type": "json_object"}})
    assert plain.output_text == fake_json_object("answer in JSON")


def test_logprobs(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    body = {"include": ["message.output_text.logprobs"], "top_logprobs": 3}
    part = post(client, scripted_openai, {**body, "max_output_tokens": 16}).json()["output"][0]
    entries = part["content"][0]["logprobs"]
    assert [e["token"] for e in entries] == [" " + w for w in expected_text(PROMPT, 0, 16).split()]
    first = entries[0]
    assert first["logprob"] == token_logprob(0, 0) and first["bytes"] == list(
        first["token"].encode()
    )
    assert first["top_logprobs"][0]["token"] == first["token"]
    assert len(first["top_logprobs"]) == 3 and set(first["top_logprobs"][1]) == {
        "token",
        "logprob",
        "bytes",
    }
    evs = events(post(client, scripted_openai, {**body, "stream": True}))
    delta = next(e for e in evs if e["type"] == "response.output_text.delta")
    (lp,) = delta["logprobs"]
    assert set(lp) == {"token", "logprob", "top_logprobs"} and len(lp["top_logprobs"]) == 3


# ----------------------------------------------------------------------------- tools


def test_tool_choice_decides(sdk: openai.OpenAI) -> None:
    plain = create(sdk, model="m", input="weather?", tools=[WEATHER])
    assert plain.output[0].type == "message"
    marked = "weather? __tool__"
    for choice in ("required", {"type": "function", "name": "get_weather"}, "auto"):
        r = create(
            sdk,
            model="m",
            input=marked if choice == "auto" else "weather?",
            tools=[CLOCK, WEATHER] if isinstance(choice, dict) else [WEATHER],
            tool_choice=choice,
        )
        (call,) = r.output
        assert call.type == "function_call" and call.status == "completed"
        assert call.id is not None and call.id.startswith("fc_")
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call.call_id)
        assert (call.name, call.arguments) == ("get_weather", fake_arguments(WEATHER["parameters"]))
        assert r.status == "completed"
    none = create(sdk, model="m", input=marked, tools=[WEATHER], tool_choice="none")
    assert none.output[0].type == "message"


def test_two_calls_and_their_stream(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    body = {"input": "both __tools_2__", "tools": [WEATHER, CLOCK], "instructions": None}
    r = post(client, scripted_openai, body).json()
    assert [(o["type"], o["name"]) for o in r["output"]] == [
        ("function_call", "get_weather"),
        ("function_call", "get_time"),
    ]
    serial = post(client, scripted_openai, {**body, "parallel_tool_calls": False}).json()
    assert len(serial["output"]) == 1 and serial["parallel_tool_calls"] is False
    evs = events(post(client, scripted_openai, {**body, "stream": True}))
    kinds = [e["type"] for e in evs]
    arguments = fake_arguments(WEATHER["parameters"])
    assert kinds[2:] == [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(pieces(arguments)),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",  # "{}"
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert evs[2]["item"]["arguments"] == "" and evs[2]["item"]["status"] == "in_progress"
    deltas = [e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta"]
    assert deltas[:-1] == pieces(arguments) and deltas[-1] == "{}"
    done = evs[-1]["response"]["output"]
    assert done[0]["arguments"] == arguments and done[1]["name"] == "get_time"


def test_function_call_round_trip(sdk: openai.OpenAI) -> None:
    tools = [WEATHER]
    first = create(sdk, model="m", input="weather? __tool__", tools=tools)
    call = first.output[0]
    assert call.type == "function_call"
    answer: Json = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    chained = create(
        sdk,
        model="m",
        previous_response_id=first.id,
        input=[answer],
        tools=tools,
        max_output_tokens=16,
    )
    assert chained.previous_response_id == first.id
    assert chained.output_text == expected_text("weather? __tool__\nsunny", 0, 16)
    inline_call = {k: call.model_dump()[k] for k in ("type", "call_id", "name", "arguments")}
    inline = create(
        sdk,
        model="m",
        input=[{"role": "user", "content": "weather? __tool__"}, inline_call, answer],
        tools=tools,
        max_output_tokens=16,
        store=False,
    )
    assert inline.output_text == chained.output_text


def test_previous_response_id(
    sdk: openai.OpenAI, client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    first = create(sdk, model="m", input="hello", instructions="Old instructions.")
    second = create(
        sdk, model="m", input="and again", instructions="New.", previous_response_id=first.id
    )
    history = [{"role": "user", "content": "hello"}, first.output[0].model_dump()]
    prompt = responses_prompt({"instructions": "New.", "input": "and again"}, history)
    assert prompt == f"New.\nhello\n{first.output_text}\nand again"
    assert second.output_text == expected_text(prompt, 0, 20)
    third = create(sdk, model="m", input="more", previous_response_id=second.id)
    assert third.output_text == expected_text(
        f"hello\n{first.output_text}\nand again\n{second.output_text}\nmore", 0, 20
    )
    err = error_of(post(client, scripted_openai, {"previous_response_id": "resp_nope"}), 404)
    assert err == {
        "message": "Previous response with id 'resp_nope' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    unstored = create(sdk, model="m", input="hello", store=False)
    r = post(client, scripted_openai, {"previous_response_id": unstored.id})
    assert error_of(r, 404)["code"] == "previous_response_not_found"


def test_kept_responses(sdk: openai.OpenAI, scripted_openai: ScriptedUpstream) -> None:
    first = create(sdk, model="m", input="hello")
    second = create(sdk, model="m", input=INPUT, previous_response_id=first.id)
    assert sdk.responses.retrieve(second.id).output_text == second.output_text
    items = sdk.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["message"] * 4  # newest first
    assert items.data[-1].id is not None and items.data[-1].id.startswith("msg_")
    assert items.data[-1].model_dump()["content"][0]["text"] == "hello"
    assert items.data[-2].id == first.output[0].id
    page = sdk.responses.input_items.list(second.id, limit=2, order="asc")
    assert [i.id for i in page.data] == [items.data[-1].id, items.data[-2].id]
    assert page.has_more is True
    sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.retrieve(first.id)
    assert caught.value.body == {
        "message": f"Response with id '{first.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    log = scripted_openai.requests()
    assert [(e["method"], e["outcome"]) for e in log[2:]] == [
        ("GET", "ok"),
        ("GET", "ok"),
        ("GET", "ok"),
        ("DELETE", "ok"),
        ("GET", "error"),
    ]


# ----------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    "name", ["seed", "stop", "top_k", "max_tokens", "messages", "response_format", "n"]
)
def test_unknown_parameters(
    client: httpx.Client, scripted_openai: ScriptedUpstream, name: str
) -> None:
    err = error_of(post(client, scripted_openai, {name: 1}))
    assert err == {
        "message": f"Unknown parameter: '{name}'.",
        "type": "invalid_request_error",
        "param": name,
        "code": "unknown_parameter",
    }


def test_checks(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    up = scripted_openai
    err = error_of(post(client, up, {"max_output_tokens": 15}))
    assert (err["param"], err["code"]) == ("max_output_tokens", "integer_below_min_value")
    assert err["message"] == (
        "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but "
        "got 15 instead."
    )
    tool_msg = {"role": "tool", "tool_call_id": "c", "content": "x"}
    cases: list[tuple[Json, str]] = [
        ({"model": None}, "model"),
        ({"input": None}, "input"),
        ({"temperature": 3}, "temperature"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"input": [tool_msg]}, "input[0].role"),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        (
            {"input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"role": "user", "content": "x", "name": "bob"}]}, "input[0].name"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "x"}]},
            "input",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.name",
        ),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        (
            {"text": {"format": {"type": "json_schema", "json_schema": {"name": "x"}}}},
            "text.format.name",
        ),
        ({"text": {"format": {"type": "json_object"}}}, "input"),  # no "json" in the input
        ({"include": ["logprobs"]}, "include[0]"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"metadata": {"n": 1}}, "metadata.n"),
    ]
    for body, param in cases:
        assert error_of(post(client, up, body))["param"] == param, body
    err = error_of(post(client, up, {"input": [tool_msg]}))
    assert err["message"] == (
        "Invalid value: 'tool'. Supported values are: 'assistant', 'system', 'developer', and "
        "'user'."
    )
    foreign = {"id": "msg_elsewhere", "type": "message", "role": "assistant", "content": "hi"}
    err = error_of(post(client, up, {"input": [foreign, INPUT[1]]}), 404)
    assert err["message"].startswith("Item with id 'msg_elsewhere' not found.")
    long = {"input": "w " * 2048, "instructions": None}
    assert error_of(post(client, up, long))["code"] == "context_length_exceeded"
    assert all(e["outcome"] == "error" for e in up.requests())


# ----------------------------------------------------------------------------- machinery


def test_auth_markers_and_scripts(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    up = scripted_openai
    r = client.post(up.url + "/responses", json=BODY)
    assert r.status_code == 401 and r.json()["error"]["message"].startswith("You didn't provide")
    r = post(client, up, {"instructions": "x __status_429__"})
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert error_of(r, 429)["code"] == "rate_limit_exceeded"
    r = post(
        client,
        up,
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "__status_500__"}]}
            ]
        },
    )
    assert error_of(r, 500)["type"] == "server_error"
    up.script({"status": 503, "times": 2})
    assert [post(client, up, {}).status_code for _ in range(3)] == [503, 503, 200]
    log = up.requests()
    assert [e["outcome"] for e in log] == ["error"] * 5 + ["ok"]
    assert all(e["path"] == "/v1/responses" for e in log)
    assert log[-1]["body"] == BODY


def test_midstream_error(
    client: httpx.Client, scripted_openai: ScriptedUpstream, sdk: openai.OpenAI
) -> None:
    up = scripted_openai
    evs = events(post(client, up, {"input": "fail __midstream_error__", "stream": True}))
    assert [e["type"] for e in evs] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.failed",
    ]
    failed = evs[-1]
    assert failed["sequence_number"] == 6
    response = failed["response"]
    assert (response["status"], response["output"], response["usage"]) == ("failed", [], None)
    assert response["error"] == {
        "code": "server_error",
        "message": "The model failed to generate a response.",
    }
    assert sdk.responses.retrieve(response["id"]).status == "failed"
    calm = post(client, up, {"input": "fail __midstream_error__"}).json()
    assert calm["status"] == "completed"  # no stream: a normal answer
    assert [e["outcome"] for e in up.requests()] == ["completed_stream", "ok", "ok"]


def test_cut_and_stall(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    up = scripted_openai
    up.script({"cut_after": 3})
    with (
        client.stream(
            "POST", up.url + "/responses", json={**BODY, "stream": True}, headers=HEADERS
        ) as r,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        r.read()
    up.script({"stall_after": 2, "stall_ms": 50, "headers": {"x-extra": "1"}})
    r = post(client, up, {"stream": True})
    assert r.headers["x-extra"] == "1" and events(r)[-1]["type"] == "response.completed"
    assert [e["outcome"] for e in up.requests()] == ["dropped", "completed_stream"]


def test_only_on_openai(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    r = client.post(scripted_fireworks.url + "/responses", json=BODY)
    assert r.status_code == 404


def test_slow_stream_disconnect(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    up = scripted_openai
    body = {**BODY, "input": "x __slow_stream__", "stream": True}
    with client.stream("POST", up.url + "/responses", json=body, headers=HEADERS) as r:
        lines = r.iter_lines()
        assert [next(lines) for _ in range(15)][-3] == "event: response.output_text.delta"
    for _ in range(100):  # the server notices the disconnect at its next write (≤ 100 ms)
        if up.requests()[0]["outcome"] is not None:
            break
        time.sleep(0.02)
    assert up.requests()[0]["outcome"] == "disconnect" and up.stats()["disconnects"] == 1

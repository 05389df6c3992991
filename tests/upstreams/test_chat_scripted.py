"""The scripted upstreams' `…/chat/completions`: OpenAI's and Fireworks' chat shapes, checks and
quirks over the fake model, and the completions machinery (markers, scripts, log) on chat."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.upstreams.chat_fake import (
    chat_prompt,
    fake_arguments,
    fake_json_object,
    fake_value,
    pieces,
)
from tests.upstreams.chat_validate import CHAT_DEFAULT_MAX_TOKENS
from tests.upstreams.fakegen import CONTEXT_WINDOW, expected_text, token_logprob
from tests.upstreams.procs import FIREWORKS_TEST_KEY, OPENAI_TEST_KEY, ScriptedUpstream

Json = dict[str, Any]
MESSAGES: list[Json] = [
    {"role": "system", "content": "You are terse."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Say this"}, {"type": "text", "text": "is a test"}],
    },
]
PROMPT = "You are terse.\nSay this\nis a test"  # the texts joined with newlines
WEATHER: Json = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK: Json = {"type": "function", "function": {"name": "get_time"}}
CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as c:
        yield c


def chat(client: httpx.Client, up: ScriptedUpstream, body: Json, **kw: Any) -> httpx.Response:
    key = OPENAI_TEST_KEY if up.dialect == "openai" else FIREWORKS_TEST_KEY
    full = {"model": "m", "messages": MESSAGES, **body}
    return client.post(
        up.url + "/chat/completions", json=full, headers={"Authorization": f"Bearer {key}"}, **kw
    )


def events(resp: httpx.Response) -> list[Any]:
    datas = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    return [d if d == "[DONE]" else orjson.loads(d) for d in datas]


def contents(chunks: list[Json]) -> dict[int, str]:
    out: dict[int, str] = {}
    for ev in chunks:
        for ch in ev["choices"]:
            out[ch["index"]] = out.get(ch["index"], "") + (ch["delta"].get("content") or "")
    return out


def openai_error(resp: httpx.Response) -> Json:
    assert resp.status_code == 400, resp.text
    error: Json = resp.json()["error"]
    return error


def test_prompt_is_the_texts_joined() -> None:
    assert chat_prompt(MESSAGES) == PROMPT
    assert chat_prompt([{"role": "assistant", "content": None, "tool_calls": []}]) == ""


# ----------------------------------------------------------------------------- OpenAI


def test_openai_shape(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    r = chat(client, scripted_openai, {"n": 2, "max_tokens": 4, "seed": 7})
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("req_")
    body = r.json()
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{29}", body["id"])
    assert (body["object"], body["model"], body["system_fingerprint"]) == (
        "chat.completion",
        "m",
        "fp_scripted01",
    )
    assert body["choices"] == [
        {
            "index": i,
            "message": {
                "role": "assistant",
                "content": expected_text(PROMPT, i, 4, seed=7),
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "length",
        }
        for i in range(2)
    ]
    assert body["usage"] == {
        "prompt_tokens": 8,
        "completion_tokens": 8,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def test_openai_bounds(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    default = chat(client, scripted_openai, {}).json()
    assert default["usage"]["completion_tokens"] == CHAT_DEFAULT_MAX_TOKENS
    both = chat(client, scripted_openai, {"max_tokens": 9, "max_completion_tokens": 3}).json()
    assert both["choices"][0]["message"]["content"] == expected_text(PROMPT, 0, 3)


def test_openai_stop_is_excluded(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    choice = chat(client, scripted_openai, {"stop": [" gamma"]}).json()["choices"][0]
    full = expected_text(PROMPT, 0, 20)
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == full[: full.index(" gamma")]


def test_openai_logprobs(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    body = {"logprobs": True, "top_logprobs": 3, "max_tokens": 2, "n": 2}
    choices = chat(client, scripted_openai, body).json()["choices"]
    lp = choices[1]["logprobs"]
    assert lp["refusal"] is None
    words = expected_text(PROMPT, 1, 2).split()
    assert [e["token"] for e in lp["content"]] == [" " + w for w in words]
    first = lp["content"][0]
    assert first["logprob"] == token_logprob(1, 0)
    assert first["bytes"] == list(first["token"].encode())
    assert first["top_logprobs"][0]["token"] == first["token"]
    assert len(first["top_logprobs"]) == 3
    assert set(first["top_logprobs"][1]) == {"token", "logprob", "bytes"}


def test_openai_stream_shape(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    body = {"n": 2, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    r = chat(client, scripted_openai, body)
    assert r.headers["content-type"].startswith("text/event-stream")
    *chunks, usage, done = events(r)
    assert done == "[DONE]"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks)
    assert len({c["id"] for c in [*chunks, usage]}) == 1
    for index in range(2):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
        assert mine[-1] == {
            "index": index,
            "delta": {},
            "logprobs": None,
            "finish_reason": "length",
        }
        assert len(mine) == 1 + 3 + 1  # role, one chunk per token, finish
    assert contents(chunks) == {i: expected_text(PROMPT, i, 3) for i in range(2)}
    plain = events(chat(client, scripted_openai, {"max_tokens": 3, "stream": True}))
    assert all("usage" not in c for c in plain[:-1])


def test_openai_stream_logprobs(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    body = {"max_tokens": 2, "stream": True, "logprobs": True, "top_logprobs": 1}
    chunks = events(chat(client, scripted_openai, body))[:-1]
    lps = [c["choices"][0]["logprobs"] for c in chunks]
    assert lps[0] is None and lps[-1] is None
    assert [lp["content"][0]["token"] for lp in lps[1:-1]] == [
        " " + w for w in expected_text(PROMPT, 0, 2).split()
    ]


def test_openai_validation(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    up = scripted_openai
    assert openai_error(chat(client, up, {"top_k": 3}))["message"] == (
        "Unrecognized request argument supplied: top_k"
    )
    err = openai_error(chat(client, up, {"temperature": 3}))
    assert (err["param"], err["code"]) == ("temperature", "decimal_above_max_value")
    assert err["message"] == (
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 "
        "instead."
    )
    err = openai_error(chat(client, up, {"top_logprobs": 21, "logprobs": True}))
    assert (err["param"], err["code"]) == ("top_logprobs", "integer_above_max_value")
    cases: list[tuple[Json, str]] = [
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [MESSAGES[1], {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
        (
            {"messages": [MESSAGES[1], {"role": "tool", "content": "x", "tool_call_id": "c"}]},
            "messages[1].role",
        ),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tool_choice": "auto"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"parallel_tool_calls": True}, "parallel_tool_calls"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"response_format": {"type": "grammar", "grammar": "x"}}, "response_format.type"),
        ({"response_format": {"type": "json_object"}}, "messages"),  # no "json" in them
        ({"response_format": {"type": "json_object", "schema": {}}}, "response_format.schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema.name",
        ),
    ]
    for body, param in cases:
        if body.get("messages") is None and "messages" in body:
            body = {k: v for k, v in body.items() if k != "messages"}
            r = client.post(
                up.url + "/chat/completions",
                json={"model": "m", **body},
                headers={"Authorization": f"Bearer {OPENAI_TEST_KEY}"},
            )
        else:
            r = chat(client, up, body)
        assert openai_error(r)["param"] == param, (body, r.text)
    err = openai_error(chat(client, up, {"messages": [{"role": "robot", "content": "x"}]}))
    assert err["message"] == (
        "Invalid value: 'robot'. Supported values are: 'system', 'assistant', 'user', "
        "'function', 'tool', and 'developer'."
    )


def test_openai_tool_answer_is_accepted(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{}"},
    }
    history = [
        MESSAGES[1],
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = chat(client, scripted_openai, {"messages": history, "tools": [WEATHER], "max_tokens": 2})
    content = r.json()["choices"][0]["message"]["content"]
    assert content == expected_text("Say this\nis a test\nsunny", 0, 2)


def test_openai_context_error(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    long = [{"role": "user", "content": "w " * 60}]
    err = openai_error(chat(client, scripted_openai, {"messages": long, "max_tokens": 2000}))
    assert (err["code"], err["param"]) == ("context_length_exceeded", "messages")
    assert err["message"] == (
        "This model's maximum context length is 2048 tokens. However, you requested 2060 tokens "
        "(60 in the messages, 2000 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    huge = [{"role": "user", "content": "w " * CONTEXT_WINDOW}]
    err = openai_error(chat(client, scripted_openai, {"messages": huge}))
    assert "your messages resulted in 2048 tokens" in err["message"]


# ----------------------------------------------------------------------------- tools


def test_tool_choice_decides(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    up = scripted_openai
    plain = chat(client, up, {"tools": [WEATHER], "max_tokens": 2}).json()["choices"][0]
    assert plain["message"]["content"] == expected_text(PROMPT, 0, 2)
    assert "tool_calls" not in plain["message"]
    none = chat(client, up, {"tools": [WEATHER], "tool_choice": "none"}).json()["choices"][0]
    assert none["finish_reason"] == "length"
    marked = [{"role": "user", "content": "weather? __tool__"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for body, finish in (
        ({"tools": [WEATHER], "tool_choice": "required"}, "tool_calls"),
        ({"tools": [WEATHER], "messages": marked}, "tool_calls"),
        ({"tools": [CLOCK, WEATHER], "tool_choice": named}, "stop"),  # OpenAI: forced → stop
    ):
        choice = chat(client, up, body).json()["choices"][0]
        message = choice["message"]
        assert choice["finish_reason"] == finish
        assert message["content"] is None and message["refusal"] is None
        (call,) = message["tool_calls"]
        assert CALL_ID.match(call["id"]) and call["type"] == "function"
        assert call["function"] == {
            "name": "get_weather",
            "arguments": fake_arguments(WEATHER["function"]["parameters"]),
        }
    args = json.loads(fake_arguments(WEATHER["function"]["parameters"]))
    assert set(args) == {"city", "days"} and isinstance(args["days"], int)
    assert args["city"] in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}


def test_two_tool_calls(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    two = [{"role": "user", "content": "both __tools_2__"}]
    body = {"messages": two, "tools": [WEATHER, CLOCK]}
    calls = chat(client, scripted_openai, body).json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert calls[1]["function"]["arguments"] == "{}"
    assert calls[0]["id"] != calls[1]["id"]
    serial = chat(client, scripted_openai, {**body, "parallel_tool_calls": False}).json()
    assert len(serial["choices"][0]["message"]["tool_calls"]) == 1


def test_tool_call_streams(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    two = [{"role": "user", "content": "both __tools_2__"}]
    chunks = events(
        chat(client, scripted_openai, {"messages": two, "tools": [WEATHER, CLOCK], "stream": True})
    )[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    finish = [c["choices"][0]["finish_reason"] for c in chunks]
    first = deltas[0]
    assert (first["role"], first["content"]) == ("assistant", None)
    head = first["tool_calls"][0]
    assert (head["index"], head["type"], head["function"]) == (
        0,
        "function",
        {"name": "get_weather", "arguments": ""},
    )
    arguments = fake_arguments(WEATHER["function"]["parameters"])
    expected_pieces = pieces(arguments)
    assert [
        d["tool_calls"][0]["function"]["arguments"] for d in deltas[1 : 1 + len(expected_pieces)]
    ] == expected_pieces
    second = deltas[1 + len(expected_pieces)]["tool_calls"][0]
    assert (second["index"], second["function"]["name"]) == (1, "get_time")
    assert deltas[-1] == {} and finish[-1] == "tool_calls" and set(finish[:-1]) == {None}


def test_tool_call_cut_by_max_tokens(
    client: httpx.Client, scripted_openai: ScriptedUpstream
) -> None:
    body = {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 1}
    choice = chat(client, scripted_openai, body).json()
    assert choice["choices"][0]["finish_reason"] == "length"
    arguments = fake_arguments(WEATHER["function"]["parameters"])
    assert (
        choice["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == arguments[:8]
    )
    assert choice["usage"]["completion_tokens"] == 1


# ----------------------------------------------------------------------------- response_format


def test_response_formats(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    json_msgs = [{"role": "user", "content": "answer in JSON"}]
    r = chat(
        client, scripted_openai, {"messages": json_msgs, "response_format": {"type": "json_object"}}
    )
    content = r.json()["choices"][0]["message"]["content"]
    assert content == fake_json_object("answer in JSON") and "answer" in json.loads(content)
    assert r.json()["usage"]["completion_tokens"] == len(pieces(content))
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "inner": {"$ref": "#/$defs/Inner"},
            "kind": {"enum": ["a", "b"]},
        },
        "required": ["name", "tags", "score", "inner", "kind"],
        "additionalProperties": False,
        "$defs": {"Inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    r = chat(client, scripted_openai, {"response_format": fmt, "stream": True})
    doc = json.loads(contents(events(r)[:-1])[0])
    assert doc == fake_value(schema)
    assert set(doc) == {"name", "tags", "score", "inner", "kind"}
    assert doc["kind"] == "a" and isinstance(doc["score"], float) and set(doc["inner"]) == {"ok"}


# ----------------------------------------------------------------------------- Fireworks


def test_fireworks_shape_and_stop(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    body = chat(client, scripted_fireworks, {"stop": " gamma"}).json()
    uuid.UUID(body["id"])
    assert body["object"] == "chat.completion" and "system_fingerprint" not in body
    choice = body["choices"][0]
    full = expected_text(PROMPT, 0, 20)
    assert choice["message"] == {
        "role": "assistant",
        "content": full[: full.index(" gamma") + len(" gamma")],  # the stop string stays
    }
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_fireworks_stream(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    body = {"n": 2, "max_tokens": 3, "stream": True, "logprobs": True, "top_logprobs": 2}
    *chunks, done = events(chat(client, scripted_fireworks, body))
    assert done == "[DONE]"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 6 and chunks[-1]["choices"]
    for index in range(2):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant"}
        assert [m["finish_reason"] for m in mine] == [None, None, None, "length"]
        entry = mine[1]["logprobs"]["content"][0]
        assert {"sampling_logprob", "token_id", "text_offset"} <= set(entry)
        assert len(entry["top_logprobs"]) == 2
    assert contents(chunks) == {i: expected_text(PROMPT, i, 3) for i in range(2)}


def test_fireworks_fields(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    up = scripted_fireworks
    extras = {
        "top_k": 40,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "mirostat_target": 5.0,
        "mirostat_lr": 0.1,
        "ignore_eos": True,
        "context_length_exceeded_behavior": "error",
        "max_completion_tokens": 3,
        "response_format": {"type": "grammar", "grammar": "root ::= 'x'"},
    }
    r = chat(client, up, extras)
    assert r.json()["choices"][0]["message"]["content"] == expected_text(PROMPT, 0, 3)
    fields: list[Json] = [{"stream_options": {}}, {"audio": {}}, {"store": True}, {"frobnicate": 1}]
    for field in fields:
        r = chat(client, up, field)
        (name,) = field
        assert r.status_code == 422 and r.json()["detail"] == [
            {
                "loc": ["body", name],
                "msg": "Extra inputs are not permitted",
                "type": "extra_forbidden",
            }
        ]
    r = chat(client, up, {"messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "messages", 0, "role"]
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 200}}}
    r = chat(client, up, {"response_format": {"type": "json_object", "schema": schema}})
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"n": 200}


def test_fireworks_tools_finish_tool_calls(
    client: httpx.Client, scripted_fireworks: ScriptedUpstream
) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    choice = chat(client, scripted_fireworks, {"tools": [WEATHER], "tool_choice": named}).json()
    assert choice["choices"][0]["finish_reason"] == "tool_calls"
    chunks = events(
        chat(
            client,
            scripted_fireworks,
            {"tools": [WEATHER], "tool_choice": "required", "stream": True},
        )
    )[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": "",
    }
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["usage"]


def test_fireworks_context(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    long = [{"role": "user", "content": "w " * 60}]
    body = {"messages": long, "max_tokens": 2000}
    assert (
        chat(client, scripted_fireworks, body).json()["usage"]["completion_tokens"]
        == CONTEXT_WINDOW - 60
    )
    r = chat(client, scripted_fireworks, {**body, "context_length_exceeded_behavior": "error"})
    assert r.status_code == 400 and "too long" in r.json()["error"]["message"]


# ----------------------------------------------------------------------------- machinery


def test_markers_scripts_and_log(client: httpx.Client, scripted_openai: ScriptedUpstream) -> None:
    up = scripted_openai
    r = chat(client, up, {"messages": [{"role": "user", "content": "x __status_429__"}]})
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    up.script({"status": 503})
    assert chat(client, up, {}).status_code == 503
    eos = chat(client, up, {"messages": [{"role": "user", "content": "__eos_2__"}]}).json()
    assert eos["choices"][0]["finish_reason"] == "stop" and eos["usage"]["completion_tokens"] == 2
    mid = events(
        chat(
            client,
            up,
            {"messages": [{"role": "user", "content": "__midstream_error__"}], "stream": True},
        )
    )
    assert len(mid) == 4 and mid[2]["error"]["type"] == "server_error" and mid[-1] == "[DONE]"
    up.script({"cut_after": 2})
    with (
        client.stream(
            "POST",
            up.url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
            headers={"Authorization": f"Bearer {OPENAI_TEST_KEY}"},
        ) as r,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        r.read()
    log = up.requests()
    assert [e["path"] for e in log] == ["/v1/chat/completions"] * 5
    assert [e["outcome"] for e in log] == ["error", "error", "ok", "completed_stream", "dropped"]
    assert log[2]["body"]["messages"] == [{"role": "user", "content": "__eos_2__"}]


def test_routes(client: httpx.Client, scripted_fireworks: ScriptedUpstream) -> None:
    headers = {"Authorization": f"Bearer {FIREWORKS_TEST_KEY}"}
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 1}
    for path in ("/inference/v1/chat/completions", "/v1/chat/completions", "/chat/completions"):
        r = client.post(scripted_fireworks.root + path, json=body, headers=headers)
        assert r.json()["object"] == "chat.completion", path
    r = client.post(
        scripted_fireworks.url + "/completions", json={"model": "m", "prompt": "p"}, headers=headers
    )
    assert r.json()["object"] == "text_completion"
    assert client.post(scripted_fireworks.url + "/chat/completions", json=body).status_code == 401


def test_fake_value_schemas() -> None:
    assert fake_value({"type": "integer", "minimum": 500}) == 500
    assert fake_value({"type": ["null", "boolean"]}) in (True, False)
    assert fake_value({"const": 3}) == 3
    assert fake_value({"type": "array", "items": {"type": "integer"}, "minItems": 3}) == [
        fake_value({"type": "integer"}, f"$[{i}]") for i in range(3)
    ]
    nested = {"properties": {"a": {"properties": {"b": {"type": "string"}}}}}
    assert fake_value(nested) == {"a": {"b": fake_value({"type": "string"}, "$.a.b")}}
    assert fake_arguments(None) == "{}"

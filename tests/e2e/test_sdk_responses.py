"""`POST /v1/responses` with the openai SDK (sync and async: `create`, the `stream` helper,
`parse`, `retrieve`, `delete`, `input_items.list`) and raw HTTP, through the session gateway:

    translated  targets that speak chat completions only (Fireworks, a generic server): the
                gateway serves the Responses API as the chat it means, and back, streams
                included
    native      OpenAI: passed through to its own `/v1/responses`, the conversation continued
                there by its own ids when it answered the turn before

Expected texts come from the scripted upstreams' fake model (tests/upstreams/chat_fake.py): the
prompt is the chat messages' texts joined by newlines (the Responses body's texts, on the
scripted OpenAI's `/v1/responses`: tests/upstreams/responses_request.py)."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pydantic
import pytest

from tests.e2e.conftest import Env
from tests.e2e.metrics_text import scrape
from tests.e2e.support import (
    FW,
    GENERIC,
    OA,
    OA_THEN_FW,
    OPENAI_MODEL,
    TARGET_LABEL,
    auth,
    expect,
)
from tests.upstreams.chat_fake import chat_prompt, compact, fake_arguments, fake_value, pieces
from tests.upstreams.responses_render import OPENING, message_kinds
from tests.upstreams.responses_request import responses_prompt

Json = dict[str, Any]
TRANSLATED = (FW, GENERIC)  # chat-only upstreams: the Responses API as chat
INSTRUCTIONS = "You are a poet."
QUESTION = "Write about the sea"
PROMPT = chat_prompt([{"content": INSTRUCTIONS}, {"content": QUESTION}])
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
WEATHER_ARGS = fake_arguments(WEATHER["parameters"])
TOOL_ASK = "What is the weather in Paris? __tool__"
# A stop string (an extension every target here serves) ends the answer before its bound: the
# response is complete (the SDK's stream helper wants `response.completed`).
FULL = expect(QUESTION, 0, 16).text
STOP = " " + FULL.split()[3]
DONE = FULL[: FULL.index(STOP)]
STOPPED: Any = {"stop": [STOP]}


def sent(env: Env, alias: str) -> Json:
    """The chat body the alias's upstream got last."""
    body: Json = env.upstream(alias).last_request()["body"]
    return body


def events_of(env: Env, body: Json) -> list[tuple[str, Json]]:
    """A raw stream's events: each `event:` name and its data."""
    r = env.http.post("/v1/responses", json=body, headers=auth())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in r.text.split("\n\n"):
        if block:
            name, data = block.split("\n")
            out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


# ---------------------------------------------------------------- answers


@pytest.mark.parametrize("alias", TRANSLATED)
def test_a_text_answer(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.responses.create(
        model=alias, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=16
    )
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.model == alias
    assert resp.output_text == expect(PROMPT, 0, 16).text
    assert (resp.status, resp.incomplete_details) == ("incomplete", None) or (
        resp.status == "incomplete"
        and resp.incomplete_details is not None
        and resp.incomplete_details.reason == "max_output_tokens"
    )
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (len(PROMPT.split()), 16)
    assert resp.usage.total_tokens == resp.usage.input_tokens + 16
    assert (resp.instructions, resp.max_output_tokens) == (INSTRUCTIONS, 16)
    assert resp.model_dump()["store"] is True
    chat = sent(env, alias)
    assert chat["messages"] == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
    ]
    assert "store" not in chat and "input" not in chat


@pytest.mark.parametrize("alias", TRANSLATED)
def test_a_completed_answer(sdk: openai.OpenAI, alias: str) -> None:
    """Stopped by a stop string (an extension), the response is complete."""
    resp = sdk.responses.create(model=alias, input=QUESTION, extra_body=STOPPED)
    assert (resp.status, resp.incomplete_details, resp.output_text) == ("completed", None, DONE)


def test_a_list_of_items_with_parts(env: Env, sdk: openai.OpenAI) -> None:
    items: Any = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": QUESTION},
    ]
    resp = sdk.responses.create(model=FW, input=items, max_output_tokens=16)
    chat = sent(env, FW)["messages"]
    assert chat == [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": QUESTION},
    ]
    assert resp.output_text == expect(chat_prompt(chat), 0, 16).text


# ---------------------------------------------------------------- streams


@pytest.mark.parametrize("alias", TRANSLATED)
def test_the_event_sequence(env: Env, alias: str) -> None:
    body = {"model": alias, "input": QUESTION, "max_output_tokens": 16, "stream": True}
    events = events_of(env, body)
    names = [name for name, _ in events]
    assert [data["type"] for _, data in events] == names
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names == [*OPENING, *message_kinds(16), "response.incomplete"]
    text = expect(QUESTION, 0, 16).text
    deltas = [data["delta"] for name, data in events if name.endswith(".delta")]
    assert "".join(deltas) == text
    first, last = events[0][1]["response"], events[-1][1]["response"]
    assert first["id"] == last["id"] and first["status"] == "in_progress"
    assert first["output"] == [] and first["usage"] is None
    assert last["usage"]["output_tokens"] == 16
    assert last["output"][0]["content"][0]["text"] == text
    assert last["output"][0]["id"] == events[2][1]["item"]["id"]
    if alias != FW:  # Fireworks reports the usage at the end unasked
        assert sent(env, alias)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("alias", TRANSLATED)
def test_the_stream_helper(sdk: openai.OpenAI, alias: str) -> None:
    deltas = []
    with sdk.responses.stream(model=alias, input=QUESTION, extra_body=STOPPED) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == DONE
    assert final.usage is not None and final.usage.output_tokens == len(DONE.split()) + 1


async def test_the_async_client(env: Env) -> None:
    async with env.async_client() as client:
        resp = await client.responses.create(model=FW, input=QUESTION, max_output_tokens=16)
        assert resp.output_text == expect(QUESTION, 0, 16).text
        stream = await client.responses.create(
            model=FW, input=QUESTION, max_output_tokens=16, stream=True
        )
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
        again = await client.responses.retrieve(resp.id)
        assert again.output_text == resp.output_text


@pytest.mark.parametrize("alias", TRANSLATED)
def test_a_failure_after_the_first_event_is_a_failed_response(
    sdk: openai.OpenAI, alias: str
) -> None:
    stream = sdk.responses.create(model=alias, input="__midstream_error__", stream=True)
    events = list(stream)
    assert events[0].type == "response.created"
    last = events[-1]
    assert last.type == "response.failed"
    assert last.response.status == "failed" and last.response.error is not None
    assert TARGET_LABEL[alias] in last.response.error.message
    # What came before the failure is in the failed response.
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    failed = last.response.model_dump()["output"]
    assert text and failed[0]["content"][0]["text"] == text


# ---------------------------------------------------------------- tools


@pytest.mark.parametrize("alias", TRANSLATED)
def test_a_function_call_and_its_output(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    first = sdk.responses.create(model=alias, input=TOOL_ASK, tools=[WEATHER])
    (call,) = first.output
    assert call.type == "function_call" and (call.id or "").startswith("fc_")
    assert (call.name, call.arguments, call.status) == ("get_weather", WEATHER_ARGS, "completed")
    assert first.status == "completed"
    assert first.usage is not None and first.usage.output_tokens == len(pieces(WEATHER_ARGS))
    assert sent(env, alias)["tools"] == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    items: Any = [
        {"role": "user", "content": TOOL_ASK},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
    ]
    second = sdk.responses.create(
        model=alias, input=items, tools=[WEATHER], max_output_tokens=16, store=False
    )
    chat = sent(env, alias)["messages"]
    assert chat[1]["tool_calls"][0]["id"] == call.call_id
    assert chat[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": WEATHER_ARGS,
    }
    assert chat[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"}
    assert second.output_text == expect(chat_prompt(chat), 0, 16).text


def test_a_function_call_streamed(env: Env) -> None:
    events = events_of(env, {"model": FW, "input": TOOL_ASK, "tools": [WEATHER], "stream": True})
    names = [name for name, _ in events]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2][1]["item"]
    assert (added["type"], added["name"], added["arguments"]) == (
        "function_call",
        "get_weather",
        "",
    )
    deltas = [d["delta"] for n, d in events if n == "response.function_call_arguments.delta"]
    assert "".join(deltas) == WEATHER_ARGS == events[-3][1]["arguments"]
    assert events[-1][1]["response"]["output"][0]["arguments"] == WEATHER_ARGS


def test_a_hosted_tool_is_refused_by_name(env: Env, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model=FW, input="x", tools=[WEATHER, {"type": "web_search"}])
    assert info.value.param == "tools[1].type" and "web_search" in info.value.message
    assert env.fireworks.requests() == []


# ---------------------------------------------------------------- structured outputs


class Forecast(pydantic.BaseModel):
    city: str
    days: int
    sunny: bool


@pytest.mark.parametrize("alias", TRANSLATED)
def test_parse_with_a_pydantic_model(env: Env, sdk: openai.OpenAI, alias: str) -> None:
    resp = sdk.responses.parse(
        model=alias, input=QUESTION, text_format=Forecast, max_output_tokens=200
    )
    form = sent(env, alias)["response_format"]
    assert form["type"] == "json_schema" and form["json_schema"]["name"] == "Forecast"
    schema = form["json_schema"]["schema"]
    assert resp.output_parsed == Forecast.model_validate(fake_value(schema))
    assert resp.output_text == compact(fake_value(schema))


# ---------------------------------------------------------------- what a chat cannot serve


def test_a_reasoning_summary_is_refused_by_name(env: Env, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model=GENERIC, input="x", reasoning={"summary": "auto"})
    assert info.value.param == "reasoning.summary"
    assert env.openai.requests() == []


def test_a_refused_chat_field_is_named_as_the_responses_field(sdk: openai.OpenAI) -> None:
    """Fireworks has no `verbosity`: the caller sent `text.verbosity`, and hears that name."""
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model=FW, input="x", text={"verbosity": "low"})
    assert info.value.param == "text.verbosity" and "'text.verbosity'" in info.value.message


# ---------------------------------------------------------------- stored responses


def test_retrieve_input_items_and_delete(sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(model=FW, instructions=INSTRUCTIONS, input=QUESTION)
    again = sdk.responses.retrieve(resp.id)
    assert again.model_dump() == resp.model_dump()
    (item,) = sdk.responses.input_items.list(resp.id).data
    assert item.type == "message" and item.role == "user"
    assert item.content[0].text == QUESTION  # type: ignore[union-attr]
    sdk.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(resp.id)


def test_a_stream_is_stored_once_it_ends(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model=FW, input=QUESTION, extra_body=STOPPED) as stream:
        final = stream.get_final_response()
    again = sdk.responses.retrieve(final.id)
    assert (again.output_text, again.usage, again.status) == (DONE, final.usage, "completed")
    ids = [item.model_dump().get("id") for item in final.output]
    assert [item.model_dump().get("id") for item in again.output] == ids


def test_store_false_keeps_nothing(sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(model=FW, input=QUESTION, store=False, max_output_tokens=16)
    assert resp.model_dump()["store"] is False
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(resp.id)


@pytest.mark.parametrize("alias", TRANSLATED)
def test_previous_response_id_continues_the_conversation(
    env: Env, sdk: openai.OpenAI, alias: str
) -> None:
    first = sdk.responses.create(
        model=alias, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=16
    )
    second = sdk.responses.create(
        model=alias, input="And the sky?", previous_response_id=first.id, max_output_tokens=16
    )
    chat = sent(env, alias)["messages"]
    # The earlier turn, without its instructions (OpenAI does not carry them over).
    assert chat == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the sky?"},
    ]
    assert second.previous_response_id == first.id
    assert second.output_text == expect(chat_prompt(chat), 0, 16).text
    third = sdk.responses.create(
        model=alias, input="Thanks", previous_response_id=second.id, max_output_tokens=16
    )
    assert len(sent(env, alias)["messages"]) == 5 and third.status == "incomplete"


def test_a_function_call_continues_by_previous_response_id(env: Env, sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model=FW, input=TOOL_ASK, tools=[WEATHER])
    call = first.output[0]
    assert call.type == "function_call"
    output: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "Rain"}]
    sdk.responses.create(
        model=FW, input=output, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=16
    )
    chat = sent(env, FW)["messages"]
    assert [m["role"] for m in chat] == ["user", "assistant", "tool"]
    assert chat[1]["tool_calls"][0]["id"] == call.call_id == chat[2]["tool_call_id"]


def test_another_callers_response_is_not_found(env: Env, sdk: openai.OpenAI) -> None:
    mine = sdk.responses.create(model=OA, input=QUESTION, max_output_tokens=16)
    with pytest.raises(openai.NotFoundError):
        env.limited.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError) as info:
        env.limited.responses.create(model=OA, input="x", previous_response_id=mine.id)
    assert info.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        env.limited.responses.delete(mine.id)
    assert sdk.responses.retrieve(mine.id).id == mine.id


def test_an_unknown_previous_response_is_a_404_before_any_upstream_call(
    env: Env, sdk: openai.OpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.responses.create(model=FW, input="x", previous_response_id="resp_nothing")
    assert info.value.param == "previous_response_id"
    assert env.fireworks.requests() == []


# ---------------------------------------------------------------- the pipeline


def test_fallback_before_the_first_event(env: Env, sdk: openai.OpenAI) -> None:
    """OpenAI (native) fails before anything was written: Fireworks (translated) answers."""
    env.openai.script({"status": 503, "times": 2})
    resp = sdk.responses.create(model=OA_THEN_FW, input=QUESTION, max_output_tokens=16)
    assert resp.output_text == expect(QUESTION, 0, 16).text and resp.model == OA_THEN_FW
    stream = sdk.responses.create(
        model=OA_THEN_FW, input=QUESTION, max_output_tokens=16, stream=True
    )
    kinds = [event.type for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert [r["outcome"] for r in env.openai.requests()] == ["error", "error"]
    assert [r["outcome"] for r in env.fireworks.requests()] == ["ok", "completed_stream"]


def test_metrics_count_the_responses_operation(env: Env, sdk: openai.OpenAI) -> None:
    def count() -> float:
        return scrape(env.url).value("gateway_requests_total", operation="responses")

    before = count()
    sdk.responses.create(model=FW, input=QUESTION, max_output_tokens=16, store=False)
    list(sdk.responses.create(model=FW, input=QUESTION, max_output_tokens=16, stream=True))
    assert count() == before + 2


def test_bad_fields_are_400s_naming_them(env: Env) -> None:
    for body, param in (
        ({"model": FW}, "input"),
        ({"model": FW, "input": 3}, "input"),
        ({"model": FW, "input": "x", "max_output_tokens": 15}, "max_output_tokens"),
        ({"model": FW, "input": "x", "temperature": 3}, "temperature"),
    ):
        r = env.http.post("/v1/responses", json=body, headers=auth())
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert env.fireworks.requests() == []


def test_without_v1_too(env: Env) -> None:
    r = env.http.post(
        "/responses", json={"model": FW, "input": "x", "max_output_tokens": 16}, headers=auth()
    )
    assert r.status_code == 200 and r.json()["object"] == "response"
    rid = r.json()["id"]
    assert env.http.get(f"/responses/{rid}", headers=auth()).json()["id"] == rid


def test_the_arguments_are_json(sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(model=FW, input=TOOL_ASK, tools=[WEATHER], store=False)
    assert json.loads(resp.output[0].model_dump()["arguments"])["city"]


# ---------------------------------------------------------------- native: OpenAI


def native_sent(env: Env) -> Json:
    """The Responses body the scripted OpenAI got last."""
    last = env.openai.last_request()
    assert last["path"] == "/v1/responses"
    body: Json = last["body"]
    return body


def test_native_a_text_answer(env: Env, sdk: openai.OpenAI) -> None:
    resp = sdk.responses.create(
        model=OA, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=16
    )
    body = native_sent(env)
    assert body == {
        "instructions": INSTRUCTIONS,
        "max_output_tokens": 16,
        "model": OPENAI_MODEL,
        "input": QUESTION,
        "store": True,
    }
    assert resp.output_text == expect(responses_prompt(body), 0, 16).text
    assert resp.id.startswith("resp_") and resp.model == OA and resp.status == "incomplete"
    assert resp.usage is not None and resp.usage.output_tokens == 16


def test_native_events_are_the_upstreams_renumbered(env: Env) -> None:
    body = {"model": OA, "input": QUESTION, "max_output_tokens": 16, "stream": True}
    events = events_of(env, body)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert events[0][0] == "response.created" and events[-1][0] == "response.incomplete"
    ids = {d["response"]["id"] for _, d in events if "response" in d}
    (rid,) = ids
    assert rid.startswith("resp_") and {
        d["response"]["model"] for _, d in events if "response" in d
    } == {OA}
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == expect(responses_prompt(native_sent(env)), 0, 16).text


def test_native_fields_openai_lacks_are_refused_by_name(env: Env, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model=OA, input="x", extra_body={"top_k": 3})
    assert info.value.param == "top_k"
    assert env.openai.requests() == []


def test_native_a_function_call_round_trip(env: Env, sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model=OA, input=TOOL_ASK, tools=[WEATHER])
    (call,) = first.output
    assert call.type == "function_call" and (call.name, call.arguments) == (
        "get_weather",
        WEATHER_ARGS,
    )
    output: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "Rain"}]
    second = sdk.responses.create(
        model=OA, input=output, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=16
    )
    body = native_sent(env)
    # OpenAI answered the turn before and keeps it: the gateway continues there, by its id.
    assert body["previous_response_id"] != first.id and body["previous_response_id"].startswith(
        "resp_"
    )
    assert body["input"] == output
    assert second.previous_response_id == first.id and second.status == "incomplete"


def test_native_a_conversation_begun_elsewhere_is_sent_inline(env: Env, sdk: openai.OpenAI) -> None:
    """The turn before was Fireworks' (translated): OpenAI holds nothing of it, and gets it inline,
    without the gateway's item ids (they name nothing at OpenAI)."""
    first = sdk.responses.create(model=FW, input=QUESTION, max_output_tokens=16)
    second = sdk.responses.create(
        model=OA, input="And then?", previous_response_id=first.id, max_output_tokens=16
    )
    body = native_sent(env)
    assert "previous_response_id" not in body
    assert [item.get("role") for item in body["input"]] == ["user", "assistant", "user"]
    assert all("id" not in item for item in body["input"])
    assert second.output_text == expect(responses_prompt(body), 0, 16).text
    third = sdk.responses.create(
        model=OA, input="Thanks", previous_response_id=second.id, max_output_tokens=16
    )
    # OpenAI answered the second turn, but does not hold the first: inline again.
    assert "previous_response_id" not in native_sent(env) and third.status == "incomplete"


def test_native_a_failure_mid_stream_is_the_upstreams_failed_response(sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model=OA, input="__midstream_error__", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    assert events[-1].response.error is not None


def test_native_parse_with_a_pydantic_model(env: Env, sdk: openai.OpenAI) -> None:
    resp = sdk.responses.parse(
        model=OA, input=QUESTION, text_format=Forecast, max_output_tokens=200
    )
    schema = native_sent(env)["text"]["format"]["schema"]
    assert resp.output_parsed == Forecast.model_validate(fake_value(schema))


@pytest.mark.parametrize("alias", [*TRANSLATED, OA])
def test_an_empty_conversation_is_a_400_naming_input(env: Env, alias: str) -> None:
    r = env.http.post("/v1/responses", json={"model": alias, "input": []}, headers=auth())
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert env.openai.requests() == env.fireworks.requests() == []
    r = env.http.post(
        "/v1/responses",
        json={"model": alias, "input": [], "instructions": "Say hi.", "store": False},
        headers=auth(),
    )
    assert r.status_code == 200, r.text

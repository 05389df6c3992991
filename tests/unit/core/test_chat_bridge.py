"""A Responses request as the chat it means, and a chat answer as the response (core.chat_bridge),
and a chat stream as the Responses events (core.chat_events)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from core.answers import ChatChunk, ChatCompletion, Usage
from core.chat_bridge import chat_request, echo, renamed, response_of
from core.chat_events import Synthesis, events
from core.completions import RequestLimits
from core.errors import InvalidRequest, UnsupportedParameter, UpstreamError
from core.responses import ResponsesRequest, validate_responses
from tests.upstreams.responses_render import OPENING, message_kinds

LABEL = "up/model"
USAGE: Usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def request(**fields: Any) -> ResponsesRequest:
    return validate_responses({"model": "m", "input": "hi", **fields}, RequestLimits())


def chat_of(**fields: Any) -> dict[str, Any]:
    return chat_request(request(**fields), LABEL, drop=False).chat.fields


# ---------------------------------------------------------------- the request


def test_a_string_input_and_instructions() -> None:
    assert chat_of(instructions="Be kind.", max_output_tokens=32, temperature=0.5) == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}],
        "max_completion_tokens": 32,
        "temperature": 0.5,
    }


def test_what_the_gateway_does_itself_is_not_sent() -> None:
    fields = chat_of(store=True, metadata={"a": "b"}, background=False, truncation="disabled")
    assert set(fields) == {"model", "messages"}


def test_items_become_messages_as_vllm_joins_them() -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "t", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Rain"},
        {"type": "function_call_output", "call_id": "c2", "output": "Noon"},
    ]
    tools: list[Any] = [{"type": "function", "name": n, "parameters": {}} for n in ("w", "t")]
    messages = chat_of(input=items, tools=tools)["messages"]
    call: Any = {"type": "function", "function": {"name": "w", "arguments": "{}"}, "id": "c1"}
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                call,
                {**call, "id": "c2", "function": {**call["function"], "name": "t"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "Noon"},
    ]


def test_a_function_call_without_an_assistant_message_before_it() -> None:
    items = [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
    ]
    tools = [{"type": "function", "name": "w", "parameters": {}}]
    (_, assistant) = chat_of(input=items, tools=tools)["messages"]
    assert assistant["content"] is None and assistant["tool_calls"][0]["id"] == "c1"


def test_tools_text_format_and_logprobs() -> None:
    tool = {"type": "function", "name": "w", "description": "d", "parameters": {}, "strict": True}
    schema = {"type": "object", "properties": {}}
    fields = chat_of(
        tools=[tool],
        tool_choice={"type": "function", "name": "w"},
        parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "f", "schema": schema, "strict": True}},
        include=["message.output_text.logprobs"],
        top_logprobs=3,
        reasoning={"effort": "low"},
    )
    assert fields["tools"] == [
        {
            "type": "function",
            "function": {"name": "w", "description": "d", "parameters": {}, "strict": True},
        }
    ]
    assert fields["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert fields["parallel_tool_calls"] is False
    assert fields["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "f", "schema": schema, "strict": True},
    }
    assert (fields["logprobs"], fields["top_logprobs"]) == (True, 3)
    assert fields["reasoning_effort"] == "low"


def test_allowed_tools_narrow_the_tools() -> None:
    tools: list[Any] = [{"type": "function", "name": n, "parameters": {}} for n in ("a", "b")]
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "b"}],
    }
    fields = chat_of(tools=tools, tool_choice=choice)
    assert [t["function"]["name"] for t in fields["tools"]] == ["b"]
    assert fields["tool_choice"] == "required"


def test_a_stream_asks_for_the_usage() -> None:
    fields = chat_of(stream=True)
    assert (fields["stream"], fields["stream_options"]) == (True, {"include_usage": True})


def test_truncation_auto_truncates_the_prompt() -> None:
    assert chat_of(truncation="auto")["context_length_exceeded_behavior"] == "truncate"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
    ],
)
def test_what_a_chat_cannot_serve_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        chat_of(**fields)
    assert info.value.param == param


def test_the_drop_policy_drops_and_says_so() -> None:
    req = request(reasoning={"summary": "auto", "effort": "low"}, max_tool_calls=2)
    made = chat_request(req, LABEL, drop=True)
    assert made.dropped == ("reasoning.summary", "max_tool_calls")
    assert made.chat.fields["reasoning_effort"] == "low"


def test_a_chat_fields_refusal_names_the_responses_field() -> None:
    err = renamed(UnsupportedParameter("Parameter 'verbosity' is not served.", param="verbosity"))
    assert (err.param, err.message) == (
        "text.verbosity",
        "Parameter 'text.verbosity' is not served.",
    )
    err = renamed(InvalidRequest("bad 'messages[3].content'", param="messages[3].content"))
    assert err.param == "input"
    assert renamed(InvalidRequest("x", param="seed")).param == "seed"


# ---------------------------------------------------------------- the answer


def chat_answer(message: dict[str, Any], finish: str = "stop") -> ChatCompletion:
    choice: Any = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    return {"choices": [choice], "usage": USAGE}


def test_a_text_answer() -> None:
    message = {"role": "assistant", "content": "Hello", "refusal": None}
    out = response_of(chat_answer(message), request())
    (item,) = out["output"]
    assert item["id"].startswith("msg_") and item["status"] == "completed"
    assert item["content"] == [
        {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    ]
    assert (out["status"], out["incomplete_details"], out["usage"]) == ("completed", None, USAGE)


def test_a_cut_answer_is_incomplete() -> None:
    message = {"role": "assistant", "content": "Hel", "refusal": None}
    out = response_of(chat_answer(message, "length"), request())
    assert (out["status"], out["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )


def test_tool_calls_are_function_call_items() -> None:
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"a":1}'}}
    ]
    message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}
    (item,) = response_of(chat_answer(message, "tool_calls"), request())["output"]
    assert item["id"].startswith("fc_")
    assert {k: item[k] for k in ("type", "call_id", "name", "arguments", "status")} == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "w",
        "arguments": '{"a":1}',
        "status": "completed",
    }


def test_the_echo_has_openais_defaults() -> None:
    made = echo(request())
    assert (made["temperature"], made["top_p"], made["tool_choice"], made["tools"]) == (
        1.0,
        1.0,
        "auto",
        [],
    )
    assert made["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert (made["store"], made["truncation"], made["parallel_tool_calls"]) == (
        True,
        "disabled",
        True,
    )


# ---------------------------------------------------------------- the stream


def delta(content: str | None = None, finish: str | None = None, **more: Any) -> ChatChunk:
    d: Any = {k: v for k, v in {"content": content, **more}.items() if v is not None}
    return {"choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]}


async def _batches(
    *batches: list[ChatChunk], fail: Exception | None = None
) -> AsyncIterator[list[ChatChunk]]:
    for batch in batches:
        yield batch
    if fail is not None:
        raise fail


async def test_text_then_a_tool_call_streamed() -> None:
    call0: Any = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "w", "arguments": ""},
    }
    args: Any = {"index": 0, "function": {"arguments": '{"a":1}'}}
    chat = _batches(
        [delta(role="assistant"), delta("Hel"), delta("lo")],
        [delta(tool_calls=[call0]), delta(tool_calls=[args], finish="tool_calls")],
        [{"choices": [], "usage": USAGE}],
    )
    out = [e for batch in [b async for b in events(chat, request(stream=True))] for e in batch]
    kinds = [e["type"] for e in out]
    assert kinds == [
        *OPENING,
        *message_kinds(2),
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    last = out[-1]["response"]
    assert last["usage"] == USAGE and last["status"] == "completed"
    message, call = last["output"]
    assert message["content"][0]["text"] == "Hello" and message["id"] == out[2]["item"]["id"]
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_1", "w", '{"a":1}')
    assert [e["output_index"] for e in out[2:-1]] == [0] * 7 + [1] * 4


async def test_the_first_events_wait_for_the_chats_first_batch() -> None:
    """Until the chat's first batch comes, a failure is the attempt's (a retry, a fallback)."""

    async def failing() -> AsyncIterator[list[ChatChunk]]:
        raise UpstreamError("down")
        yield []

    stream = events(failing(), request(stream=True))
    with pytest.raises(UpstreamError):
        await stream.__anext__()


async def test_a_failure_after_the_first_event_is_a_failed_response_then_the_error() -> None:
    chat = _batches([delta("Hel")], fail=UpstreamError("cut", code="upstream_error"))
    got: list[Any] = []
    with pytest.raises(UpstreamError):
        async for batch in events(chat, request(stream=True)):
            got += batch
    last = got[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["error"] == {"code": "upstream_error", "message": "cut"}
    assert last["response"]["output"][0]["content"][0]["text"] == "Hel"


def test_a_cut_stream_is_incomplete() -> None:
    made = Synthesis(request(stream=True))
    made.chunks([delta("x", finish="length")])
    (*_, last) = made.end()
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_message_cut_short_is_incomplete_whole_and_streamed() -> None:
    message = {"role": "assistant", "content": "Hel", "refusal": None}
    (item,) = response_of(chat_answer(message, "length"), request())["output"]
    assert item["status"] == "incomplete"
    made = Synthesis(request(stream=True))
    made.chunks([delta("Hel", finish="length")])
    *_, done, last = made.end()
    assert done["type"] == "response.output_item.done" and done["item"]["status"] == "incomplete"
    assert last["response"]["output"][0]["status"] == "incomplete"

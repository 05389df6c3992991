"""The Responses request: the fields' types and ranges, what the openai SDK sends (create, parse,
an Agents-SDK style conversation of function calls), the rules between fields, the features the
gateway refuses, its bounds, defaults and overrides; each bad input a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)
from pydantic import BaseModel

from core.completions import RequestLimits
from core.errors import InvalidRequest
from core.fields import EXTENSION, OPENAI, VLLM
from core.responses import (
    OPENAI_FIELDS,
    RESPONSES,
    ResponsesRequest,
    apply_responses_defaults,
    apply_responses_overrides,
    hosted_tool_choice,
    hosted_tools,
    parse_responses,
    validate_responses,
)
from tests.unit.refusals import refused

LIMITS = RequestLimits()
BASE: dict[str, Any] = {"model": "m", "input": "hi"}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
USER = {"role": "user", "content": "hi"}


def parse(**fields: Any) -> ResponsesRequest:
    return validate_responses({**BASE, **fields}, LIMITS)


# ---------------------------------------------------------------- what the openai SDK sends


class Weather(BaseModel):
    city: str
    temp_c: float


Call = Callable[[openai.OpenAI], object]


def create(**params: Any) -> Call:
    """`client.responses.create(**params)`, for `sent`."""
    return lambda client: client.responses.create(**params)


def sdk_parse(**params: Any) -> Call:
    """`client.responses.parse(**params)`, for `sent`."""
    return lambda client: client.responses.parse(**params)


def sent(call: Call) -> dict[str, Any]:
    """The JSON body the openai SDK sends for `call` (answered with a 400, never retried)."""
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        bodies.append(json.loads(request.content))
        return httpx2.Response(400, json={"error": {"message": "seen", "type": "x"}})

    client = openai.OpenAI(
        api_key="k",
        base_url="http://gateway.test/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
    )
    with pytest.raises(openai.BadRequestError):
        call(client)
    return bodies[0]


# The items a model's answer holds, as OpenAI returns them (and vLLM: reasoning as content),
# sent back as the SDK's objects (`input += response.output`).
OUTPUT = [
    ResponseReasoningItem.model_validate(
        {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "Looked it up."}],
            "content": [{"type": "reasoning_text", "text": "The user wants the weather."}],
            "encrypted_content": None,
            "status": None,
        }
    ),
    ResponseFunctionToolCall.model_validate(
        {
            "id": "fc_1",
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        }
    ),
]
ANSWER = ResponseOutputMessage.model_validate(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Sunny, 21°C.", "annotations": []}],
    }
)
SDK_CALLS: dict[str, Call] = {
    "a string": create(model="m", input="hi", instructions="be brief"),
    "messages": create(
        model="m",
        input=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "?"}]},
        ],
        max_output_tokens=64,
        temperature=0.2,
        top_p=0.9,
        store=False,
        metadata={"team": "a"},
    ),
    "an image and a file": create(
        model="m",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what are these?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    {"type": "input_image", "file_id": "file-1", "detail": "low"},
                    {"type": "input_file", "file_id": "file-2"},
                    {"type": "input_file", "file_data": "data:...", "filename": "a.pdf"},
                    {"type": "input_file", "file_url": "https://example.com/a.pdf"},
                ],
            }
        ],
    ),
    "a stream": create(
        model="m",
        input="hi",
        stream=True,
        stream_options={"include_obfuscation": False},
        include=["message.output_text.logprobs"],
        top_logprobs=3,
    ),
    "tools": create(
        model="m",
        input="weather?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_tool_calls=2,
    ),
    "allowed tools": create(
        model="m",
        input="weather?",
        tools=[TOOL, {"type": "web_search"}],
        tool_choice={
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "function", "name": "get_weather"}],
        },
    ),
    "function calls sent back": create(
        model="m",
        input=[
            {"role": "user", "content": "weather in Paris?"},
            *OUTPUT,
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21"},
            ANSWER,
            {"role": "user", "content": "and tomorrow?"},
        ],
        tools=[TOOL],
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        store=False,
    ),
    "responses.parse": sdk_parse(model="m", input="w?", text_format=Weather),
    "responses.parse with a pydantic tool": sdk_parse(
        model="m", input="w?", tools=[openai.pydantic_function_tool(Weather)]
    ),
    "json mode": create(
        model="m", input="json", text={"format": {"type": "json_object"}, "verbosity": "low"}
    ),
    "a follow-up": create(
        model="m", input="and then?", previous_response_id="resp_1", truncation="auto"
    ),
    "OpenAI's other fields": create(
        model="m",
        input="hi",
        user="u",
        safety_identifier="s",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        service_tier="flex",
        background=False,
        reasoning={"effort": "none"},
    ),
    "vLLM's extras": create(
        model="m",
        input="hi",
        extra_body={
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "seed": 7,
            "stop": ["\n\n"],
            "frequency_penalty": 0.5,
            "presence_penalty": -0.5,
            "logit_bias": {"50256": -100},
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "stop_token_ids": [2],
            "structured_outputs": {"regex": "[a-z]+"},
            "vllm_xargs": {"x": 1},
            "priority": -1,
            "cache_salt": "salt",
            "ignore_eos": False,
        },
    ),
}


@pytest.mark.parametrize("call", SDK_CALLS.values(), ids=SDK_CALLS.keys())
def test_what_the_openai_sdk_sends_is_valid(call: Call) -> None:
    body = sent(call)
    req = validate_responses(body, LIMITS)
    assert req.fields == body and req.unknown == ()
    assert all(
        item["type"] in ("message", "function_call", "function_call_output", "reasoning")
        for item in req.input
    )


def test_responses_parse_sends_a_strict_json_schema_format() -> None:
    body = sent(SDK_CALLS["responses.parse"])
    req = validate_responses(body, LIMITS)
    spec = req.fields["text"]["format"]
    assert (spec["type"], spec["name"], spec["strict"]) == ("json_schema", "Weather", True)
    assert spec["schema"]["required"] == ["city", "temp_c"]


def test_a_conversation_sent_back_keeps_its_items_as_sent() -> None:
    body = sent(SDK_CALLS["function calls sent back"])
    req = validate_responses(body, LIMITS)
    assert [i["type"] for i in req.input] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    # Only the messages that had no type changed, and only by it.
    assert req.input[0] == {"type": "message", **body["input"][0]}
    assert req.input[1:5] == body["input"][1:5]
    assert "type" not in body["input"][0] and req.fields["input"] is body["input"]


# ---------------------------------------------------------------- accepted shapes


def items(*each: dict[str, Any]) -> dict[str, Any]:
    """A body's `input` of these items."""
    return {"input": list(each)}


def said(role: str, *parts: dict[str, Any], **keys: Any) -> dict[str, Any]:
    """A message of these content parts."""
    return {"role": role, "content": list(parts), **keys}


def fmt(**spec: Any) -> dict[str, Any]:
    """A body's `text.format`."""
    return {"text": {"format": spec}}


def choose(tool_choice: Any, *tools: dict[str, Any]) -> dict[str, Any]:
    return {"tools": list(tools), "tool_choice": tool_choice}


def output(value: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": "c", "output": value}


def reasoning(**keys: Any) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [], **keys}


CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
TEXT = {"type": "input_text", "text": "x"}
IMAGE = {"type": "input_image", "image_url": "https://example.com/c.png"}
ANSWERED = {"type": "output_text", "text": "x"}
MCP = {"type": "mcp", "server_label": "d"}
ALLOWED = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "x"}]}

GOOD: list[dict[str, Any]] = [
    {},
    items(),  # OpenAI's types take an empty list (a turn with previous_response_id)
    items({"type": "message", "role": "system", "content": "x"}),
    items({"role": "assistant", "content": "earlier answer"}, USER),
    items(said("assistant", {"type": "refusal", "refusal": "no"})),
    items(said("assistant", {**ANSWERED, "annotations": None}, phase="final_answer")),
    items({"type": "item_reference", "id": "msg_1"}, {"id": "rs_1"}, USER),
    items(reasoning()),  # vLLM makes up the id
    items(reasoning(encrypted_content="gAAA", status=None)),
    items(CALL, output([TEXT, IMAGE])),
    items(output(""), output([])),
    items(said("user", {"type": "input_image", "file_id": "f", "detail": "original"})),
    items(said("user", {"type": "input_file", "file_url": "https://example.com/a.pdf"})),
    {"tools": [{"type": "function", "name": "f"}]},  # parameters and strict may be left out
    {"tools": [{"type": "web_search"}, MCP, TOOL]},
    {"tools": [{"type": "a_tool_of_tomorrow"}]},  # a hosted tool: the target decides
    choose("required", TOOL),
    choose({"type": "file_search"}, {"type": "file_search"}),
    choose(MCP, MCP),
    {"tool_choice": "auto"},  # OpenAI's Responses takes auto and none without tools
    {"tool_choice": "none"},
    choose("none"),
    {"parallel_tool_calls": True},  # without tools too
    fmt(type="text"),
    {"text": {"verbosity": "high"}},
    fmt(type="json_schema", name="a-b_1", schema={}, description="d", strict=None),
    {"reasoning": {"effort": "xhigh", "generate_summary": "concise"}},
    {"reasoning": {"effort": "max", "context": "all_turns"}},  # unknown keys kept
    {"top_logprobs": 20},  # without include: OpenAI takes it
    {"include": []},
    {"include": ["web_search_call.action.sources", "message.input_image.image_url"]},
    {"max_output_tokens": 16, "max_tool_calls": 1},
    {"max_output_tokens": LIMITS.max_tokens},
    {"background": False, "store": True},
    {"service_tier": "priority", "truncation": "disabled"},
    {"stream": True, "stream_options": {}},
    {"conversation": None, "prompt": None, "instructions": None},  # null: left out
    {"seed": 2**70},  # each target checks a seed's range, in its own words
    {"mirostat_target": 5.0, "mirostat_lr": 0.1, "context_length_exceeded_behavior": "truncate"},
]


@pytest.mark.parametrize("fields", GOOD, ids=[str(g)[:60] for g in GOOD])
def test_valid_requests(fields: dict[str, Any]) -> None:
    kept = {k: v for k, v in fields.items() if v is not None}
    assert parse(**fields).fields.items() >= kept.items()


# ---------------------------------------------------------------- refusals

# (field overrides, param named in the 400)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"model": 3}, "model"),
    ({"input": 3}, "input"),
    ({"input": USER}, "input"),
    (items(3), "input[0]"),  # type: ignore[arg-type]
    (items("hi"), "input[0]"),  # type: ignore[arg-type]
    (items({"content": "x"}), "input[0].role"),
    (items({}), "input[0].role"),
    (items({"role": "tool", "content": "x"}), "input[0].role"),
    (items({"role": "user"}), "input[0].content"),
    (items(said("user")), "input[0].content"),  # an empty list
    (items({"role": "user", "content": 3}), "input[0].content"),
    (items(USER, said("user", 3)), "input[1].content[0]"),  # type: ignore[arg-type]
    (items(USER, said("user", {})), "input[1].content[0].type"),
    (items(USER, said("user", {"type": "text", "text": "x"})), "input[1].content[0].type"),
    (items(said("user", {"type": "input_text"})), "input[0].content[0].text"),
    (items(said("user", {"type": "input_text", "text": 1})), "input[0].content[0].text"),
    (items(said("user", {"type": "input_image"})), "input[0].content[0]"),
    (items(said("user", {**IMAGE, "detail": "max"})), "input[0].content[0].detail"),
    (items(said("user", {**IMAGE, "image_url": 1})), "input[0].content[0].image_url"),
    (items(said("user", {"type": "input_file", "filename": "a"})), "input[0].content[0]"),
    (items(said("user", {"type": "input_file", "file_id": 3})), "input[0].content[0].file_id"),
    (items(said("user", ANSWERED)), "input[0].content[0].type"),
    (items(said("system", IMAGE, ANSWERED)), "input[0].content[1].type"),
    (items(said("assistant", TEXT)), "input[0].content[0].type"),
    (items(said("assistant", {"type": "output_text"})), "input[0].content[0].text"),
    (
        items(said("assistant", {**ANSWERED, "annotations": {}})),
        "input[0].content[0].annotations",
    ),
    (items(said("assistant", {"type": "refusal"})), "input[0].content[0].refusal"),
    (items({**USER, "status": "done"}), "input[0].status"),
    (items({**USER, "id": 1}), "input[0].id"),
    (items({**USER, "type": "message", "phase": "x"}), "input[0].phase"),
    (items({**CALL, "call_id": None}), "input[0].call_id"),
    (items({**CALL, "name": None}), "input[0].name"),
    (items({k: v for k, v in CALL.items() if k != "arguments"}), "input[0].arguments"),
    (items({**CALL, "arguments": {}}), "input[0].arguments"),
    (items({**CALL, "status": "failed"}), "input[0].status"),
    (items({**output("x"), "call_id": 3}), "input[0].call_id"),
    (items(output(None)), "input[0].output"),
    (items(output(3)), "input[0].output"),
    (items(output([{"type": "refusal", "refusal": "x"}])), "input[0].output[0].type"),
    (items(output([3])), "input[0].output[0]"),
    (items({"type": "reasoning", "id": "rs"}), "input[0].summary"),
    (items(reasoning(summary=[{"type": "summary_text"}])), "input[0].summary[0].text"),
    (
        items(reasoning(summary=[{"type": "reasoning_text", "text": "x"}])),
        "input[0].summary[0].type",
    ),
    (items(reasoning(content=[{"type": "summary_text", "text": "x"}])), "input[0].content[0].type"),
    (items(reasoning(encrypted_content=1)), "input[0].encrypted_content"),
    (items({"type": "item_reference"}), "input[0].id"),
    (items(USER, {"type": "note", "text": "x"}), "input[1].type"),
    (items(USER, {"type": 3}), "input[1].type"),
    (items(USER, {"type": ["message"]}), "input[1].type"),
    ({"instructions": 3}, "instructions"),
    ({"max_output_tokens": 15}, "max_output_tokens"),  # OpenAI's floor
    ({"max_output_tokens": "16"}, "max_output_tokens"),
    ({"max_output_tokens": LIMITS.max_tokens + 1}, "max_output_tokens"),  # the gateway's bound
    ({"max_tool_calls": 0}, "max_tool_calls"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": -0.1}, "top_p"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": -1}, "top_logprobs"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_obfuscation": True}}, "stream_options"),  # needs stream
    (
        {"stream": True, "stream_options": {"include_obfuscation": 1}},
        "stream_options.include_obfuscation",
    ),
    ({"store": 1}, "store"),
    ({"previous_response_id": 3}, "previous_response_id"),
    ({"background": "no"}, "background"),
    ({"include": "reasoning.encrypted_content"}, "include"),
    ({"include": ["message.output_text.logprobs", "usage"]}, "include[1]"),
    ({"metadata": {"k": 3}}, "metadata.k"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"user": 3}, "user"),
    ({"safety_identifier": 3}, "safety_identifier"),
    ({"prompt_cache_key": 3}, "prompt_cache_key"),
    ({"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
    ({"service_tier": "cheap"}, "service_tier"),
    ({"truncation": "left"}, "truncation"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tools": {}}, "tools"),
    ({"tools": [3]}, "tools[0]"),
    ({"tools": [{"name": "f"}]}, "tools[0].type"),
    ({"tools": [TOOL, {"type": 3}]}, "tools[1].type"),
    ({"tools": [{"type": ""}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "no spaces"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "x" * 65}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": 3}]}, "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict"),
    ({"tools": [{"type": "function", "name": "f", "description": 1}]}, "tools[0].description"),
    (choose("any", TOOL), "tool_choice"),
    (choose(3, TOOL), "tool_choice"),
    (choose({}, TOOL), "tool_choice.type"),
    (choose({"type": 1}, TOOL), "tool_choice.type"),
    (choose({"type": "function"}, TOOL), "tool_choice.name"),
    (choose({"type": "function", "name": "other"}, TOOL), "tool_choice.name"),
    (choose({**ALLOWED, "mode": "any"}, TOOL), "tool_choice.mode"),
    (choose({**ALLOWED, "tools": None}, TOOL), "tool_choice.tools"),
    (choose({**ALLOWED, "tools": [{"type": "function"}]}, TOOL), "tool_choice.tools[0].name"),
    (choose(ALLOWED, {"type": "function", "name": "y"}), "tool_choice.tools[0].name"),
    (choose({"type": "mcp"}, TOOL), "tool_choice.server_label"),
    (choose({"type": "custom"}, TOOL), "tool_choice.name"),
    ({"tool_choice": "required"}, "tool_choice"),  # forces a tool: needs tools
    (choose("required"), "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "f"}}, "tool_choice"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"text": "json"}, "text"),
    ({"text": {"format": "json"}}, "text.format"),
    (fmt(), "text.format.type"),
    (fmt(type="xml"), "text.format.type"),
    (fmt(type="json_schema", schema={}), "text.format.name"),
    (fmt(type="json_schema", name="a b", schema={}), "text.format.name"),
    (fmt(type="json_schema", name="a"), "text.format.schema"),
    (fmt(type="json_schema", name="a", schema=[]), "text.format.schema"),
    (fmt(type="json_schema", name="a", schema={}, strict=1), "text.format.strict"),
    (fmt(type="json_schema", name="a", schema={}, description=1), "text.format.description"),
    ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "short"}}, "reasoning.summary"),
    ({"reasoning": {"generate_summary": True}}, "reasoning.generate_summary"),
    ({"reasoning": "high"}, "reasoning"),
    ({"conversation": 3}, "conversation"),
    ({"conversation": {}}, "conversation.id"),
    ({"prompt": "p"}, "prompt"),
    ({"prompt": {"version": "1"}}, "prompt.id"),
    ({"prompt": {"id": "p", "variables": []}}, "prompt.variables"),
    ({"mirostat_lr": 0.1}, "mirostat_lr"),
    ({"context_length_exceeded_behavior": "drop"}, "context_length_exceeded_behavior"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"ignore_eos": "no"}, "ignore_eos"),
    ({"seed": 1.5}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"logit_bias": {"a": 1}}, "logit_bias.a"),
    ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"vllm_xargs": {"k": {}}}, "vllm_xargs.k"),
    ({"priority": 0.5}, "priority"),
    ({"cache_salt": 3}, "cache_salt"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[str(b[0])[:70] for b in BAD])
def test_bad_input_names_the_parameter(fields: dict[str, Any], param: str) -> None:
    refused(param, parse, **fields)


@pytest.mark.parametrize("missing", ["model", "input"])
def test_required_fields(missing: str) -> None:
    for data in ({k: v for k, v in BASE.items() if k != missing}, {**BASE, missing: None}):
        with pytest.raises(InvalidRequest) as info:
            validate_responses(data, LIMITS)
        assert info.value.param == missing
        assert info.value.message == f"Missing required parameter: '{missing}'."


def test_missing_keys_of_an_item_are_named_in_openai_words() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(input=[USER, {"type": "function_call", "call_id": "c", "name": "f"}])
    assert info.value.message == "Missing required parameter: 'input[1].arguments'."


def test_wording_of_a_bad_value() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(input=[{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}])
    assert info.value.message == (
        "Invalid value for 'input[0].content[0].type': expected one of 'output_text', "
        "'refusal', got \"input_text\"."
    )


# ---------------------------------------------------------------- what the gateway refuses


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"background": True}, "background", "'background' is not supported by this gateway"),
        ({"conversation": "conv_1"}, "conversation", "'conversation' is not supported"),
        ({"conversation": {"id": "conv_1"}}, "conversation", "'conversation' is not supported"),
        ({"prompt": {"id": "pmpt_1", "version": "2"}}, "prompt", "'prompt' is not supported"),
        (
            {"conversation": "conv_1", "previous_response_id": "resp_1"},
            "previous_response_id",
            "Mutually exclusive parameters: Ensure you are only providing one of: "
            "'previous_response_id' or 'conversation'.",
        ),
        (
            {"stream_options": {"include_obfuscation": False}, "stream": False},
            "stream_options",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ),
    ],
)
def test_features_the_gateway_does_not_implement(
    fields: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(**fields)
    assert info.value.param == param
    assert says in info.value.message


def test_the_gateways_bound_on_output_tokens() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_responses({**BASE, "max_output_tokens": 100}, RequestLimits(max_tokens=99))
    assert info.value.message == "'max_output_tokens' is 100; this gateway allows at most 99."


# ---------------------------------------------------------------- the request the gateway builds


def test_the_request_the_gateway_builds() -> None:
    body = b'{"model": "m", "input": "hi", "instructions": "be brief", "stream": true,'
    body += b' "max_output_tokens": 99, "previous_response_id": "resp_1", "store": false,'
    body += b' "x": 1, "temperature": null}'
    req = parse_responses(body, LIMITS)
    assert req.input == [{"type": "message", "role": "user", "content": "hi"}]
    assert (req.model, req.instructions, req.stream, req.store) == ("m", "be brief", True, False)
    assert (req.max_output_tokens, req.previous_response_id) == (99, "resp_1")
    assert req.unknown == ("x",) and req.fields["x"] == 1 and "temperature" not in req.fields
    assert req.fields["input"] == "hi" and req.history == []
    plain = parse()
    assert (plain.max_output_tokens, plain.stream, plain.store) == (None, False, True)
    assert plain.instructions is None and plain.previous_response_id is None


def test_items_get_their_type_and_the_callers_list_is_left_alone() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "a"},
        {"type": None, "role": "user", "content": "b"},
        {"type": "message", "role": "user", "content": "c"},
        {"id": "msg_0"},  # an item reference sent as its id alone
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    before = json.loads(json.dumps(items))
    req = parse(input=items)
    assert items == before and req.fields["input"] is items
    assert [i["type"] for i in req.input] == [
        "message",
        "message",
        "message",
        "item_reference",
        "function_call_output",
    ]
    assert req.input[0] == {"role": "user", "content": "a", "type": "message"}
    assert req.input[3] == {"id": "msg_0", "type": "item_reference"}
    assert req.input[2] is items[2] and req.input[4] is items[4]


def test_hosted_tools_in_order() -> None:
    req = parse(
        tools=[TOOL, {"type": "web_search"}, {"type": "mcp", "server_label": "d"}],
        tool_choice={"type": "web_search"},
    )
    assert hosted_tools(req.fields) == [("tools[1]", "web_search"), ("tools[2]", "mcp")]
    assert hosted_tool_choice(req.fields) == ("tool_choice", "web_search")
    assert hosted_tools(parse(tools=[TOOL]).fields) == []
    assert hosted_tools(parse().fields) == []
    named = parse(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})
    assert hosted_tool_choice(named.fields) is None


# ---------------------------------------------------------------- defaults and overrides


def test_defaults_fill_what_the_caller_left_out() -> None:
    defaults = {
        "max_tokens": 256,  # as max_output_tokens
        "temperature": 0.1,
        "top_k": 40,
        "stop": ["\n"],
        "seed": 3,
        "n": 2,  # no Responses field
        "logprobs": 5,
        "best_of": 2,
        "top_p": 7,  # not a valid value
        "model": "other",  # required: never a default
    }
    req = apply_responses_defaults(parse(temperature=0.5), defaults)
    assert req.max_output_tokens == 256 and req.fields["max_output_tokens"] == 256
    assert req.fields["temperature"] == 0.5  # the caller's
    assert (req.fields["top_k"], req.fields["stop"], req.fields["seed"]) == (40, ["\n"], 3)
    assert not {"n", "logprobs", "best_of", "top_p", "max_tokens"} & req.fields.keys()
    assert req.model == "m"


def test_defaults_never_override_the_callers_fields() -> None:
    req = parse(max_output_tokens=32)
    assert apply_responses_defaults(req, {"max_tokens": 256}).max_output_tokens == 32
    assert apply_responses_defaults(req, {"max_tokens": 8}) is req  # below OpenAI's floor
    assert apply_responses_defaults(req, {}) is req


def test_overrides_win_are_checked_whole_and_keep_the_history() -> None:
    req = parse(temperature=0.5)
    req.history = [{"type": "message", "role": "user", "content": "before"}]
    again = apply_responses_overrides(req, {"temperature": 0.2, "max_output_tokens": 20}, LIMITS)
    assert again.fields["temperature"] == 0.2 and again.max_output_tokens == 20
    assert again.history is req.history
    with pytest.raises(InvalidRequest) as info:
        apply_responses_overrides(req, {"temperature": 3}, LIMITS)
    assert info.value.param == "temperature"


# ---------------------------------------------------------------- the declaration


def test_declaration_families() -> None:
    by_name = RESPONSES.by_name
    for name in ("seed", "stop", "logit_bias", "frequency_penalty", "presence_penalty"):
        assert by_name[name].family is VLLM, name  # not OpenAI's Responses fields
    assert by_name["seed"].ranged_by_target
    for name in ("top_k", "min_p", "repetition_penalty", "ignore_eos", "mirostat_target"):
        assert by_name[name].family is EXTENSION, name
    for name in ("skip_special_tokens", "stop_token_ids", "structured_outputs", "cache_salt"):
        assert by_name[name].family is VLLM, name
    assert {"model", "input", "tools", "text", "reasoning", "include"} <= set(OPENAI_FIELDS)
    assert by_name["max_output_tokens"].lo == 16 and by_name["top_logprobs"].hi == 20
    assert by_name["temperature"].family is OPENAI
    assert RESPONSES.sub_fields() == (
        "stream_options.include_obfuscation",
        "text.format",
        "text.verbosity",
        "reasoning.effort",
        "reasoning.summary",
        "reasoning.generate_summary",
    )

"""The chat request: every message role's shape, tools and tool_choice, the fields' types and
ranges, the rules between fields, each bad input a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from core.chat import CHAT, VLLM_FIELDS, apply_chat_defaults, parse_chat, validate_chat
from core.completions import RequestLimits
from core.errors import InvalidRequest
from tests.unit.refusals import refused

LIMITS = RequestLimits()
USER = {"role": "user", "content": "hi"}
BASE: dict[str, Any] = {"model": "m", "messages": [USER]}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def parse(**fields: Any) -> Any:
    return validate_chat({**BASE, **fields}, LIMITS)


GOOD: list[dict[str, Any]] = [
    {},
    {"messages": [{"role": "developer", "content": "be brief"}, USER]},
    {"messages": [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}, USER]},
    {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ]
    },
    {
        "messages": [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [TOOL],
    },
    {"messages": [USER, {"role": "assistant", "refusal": "no"}]},
    {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"logprobs": True, "top_logprobs": 20},
    {"max_completion_tokens": 5, "max_tokens": 7},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"stream": True, "stream_options": {"include_usage": True}},
    {"metadata": {"team": "a"}, "store": False, "user": "u", "seed": 3},
    {"chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": True},
    {"documents": [{"title": "t", "text": "x"}], "top_k": 5, "min_p": 0.1},
    # Roles of a chat template's own (vLLM serves them; OpenAI's tables refuse them).
    {"messages": [{"role": "ipython", "content": "42"}, {"role": "observation", "content": ""}]},
    {"messages": [USER, {"role": "ipython", "content": [{"type": "text", "text": "4"}]}]},
    {"messages": [{"role": "observation", "name": "tool", "tool_call_id": "c1"}]},
    {"seed": -(2**63) - 1},  # each target checks a seed's range, in its own words
    {"seed": 2**70},
]


@pytest.mark.parametrize("fields", GOOD, ids=[str(g)[:60] for g in GOOD])
def test_valid_requests(fields: dict[str, Any]) -> None:
    assert parse(**fields).fields.items() >= fields.items()


# (field overrides, param named in the 400)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [3]}, "messages[0]"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": 7, "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "ipython", "content": 3}]}, "messages[0].content"),
    (
        {"messages": [{"role": "ipython", "content": [{"type": "x"}]}]},
        "messages[0].content[0].type",
    ),
    ({"messages": [{"role": "ipython", "content": "x", "name": 1}]}, "messages[0].name"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "messages[0].content[0].type",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages[0].content[0].text",
    ),
    (
        {"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].type",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].image_url.url",
    ),
    ({"messages": [USER, {"role": "assistant"}]}, "messages[1].content"),
    (
        {"messages": [USER, {"role": "assistant", "tool_calls": [{**CALL, "id": 3}]}]},
        "messages[1].tool_calls[0].id",
    ),
    (
        {
            "messages": [
                USER,
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]},
            ]
        },
        "messages[1].tool_calls[0].function",
    ),
    ({"messages": [USER, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "name": 3}]}, "messages[0].name"),
    ({"model": 3}, "model"),
    ({"tools": {}}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools[0].type"),
    (
        {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
        "tools[0].function.name",
    ),
    (
        {"tools": [{**TOOL, "function": {"name": "f", "parameters": 3}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": [TOOL], "tool_choice": "any"}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),  # without tools
    (
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {}}},
        "tool_choice.function.name",
    ),
    (
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
        "tool_choice.function.name",
    ),
    ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"max_completion_tokens": 10**6}, "max_completion_tokens"),
    ({"n": 0}, "n"),
    ({"temperature": 2.5}, "temperature"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": 1}}},
        "response_format.json_schema.strict",
    ),
    ({"metadata": {"k": 3}}, "metadata.k"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"mirostat_lr": 0.1}, "mirostat_lr"),
    ({"context_length_exceeded_behavior": "drop"}, "context_length_exceeded_behavior"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"documents": [{"text": 3}]}, "documents[0].text"),
    ({"add_generation_prompt": "yes"}, "add_generation_prompt"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[str(b[0])[:60] for b in BAD])
def test_bad_input_names_the_parameter(fields: dict[str, Any], param: str) -> None:
    refused(param, parse, **fields)


@pytest.mark.parametrize("missing", ["model", "messages"])
def test_required_fields(missing: str) -> None:
    data = dict(BASE)
    del data[missing]
    with pytest.raises(InvalidRequest) as info:
        validate_chat(data, LIMITS)
    assert info.value.param == missing
    assert info.value.message == f"Missing required parameter: '{missing}'."


def test_the_request_the_gateway_builds() -> None:
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": true,'
    )
    body += b' "stream_options": {"include_usage": true}, "max_completion_tokens": 9, "x": 1}'
    req = parse_chat(body, LIMITS)
    assert (req.model, req.n, req.stream, req.include_usage) == ("m", 2, True, True)
    assert req.max_tokens == 9 and req.unknown == ("x",) and req.fields["x"] == 1
    assert parse().max_tokens is None  # what the window leaves
    assert parse(max_tokens=4).max_tokens == 4


def test_defaults_fill_what_the_caller_left_out() -> None:
    req = apply_chat_defaults(parse(temperature=0.5), {"temperature": 0.1, "max_tokens": 8})
    assert req.fields["temperature"] == 0.5 and req.max_tokens == 8


def test_declaration_families() -> None:
    assert {"chat_template", "add_generation_prompt", "echo", "structured_outputs"} <= set(
        VLLM_FIELDS
    )
    assert CHAT.by_name["top_logprobs"].hi == 20
    assert CHAT.sub_fields() == (
        "stream_options.include_usage",
        "stream_options.include_obfuscation",
        "stream_options.continuous_usage_stats",
    )


@pytest.mark.parametrize("role", [["user"], {"r": 1}, 3, None])
def test_a_role_of_another_type_is_a_400_naming_it(role: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        validate_chat({"model": "m", "messages": [{"role": role, "content": "x"}]}, LIMITS)
    assert exc.value.param == "messages[0].role"

"""The Responses input items and tools: every item type OpenAI has is served or refused by name,
the values OpenAI's SDK declares are the ones taken, and the helpers over validated items."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin, get_type_hints

import pytest
from openai.types.responses.response_includable import ResponseIncludable
from openai.types.responses.response_input_item_param import ResponseInputItemParam
from openai.types.responses.service_tier import ServiceTier
from openai.types.shared_params.reasoning_effort import ReasoningEffort

from core import response_items as ri
from core.completions import RequestLimits
from core.errors import InvalidRequest
from core.responses import EFFORTS, RESPONSES, SERVICE_TIERS, validate_responses

LIMITS = RequestLimits()


def literals(hint: Any) -> set[str]:
    """The string literals a type hint allows, through Required, Optional and unions."""
    if get_origin(hint) is Literal:
        return set(get_args(hint))
    return {value for arg in get_args(hint) for value in literals(arg)}


def sdk_item_types() -> set[str]:
    return {
        kind
        for item in get_args(ResponseInputItemParam)
        for kind in literals(get_type_hints(item, include_extras=True)["type"])
    }


def test_every_item_type_of_the_sdk_is_served_or_refused_by_name() -> None:
    served = set(ri.ITEMS)
    assert sdk_item_types() == served | ri.UNSERVED_ITEMS
    assert not served & ri.UNSERVED_ITEMS


@pytest.mark.parametrize("kind", sorted(ri.UNSERVED_ITEMS))
def test_items_of_hosted_tools_are_refused_naming_their_type(kind: str) -> None:
    body = {"model": "m", "input": [{"role": "user", "content": "hi"}, {"type": kind, "id": "x"}]}
    with pytest.raises(InvalidRequest) as info:
        validate_responses(body, LIMITS)
    assert info.value.param == "input[1].type"
    assert info.value.message == (
        f"Input items of type '{kind}' are not supported by this gateway: it serves function "
        "tools only."
    )


def test_the_values_openai_declares() -> None:
    assert set(ri.INCLUDABLE) == literals(ResponseIncludable)
    assert set(EFFORTS) == literals(ReasoningEffort)
    assert set(SERVICE_TIERS) == literals(ServiceTier)
    assert RESPONSES.by_name["service_tier"].options == SERVICE_TIERS
    assert RESPONSES.by_name["reasoning"].parts[0].options == EFFORTS


@pytest.mark.parametrize(
    ("item", "kind"),
    [
        ({"role": "user", "content": "x"}, "message"),
        ({"type": None, "role": "user", "content": "x"}, "message"),
        ({"content": "x"}, "message"),  # a message without its role (a 400 naming it)
        ({"id": "msg_1"}, "item_reference"),
        ({"id": "msg_1", "content": "x"}, "message"),
        ({"type": "function_call", "id": "fc_1"}, "function_call"),
    ],
)
def test_item_type(item: dict[str, Any], kind: str) -> None:
    assert ri.item_type(item) == kind


def test_as_items() -> None:
    assert ri.as_items("hi") == [{"type": "message", "role": "user", "content": "hi"}]
    sent: list[dict[str, Any]] = [
        {"role": "user", "content": "a"},
        {"id": "r"},
        {"type": "reasoning", "summary": []},
    ]
    items = ri.as_items(sent)
    assert items == [
        {"role": "user", "content": "a", "type": "message"},
        {"id": "r", "type": "item_reference"},
        {"type": "reasoning", "summary": []},
    ]
    assert sent[:2] == [{"role": "user", "content": "a"}, {"id": "r"}]
    assert items[2] is sent[2]  # typed already: the caller's own


IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png"}
TEXT = {"type": "input_text", "text": "x"}


@pytest.mark.parametrize(
    ("items", "found"),
    [
        ([{"type": "message", "role": "user", "content": "x"}], None),
        ([{"type": "message", "role": "user", "content": [TEXT]}], None),
        (
            [
                {"type": "message", "role": "assistant", "content": [{"type": "refusal"}]},
                {"type": "message", "role": "user", "content": [TEXT, IMAGE]},
            ],
            ("input[1].content[1]", "input_image"),
        ),
        (
            [{"type": "function_call_output", "call_id": "c", "output": [TEXT, IMAGE]}],
            ("input[0].output[1]", "input_image"),
        ),
        (
            [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
            ("input[0].content[0]", "input_file"),
        ),
        # A reasoning item's content is its own text.
        ([{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text"}]}], None),
    ],
)
def test_first_media_part(items: list[dict[str, Any]], found: tuple[str, str] | None) -> None:
    assert ri.first_media_part(items) == found


def test_functions_named_by_tool_choice() -> None:
    assert ri.chosen_functions("auto") == []
    assert ri.chosen_functions({"type": "function", "name": "f"}) == [("tool_choice.name", "f")]
    allowed = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "mcp", "server_label": "d"}, {"type": "function", "name": "g"}],
    }
    assert ri.chosen_functions(allowed) == [("tool_choice.tools[1].name", "g")]
    assert ri.chosen_functions({"type": "file_search"}) == []
    tools = [{"type": "function", "name": "f"}, {"type": "web_search"}]
    assert ri.function_names(tools) == {"f"}


@pytest.mark.parametrize(
    ("tool_choice", "hosted"),
    [
        ("required", None),
        ({"type": "function", "name": "f"}, None),
        ({"type": "allowed_tools", "mode": "auto", "tools": []}, None),
        ({"type": "mcp", "server_label": "d"}, ("tool_choice", "mcp")),
        ({"type": "image_generation"}, ("tool_choice", "image_generation")),
    ],
)
def test_hosted_tool_choice(tool_choice: Any, hosted: tuple[str, str] | None) -> None:
    assert ri.hosted_tool_choice({"tool_choice": tool_choice}) == hosted
    assert ri.hosted_tool_choice({}) is None

"""Checks of the Responses request's structured fields, as OpenAI checks them: `input` (its items
by type: messages by role with their content parts, function calls and their outputs, reasoning,
item references), `tools` (function tools by OpenAI's name rules, hosted tools by their type),
`tool_choice`, `text.format`, `include`, `conversation` and `prompt`. Each returns the value or
raises a 400 naming the part that is wrong (`input[1].content[0].type`, `tools[0].name`).

The gateway serves function tools only: an input item of one of OpenAI's hosted tools
(`web_search_call`, `computer_call`, …) is refused here, by its type. A hosted tool in `tools` is
valid here; whether a target can run it is the target's to say (`hosted_tools`).

Also the helpers over validated items and tools: `as_items` (the input as a list of items, each
with its type), `item_type`, `first_media_part`, `function_names`, `hosted_tools`,
`hosted_tool_choice`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from core.checks import Validator, bad, choice, obj, string
from core.errors import InvalidRequest

# The name rules OpenAI states for a function tool hold for a json_schema format too (name of
# a-z, A-Z, 0-9, _ and -, at most 64; description; strict): one rule, core.messages'.
from core.messages import function_definition as named_schema
from core.messages import required

Check = Callable[[dict[str, Any], str], None]

STATUSES = ("in_progress", "completed", "incomplete")
ROLES = ("user", "system", "developer", "assistant")
INPUT_PARTS = ("input_text", "input_image", "input_file")
OUTPUT_PARTS = ("output_text", "refusal")
# The content parts each role may send: an assistant's are what the model wrote (an output
# message sent back), the others' what a caller gives (OpenAI: "Supported values are:
# 'output_text' and 'refusal'" for an assistant).
PARTS: Mapping[str, tuple[str, ...]] = {
    "user": INPUT_PARTS,
    "system": INPUT_PARTS,
    "developer": INPUT_PARTS,
    "assistant": OUTPUT_PARTS,
}
TEXT_PARTS = ("input_text", "output_text", "refusal")
IMAGE_DETAILS = ("low", "high", "auto", "original")
FILE_DETAILS = ("low", "high", "auto")
# The item types of OpenAI's hosted tools (and its server-side features): a caller sends them
# back only to a server that ran those tools, which the gateway does not.
UNSERVED_ITEMS = frozenset(
    (
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "web_search_call",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "configuration_update",
        "compaction",
        "compaction_trigger",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "program",
        "program_output",
    )
)
INCLUDABLE = (
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
)
TOOL_CHOICES = ("none", "auto", "required")
# A stored response's input items listed (`GET /v1/responses/{id}/input_items`): OpenAI's range
# and default of `limit`, and its orders.
LIST_LIMIT = (1, 100)
LIST_DEFAULT = 20
ORDERS = ("asc", "desc")
# tool_choice values that may come without tools (OpenAI's Responses takes them).
CHOICES_WITHOUT_TOOLS = ("none", "auto")


NOTHING: Mapping[str, Validator] = MappingProxyType({})


def shape(needed: Mapping[str, Validator], optional: Mapping[str, Validator] = NOTHING) -> Check:
    """An object's keys: the required ones (null: missing) and the optional ones (null: absent),
    each with its check. Other keys are kept as sent."""

    def check(v: dict[str, Any], name: str) -> None:
        for key, each in needed.items():
            each(required(v, key, name), f"{name}.{key}")
        for key, each in optional.items():
            if v.get(key) is not None:
                each(v[key], f"{name}.{key}")

    return check


def array_of(check: Check, what: str, *, non_empty: bool = False) -> Validator:
    """An array (non-empty if asked) of objects, each checked by `check` at `name[i]`."""
    expected = f"a non-empty array of {what}" if non_empty else f"an array of {what}"

    def check_array(v: Any, name: str) -> list[Any]:
        if type(v) is not list or (non_empty and not v):
            raise bad(name, expected, v)
        for i, member in enumerate(v):
            check(obj(member, f"{name}[{i}]"), f"{name}[{i}]")
        return v

    return check_array


def one_of(*keys: str) -> Check:
    """At least one of these keys is set (an image's URL or file; a file's id, data or URL)."""
    quoted = [f"'{k}'" for k in keys]
    what = f"a part with {', '.join(quoted[:-1])} or {quoted[-1]}"

    def check(v: dict[str, Any], name: str) -> None:
        if all(v.get(k) is None for k in keys):
            raise bad(name, what, v)

    return check


def both(*checks: Check) -> Check:
    def check(v: dict[str, Any], name: str) -> None:
        for each in checks:
            each(v, name)

    return check


def typed(kinds: Mapping[str, Check]) -> Check:
    """An object whose `type` is one of `kinds`, checked by that kind's check."""
    one = choice(*kinds)

    def check(v: dict[str, Any], name: str) -> None:
        kinds[one(required(v, "type", name), f"{name}.type")](v, name)

    return check


status = choice(*STATUSES)
no_keys = shape(NOTHING)


def as_sent(v: Any, name: str) -> None:
    """A value the gateway passes on unread (an annotation, a logprob sent back)."""


# ---------------------------------------------------------------- content parts

PART_CHECKS: Mapping[str, Check] = {
    "input_text": shape({"text": string}),
    "input_image": both(
        one_of("image_url", "file_id"),
        shape({}, {"image_url": string, "file_id": string, "detail": choice(*IMAGE_DETAILS)}),
    ),
    "input_file": both(
        one_of("file_id", "file_data", "file_url"),
        shape(
            {},
            {
                "file_id": string,
                "file_data": string,
                "file_url": string,
                "filename": string,
                "detail": choice(*FILE_DETAILS),
            },
        ),
    ),
    "output_text": shape(
        {"text": string},
        {
            "annotations": array_of(as_sent, "annotations"),
            "logprobs": array_of(as_sent, "logprobs"),
        },
    ),
    "refusal": shape({"refusal": string}),
}
PARTS_BY_ROLE: Mapping[str, Check] = {
    role: typed({kind: PART_CHECKS[kind] for kind in kinds}) for role, kinds in PARTS.items()
}
input_parts = array_of(typed({kind: PART_CHECKS[kind] for kind in INPUT_PARTS}), "content parts")


def _content(role: str) -> Validator:
    """A string, or a non-empty array of the parts the role may send."""
    parts = array_of(PARTS_BY_ROLE[role], "content parts", non_empty=True)

    def check(v: Any, name: str) -> Any:
        if type(v) is str:
            return v
        if type(v) is not list:
            raise bad(name, "a string or a non-empty array of content parts", v)
        return parts(v, name)

    return check


CONTENT: Mapping[str, Validator] = {role: _content(role) for role in ROLES}

# ---------------------------------------------------------------- input items

message_fields = shape(
    {}, {"id": string, "status": status, "phase": choice("commentary", "final_answer")}
)


def _message(v: dict[str, Any], name: str) -> None:
    role = choice(*ROLES)(required(v, "role", name), f"{name}.role")
    CONTENT[role](required(v, "content", name), f"{name}.content")
    message_fields(v, name)


def _call_output(v: Any, name: str) -> Any:
    """A function's output: text, or the parts of an input (text, images, files)."""
    return v if type(v) is str else input_parts(v, name)


def _texts(kind: str) -> Validator:
    return array_of(typed({kind: shape({"text": string})}), f"{kind} parts")


ITEMS: Mapping[str, Check] = {
    "message": _message,
    "function_call": shape(
        {"call_id": string, "name": string, "arguments": string},
        {"id": string, "status": status, "namespace": string},
    ),
    "function_call_output": shape(
        {"call_id": string, "output": _call_output}, {"id": string, "status": status}
    ),
    "reasoning": shape(
        {"summary": _texts("summary_text")},
        {
            "id": string,
            "content": _texts("reasoning_text"),
            "encrypted_content": string,
            "status": status,
        },
    ),
    "item_reference": shape({"id": string}),
}
item_kind = choice(*ITEMS)


def item_type(item: Mapping[str, Any]) -> str:
    """An item's type (a string, once validated); without one (OpenAI's easy forms), a message,
    or an item reference when it holds an id and neither a role nor content."""
    kind = item.get("type")
    if kind is not None:
        return kind  # type: ignore[no-any-return]
    reference = "id" in item and item.get("role") is None and item.get("content") is None
    return "item_reference" if reference else "message"


def item(v: Any, name: str) -> None:
    kind = item_type(obj(v, name))
    if type(kind) is str and kind in UNSERVED_ITEMS:
        raise InvalidRequest(
            f"Input items of type '{kind}' are not supported by this gateway: it serves "
            "function tools only.",
            param=f"{name}.type",
        )
    ITEMS[item_kind(kind, f"{name}.type")](v, name)


def input_items(v: Any, name: str) -> Any:
    """A string (one user message), or an array of items. An empty array is taken, as OpenAI's
    types take it (with `previous_response_id`, the turn may add nothing)."""
    if type(v) is str:
        return v
    if type(v) is not list:
        raise bad(name, "a string or an array of input items", v)
    for i, each in enumerate(v):
        item(each, f"{name}[{i}]")
    return v


def as_items(v: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validated input as items: a string is one user message; an item without its type (a
    message, an item reference) gets it, in a copy: the caller's items are left as they are.
    Nothing else changes."""
    if isinstance(v, str):
        return [{"type": "message", "role": "user", "content": v}]
    return [
        each if each.get("type") is not None else {**each, "type": item_type(each)} for each in v
    ]


# Where the content parts of an item are (a reasoning item's are its own text).
PARTS_KEY: Mapping[str, str] = {"message": "content", "function_call_output": "output"}


def first_media_part(items: Iterable[Mapping[str, Any]]) -> tuple[str, str] | None:
    """The first content part that is not text (an image, a file), in a message or a function's
    output: its path in the request (`input[1].content[0]`) and its type; None: text only."""
    for i, each in enumerate(items):
        key = PARTS_KEY.get(item_type(each))
        parts = each.get(key) if key else None
        if type(parts) is not list:
            continue
        for j, part in enumerate(parts):
            if part.get("type") not in TEXT_PARTS:
                return f"input[{i}].{key}[{j}]", str(part.get("type"))
    return None


# ---------------------------------------------------------------- tools and tool_choice


def tools(v: Any, name: str) -> list[Any]:
    """Function tools by OpenAI's rules; any other tool by its type (a hosted tool, the target's
    to serve or refuse)."""
    if type(v) is not list:
        raise bad(name, "an array of tools", v)
    for i, tool in enumerate(v):
        where = f"{name}[{i}]"
        kind = required(obj(tool, where), "type", where)
        if type(kind) is not str or not kind:
            raise bad(f"{where}.type", "a tool type (a string)", kind)
        if kind == "function":
            named_schema(tool, where)
    return v


def _allowed(v: Any, name: str) -> list[Any]:
    if type(v) is not list:
        raise bad(name, "an array of tools", v)
    for i, tool in enumerate(v):
        where = f"{name}[{i}]"
        kind = string(required(obj(tool, where), "type", where), f"{where}.type")
        if kind == "function":
            string(required(tool, "name", where), f"{where}.name")
    return v


# The named choices with keys of their own; any other type names a hosted tool.
NAMED_CHOICES: Mapping[str, Check] = {
    "function": shape({"name": string}),
    "allowed_tools": shape({"mode": choice("auto", "required"), "tools": _allowed}),
    "mcp": shape({"server_label": string}, {"name": string}),
    "custom": shape({"name": string}),
}


def tool_choice(v: Any, name: str) -> Any:
    """`none`, `auto`, `required`, a named function, the allowed tools, or a hosted tool's type."""
    if type(v) is str:
        return choice(*TOOL_CHOICES)(v, name)
    if type(v) is not dict:
        raise bad(name, "one of 'none', 'auto', 'required', or an object", v)
    kind = required(v, "type", name)
    if type(kind) is not str or not kind:
        raise bad(f"{name}.type", "a tool type (a string)", kind)
    NAMED_CHOICES.get(kind, no_keys)(v, name)
    return v


def function_names(tools: Iterable[Mapping[str, Any]]) -> set[str]:
    return {t["name"] for t in tools if t["type"] == "function"}


def chosen_functions(chosen: Any) -> list[tuple[str, str]]:
    """The functions a validated tool_choice names: (path, name) each."""
    if type(chosen) is not dict:
        return []
    if chosen["type"] == "function":
        return [("tool_choice.name", chosen["name"])]
    if chosen["type"] != "allowed_tools":
        return []
    return [
        (f"tool_choice.tools[{i}].name", t["name"])
        for i, t in enumerate(chosen["tools"])
        if t["type"] == "function"
    ]


def named_tools(fields: Mapping[str, Any]) -> None:
    """The functions tool_choice names must be among the tools."""
    known = function_names(fields.get("tools", ()))
    for path, name in chosen_functions(fields.get("tool_choice")):
        if name not in known:
            raise InvalidRequest(
                f"Invalid value for 'tool_choice': no function named '{name}' is in 'tools'.",
                param=path,
            )


def hosted_tools(fields: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The tools that are not functions (OpenAI's hosted tools, custom tools, …), in order: their
    path and type, e.g. ("tools[1]", "web_search")."""
    return [
        (f"tools[{i}]", tool["type"])
        for i, tool in enumerate(fields.get("tools", ()))
        if tool["type"] != "function"
    ]


def hosted_tool_choice(fields: Mapping[str, Any]) -> tuple[str, str] | None:
    """A tool_choice that forces a hosted tool: ("tool_choice", its type); None otherwise."""
    chosen = fields.get("tool_choice")
    if type(chosen) is dict and chosen["type"] not in ("function", "allowed_tools"):
        return "tool_choice", chosen["type"]
    return None


# ---------------------------------------------------------------- the other structured fields

json_schema_format = both(named_schema, shape({"schema": obj}))
TEXT_FORMAT_CHECKS: Mapping[str, Check] = {
    "text": no_keys,
    "json_object": no_keys,
    "json_schema": json_schema_format,
}
_text_format = typed(TEXT_FORMAT_CHECKS)


def text_format(v: Any, name: str) -> dict[str, Any]:
    """`{"type": "text"}`, `{"type": "json_object"}`, or a json_schema format: its name (OpenAI's
    name rules), its schema, `strict`, `description`."""
    _text_format(obj(v, name), name)
    return v  # type: ignore[no-any-return]


def include(v: Any, name: str) -> list[Any]:
    if type(v) is not list:
        raise bad(name, "an array of include values", v)
    one = choice(*INCLUDABLE)
    for i, each in enumerate(v):
        one(each, f"{name}[{i}]")
    return v


conversation_id = shape({"id": string})
stored_prompt = shape({"id": string}, {"variables": obj, "version": string})


def conversation(v: Any, name: str) -> Any:
    """A conversation's id, or `{"id": …}`."""
    if type(v) is str:
        return v
    if type(v) is not dict:
        raise bad(name, "a conversation's id or an object", v)
    conversation_id(v, name)
    return v


def prompt(v: Any, name: str) -> dict[str, Any]:
    """A stored prompt's reference: its id, its variables, its version."""
    stored_prompt(obj(v, name), name)
    return v  # type: ignore[no-any-return]

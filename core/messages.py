"""Checks of the chat request's structured fields, as OpenAI checks them: `messages` (each role's
shape, content as a string or an array of parts, the assistant's tool calls, a tool message's
`tool_call_id`), `tools`, `tool_choice`, `response_format` with `strict`, `metadata`. Each returns
the value or raises a 400 naming the field, or the item of it, that is wrong. Whether a target can
serve what a message holds (an image part, audio) is the target's to say."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from core.checks import bad, boolean, choice, obj, string
from core.errors import InvalidRequest

ROLES = ("developer", "system", "user", "assistant", "tool", "function")
TOOL_CHOICES = ("none", "auto", "required")
# The content parts each role may send (OpenAI's message types).
PARTS: Mapping[str, tuple[str, ...]] = {
    "developer": ("text",),
    "system": ("text",),
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
    "function": ("text",),
}
MAX_METADATA_KEYS = 16  # OpenAI's: 16 pairs, keys up to 64 characters, values up to 512
MAX_FUNCTION_NAME = 64


def missing(name: str) -> InvalidRequest:
    """OpenAI's words for a required key that is absent (or null)."""
    return InvalidRequest(f"Missing required parameter: '{name}'.", param=name)


def required(message: Mapping[str, Any], key: str, name: str) -> Any:
    """`message[key]`, or a 400 naming `name.key`."""
    value = message.get(key)
    if value is None:
        raise missing(f"{name}.{key}")
    return value


def _part(part: Any, name: str, kinds: tuple[str, ...]) -> None:
    obj(part, name)
    kind = choice(*kinds)(part.get("type"), f"{name}.type")
    if kind in ("text", "refusal"):
        string(required(part, kind, name), f"{name}.{kind}")
    elif kind == "image_url":
        image = obj(required(part, "image_url", name), f"{name}.image_url")
        string(required(image, "url", f"{name}.image_url"), f"{name}.image_url.url")
    else:  # input_audio, file: their own objects
        obj(required(part, kind, name), f"{name}.{kind}")


def content(v: Any, name: str, role: str) -> None:
    """A string, or a non-empty array of the parts the role may send."""
    _parts(v, name, PARTS[role])


def _parts(v: Any, name: str, kinds: tuple[str, ...]) -> None:
    if type(v) is str:
        return
    if type(v) is not list or not v:
        raise bad(name, "a string or a non-empty array of content parts", v)
    for i, part in enumerate(v):
        _part(part, f"{name}[{i}]", kinds)


def tool_call(v: Any, name: str) -> None:
    obj(v, name)
    string(required(v, "id", name), f"{name}.id")
    choice("function")(required(v, "type", name), f"{name}.type")
    function = obj(required(v, "function", name), f"{name}.function")
    string(required(function, "name", f"{name}.function"), f"{name}.function.name")
    string(required(function, "arguments", f"{name}.function"), f"{name}.function.arguments")


def _assistant(m: Mapping[str, Any], name: str) -> None:
    calls = m.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            raise bad(f"{name}.tool_calls", "an array of tool calls", calls)
        for i, call in enumerate(calls):
            tool_call(call, f"{name}.tool_calls[{i}]")
    if m.get("content") is not None:
        content(m["content"], f"{name}.content", "assistant")
    elif not calls and m.get("function_call") is None and m.get("refusal") is None:
        raise missing(f"{name}.content")
    if m.get("refusal") is not None:
        string(m["refusal"], f"{name}.refusal")


def _with_content(role: str) -> Callable[[Mapping[str, Any], str], None]:
    def check(m: Mapping[str, Any], name: str) -> None:
        content(required(m, "content", name), f"{name}.content", role)
        if role == "tool":
            string(required(m, "tool_call_id", name), f"{name}.tool_call_id")
        if role == "function":
            string(required(m, "name", name), f"{name}.name")

    return check


BY_ROLE: Mapping[str, Callable[[Mapping[str, Any], str], None]] = {
    "developer": _with_content("developer"),
    "system": _with_content("system"),
    "user": _with_content("user"),
    "assistant": _assistant,
    "tool": _with_content("tool"),
    "function": _with_content("function"),
}


# A message that is only a role and its text needs no more checks (most messages are).
PLAIN_ROLES = frozenset(("developer", "system", "user", "assistant"))
openai_role = choice(*ROLES)
# What a message in a role of a chat template's own may hold (vLLM's custom message): any part.
ANY_PART = tuple(dict.fromkeys(p for parts in PARTS.values() for p in parts))


def _custom(m: Mapping[str, Any], name: str) -> None:
    """A role OpenAI does not have (Llama 3.1's `ipython`, GLM's `observation`, a template's
    own): vLLM hands it to the chat template. Its content, when there is one, is text or parts;
    targets that serve only OpenAI's roles refuse it (`openai_roles_only`)."""
    if m.get("content") is not None:
        _parts(m["content"], f"{name}.content", ANY_PART)
    if m.get("tool_call_id") is not None:
        string(m["tool_call_id"], f"{name}.tool_call_id")


def message(v: Any, name: str) -> None:
    m = obj(v, name)
    role = required(m, "role", name)
    check = BY_ROLE.get(role) if type(role) is str else None
    if check is None and (type(role) is not str or not role):
        openai_role(role, f"{name}.role")  # not a role at all: OpenAI's words
    if role != "function" and m.get("name") is not None:
        string(m["name"], f"{name}.name")
    (check or _custom)(m, name)


def openai_roles_only(messages: list[dict[str, Any]]) -> None:
    """OpenAI's roles only: the first message in another role is a 400 naming it, in OpenAI's
    words (for targets that are not vLLM's, which would refuse it or misread it)."""
    for i, item in enumerate(messages):
        if item["role"] not in BY_ROLE:
            openai_role(item["role"], f"messages[{i}].role")


def messages(v: Any, name: str) -> list[Any]:
    if type(v) is not list or not v:
        raise bad(name, "a non-empty array of messages", v)
    for i, item in enumerate(v):
        plain = type(item) is dict and len(item) == 2 and type(item.get("content")) is str
        if not (plain and type(item.get("role")) is str and item["role"] in PLAIN_ROLES):
            message(item, f"{name}[{i}]")
    return v


def function_definition(v: Any, name: str) -> None:
    """A function's name (OpenAI's rules), description, parameters and strict."""
    f = obj(v, name)
    fname = string(required(f, "name", name), f"{name}.name")
    if (
        not fname
        or len(fname) > MAX_FUNCTION_NAME
        or not all(c.isascii() and (c.isalnum() or c in "_-") for c in fname)
    ):
        raise bad(f"{name}.name", "a name of a-z, A-Z, 0-9, _ and -, at most 64 characters", fname)
    if f.get("description") is not None:
        string(f["description"], f"{name}.description")
    if f.get("parameters") is not None:
        obj(f["parameters"], f"{name}.parameters")
    if f.get("strict") is not None:
        boolean(f["strict"], f"{name}.strict")


def tools(v: Any, name: str) -> list[Any]:
    if type(v) is not list:
        raise bad(name, "an array of tools", v)
    for i, tool in enumerate(v):
        where = f"{name}[{i}]"
        obj(tool, where)
        choice("function")(required(tool, "type", where), f"{where}.type")
        function_definition(required(tool, "function", where), f"{where}.function")
    return v


def tool_choice(v: Any, name: str) -> Any:
    """`none`, `auto`, `required`, or a named function."""
    if type(v) is str:
        return choice(*TOOL_CHOICES)(v, name)
    named = obj(v, name)
    choice("function")(required(named, "type", name), f"{name}.type")
    function = obj(required(named, "function", name), f"{name}.function")
    string(required(function, "name", f"{name}.function"), f"{name}.function.name")
    return v


def metadata(v: Any, name: str) -> dict[str, Any]:
    m = obj(v, name)
    if len(m) > MAX_METADATA_KEYS:
        raise bad(name, f"at most {MAX_METADATA_KEYS} key-value pairs", len(m))
    for key, value in m.items():
        if len(key) > 64 or type(value) is not str or len(value) > 512:
            raise bad(f"{name}.{key}", "a string of at most 512 characters", value)
    return m


TEXT_PARTS = ("text", "refusal")


def first_media_part(messages: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The first content part that is not text (an image, audio, a file): its path in the
    request (`messages[1].content[0]`) and its type; None when the chat is text only."""
    for i, message in enumerate(messages):
        parts = message.get("content")
        if type(parts) is not list:
            continue
        for j, part in enumerate(parts):
            if part.get("type") not in TEXT_PARTS:
                return f"messages[{i}].content[{j}]", part["type"]
    return None


def text_only(label: str, kind: str) -> str:
    """What a caller hears when a target's model reads text only."""
    return (
        f"Target '{label}' serves a text-only model: it cannot take a content part of type "
        f"'{kind}'."
    )

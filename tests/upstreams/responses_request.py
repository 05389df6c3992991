"""The Responses API's request at the scripted OpenAI upstream (`POST …/responses`): OpenAI's
checks in its words, the conversation the request continues, and what the fake model reads.

* Checks (400 `{"error": {message, type, param, code}}`, the first problem found): a field
  CreateResponse does not have is `Unknown parameter: 'seed'.` (code `unknown_parameter`; chat's
  `messages`, `max_tokens`, `stop`, `response_format`, `seed`, `n`, `top_k` … are unknown here);
  ranges and types as chat's (`max_output_tokens` >= 16, `temperature` 0..2, `top_p` 0..1,
  `top_logprobs` 0..20); `model` and `input` required; each input item by its type (a message's
  role and its parts by role, a function call's and output's fields, no unknown keys); function
  tools `{"type": "function", "name", "parameters"}` (chat's nested `function` is a missing
  `name`); `tool_choice`; `text.format`; `include`.
* The conversation: with `previous_response_id`, the earlier response's items (its own
  conversation, then its output) come before this request's input (`Memory.history`; an unknown
  id is a 404 `previous_response_not_found`). An input item with an `id` must be one this
  upstream made and kept (else 404 "Item with id '…' not found."), and a `function_call_output`
  must answer a `function_call` of the conversation (400 "No tool call found for function call
  output with call_id …").
* The prompt (`responses_prompt`): `instructions` (when not empty; an earlier response's are not
  carried over) then each item's text, joined with "\\n": a message's string content or its
  `input_text`/`output_text` parts' text, a `function_call_output`'s output (a string, or its
  `input_text` parts), nothing for function calls and reasoning. That is `chat_prompt` of the
  equivalent chat messages, so `fakegen.expected_text(responses_prompt(body), 0, bound)` is a
  text answer.
* Generation is chat's (chat_render over `ChatParams`): the same `__tool__`/`__tools_2__` rule
  on the conversation's last item, `tool_choice`, `text.format` as chat's `response_format`,
  `include: ["message.output_text.logprobs"]` as chat's `logprobs: true`. No
  `max_output_tokens`: CHAT_DEFAULT_MAX_TOKENS (20).
* Not modelled (a 400 that says so): `background: true`, `conversation`, `prompt`, hosted tools,
  `item_reference` items; `truncation: "auto"` is echoed, but an input over the window is
  refused either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .chat_fake import content_texts
from .chat_validate import (
    CHAT_DEFAULT_MAX_TOKENS,
    OPENAI_MAX_TOP_LOGPROBS,
    ChatParams,
    _invalid_type,
    _missing,
    _openai_violation,
)
from .errors import UpstreamError, openai_error
from .fakegen import prompt_from_text
from .validate import Rule, check_all

Json = dict[str, Any]
RESPONSES_DEFAULT_MAX_OUTPUT_TOKENS = CHAT_DEFAULT_MAX_TOKENS
MIN_OUTPUT_TOKENS = 16
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    LOGPROBS_INCLUDE,
)
RESPONSES_RULES: dict[str, Rule] = {
    "model": Rule("str"),
    "input": Rule("any"),
    "instructions": Rule("str"),
    "max_output_tokens": Rule("int", MIN_OUTPUT_TOKENS),
    "max_tool_calls": Rule("int", 1),
    "metadata": Rule("object"),
    "parallel_tool_calls": Rule("bool"),
    "previous_response_id": Rule("str"),
    "reasoning": Rule("object"),
    "store": Rule("bool"),
    "stream": Rule("bool"),
    "stream_options": Rule("object"),
    "temperature": Rule("number", 0, 2),
    "top_p": Rule("number", 0, 1),
    "top_logprobs": Rule("int", 0, OPENAI_MAX_TOP_LOGPROBS),
    "text": Rule("object"),
    "tools": Rule("any"),
    "tool_choice": Rule("any"),
    "truncation": Rule("str", choices=("auto", "disabled")),
    "user": Rule("str"),
    "include": Rule("any"),
    "service_tier": Rule("str"),
    "safety_identifier": Rule("str"),
    "prompt_cache_key": Rule("str"),
    "prompt_cache_retention": Rule("str"),
    "background": Rule("bool"),
    "conversation": Rule("any"),
    "prompt": Rule("any"),
    "context_management": Rule("any"),
}
# OpenAI serves these; the fake model does not (a 400 that says so, when set).
NOT_MODELLED = ("background", "conversation", "prompt")
ROLES = ("assistant", "system", "developer", "user")
INPUT_PARTS = ("input_text", "input_image", "input_file")
PARTS_BY_ROLE: dict[str, tuple[str, ...]] = {
    "assistant": ("output_text", "refusal"),
    "system": INPUT_PARTS,
    "developer": INPUT_PARTS,
    "user": INPUT_PARTS,
}
PART_KEYS: dict[str, frozenset[str]] = {
    "input_text": frozenset({"type", "text"}),
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
    "refusal": frozenset({"type", "refusal"}),
    "input_image": frozenset({"type", "image_url", "file_id", "detail"}),
    "input_file": frozenset({"type", "file_id", "file_data", "file_url", "filename"}),
}
PART_TEXT = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


@dataclass(frozen=True)
class ItemSpec:
    """An input item type: its required string fields and every key it may have."""

    required: tuple[str, ...]
    keys: frozenset[str]


ITEMS: dict[str, ItemSpec] = {
    "message": ItemSpec(("role",), frozenset({"type", "role", "content", "id", "status", "phase"})),
    "function_call": ItemSpec(
        ("call_id", "name", "arguments"),
        frozenset({"type", "call_id", "name", "arguments", "id", "status", "namespace", "caller"}),
    ),
    "function_call_output": ItemSpec(
        ("call_id",), frozenset({"type", "call_id", "output", "id", "status"})
    ),
    "reasoning": ItemSpec(
        (), frozenset({"type", "id", "summary", "content", "encrypted_content", "status"})
    ),
}
FORMAT_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"type"}),
    "json_object": frozenset({"type"}),
    "json_schema": frozenset({"type", "name", "schema", "strict", "description"}),
}
TOOL_KEYS = frozenset(
    {"type", "name", "description", "parameters", "strict", "defer_loading", "allowed_callers"}
)
TOOL_CHOICES = ("none", "auto", "required")
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Memory(Protocol):
    """What this upstream kept of earlier responses (the server's store)."""

    def history(self, response_id: str) -> list[Json] | None:
        """The items a next turn continues from: the response's conversation, then its
        output; None when no such response is kept."""

    def has_item(self, item_id: str) -> bool:
        """Whether a kept response holds an item with this id."""


@dataclass(frozen=True)
class ResponsesParams:
    """A valid Responses request: the body as sent (echoed in the answer), its conversation and
    what the fake model does (chat's machinery)."""

    body: Json
    items: tuple[Json, ...]  # this request's input (a string input as one user message)
    history: tuple[Json, ...]  # the earlier turns' items (previous_response_id)
    chat: ChatParams
    bound: int | None  # max_output_tokens as sent
    logprobs: bool  # include has message.output_text.logprobs
    stream: bool
    store: bool
    obfuscate: bool  # stream deltas carry `obfuscation` (OpenAI's default)


# ---------------------------------------------------------------- the prompt


def input_items(raw: Any) -> list[Any]:
    """A body's `input` as items: a string is one user message."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return raw if isinstance(raw, list) else []


def item_kind(item: Mapping[str, Any]) -> Any:
    """An item's type; a message may leave it out (EasyInputMessage)."""
    return item.get("type", "message" if "role" in item else None)


def _part_texts(parts: Any, kinds: tuple[str, ...]) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [
        p["text"]
        for p in parts
        if isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text"), str)
    ]


def _message_texts(item: Mapping[str, Any]) -> list[str]:
    content = item.get("content")
    if isinstance(content, str):
        return content_texts(content)
    return _part_texts(content, ("input_text", "output_text"))


def _output_texts(item: Mapping[str, Any]) -> list[str]:
    output = item.get("output")
    return [output] if isinstance(output, str) else _part_texts(output, ("input_text",))


ITEM_TEXTS: dict[str, Callable[[Mapping[str, Any]], list[str]]] = {
    "message": _message_texts,
    "function_call_output": _output_texts,
}


def item_texts(items: Sequence[Any]) -> list[str]:
    """The texts the fake model reads in these items, in order."""
    out: list[str] = []
    for item in items:
        if isinstance(item, dict):
            read = ITEM_TEXTS.get(item_kind(item))
            out += read(item) if read is not None else []
    return out


def responses_texts(body: Any) -> list[str]:
    """Every text of a raw Responses body (its instructions and input), for markers, whatever
    else is wrong with it."""
    if not isinstance(body, dict):
        return []
    instructions = body.get("instructions")
    head = [instructions] if isinstance(instructions, str) and instructions else []
    return head + item_texts(input_items(body.get("input")))


def responses_prompt(body: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()) -> str:
    """What the fake model reads for a Responses body: its instructions, then the texts of
    `history` (an earlier turn's items and output, as `previous_response_id` brings them),
    then of its input, joined with newlines."""
    instructions = body.get("instructions")
    head = [instructions] if isinstance(instructions, str) and instructions else []
    return "\n".join(head + item_texts(list(history)) + item_texts(input_items(body.get("input"))))


def last_user_text(items: Sequence[Any]) -> str:
    """The conversation's last item's text if it is the user's message, else "" (chat's rule
    for the tool markers)."""
    last = items[-1] if items else None
    if isinstance(last, dict) and item_kind(last) == "message" and last.get("role") == "user":
        return "\n".join(_message_texts(last))
    return ""


# ---------------------------------------------------------------- OpenAI's words


def _unknown(name: str) -> UpstreamError:
    return openai_error(400, f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")


def _listed(values: Sequence[str]) -> str:
    quoted = [f"'{v}'" for v in values]
    if len(quoted) < 3:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def _invalid_value(name: str, value: Any, allowed: Sequence[str]) -> UpstreamError:
    return openai_error(
        400,
        f"Invalid value: '{value}'. Supported values are: {_listed(allowed)}.",
        param=name,
        code="invalid_value",
    )


def _not_modelled(name: str, what: str) -> UpstreamError:
    return openai_error(400, f"The scripted OpenAI upstream does not model {what}.", param=name)


def _check_keys(value: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in value:
        if key not in allowed:
            raise _unknown(f"{where}.{key}")


def _check_string(value: Mapping[str, Any], key: str, where: str) -> None:
    if value.get(key) is None:
        raise _missing(f"{where}.{key}")
    if not isinstance(value[key], str):
        raise _invalid_type(f"{where}.{key}", "a string", value[key])


# ---------------------------------------------------------------- top-level fields


def _check_fields(body: Mapping[str, Any]) -> None:
    for key in body:
        if key not in RESPONSES_RULES:
            raise _unknown(key)
    for v in check_all(body, RESPONSES_RULES):
        if v.problem == "choice":
            raise _invalid_value(v.name, v.value, v.rule.choices)
        raise _openai_violation(v)
    for name in NOT_MODELLED:
        if body.get(name):
            raise _not_modelled(name, f"'{name}'")
    for name in ("model", "input"):
        if body.get(name) is None:
            raise _missing(name)
    metadata = body.get("metadata") or {}
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _invalid_type(f"metadata.{key}", "a string", value)
    if body.get("stream_options") is not None and not body.get("stream"):
        message = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise openai_error(400, message, param="stream_options")


# ---------------------------------------------------------------- input items


def _check_part(part: Any, role: str, where: str) -> None:
    if not isinstance(part, dict):
        raise _invalid_type(where, "an object", part)
    kind = part.get("type")
    if kind is None:
        raise _missing(f"{where}.type")
    allowed = PARTS_BY_ROLE[role]
    if kind not in allowed:
        raise _invalid_value(f"{where}.type", kind, allowed)
    _check_keys(part, PART_KEYS[kind], where)
    text_key = PART_TEXT.get(kind)
    if text_key is not None:
        _check_string(part, text_key, where)


def _check_message(item: Mapping[str, Any], where: str) -> None:
    role = item["role"]
    if role not in ROLES:
        raise _invalid_value(f"{where}.role", role, ROLES)
    content = item.get("content")
    if content is None:
        raise _missing(f"{where}.content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid_type(f"{where}.content", "one of a string or array of objects", content)
    for j, part in enumerate(content):
        _check_part(part, role, f"{where}.content[{j}]")


def _check_call_output(item: Mapping[str, Any], where: str) -> None:
    output = item.get("output")
    if output is None:
        raise _missing(f"{where}.output")
    if not isinstance(output, str | list):
        raise _invalid_type(f"{where}.output", "one of a string or array of objects", output)
    for j, part in enumerate(output if isinstance(output, list) else []):
        _check_part(part, "user", f"{where}.output[{j}]")


ITEM_CHECKS: dict[str, Callable[[Mapping[str, Any], str], None]] = {
    "message": _check_message,
    "function_call_output": _check_call_output,
}


def _check_item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise _invalid_type(where, "an object", item)
    kind = item_kind(item)
    if kind is None:
        raise _missing(f"{where}.type")
    if kind == "item_reference":
        raise _not_modelled(f"{where}.type", "'item_reference' items")
    spec = ITEMS.get(kind)
    if spec is None:
        raise _invalid_value(f"{where}.type", kind, tuple(ITEMS))
    for key in spec.required:
        _check_string(item, key, where)
    check = ITEM_CHECKS.get(kind)
    if check is not None:  # before the keys: a chat `tool` message is a role OpenAI names
        check(item, where)
    _check_keys(item, spec.keys, where)


def _check_input(raw: Any) -> list[Json]:
    if isinstance(raw, str):
        return input_items(raw)
    if not isinstance(raw, list):
        raise _invalid_type("input", "one of a string or array of input items", raw)
    for i, item in enumerate(raw):
        _check_item(item, f"input[{i}]")
    return raw


# ---------------------------------------------------------------- tools, formats, include


def _check_tool(tool: Any, where: str) -> None:
    if not isinstance(tool, dict):
        raise _invalid_type(where, "an object", tool)
    kind = tool.get("type")
    if kind is None:
        raise _missing(f"{where}.type")
    if kind != "function":
        raise _not_modelled(f"{where}.type", f"'{kind}' tools (only 'function' ones)")
    _check_string(tool, "name", where)
    if not _NAME.match(tool["name"]):
        raise openai_error(
            400,
            f"Invalid '{where}.name': string does not match pattern. Expected a string that "
            "matches the pattern '^[a-zA-Z0-9_-]+$'.",
            param=f"{where}.name",
            code="invalid_value",
        )
    _check_keys(tool, TOOL_KEYS, where)
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _invalid_type(f"{where}.parameters", "an object", parameters)


def _check_tools(raw: Any) -> list[Json]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _invalid_type("tools", "an array of objects", raw)
    for i, tool in enumerate(raw):
        _check_tool(tool, f"tools[{i}]")
    return raw


def _check_tool_choice(choice: Any, tools: list[Json]) -> None:
    if choice is None or isinstance(choice, str):
        if choice is not None and choice not in TOOL_CHOICES:
            raise _invalid_value("tool_choice", choice, TOOL_CHOICES)
        return
    if not isinstance(choice, dict):
        raise _invalid_type("tool_choice", "one of a string or object", choice)
    if choice.get("type") != "function":
        raise _not_modelled("tool_choice.type", f"tool_choice of type '{choice.get('type')}'")
    _check_string(choice, "name", "tool_choice")
    _check_keys(choice, frozenset({"type", "name"}), "tool_choice")
    if choice["name"] not in {t["name"] for t in tools}:
        raise openai_error(
            400, "Tool choice 'function' not found in 'tools' parameter.", param="tool_choice"
        )


def _check_text(text: Any, prompt: str) -> None:
    if text is None:
        return
    _check_keys(text, frozenset({"format", "verbosity"}), "text")
    verbosity = text.get("verbosity")
    if verbosity is not None and verbosity not in ("low", "medium", "high"):
        raise _invalid_value("text.verbosity", verbosity, ("low", "medium", "high"))
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise _invalid_type("text.format", "an object", fmt)
    kind = fmt.get("type")
    if kind is None:
        raise _missing("text.format.type")
    if kind not in FORMAT_KEYS:
        raise _invalid_value("text.format.type", kind, tuple(FORMAT_KEYS))
    if kind == "json_schema":
        _check_string(fmt, "name", "text.format")
        if not isinstance(fmt.get("schema"), dict):
            raise _missing("text.format.schema")
    _check_keys(fmt, FORMAT_KEYS[kind], "text.format")
    if kind == "json_object" and "json" not in prompt.lower():
        raise openai_error(
            400,
            "Response input messages must contain the word 'json' in some form to use "
            "'text.format' of type 'json_object'.",
            param="input",
        )


def _check_include(raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _invalid_type("include", "an array of strings", raw)
    for i, value in enumerate(raw):
        if value not in INCLUDABLE:
            raise _invalid_value(f"include[{i}]", value, INCLUDABLE)
    return raw


# ---------------------------------------------------------------- the conversation


def _history(body: Mapping[str, Any], memory: Memory) -> list[Json]:
    rid = body.get("previous_response_id")
    if rid is None:
        return []
    history = memory.history(rid)
    if history is None:
        raise openai_error(
            404,
            f"Previous response with id '{rid}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return history


def _check_conversation(history: list[Json], items: list[Json], memory: Memory) -> None:
    calls = {i["call_id"] for i in history if item_kind(i) == "function_call"}
    for item in items:
        item_id = item.get("id")
        if isinstance(item_id, str) and not memory.has_item(item_id):
            raise openai_error(
                404,
                f"Item with id '{item_id}' not found. Items are not persisted when `store` is "
                "set to false. Try again with `store` set to true, or remove this item from "
                "your input.",
                param="input",
            )
        kind = item_kind(item)
        if kind == "function_call":
            calls.add(item["call_id"])
        elif kind == "function_call_output" and item["call_id"] not in calls:
            raise openai_error(
                400,
                f"No tool call found for function call output with call_id {item['call_id']}.",
                param="input",
            )


def _context(prompt_tokens: int, window: int) -> None:
    if prompt_tokens >= window:
        raise openai_error(
            400,
            "Your input exceeds the context window of this model. Please adjust your input and "
            "try again.",
            param="input",
            code="context_length_exceeded",
        )


# ---------------------------------------------------------------- the request


def chat_tools(tools: list[Json]) -> tuple[Json, ...]:
    """Function tools in chat's shape (chat_render calls them)."""
    return tuple(
        {"type": "function", "function": {"name": t["name"], "parameters": t.get("parameters")}}
        for t in tools
    )


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def chat_format(text: Any) -> Json | None:
    """`text.format` as chat's `response_format` (chat_fake.fake_document reads it)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {"name": fmt["name"], "schema": fmt["schema"]}}


def parse_responses(body: Any, window: int, memory: Memory) -> ResponsesParams:
    """A Responses body checked as OpenAI checks it (UpstreamError: its error answer)."""
    if not isinstance(body, dict):
        raise openai_error(400, "We could not parse the JSON body of your request.")
    _check_fields(body)
    items = _check_input(body["input"])
    tools = _check_tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"), tools)
    include = _check_include(body.get("include"))
    history = _history(body, memory)
    _check_conversation(history, items, memory)
    text = responses_prompt(body, history)
    _check_text(body.get("text"), text)
    prompt = prompt_from_text(text)
    _context(len(prompt), window)
    bound = body.get("max_output_tokens")
    chat = ChatParams(
        model=body["model"],
        prompt=prompt,
        last_user=last_user_text([*history, *items]),
        max_tokens=min(bound or RESPONSES_DEFAULT_MAX_OUTPUT_TOKENS, window - len(prompt)),
        logprobs=LOGPROBS_INCLUDE in include,
        top_logprobs=body.get("top_logprobs") or 0,
        tools=chat_tools(tools),
        tool_choice=chat_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        response_format=chat_format(body.get("text")),
    )
    options = body.get("stream_options") or {}
    return ResponsesParams(
        body=body,
        items=tuple(items),
        history=tuple(history),
        chat=chat,
        bound=bound,
        logprobs=chat.logprobs,
        stream=bool(body.get("stream")),
        store=body.get("store") is not False,
        obfuscate=options.get("include_obfuscation") is not False,
    )

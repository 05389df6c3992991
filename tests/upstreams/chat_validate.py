"""Chat request checks of the scripted upstreams, each in its provider's way, and the
dialect-neutral `ChatParams` a valid request becomes.

OpenAI: 400s in its current style (`Invalid 'temperature': decimal above maximum value. …`,
`Missing required parameter: 'messages[1].tool_call_id'.`, `Unrecognized request argument
supplied: top_k`), `param` naming the field or item, its rules between fields, and its chat
context error (`param: messages`). Fireworks: FastAPI's 422 for fields outside its schema or of
the wrong type, 400 `{"error": {"object": "error", …}}` for its request errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .chat_fake import chat_prompt, last_user_text
from .errors import (
    UpstreamError,
    detail_item,
    fireworks_request_error,
    openai_error,
    validation_error,
)
from .fakegen import Prompt, prompt_from_text
from .validate import Rule, Violation, check_all, num_text, parse_stops

# Neither max_tokens nor max_completion_tokens: the fake model writes at most this many tokens
# (OpenAI would fill the context window, Fireworks' default is larger: a fixed, small bound keeps
# answers short, and differs from completions' 16 so a bound the gateway adds is visible).
CHAT_DEFAULT_MAX_TOKENS = 20
OPENAI_MAX_TOP_LOGPROBS = 20
FIREWORKS_MAX_TOP_LOGPROBS = 5
TOOL_MARKER = "__tool__"  # in the last user message: tool_choice "auto" calls a tool
TWO_TOOLS_MARKER = "__tools_2__"  # … two of them (unless parallel_tool_calls is false)
OPENAI_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
FIREWORKS_ROLES = ("system", "developer", "user", "assistant", "tool")
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ChatParams:
    """A validated chat request, dialect-neutral."""

    model: str
    prompt: Prompt
    last_user: str
    n: int = 1
    max_tokens: int = CHAT_DEFAULT_MAX_TOKENS
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None  # None (auto when tools), "none", "auto", "required", or named
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    ignore_eos: bool = False
    truncate: bool = False  # lower the bound to what the window leaves (Fireworks' default)

    @property
    def named_tool(self) -> str | None:
        choice = self.tool_choice
        return choice["function"]["name"] if isinstance(choice, dict) else None

    def called_tools(self) -> list[dict[str, Any]]:
        """The functions this request makes the model call ([]: it answers in text)."""
        if not self.tools or self.tool_choice == "none":
            return []
        functions = [t["function"] for t in self.tools]
        if self.named_tool is not None:
            return [f for f in functions if f["name"] == self.named_tool][:1]
        marked = TOOL_MARKER in self.last_user or TWO_TOOLS_MARKER in self.last_user
        if self.tool_choice != "required" and not marked:
            return []
        if TWO_TOOLS_MARKER in self.last_user and self.parallel_tool_calls:
            return [functions[0], functions[1 % len(functions)]]
        return functions[:1]

    @property
    def json_format(self) -> dict[str, Any] | None:
        fmt = self.response_format
        if fmt is not None and fmt.get("type") in ("json_object", "json_schema"):
            return fmt
        return None


# ---------------------------------------------------------------- OpenAI

OPENAI_CHAT_RULES: dict[str, Rule] = {
    "model": Rule("str"),
    "messages": Rule("any"),
    "frequency_penalty": Rule("number", -2, 2),
    "presence_penalty": Rule("number", -2, 2),
    "logit_bias": Rule("object"),
    "logprobs": Rule("bool"),
    "top_logprobs": Rule("int", 0, OPENAI_MAX_TOP_LOGPROBS),
    "max_tokens": Rule("int", 1),
    "max_completion_tokens": Rule("int", 1),
    "n": Rule("int", 1, 128),
    "seed": Rule("int"),
    "stop": Rule("any"),
    "stream": Rule("bool"),
    "stream_options": Rule("object"),
    "temperature": Rule("number", 0, 2),
    "top_p": Rule("number", 0, 1),
    "tools": Rule("any"),
    "tool_choice": Rule("any"),
    "parallel_tool_calls": Rule("bool"),
    "response_format": Rule("object"),
    "user": Rule("str"),
    "metadata": Rule("object"),
    "store": Rule("bool"),
    "service_tier": Rule("str"),
    "reasoning_effort": Rule("str"),
    "verbosity": Rule("str"),
    "prompt_cache_key": Rule("str"),
    "safety_identifier": Rule("str"),
    "audio": Rule("object"),
    "modalities": Rule("any"),
    "prediction": Rule("object"),
    "web_search_options": Rule("object"),
    "functions": Rule("any"),
    "function_call": Rule("any"),
}
_KIND_WORDS = {"int": "an integer", "number": "a decimal", "bool": "a boolean", "str": "a string"}


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"


def _openai_violation(v: Violation) -> UpstreamError:
    if v.problem == "type":
        expected = _KIND_WORDS.get(v.rule.kind, "an object")
        message = (
            f"Invalid type for '{v.name}': expected {expected}, but got {_json_kind(v.value)} "
            "instead."
        )
        return openai_error(400, message, param=v.name, code="invalid_type")
    kind = "integer" if v.rule.kind == "int" else "decimal"
    below = v.problem == "min"
    bound = num_text(v.rule.lo if below else v.rule.hi)
    where, sign = ("below minimum", ">=") if below else ("above maximum", "<=")
    message = (
        f"Invalid '{v.name}': {kind} {where} value. Expected a value {sign} {bound}, but got "
        f"{v.value} instead."
    )
    code = f"{kind}_{'below_min' if below else 'above_max'}_value"
    return openai_error(400, message, param=v.name, code=code)


def _missing(name: str) -> UpstreamError:
    return openai_error(
        400, f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
    )


def _invalid_value(name: str, value: Any, allowed: tuple[str, ...]) -> UpstreamError:
    shown = ", ".join(f"'{a}'" for a in allowed[:-1]) + f", and '{allowed[-1]}'"
    return openai_error(
        400,
        f"Invalid value: '{value}'. Supported values are: {shown}.",
        param=name,
        code="invalid_value",
    )


def _invalid_type(name: str, expected: str, value: Any) -> UpstreamError:
    message = (
        f"Invalid type for '{name}': expected {expected}, but got {_json_kind(value)} instead."
    )
    return openai_error(400, message, param=name, code="invalid_type")


def _check_openai_content(content: Any, name: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid_type(name, "one of a string or array of objects", content)
    for i, part in enumerate(content):
        where = f"{name}[{i}]"
        if not isinstance(part, dict):
            raise _invalid_type(where, "an object", part)
        kind = part.get("type")
        if kind is None:
            raise _missing(f"{where}.type")
        if kind == "text" and not isinstance(part.get("text"), str):
            raise _missing(f"{where}.text")


def _check_openai_message(m: Any, i: int, previous: list[Any]) -> None:
    name = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _invalid_type(name, "an object", m)
    role = m.get("role")
    if role is None:
        raise _missing(f"{name}.role")
    if role not in OPENAI_ROLES:
        raise _invalid_value(f"{name}.role", role, OPENAI_ROLES)
    if role == "assistant":
        if m.get("content") is None and not m.get("tool_calls") and not m.get("function_call"):
            raise _missing(f"{name}.content")
    elif m.get("content") is None:
        raise _missing(f"{name}.content")
    if m.get("content") is not None:
        _check_openai_content(m["content"], f"{name}.content")
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise _missing(f"{name}.tool_call_id")
        answered = any(isinstance(p, dict) and p.get("tool_calls") for p in previous[-1:])
        tools_before = previous and isinstance(previous[-1], dict) and previous[-1].get("role")
        if not answered and tools_before != "tool":
            raise openai_error(
                400,
                "Invalid parameter: messages with role 'tool' must be a response to a "
                "preceeding message with 'tool_calls'.",
                param=f"{name}.role",
            )


def _check_openai_messages(body: Mapping[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array of objects", messages)
    if not messages:
        raise openai_error(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            param="messages",
            code="empty_array",
        )
    for i, m in enumerate(messages):
        _check_openai_message(m, i, messages[:i])


def _check_openai_tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _invalid_type("tools", "an array of objects", tools)
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _invalid_type(where, "an object", tool)
        if tool.get("type") is None:
            raise _missing(f"{where}.type")
        if tool["type"] != "function":
            raise _invalid_value(f"{where}.type", tool["type"], ("function", "custom"))
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _missing(f"{where}.function")
        fname = function.get("name")
        if not isinstance(fname, str) or not _NAME.match(fname):
            raise openai_error(
                400,
                f"Invalid '{where}.function.name': string does not match pattern. Expected a "
                "string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                param=f"{where}.function.name",
                code="invalid_value",
            )
        params = function.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _invalid_type(f"{where}.function.parameters", "an object", params)
    return tools


def _check_openai_tool_choice(body: Mapping[str, Any], tools: list[dict[str, Any]]) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _invalid_value("tool_choice", choice, ("none", "auto", "required"))
    elif isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _missing("tool_choice.function.name")
    else:
        raise _invalid_type("tool_choice", "one of a string or object", choice)
    if not tools:
        raise openai_error(
            400,
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
            "specified.",
            param="tool_choice",
        )
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        if name not in {t["function"]["name"] for t in tools}:
            raise openai_error(
                400,
                f"Invalid value for 'tool_choice': function '{name}' is not one of the 'tools'.",
                param="tool_choice",
                code="invalid_value",
            )


def _check_openai_response_format(body: Mapping[str, Any]) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type")
    if kind is None:
        raise _missing("response_format.type")
    kinds = ("json_object", "json_schema", "text")
    if kind not in kinds:
        raise _invalid_value("response_format.type", kind, kinds)
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    for key in fmt:
        if key not in allowed:
            raise openai_error(
                400,
                f"Unknown parameter: 'response_format.{key}'.",
                param=f"response_format.{key}",
                code="unknown_parameter",
            )
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise _missing("response_format.json_schema")
        if not isinstance(spec.get("name"), str):
            raise _missing("response_format.json_schema.name")
    if kind == "json_object":
        texts = chat_prompt(body["messages"])
        if "json" not in texts.lower():
            raise openai_error(
                400,
                "'messages' must contain the word 'json' in some form, to use 'response_format' "
                "of type 'json_object'.",
                param="messages",
            )


def _openai_unknown(body: Mapping[str, Any]) -> None:
    unknown = [k for k in body if k not in OPENAI_CHAT_RULES]
    if len(unknown) == 1:
        raise openai_error(400, f"Unrecognized request argument supplied: {unknown[0]}")
    if unknown:
        raise openai_error(400, f"Unrecognized request arguments supplied: {', '.join(unknown)}")


def _openai_cross_checks(body: Mapping[str, Any], tools: list[dict[str, Any]]) -> None:
    if body.get("stream_options") is not None and not body.get("stream"):
        message = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise openai_error(400, message, param="stream_options")
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        raise openai_error(
            400,
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when "
            "'top_logprobs' is specified.",
            param="top_logprobs",
        )
    if body.get("parallel_tool_calls") is not None and not tools:
        raise openai_error(
            400,
            "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when "
            "'tools' are specified.",
            param="parallel_tool_calls",
        )


def parse_openai_chat(body: Any, window: int) -> ChatParams:
    if not isinstance(body, dict):
        raise openai_error(400, "We could not parse the JSON body of your request.")
    _openai_unknown(body)
    violations = check_all(body, OPENAI_CHAT_RULES)
    if violations:
        raise _openai_violation(violations[0])
    if not body.get("model"):
        raise openai_error(400, "you must provide a model parameter")
    _check_openai_messages(body)
    tools = _check_openai_tools(body)
    _check_openai_tool_choice(body, tools)
    _check_openai_response_format(body)
    _openai_cross_checks(body, tools)
    stops = parse_stops(body.get("stop"))
    if stops is None:
        raise openai_error(
            400, f"Invalid 'stop': {body.get('stop')!r} is not a string or array.", param="stop"
        )
    prompt = prompt_from_text(chat_prompt(body["messages"]))
    bound = _bound(body)
    max_tokens = _openai_context(len(prompt), bound, window)
    options = body.get("stream_options") or {}
    return ChatParams(
        model=body["model"],
        prompt=prompt,
        last_user=last_user_text(body["messages"]),
        n=body.get("n") or 1,
        max_tokens=max_tokens,
        stops=stops,
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        logprobs=bool(body.get("logprobs")),
        top_logprobs=body.get("top_logprobs") or 0,
        seed=body.get("seed"),
        tools=tuple(tools),
        tool_choice=body.get("tool_choice"),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        response_format=body.get("response_format"),
    )


def _bound(body: Mapping[str, Any]) -> int | None:
    """max_completion_tokens wins over max_tokens."""
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            return int(body[name])
    return None


def _openai_context(prompt_tokens: int, bound: int | None, window: int) -> int:
    if bound is None:
        if prompt_tokens >= window:
            message = (
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the "
                "messages."
            )
            raise openai_error(400, message, param="messages", code="context_length_exceeded")
        return min(CHAT_DEFAULT_MAX_TOKENS, window - prompt_tokens)
    total = prompt_tokens + bound
    if total > window:
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{total} tokens ({prompt_tokens} in the messages, {bound} in the completion). "
            "Please reduce the length of the messages or completion."
        )
        raise openai_error(400, message, param="messages", code="context_length_exceeded")
    return bound


# ---------------------------------------------------------------- Fireworks

FIREWORKS_CHAT_RULES: dict[str, Rule] = {
    "model": Rule("str"),
    "messages": Rule("any"),
    "tools": Rule("any"),
    "tool_choice": Rule("any"),
    "parallel_tool_calls": Rule("bool"),
    "max_tokens": Rule("int", 1),
    "max_completion_tokens": Rule("int", 1),
    "prompt_truncate_len": Rule("int", 0),
    "temperature": Rule("number", 0, 2),
    "top_p": Rule("number", 0, 1),
    "top_k": Rule("int", 0, 100),
    "min_p": Rule("number", 0, 1),
    "typical_p": Rule("number", 0, 1),
    "frequency_penalty": Rule("number", -2, 2),
    "presence_penalty": Rule("number", -2, 2),
    "repetition_penalty": Rule("number", 0, 2),
    "mirostat_target": Rule("number"),
    "mirostat_lr": Rule("number"),
    "n": Rule("int", 1, 128),
    "stop": Rule("any"),
    "response_format": Rule("object"),
    "stream": Rule("bool"),
    "context_length_exceeded_behavior": Rule("str", choices=("truncate", "error")),
    "user": Rule("str"),
    "logprobs": Rule("bool"),
    "top_logprobs": Rule("int", 0, FIREWORKS_MAX_TOP_LOGPROBS),
    "ignore_eos": Rule("bool"),
    "seed": Rule("int"),
    "logit_bias": Rule("object"),
    "reasoning_effort": Rule("any"),
    "prediction": Rule("any"),
    "metadata": Rule("object"),
    "raw_output": Rule("bool"),
    "echo": Rule("bool"),
    "perf_metrics_in_response": Rule("bool"),
    "prompt_cache_isolation_key": Rule("str"),
}
FIREWORKS_FORMATS = ("json_object", "json_schema", "grammar", "text")


def _fireworks_item(v: Violation) -> dict[str, Any]:
    """As for completions (dialect_fireworks), but `logprobs` is a boolean here."""
    if v.problem in ("min", "max"):
        below = v.problem == "min"
        bound = num_text(v.rule.lo if below else v.rule.hi)
        word, kind = ("greater", "greater_than_equal") if below else ("less", "less_than_equal")
        return detail_item(v.name, f"Input should be {word} than or equal to {bound}", kind)
    if v.problem == "choice":
        allowed = " or ".join(f"'{c}'" for c in v.rule.choices)
        return detail_item(v.name, f"Input should be {allowed}", "literal_error")
    kinds = {
        "int": ("integer", "int_type"),
        "number": ("number", "float_type"),
        "bool": ("boolean", "bool_type"),
        "str": ("string", "string_type"),
    }
    word, type_ = kinds.get(v.rule.kind, ("dictionary", "dict_type"))
    return detail_item(v.name, f"Input should be a valid {word}", type_)


def _at(*loc: str | int) -> list[str | int]:
    return ["body", *loc]


def _fireworks_message_items(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        return [
            {"loc": _at("messages"), "msg": "Input should be a valid list", "type": "list_type"}
        ]
    if not messages:
        return [
            {
                "loc": _at("messages"),
                "msg": "List should have at least 1 item after validation, not 0",
                "type": "too_short",
            }
        ]
    items = []
    allowed = " or ".join(f"'{r}'" for r in FIREWORKS_ROLES)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            items.append(
                {
                    "loc": _at("messages", i),
                    "msg": "Input should be a valid dictionary",
                    "type": "dict_type",
                }
            )
        elif m.get("role") not in FIREWORKS_ROLES:
            items.append(
                {
                    "loc": _at("messages", i, "role"),
                    "msg": f"Input should be {allowed}",
                    "type": "literal_error",
                }
            )
    return items


def _fireworks_format_items(fmt: Any) -> list[dict[str, Any]]:
    if not isinstance(fmt, dict):
        return []
    if fmt.get("type") not in FIREWORKS_FORMATS:
        allowed = ", ".join(f"'{t}'" for t in FIREWORKS_FORMATS)
        return [
            {
                "loc": _at("response_format", "type"),
                "msg": f"Input should be {allowed}",
                "type": "literal_error",
            }
        ]
    if fmt["type"] == "grammar" and not isinstance(fmt.get("grammar"), str):
        return [
            {"loc": _at("response_format", "grammar"), "msg": "Field required", "type": "missing"}
        ]
    return []


def _fireworks_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = [
        detail_item(k, "Field required", "missing") for k in ("model", "messages") if k not in body
    ]
    items += [
        detail_item(k, "Extra inputs are not permitted", "extra_forbidden")
        for k in body
        if k not in FIREWORKS_CHAT_RULES
    ]
    items += [_fireworks_item(v) for v in check_all(body, FIREWORKS_CHAT_RULES)]
    if "messages" in body:
        items += _fireworks_message_items(body["messages"])
    items += _fireworks_format_items(body.get("response_format"))
    return items


def parse_fireworks_chat(body: Any, window: int) -> ChatParams:
    if not isinstance(body, dict):
        raise validation_error([detail_item(0, "JSON decode error", "json_invalid")])
    items = _fireworks_items(body)
    if items:
        raise validation_error(items)
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise fireworks_request_error(
            400, "Only one of max_tokens and max_completion_tokens may be set."
        )
    stops = parse_stops(body.get("stop"))
    if stops is None:
        raise validation_error(
            [detail_item("stop", "Input should be a valid string or list", "union_tag_invalid")]
        )
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("function", {}).get("name") not in {
        t.get("function", {}).get("name") for t in tools if isinstance(t, dict)
    }:
        raise fireworks_request_error(400, "tool_choice names a function that is not in tools.")
    prompt = prompt_from_text(chat_prompt(body["messages"]))
    truncate = body.get("context_length_exceeded_behavior") != "error"
    bound = _bound(body)
    max_tokens = CHAT_DEFAULT_MAX_TOKENS if bound is None else bound
    _fireworks_context(len(prompt), max_tokens, window, truncate)
    return ChatParams(
        model=body["model"],
        prompt=prompt,
        last_user=last_user_text(body["messages"]),
        n=body.get("n") or 1,
        max_tokens=max_tokens,
        stops=stops,
        stream=bool(body.get("stream")),
        logprobs=bool(body.get("logprobs")),
        top_logprobs=body.get("top_logprobs") or 0,
        seed=body.get("seed"),
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        response_format=body.get("response_format"),
        ignore_eos=bool(body.get("ignore_eos")),
        truncate=truncate,
    )


def _fireworks_context(prompt_tokens: int, max_tokens: int, window: int, truncate: bool) -> None:
    if prompt_tokens >= window:
        raise fireworks_request_error(
            400,
            f"The prompt is too long: {prompt_tokens} tokens, the model's maximum context length "
            f"is {window} tokens.",
        )
    total = prompt_tokens + max_tokens
    if total > window and not truncate:
        raise fireworks_request_error(
            400,
            f"The prompt plus max_tokens is too long: {prompt_tokens} + {max_tokens} = {total} "
            f"tokens, the model's maximum context length is {window} tokens.",
        )

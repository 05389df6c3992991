"""`POST /v1/chat/completions`: OpenAI's CreateChatCompletionRequest declared as data, with the
provider extensions and vLLM's chat extras, and the request the gateway builds from a body.

`parse_chat` does the single JSON parse of a body and validates every known field from the
declaration (`CHAT`), then OpenAI's rules between fields (`CROSS_CHECKS`) and the gateway's own
bounds. Fields a target cannot serve (audio, web search, an image on a text-only model) are the
target's to refuse, naming them. Unknown fields are kept as sent, for the dialects to decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from core import messages as m
from core import structured as rf
from core.checks import obj
from core.completions import (
    EXTENSIONS,
    MIROSTAT_RULE,
    SAMPLING,
    STREAM_OPTIONS_RULE,
    VLLM_EXTRAS,
    CrossCheck,
    RequestLimits,
    cross_check,
)
from core.errors import InvalidRequest
from core.fields import (
    OPENAI,
    VLLM,
    Declaration,
    boolean,
    choice,
    integer,
    string,
    structured,
)
from core.wire import validated

MAX_TOP_LOGPROBS = 20  # OpenAI's

CHAT = Declaration(
    "CreateChatCompletionRequest",
    required=("model", "messages"),
    fields=(
        structured("messages", ("array",), m.messages),
        string("model"),
        boolean("logprobs", default=False),
        integer("top_logprobs", 0, MAX_TOP_LOGPROBS),
        integer("max_tokens", 1),
        integer("max_completion_tokens", 1),
        structured("response_format", ("object",), rf.chat_response_format),
        *SAMPLING,
        structured("tools", ("array",), m.tools),
        structured("tool_choice", ("string", "object"), m.tool_choice),
        boolean("parallel_tool_calls", default=True),
        structured("metadata", ("object",), m.metadata),
        boolean("store"),
        choice("service_tier", "auto", "default", "flex", "scale", "priority"),
        choice("reasoning_effort", "none", "minimal", "low", "medium", "high"),
        choice("verbosity", "low", "medium", "high"),
        string("prompt_cache_key"),
        string("safety_identifier"),
        # OpenAI's audio and search: served by OpenAI alone (the other targets refuse them).
        structured("audio", ("object",), obj),
        structured("modalities", ("array",), rf.strings),
        structured("prediction", ("object",), obj),
        structured("web_search_options", ("object",), obj),
        *EXTENSIONS,
        # vLLM's chat extras (its ChatCompletionRequest), as vLLM checks them, then the ones
        # its completions take too.
        boolean("echo", family=VLLM),
        boolean("add_generation_prompt", family=VLLM),
        boolean("continue_final_message", family=VLLM),
        string("chat_template", family=VLLM),
        structured("chat_template_kwargs", ("object",), obj, family=VLLM),
        structured("documents", ("array",), rf.documents, family=VLLM),
        *VLLM_EXTRAS,
    ),
)
FIELDS = CHAT.names()
OPENAI_FIELDS = CHAT.names(OPENAI)
VLLM_FIELDS = CHAT.names(VLLM)


@dataclass(slots=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    n: int
    # The caller's bound on generated tokens (max_completion_tokens, else max_tokens); None:
    # what the context window leaves, as OpenAI and vLLM do.
    max_tokens: int | None
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int | None
    fields: dict[str, Any]  # every non-null field as sent (validated), unknown ones included
    unknown: tuple[str, ...] = field(default=())
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats


CROSS_CHECKS = (
    STREAM_OPTIONS_RULE,
    CrossCheck(
        lambda f: "top_logprobs" in f and not f.get("logprobs", False),
        "'top_logprobs' requires 'logprobs' to be true.",
        "top_logprobs",
    ),
    CrossCheck(
        lambda f: "tool_choice" in f and f["tool_choice"] != "none" and not f.get("tools"),
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
        "specified.",
        "tool_choice",
    ),
    CrossCheck(
        lambda f: "parallel_tool_calls" in f and not f.get("tools"),
        "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when "
        "'tools' are specified.",
        "parallel_tool_calls",
    ),
    MIROSTAT_RULE,
)


def parse_chat(body: bytes, limits: RequestLimits) -> ChatRequest:
    return validated(body, lambda data: validate_chat(data, limits))


def validate_chat(data: Mapping[str, Any], limits: RequestLimits) -> ChatRequest:
    fields, unknown = CHAT.validate(data)
    cross_check(CROSS_CHECKS, fields)
    _named_tool(fields)
    usage = fields.get("stream_options", {})
    req = ChatRequest(
        model=fields["model"],
        messages=fields["messages"],
        n=fields.get("n", 1),
        max_tokens=fields.get("max_completion_tokens", fields.get("max_tokens")),
        stream=fields.get("stream", False),
        include_usage=bool(usage.get("include_usage")),
        logprobs=fields.get("logprobs", False),
        top_logprobs=fields.get("top_logprobs"),
        fields=fields,
        unknown=unknown,
        continuous_usage=bool(usage.get("include_usage") and usage.get("continuous_usage_stats")),
    )
    _bounds(req, limits)
    return req


def _named_tool(f: Mapping[str, Any]) -> None:
    """A named tool_choice must name one of the tools."""
    chosen = f.get("tool_choice")
    if not isinstance(chosen, dict):
        return
    name = chosen["function"]["name"]
    if name not in {t["function"]["name"] for t in f.get("tools", ())}:
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': no function named '{name}' is in 'tools'.",
            param="tool_choice.function.name",
        )


def _bounds(req: ChatRequest, limits: RequestLimits) -> None:
    for name, value, bound in (
        ("n", req.n, limits.max_n),
        (_tokens_field(req), req.max_tokens or 0, limits.max_tokens),
    ):
        if value > bound:
            raise InvalidRequest(
                f"'{name}' is {value}; this gateway allows at most {bound}.", param=name
            )


def _tokens_field(req: ChatRequest) -> str:
    return "max_completion_tokens" if "max_completion_tokens" in req.fields else "max_tokens"


def apply_chat_defaults(req: ChatRequest, defaults: Mapping[str, Any]) -> ChatRequest:
    """Model-level defaults fill only the fields the caller did not set. An alias's defaults
    are written for completions: those that are chat fields with a valid chat value apply
    (`max_tokens`, `temperature`, `top_k`, …); the others (`logprobs` as a count, `best_of`,
    `suffix`) mean nothing to a chat and are left out."""
    missing = {k: v for k, v in defaults.items() if k not in req.fields and _applies(k, v)}
    if not missing:
        return req
    fields = missing | req.fields
    tokens = fields.get("max_completion_tokens", fields.get("max_tokens"))
    return replace(req, fields=fields, max_tokens=tokens)


def _applies(name: str, value: Any) -> bool:
    if name not in CHAT or name in CHAT.required:
        return False
    try:
        CHAT.check(name, value)
    except InvalidRequest:
        return False
    return True


def apply_chat_overrides(
    req: ChatRequest, overrides: Mapping[str, Any], limits: RequestLimits
) -> ChatRequest:
    """Portkey's override_params win over the caller's fields; the result is checked whole."""
    return validate_chat({**req.fields, **overrides}, limits)

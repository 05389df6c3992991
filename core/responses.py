"""`POST /v1/responses`: OpenAI's CreateResponse request declared as data, with the provider
extensions and the extras vLLM's ResponsesRequest takes, and the request the gateway builds from a
body.

`parse_responses` does the single JSON parse of a body and validates every known field from the
declaration (`RESPONSES`; the input items, tools and formats by `core.response_items`), then
OpenAI's rules between fields (`CROSS_CHECKS`), the features this gateway does not implement
(`conversation`, stored `prompt`s, `background` responses) and the gateway's own bounds. Unknown
fields are kept as sent, for the dialects to decide; whether a target can run a hosted tool is
the target's to say (`hosted_tools`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from core import messages as m
from core import response_items as ri
from core.answers import Upstream
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
    Field,
    boolean,
    choice,
    integer,
    object_of,
    string,
    structured,
)
from core.response_items import hosted_tool_choice as hosted_tool_choice
from core.response_items import hosted_tools as hosted_tools
from core.wire import validated

MIN_OUTPUT_TOKENS = 16  # OpenAI's floor of max_output_tokens
MAX_TOP_LOGPROBS = 20  # OpenAI's
# OpenAI's (its SDK's ServiceTier and ReasoningEffort): wider than the chat's older lists.
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast", "ultrafast")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SUMMARIES = ("auto", "concise", "detailed")

_SAMPLING = MappingProxyType({f.name: f for f in SAMPLING})
_VLLM = MappingProxyType({f.name: f for f in VLLM_EXTRAS})


def _from_vllm(*names: str) -> tuple[Field, ...]:
    """Sampling fields of the completions that OpenAI's Responses does not have and vLLM's
    does: the same checks and ranges, vLLM's family here (OpenAI's table must not pass them)."""
    return tuple(replace(_SAMPLING[n], family=VLLM) for n in names)


RESPONSES = Declaration(
    "CreateResponse",
    required=("model", "input"),
    fields=(
        string("model"),
        structured("input", ("string", "array"), ri.input_items),
        string("instructions"),
        integer("max_output_tokens", MIN_OUTPUT_TOKENS),
        integer("max_tool_calls", 1),
        _SAMPLING["temperature"],
        _SAMPLING["top_p"],
        integer("top_logprobs", 0, MAX_TOP_LOGPROBS),
        _SAMPLING["stream"],
        object_of("stream_options", boolean("include_obfuscation")),
        boolean("store", default=True),
        string("previous_response_id"),
        structured("conversation", ("string", "object"), ri.conversation),
        boolean("background", default=False),
        structured("include", ("array",), ri.include),
        structured("metadata", ("object",), m.metadata),
        _SAMPLING["user"],
        string("safety_identifier"),
        string("prompt_cache_key"),
        choice("prompt_cache_retention", "in_memory", "24h"),
        choice("service_tier", *SERVICE_TIERS),
        choice("truncation", "auto", "disabled", default="disabled"),
        boolean("parallel_tool_calls", default=True),
        structured("tools", ("array",), ri.tools),
        structured("tool_choice", ("string", "object"), ri.tool_choice),
        # Its format is checked beyond its type (a json_schema's name and schema).
        replace(
            object_of(
                "text",
                structured("format", ("object",), ri.text_format),
                choice("verbosity", "low", "medium", "high"),
            ),
            structured=True,
        ),
        object_of(
            "reasoning",
            choice("effort", *EFFORTS),
            choice("summary", *SUMMARIES),
            choice("generate_summary", *SUMMARIES),
        ),
        structured("prompt", ("object",), ri.prompt),
        *EXTENSIONS,
        # vLLM's extras of its ResponsesRequest, as its completions declare them.
        *_from_vllm("seed", "frequency_penalty", "presence_penalty", "logit_bias", "stop"),
        *(
            _VLLM[n]
            for n in (
                "skip_special_tokens",
                "include_stop_str_in_output",
                "stop_token_ids",
                "structured_outputs",
                "vllm_xargs",
                "priority",
            )
        ),
        string("cache_salt", family=VLLM),
    ),
)
FIELDS = RESPONSES.names()
OPENAI_FIELDS = RESPONSES.names(OPENAI)
VLLM_FIELDS = RESPONSES.names(VLLM)


@dataclass(slots=True)
class ResponsesRequest:
    model: str
    # The input items as validated; a string input is one user message item:
    # {"type": "message", "role": "user", "content": "<the string>"}. Every message item has
    # its "type" ("message"), added when the caller left it out; so has an item reference sent
    # as only its id ("item_reference"): every item has its type.
    input: list[dict[str, Any]]
    instructions: str | None
    # The caller's bound on generated tokens; None: what the context window leaves.
    max_output_tokens: int | None
    stream: bool
    store: bool  # OpenAI's default: true
    previous_response_id: str | None
    fields: dict[str, Any]  # every non-null field as sent (validated), unknown ones included
    unknown: tuple[str, ...] = ()
    # The items of the conversation before this turn (previous_response_id), as the gateway
    # rebuilt them from its store: what a target that does not store them is sent first.
    history: list[dict[str, Any]] = field(default_factory=list)
    # The turn before, when an upstream that keeps responses answered it: the provider, its id
    # there, and whether it holds the whole conversation (a target of the same provider may
    # continue from that id instead of being sent the history).
    previous_upstream: Upstream | None = None


def _unserved(name: str, instead: str) -> str:
    return f"'{name}' is not supported by this gateway: {instead}"


CROSS_CHECKS = (
    STREAM_OPTIONS_RULE,
    CrossCheck(
        lambda f: "conversation" in f,
        "Mutually exclusive parameters: Ensure you are only providing one of: "
        "'previous_response_id' or 'conversation'.",
        "previous_response_id",
    ),
    CrossCheck(
        lambda f: "conversation" in f,
        _unserved(
            "conversation",
            "send the conversation's items in 'input', or continue a response with "
            "'previous_response_id'.",
        ),
        "conversation",
    ),
    CrossCheck(
        lambda f: "prompt" in f,
        _unserved("prompt", "send the prompt's text in 'instructions' and 'input'."),
        "prompt",
    ),
    CrossCheck(
        lambda f: f.get("background") is True,
        _unserved("background", "send the request without it (or with 'stream': true)."),
        "background",
    ),
    # OpenAI's Responses takes "auto" and "none" without tools (they force nothing); a choice
    # that forces a tool ("required", a named or hosted tool, allowed tools) needs tools.
    CrossCheck(
        lambda f: f["tool_choice"] not in ri.CHOICES_WITHOUT_TOOLS and not f.get("tools"),
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
        "specified.",
        "tool_choice",
    ),
    MIROSTAT_RULE,
)


def parse_responses(body: bytes, limits: RequestLimits) -> ResponsesRequest:
    return validated(body, lambda data: validate_responses(data, limits))


def validate_responses(data: Mapping[str, Any], limits: RequestLimits) -> ResponsesRequest:
    fields, unknown = RESPONSES.validate(data)
    cross_check(CROSS_CHECKS, fields)
    ri.named_tools(fields)
    req = ResponsesRequest(
        model=fields["model"],
        input=ri.as_items(fields["input"]),
        instructions=fields.get("instructions"),
        max_output_tokens=fields.get("max_output_tokens"),
        stream=fields.get("stream", False),
        store=fields.get("store", True),
        previous_response_id=fields.get("previous_response_id"),
        fields=fields,
        unknown=unknown,
    )
    if (req.max_output_tokens or 0) > limits.max_tokens:
        raise InvalidRequest(
            f"'max_output_tokens' is {req.max_output_tokens}; this gateway allows at most "
            f"{limits.max_tokens}.",
            param="max_output_tokens",
        )
    return req


def apply_responses_defaults(
    req: ResponsesRequest, defaults: Mapping[str, Any]
) -> ResponsesRequest:
    """Model-level defaults fill only the fields the caller did not set. An alias's defaults are
    written for completions: those that are Responses fields with a valid value apply
    (`max_tokens` as `max_output_tokens`); the others (`n`, `logprobs` as a count, `best_of`)
    mean nothing to a response and are left out."""
    missing: dict[str, Any] = {}
    for name, value in defaults.items():
        name = "max_output_tokens" if name == "max_tokens" else name
        if name in req.fields or name not in RESPONSES or name in RESPONSES.required:
            continue
        try:
            missing[name] = RESPONSES.check(name, value)
        except InvalidRequest:
            continue
    if not missing:
        return req
    fields = missing | req.fields
    return replace(req, fields=fields, max_output_tokens=fields.get("max_output_tokens"))


def spoken(req: ResponsesRequest) -> ResponsesRequest:
    """The request, if its conversation says anything: an empty `input` with no instructions
    and no earlier turns gives a model nothing to answer (a 400 naming `input`, before any
    target is asked)."""
    if not req.input and not req.history and not req.instructions:
        raise InvalidRequest(
            "Invalid 'input': the conversation is empty; send at least one input item, or "
            "instructions.",
            param="input",
        )
    return req


def apply_responses_overrides(
    req: ResponsesRequest, overrides: Mapping[str, Any], limits: RequestLimits
) -> ResponsesRequest:
    """Portkey's override_params win over the caller's fields; the result is checked whole (the
    history rebuilt for this turn is kept)."""
    again = validate_responses({**req.fields, **overrides}, limits)
    again.history, again.previous_upstream = req.history, req.previous_upstream
    return again

"""`POST /v1/completions`: OpenAI's CreateCompletionRequest declared as data, with the provider
extensions and vLLM's extras, and the request the gateway builds from a body.

`parse_completion` does the single JSON parse of a body and validates every known field from the
declaration (`COMPLETIONS`), then the rules between fields OpenAI states (`CROSS_CHECKS`) and the
gateway's own bounds (`RequestLimits`). Unknown fields are kept as sent; the dialect rules of the
serving provider decide what happens to them. Checks that only vLLM makes between its extras run
on vLLM's paths (`providers.rules.vllm_checks`). Every error names its parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from core import structured as rf
from core.checks import INT64_MAX, INT64_MIN
from core.errors import InvalidRequest
from core.fields import (
    EXTENSION,
    OPENAI,
    VLLM,
    Declaration,
    boolean,
    choice,
    integer,
    number,
    object_of,
    string,
)
from core.fields import structured as obj
from core.wire import validated

CONTEXT = "context_length_exceeded_behavior"  # the extension's name
CONTEXT_BEHAVIORS = ("error", "truncate")
DEFAULT_MAX_TOKENS = 16  # OpenAI's: an absent or null max_tokens means 16


# Fields the generation endpoints (completions, chat) share, declared once.
SAMPLING = (
    number("frequency_penalty", -2.0, 2.0, default=0),
    obj("logit_bias", ("object",), rf.logit_bias),
    integer("n", 1, 128, default=1),
    number("presence_penalty", -2.0, 2.0, default=0),
    integer("seed", INT64_MIN, INT64_MAX, by_target=True),  # OpenAI's and vLLM's: int64
    obj("stop", ("string", "array"), rf.stop),
    boolean("stream", default=False),
    object_of(
        "stream_options",
        boolean("include_usage"),
        boolean("include_obfuscation"),
        boolean("continuous_usage_stats", family=VLLM),
    ),
    number("temperature", 0.0, 2.0, default=1),
    number("top_p", 0.0, 1.0, default=1),
    string("user"),
)
# The provider extensions every target may serve (a dialect's table says which do).
EXTENSIONS = (
    choice(CONTEXT, *CONTEXT_BEHAVIORS, family=EXTENSION),
    boolean("ignore_eos", family=EXTENSION),
    number("mirostat_target", 0.0, lo_open=True, family=EXTENSION),
    number("mirostat_lr", 0.0, lo_open=True, family=EXTENSION),
    integer("top_k", -1, family=EXTENSION),
    number("repetition_penalty", 0.0, lo_open=True, family=EXTENSION),
    number("min_p", 0.0, 1.0, family=EXTENSION),
)
# vLLM's own extras of both its requests: types and ranges as vLLM checks them.
VLLM_EXTRAS = (
    integer("prompt_logprobs", -1, family=VLLM),
    boolean("return_token_ids", family=VLLM),
    boolean("return_tokens_as_token_ids", family=VLLM),
    integer("truncate_prompt_tokens", -1, INT64_MAX, family=VLLM),
    choice("truncation_side", "left", "right", family=VLLM),
    integer("min_tokens", 0, family=VLLM),
    obj("stop_token_ids", ("array",), rf.token_id_list, family=VLLM),
    boolean("include_stop_str_in_output", family=VLLM),
    boolean("skip_special_tokens", family=VLLM),
    boolean("spaces_between_special_tokens", family=VLLM),
    obj("bad_words", ("array",), rf.strings, family=VLLM),
    obj("allowed_token_ids", ("array",), rf.token_id_list, family=VLLM),
    obj("logprob_token_ids", ("array",), rf.token_id_list, family=VLLM),
    obj("structured_outputs", ("object",), rf.structured_outputs, family=VLLM),
    boolean("use_beam_search", family=VLLM),
    number("length_penalty", family=VLLM),
    boolean("add_special_tokens", family=VLLM),
    obj("vllm_xargs", ("object",), rf.xargs, family=VLLM),
    integer("priority", INT64_MIN, INT64_MAX, family=VLLM),
)

COMPLETIONS = Declaration(
    "CreateCompletionRequest",
    required=("model", "prompt"),
    fields=(
        string("model"),
        obj("prompt", ("string", "array"), rf.prompt),
        integer("best_of", 0, 20),
        boolean("echo", default=False),
        # OpenAI's cap of 5 is the dialects' (providers.rules.params); vLLM allows up to its
        # max_logprobs, and -1 for the whole vocabulary.
        integer("logprobs", -1),
        integer("max_tokens", 0, default=DEFAULT_MAX_TOKENS),
        string("suffix"),
        *SAMPLING,
        *EXTENSIONS,
        obj("response_format", ("object",), rf.response_format, family=EXTENSION),
        *VLLM_EXTRAS,
    ),
)


# The declaration's names by family: what dialect tables are written against.
FIELDS = COMPLETIONS.names()
OPENAI_FIELDS = COMPLETIONS.names(OPENAI)
VLLM_FIELDS = COMPLETIONS.names(VLLM)
# Keys inside object fields that dialects treat apart from their field (`params` sub-rows).
SUB_FIELDS = COMPLETIONS.sub_fields(EXTENSION, VLLM)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds the gateway enforces on top of OpenAI's ranges (config `server:`)."""

    max_n: int = 128
    max_best_of: int = 20
    max_tokens: int = 32768
    max_prompts: int = 2048
    max_choices: int = 512  # prompts x max(n, best_of): one request's total generations


@dataclass(slots=True)
class CompletionRequest:
    model: str
    prompts: list[str] | list[list[int]]  # always a batch; one element for a single prompt
    prompt_is_tokens: bool
    n: int
    best_of: int | None
    max_tokens: int  # effective value: 16 when absent or null
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    logprobs: int | None
    echo: bool
    fields: dict[str, Any]  # every non-null field as sent (validated), unknown ones included
    unknown: tuple[str, ...] = field(default=())
    # vLLM's `stream_options.continuous_usage_stats` (with include_usage, as vLLM reads it):
    # each content chunk carries its choice's usage so far.
    continuous_usage: bool = False

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)


@dataclass(frozen=True, slots=True)
class CrossCheck:
    """A rule between fields: when `broken` holds for the validated fields, a 400 naming
    `param`. Every rule is about the field it names: it is asked only when that was sent."""

    broken: Callable[[Mapping[str, Any]], bool]
    message: str
    param: str


def cross_check(rules: tuple[CrossCheck, ...], fields: Mapping[str, Any]) -> None:
    for rule in rules:
        if rule.param in fields and rule.broken(fields):
            raise InvalidRequest(rule.message, param=rule.param)


# The rules between fields every generation request has (completions, chat, responses).
STREAM_OPTIONS_RULE = CrossCheck(
    lambda f: "stream_options" in f and not f.get("stream", False),
    "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    "stream_options",
)
MIROSTAT_RULE = CrossCheck(
    lambda f: "mirostat_lr" in f and "mirostat_target" not in f,
    "'mirostat_lr' requires 'mirostat_target'.",
    "mirostat_lr",
)

CROSS_CHECKS = (
    STREAM_OPTIONS_RULE,
    CrossCheck(
        lambda f: f.get("best_of") not in (None, 1) and bool(f.get("stream", False)),
        "'best_of' cannot be used with 'stream'.",
        "best_of",
    ),
    CrossCheck(
        lambda f: f.get("best_of") is not None and f["best_of"] < f.get("n", 1),
        "'best_of' must be greater than or equal to 'n'.",
        "best_of",
    ),
    MIROSTAT_RULE,
    CrossCheck(
        lambda f: f.get("max_tokens") == 0 and not f.get("echo", False),
        "'max_tokens' may be 0 only with 'echo'.",
        "max_tokens",
    ),
)


def parse_completion(body: bytes, limits: RequestLimits) -> CompletionRequest:
    return validated(body, lambda data: validate_completion(data, limits))


# vLLM's input `prompt_embeds` stands in for a prompt there; with neither, vLLM's wording.
NO_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."
EMBEDS_UNSERVED = (
    "Prompt embeddings ('prompt_embeds') are not served through the gateway: send the prompt as "
    "text or token ids."
)


def validate_completion(data: Mapping[str, Any], limits: RequestLimits) -> CompletionRequest:
    if "prompt_embeds" in data and data.get("prompt") in (None, ""):
        embeds = data["prompt_embeds"]
        if embeds is None or embeds == []:
            raise InvalidRequest(NO_PROMPT, param="prompt")
        if data.get("prompt") is None:
            raise InvalidRequest(EMBEDS_UNSERVED, param="prompt_embeds")
    fields, unknown = COMPLETIONS.validate(data)
    cross_check(CROSS_CHECKS, fields)
    return _build(fields, unknown, limits)


def _build(f: dict[str, Any], unknown: tuple[str, ...], limits: RequestLimits) -> CompletionRequest:
    prompt = f["prompt"]
    is_tokens = type(prompt) is list and type(prompt[0]) is not str
    prompts = [prompt] if type(prompt) is str or (is_tokens and type(prompt[0]) is int) else prompt
    stop = f.get("stop", ())
    usage = f.get("stream_options", {})
    req = CompletionRequest(
        model=f["model"],
        prompts=prompts,
        prompt_is_tokens=is_tokens,
        n=f.get("n", 1),
        best_of=f.get("best_of"),
        max_tokens=f.get("max_tokens", DEFAULT_MAX_TOKENS),
        stream=f.get("stream", False),
        include_usage=bool(usage.get("include_usage")),
        stop=(stop,) if type(stop) is str else tuple(stop),
        logprobs=f.get("logprobs"),
        echo=f.get("echo", False),
        fields=f,
        unknown=unknown,
        continuous_usage=bool(usage.get("include_usage") and usage.get("continuous_usage_stats")),
    )
    _bounds(req, limits)
    return req


def _bounds(req: CompletionRequest, limits: RequestLimits) -> None:
    best_of = req.best_of or 1
    if (
        req.n_prompts * max(req.n, best_of) <= limits.max_choices
        and req.max_tokens <= limits.max_tokens
        and req.n_prompts <= limits.max_prompts
        and req.n <= limits.max_n
        and best_of <= limits.max_best_of
    ):
        return  # the usual request: within every bound, no message to build
    checks = (
        ("n", req.n, limits.max_n),
        ("best_of", req.best_of or 0, limits.max_best_of),
        ("max_tokens", req.max_tokens, limits.max_tokens),
        ("prompt", req.n_prompts, limits.max_prompts),
    )
    for name, value, bound in checks:
        if value > bound:
            raise InvalidRequest(
                f"'{name}' is {value}; this gateway allows at most {bound}.", param=name
            )
    choices = req.n_prompts * max(req.n, req.best_of or 1)
    if choices > limits.max_choices:
        raise InvalidRequest(
            f"The request asks for {choices} generations (prompts x max(n, best_of)); "
            f"this gateway allows at most {limits.max_choices}.",
            param="n",
        )


def apply_defaults(req: CompletionRequest, defaults: Mapping[str, Any]) -> CompletionRequest:
    """Model-level defaults fill only the fields the caller did not set."""
    missing = {k: v for k, v in defaults.items() if k not in req.fields}
    if not missing:
        return req
    return replace(
        req,
        fields=missing | req.fields,
        max_tokens=missing.get("max_tokens", req.max_tokens),
    )


def apply_overrides(
    req: CompletionRequest, overrides: Mapping[str, Any], limits: RequestLimits
) -> CompletionRequest:
    """Portkey's override_params: they win over the caller's fields (`{...body, ...override}`),
    and the result is checked as a whole, as a caller's request would be."""
    return validate_completion({**req.fields, **overrides}, limits)

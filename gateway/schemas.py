"""The one definition of the completions API: request fields, their types and ranges.

`parse_completion` does the single JSON parse of a body and validates every known field
(protocol.md §1, plus the provider extensions). Unknown fields are kept as sent; the dialect
rules of the serving provider decide what happens to them. Every error names its parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gateway.checks import Validator, batch, checked, parse_json
from gateway.checks import bad as _bad
from gateway.checks import boolean as _bool
from gateway.checks import choice as _choice
from gateway.checks import integer as _int
from gateway.checks import number as _number
from gateway.checks import obj as _object
from gateway.checks import string as _string
from gateway.checks import token_ids as _tokens
from gateway.errors import InvalidRequest

CONTEXT_BEHAVIORS = ("error", "truncate")
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
DEFAULT_MAX_TOKENS = 16


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


# ---------------------------------------------------------------- structured fields


def _prompt(v: Any, name: str) -> Any:
    if type(v) is str:
        return v
    if type(v) is not list or not v:
        raise _bad(name, "a string, an array of strings, or a non-empty array of token ids", v)
    batch(v, name, empty_strings=True)
    return v


def _stop(v: Any, name: str) -> Any:
    if type(v) is str:
        if not v:
            raise _bad(name, "a non-empty string", v)
        return v
    if type(v) is not list or not 1 <= len(v) <= 4:
        raise _bad(name, "a string or an array of 1 to 4 strings", v)
    for i, s in enumerate(v):
        if type(s) is not str or not s:
            raise _bad(f"{name}[{i}]", "a non-empty string", s)
    return v


def _logit_bias(v: Any, name: str) -> dict[str, Any]:
    _object(v, name)
    for key, bias in v.items():
        if not key.isdigit():
            raise _bad(f"{name}.{key}", "a token id as a string key", key)
        if type(bias) not in (int, float) or not -100 <= bias <= 100:
            raise _bad(f"{name}.{key}", "a number between -100 and 100", bias)
    return v  # type: ignore[no-any-return]


def _stream_options(v: Any, name: str) -> dict[str, Any]:
    _object(v, name)
    for key in ("include_usage", "include_obfuscation", "continuous_usage_stats"):
        if key in v and v[key] is not None:
            _bool(v[key], f"{name}.{key}")
    return v  # type: ignore[no-any-return]


def _response_format(v: Any, name: str) -> dict[str, Any]:
    _object(v, name)
    kind = _choice(*RESPONSE_FORMAT_TYPES)(v.get("type"), f"{name}.type")
    if kind == "json_object" and v.get("schema") is not None:
        _object(v["schema"], f"{name}.schema")
    if kind == "json_schema":
        spec = _object(v.get("json_schema"), f"{name}.json_schema")
        _object(spec.get("schema"), f"{name}.json_schema.schema")
        if spec.get("name") is not None:
            _string(spec["name"], f"{name}.json_schema.name")
        if spec.get("strict") is not None:
            _bool(spec["strict"], f"{name}.json_schema.strict")
    return v  # type: ignore[no-any-return]


def _token_ids(v: Any, name: str) -> list[int]:
    if type(v) is not list:
        raise _bad(name, "an array of token ids", v)
    _tokens(v, name)
    return v


def _strings(v: Any, name: str) -> list[str]:
    if type(v) is not list:
        raise _bad(name, "an array of strings", v)
    for i, item in enumerate(v):
        _string(item, f"{name}[{i}]")
    return v


# structured_outputs: vLLM's StructuredOutputsParams fields; one constraint at most.
STRUCTURED_KINDS: dict[str, Validator] = {
    "json": lambda v, n: v if type(v) in (dict, str) else _fail(n, "a JSON schema (object)", v),
    "regex": _string,
    "choice": lambda v, n: _strings(v, n) if v else _fail(n, "a non-empty array of strings", v),
    "grammar": _string,
    "json_object": _bool,
    "structural_tag": _string,
}
STRUCTURED_OPTIONS: dict[str, Validator] = {
    "disable_fallback": _bool,
    "disable_any_whitespace": _bool,
    "disable_additional_properties": _bool,
    "whitespace_pattern": _string,
}


def _fail(name: str, what: str, value: Any) -> Any:
    raise _bad(name, what, value)


def _structured_outputs(v: Any, name: str) -> dict[str, Any]:
    _object(v, name)
    known = STRUCTURED_KINDS | STRUCTURED_OPTIONS
    for key, value in v.items():
        check = known.get(key)
        if check is None:
            raise _bad(f"{name}.{key}", "one of " + ", ".join(known), key)
        if value is not None:
            check(value, f"{name}.{key}")
    kinds = [k for k in STRUCTURED_KINDS if v.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise InvalidRequest(
            f"'{name}' takes exactly one constraint of {', '.join(STRUCTURED_KINDS)}; "
            f"got {len(kinds)}{': ' + ', '.join(kinds) if kinds else ''}.",
            param=name,
        )
    return v  # type: ignore[no-any-return]


def _xargs(v: Any, name: str) -> dict[str, Any]:
    """vllm_xargs: str → str | int | float | a list of those (vLLM's type)."""
    _object(v, name)
    scalar = (str, int, float)
    for key, value in v.items():
        items = value if type(value) is list else [value]
        if any(type(x) not in scalar for x in items):
            raise _bad(f"{name}.{key}", "a string, a number or an array of them", value)
    return v  # type: ignore[no-any-return]


# ---------------------------------------------------------------- the field table

OPENAI_FIELDS: dict[str, Validator] = {
    "model": _string,
    "prompt": _prompt,
    "best_of": _int(0, 20),
    "echo": _bool,
    "frequency_penalty": _number(-2.0, 2.0),
    "logit_bias": _logit_bias,
    # OpenAI's cap of 5 is the dialects' (providers.params); vLLM allows up to its
    # max_logprobs, and -1 for the whole vocabulary.
    "logprobs": _int(-1),
    "max_tokens": _int(0),
    "n": _int(1, 128),
    "presence_penalty": _number(-2.0, 2.0),
    "seed": _int(-(2**63), 2**64 - 1),
    "stop": _stop,
    "stream": _bool,
    "stream_options": _stream_options,
    "suffix": _string,
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0),
    "user": _string,
}

EXTENSION_FIELDS: dict[str, Validator] = {
    "context_length_exceeded_behavior": _choice(*CONTEXT_BEHAVIORS),
    "ignore_eos": _bool,
    "mirostat_target": _number(0.0, lo_open=True),
    "mirostat_lr": _number(0.0, lo_open=True),
    "top_k": _int(-1),
    "repetition_penalty": _number(0.0, lo_open=True),
    "min_p": _number(0.0, 1.0),
    "response_format": _response_format,
}

# vLLM's own extras (its CompletionRequest, protocol.md §8): types and ranges as vLLM checks them.
VLLM_FIELDS: dict[str, Validator] = {
    "prompt_logprobs": _int(-1),
    "return_token_ids": _bool,
    "return_tokens_as_token_ids": _bool,
    "truncate_prompt_tokens": _int(-1, 2**63 - 1),
    "truncation_side": _choice("left", "right"),
    "min_tokens": _int(0),
    "stop_token_ids": _token_ids,
    "include_stop_str_in_output": _bool,
    "skip_special_tokens": _bool,
    "spaces_between_special_tokens": _bool,
    "bad_words": _strings,
    "allowed_token_ids": _token_ids,
    "logprob_token_ids": _token_ids,
    "structured_outputs": _structured_outputs,
    "use_beam_search": _bool,
    "length_penalty": _number(),
    "add_special_tokens": _bool,
    "vllm_xargs": _xargs,
    "priority": _int(-(2**63), 2**63 - 1),
}

FIELDS: dict[str, Validator] = OPENAI_FIELDS | EXTENSION_FIELDS | VLLM_FIELDS
# Keys inside object fields that dialects treat apart from their field (`params` sub-rows).
SUB_FIELDS = ("stream_options.continuous_usage_stats",)


# ---------------------------------------------------------------- parse


def parse_completion(body: bytes, limits: RequestLimits) -> CompletionRequest:
    return validate_completion(parse_json(body), limits)


def validate_completion(data: dict[str, Any], limits: RequestLimits) -> CompletionRequest:
    fields, unknown = checked(data, FIELDS, ("model", "prompt"))
    _cross_checks(fields)
    return _build(fields, unknown, limits)


def _cross_checks(f: Mapping[str, Any]) -> None:
    stream = f.get("stream", False)
    if "stream_options" in f and not stream:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )
    best_of = f.get("best_of")
    if best_of is not None and best_of != 1 and stream:
        raise InvalidRequest("'best_of' cannot be used with 'stream'.", param="best_of")
    if best_of is not None and best_of < f.get("n", 1):
        raise InvalidRequest("'best_of' must be greater than or equal to 'n'.", param="best_of")
    if "mirostat_lr" in f and "mirostat_target" not in f:
        raise InvalidRequest("'mirostat_lr' requires 'mirostat_target'.", param="mirostat_lr")
    if f.get("max_tokens") == 0 and not f.get("echo", False):
        raise InvalidRequest("'max_tokens' may be 0 only with 'echo'.", param="max_tokens")
    _vllm_cross_checks(f)


MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's (sampling_params.MAX_LOGPROB_TOKEN_IDS)
# What beam search leaves out: vLLM's server maps a beam-search request with
# `to_beam_search_params` (n, max_tokens, temperature, length_penalty, ignore_eos,
# include_stop_str_in_output, skip_special_tokens) and ignores everything else. A field here set
# to anything but its neutral values would change nothing, so it is refused rather than
# silently lost.
BEAM_IGNORES: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "best_of": (1,),
        "stop": ("", []),
        "stop_token_ids": ([],),
        "min_tokens": (0,),
        "top_p": (1,),
        "top_k": (0, -1),
        "min_p": (0,),
        "presence_penalty": (0,),
        "frequency_penalty": (0,),
        "repetition_penalty": (1,),
        "logit_bias": ({},),
        "bad_words": ([],),
        "allowed_token_ids": (),
        "structured_outputs": (),
        "response_format": ({"type": "text"},),
        "vllm_xargs": ({},),
        "mirostat_target": (),
        "mirostat_lr": (),
        "prompt_logprobs": (),
        "logprob_token_ids": ([],),
        "spaces_between_special_tokens": (True,),
    }
)


def _beam_search_checks(f: Mapping[str, Any]) -> None:
    if f.get("stream"):
        raise InvalidRequest(
            "Streaming is not supported with beam search.", param="use_beam_search"
        )
    if f.get("echo") and f.get("logprobs") is not None:
        raise InvalidRequest(
            "'echo' with 'logprobs' is not supported with beam search: beam search does not "
            "compute prompt logprobs.",
            param="echo",
        )
    for name, neutral in BEAM_IGNORES.items():
        if name in f and f[name] not in neutral:
            raise InvalidRequest(
                f"'{name}' has no effect with beam search, which applies only n (the beam "
                "width), max_tokens, temperature, length_penalty, ignore_eos, "
                "include_stop_str_in_output and skip_special_tokens.",
                param=name,
            )


def _logprob_token_ids_checks(f: Mapping[str, Any]) -> None:
    """vLLM's: the listed ids' logprobs replace the top `logprobs`, so logprobs must be asked
    for, and there must be generated tokens to score."""
    if f.get("logprobs") is None:
        raise InvalidRequest(
            "'logprobs' must be set when using 'logprob_token_ids'.", param="logprob_token_ids"
        )
    if f.get("echo") and f.get("max_tokens") == 0:
        raise InvalidRequest(
            "'logprob_token_ids' is not supported with 'echo' and 'max_tokens' 0: no tokens are "
            "generated.",
            param="logprob_token_ids",
        )
    if len(f["logprob_token_ids"]) > MAX_LOGPROB_TOKEN_IDS:
        raise InvalidRequest(
            f"'logprob_token_ids' may list at most {MAX_LOGPROB_TOKEN_IDS} token ids.",
            param="logprob_token_ids",
        )


def _vllm_cross_checks(f: Mapping[str, Any]) -> None:
    """vLLM's own request checks (CompletionRequest validators, SamplingParams)."""
    prompt_logprobs = f.get("prompt_logprobs")
    if prompt_logprobs is not None and f.get("stream") and prompt_logprobs != 0:
        raise InvalidRequest(
            "'prompt_logprobs' are not available when 'stream' is enabled.",
            param="prompt_logprobs",
        )
    if f.get("use_beam_search"):
        _beam_search_checks(f)
    elif f.get("length_penalty", 1) != 1:
        raise InvalidRequest(
            "'length_penalty' applies only to beam search ('use_beam_search': true).",
            param="length_penalty",
        )
    min_tokens = f.get("min_tokens", 0)
    max_tokens = f.get("max_tokens", DEFAULT_MAX_TOKENS)
    if min_tokens > max(max_tokens, 1):
        raise InvalidRequest(
            f"'min_tokens' ({min_tokens}) must be less than or equal to 'max_tokens' "
            f"({max_tokens}).",
            param="min_tokens",
        )
    if f.get("logprob_token_ids"):
        _logprob_token_ids_checks(f)
    if f.get("allowed_token_ids") == []:
        raise InvalidRequest("'allowed_token_ids' must not be empty.", param="allowed_token_ids")


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

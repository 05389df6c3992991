"""Request fields → vLLM `SamplingParams`, as a pure function.

The mapping follows vLLM's own OpenAI server (`CompletionRequest.to_sampling_params` in
vllm/entrypoints/openai/completion/protocol.py), so a request gives the same tokens through the
in-process engine as through a vLLM server: the same defaults for unset fields, `prompt_logprobs`
= `logprobs` for echo, one throw-away token for echo with `max_tokens` 0, `response_format` as
structured outputs. What vLLM's server leaves out, the gateway adds: Mirostat v2 goes to the
engine's logits processor through `extra_args`.

`sampling_kwargs` returns plain data (testable without vLLM); `build` turns it into the vLLM
objects and is the only place here that imports vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidRequest
from providers.vllm_engine import mirostat

# Defaults for unset fields: vLLM server's CompletionRequest._DEFAULT_SAMPLING_PARAMS.
DEFAULTS: Mapping[str, Any] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}
# Fields taken as they are (the gateway validated them as vLLM does; vLLM checks the rest, e.g.
# token ids against the vocabulary, and its errors are 400s naming the field).
VLLM_DIRECT = (
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "bad_words",
    "allowed_token_ids",
)
DIRECT = ("seed", "logit_bias", *VLLM_DIRECT)
KNOWN_FIELDS = frozenset(
    (
        *DEFAULTS,
        *DIRECT,
        *mirostat.EXTRA_ARGS_KEYS,
        "n",
        "stop",
        "logprobs",
        "prompt_logprobs",
        "logprob_token_ids",
        "max_tokens",
        "ignore_eos",
        "vllm_xargs",
        "structured_outputs",
    )
)


@dataclass(frozen=True, slots=True)
class Generation:
    """How many sequences to generate and how long: decided by the adapter (best_of emulation,
    context fitting), not read from the body."""

    n: int
    max_tokens: int
    stream: bool


def sampling_kwargs(body: Mapping[str, Any], gen: Generation) -> dict[str, Any]:
    """Keyword arguments for `SamplingParams.from_optional`; `structured_outputs` and
    `output_kind` stay plain values here (`build` makes the vLLM objects)."""
    kwargs: dict[str, Any] = {name: body.get(name, default) for name, default in DEFAULTS.items()}
    kwargs.update((name, body[name]) for name in DIRECT if name in body)
    echo = bool(body.get("echo"))
    logprobs = body.get("logprobs")
    scored = body.get("logprob_token_ids") or None  # these ids' logprobs instead of the top k
    kwargs.update(
        n=gen.n,
        stop=_stop(body.get("stop")),
        logprobs=None if scored else logprobs,
        logprob_token_ids=scored,
        prompt_logprobs=_prompt_logprobs(body, echo, logprobs),
        ignore_eos=bool(body.get("ignore_eos", False)),
        # vLLM cannot generate 0 tokens: echo alone makes one and drops it, as vLLM's server does.
        max_tokens=gen.max_tokens if gen.max_tokens > 0 else 1,
        output_kind="delta" if gen.stream else "final",
        structured_outputs=constraints(body),
        extra_args=extra_args(body),
    )
    return kwargs


def _prompt_logprobs(body: Mapping[str, Any], echo: bool, logprobs: int | None) -> int | None:
    """As asked; unset with echo, the echoed prompt's logprobs (vLLM's server)."""
    asked = body.get("prompt_logprobs")
    return logprobs if asked is None and echo else asked


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def constraints(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """vLLM's `structured_outputs` with `response_format`'s constraint over it, as vLLM's
    server merges them (two constraints left standing are vLLM's own 400)."""
    given = body.get("structured_outputs")
    override = structured_outputs(body.get("response_format"))
    if given is None:
        return override
    return {**given, **(override or {})}


def structured_outputs(response_format: Any) -> dict[str, Any] | None:
    """`response_format` as vLLM's StructuredOutputsParams fields. Fireworks' json_object with a
    `schema` constrains to that schema (vLLM's own server would ignore the schema)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return {"json_object": True} if schema is None else {"json": schema}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidRequest(
                "response_format json_schema needs 'json_schema': {'name': …, 'schema': {…}}.",
                param="response_format",
            )
        return {"json": spec["schema"]}
    raise InvalidRequest(
        f"Unsupported response_format type {kind!r}: use 'text', 'json_object' or 'json_schema'.",
        param="response_format",
    )


def extra_args(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """`SamplingParams.extra_args`: the caller's `vllm_xargs` (for logits processors, as vLLM's
    server passes them), then Mirostat's settings, which win over xargs of the same name."""
    merged = {**body.get("vllm_xargs", {}), **mirostat_args(body)}
    return merged or None


def mirostat_args(body: Mapping[str, Any]) -> dict[str, float]:
    """Mirostat v2 parameters for the engine's logits processor; empty when not asked for.
    Checked here, by the processor's own validator, so a bad value is a 400 naming the field."""
    try:
        settings = mirostat.from_extra_args({k: body.get(k) for k in mirostat.EXTRA_ARGS_KEYS})
    except mirostat.MirostatError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    if settings is None:
        return {}
    return dict(zip(mirostat.EXTRA_ARGS_KEYS, settings, strict=True))


def build(kwargs: Mapping[str, Any]) -> Any:
    """The vLLM `SamplingParams` for `sampling_kwargs(...)`; vLLM's own validation errors become
    400s naming the parameter."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    kinds = {"delta": RequestOutputKind.DELTA, "final": RequestOutputKind.FINAL_ONLY}
    args = dict(kwargs)
    args["output_kind"] = kinds[args["output_kind"]]
    if isinstance(args["structured_outputs"], Mapping):  # else vLLM's own, or None
        args["structured_outputs"] = StructuredOutputsParams(**args["structured_outputs"])
    try:
        return SamplingParams.from_optional(**args)
    except VLLMValidationError as exc:
        message = str(exc.args[0]) if exc.args else "Invalid sampling parameters."
        raise InvalidRequest(message, param=exc.parameter or _named(message)) from None
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=_named(str(exc))) from None


def _named(message: str) -> str | None:
    """vLLM's messages start with the field's name ("top_k must be …") even when the error
    does not carry it."""
    first = message.split(" ", 1)[0]
    return first if first in KNOWN_FIELDS else None

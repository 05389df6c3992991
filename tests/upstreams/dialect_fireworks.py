"""The scripted Fireworks upstream (quirks from its docs and traffic): bare UUID ids, stop strings
kept in the text, usage on the last content chunk, `context_length_exceeded_behavior`
(default truncate), FastAPI 422 for any field outside its schema, `{"fault"}`/`{"detail"}`/
`{"error"}` error shapes, the `logprobs: true` content format and extra per-choice keys."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .dialect import Dialect, Json
from .errors import (
    UpstreamError,
    detail_item,
    fireworks_request_error,
    fireworks_status_error,
    validation_error,
)
from .render import ChoiceOut, Delta, Result, content_logprobs, legacy_logprobs
from .validate import (
    COMMON_RULES,
    DEFAULT_MAX_TOKENS,
    ECHO_ALL,
    Params,
    Rule,
    Violation,
    check_all,
    num_text,
    or_default,
    parse_prompts,
    parse_stops,
)

FIREWORKS_RULES: dict[str, Rule] = {
    **COMMON_RULES,
    "logprobs": Rule("int_or_bool", 0, 5),
    "top_logprobs": Rule("int", 0, 5),
    "max_completion_tokens": Rule("int", 0),
    "top_k": Rule("int", 0, 100),
    "min_p": Rule("number", 0, 1),
    "typical_p": Rule("number", 0, 1),
    "repetition_penalty": Rule("number", 0, 2),
    "mirostat_target": Rule("number"),
    "mirostat_lr": Rule("number"),
    "ignore_eos": Rule("bool"),
    "echo_last": Rule("int", 0),
    "response_format": Rule("object"),
    "context_length_exceeded_behavior": Rule("str", choices=("truncate", "error")),
    "raw_output": Rule("bool"),
    "perf_metrics_in_response": Rule("bool"),
    "return_token_ids": Rule("bool"),
    "prompt_cache_isolation_key": Rule("str"),
    "metadata": Rule("object"),
    "images": Rule("any"),
    "speculation": Rule("any"),
    "prediction": Rule("any"),
    "reasoning_effort": Rule("any"),
    "reasoning_history": Rule("any"),
    "thinking": Rule("any"),
}
RESPONSE_FORMAT_TYPES = ("json_object", "json_schema", "grammar", "text")


def _fireworks_item(v: Violation) -> dict[str, Any]:
    if v.problem == "min":
        return detail_item(
            v.name,
            f"Input should be greater than or equal to {num_text(v.rule.lo)}",
            "greater_than_equal",
        )
    if v.problem == "max":
        return detail_item(
            v.name,
            f"Input should be less than or equal to {num_text(v.rule.hi)}",
            "less_than_equal",
        )
    if v.problem == "choice":
        allowed = " or ".join(f"'{c}'" for c in v.rule.choices)
        return detail_item(v.name, f"Input should be {allowed}", "literal_error")
    kinds = {
        "int": ("integer", "int_type"),
        "number": ("number", "float_type"),
        "bool": ("boolean", "bool_type"),
        "str": ("string", "string_type"),
        "int_or_bool": ("integer", "int_type"),
    }
    word, type_ = kinds.get(v.rule.kind, ("dictionary", "dict_type"))
    return detail_item(v.name, f"Input should be a valid {word}", type_)


def _fireworks_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = [
        detail_item(k, "Field required", "missing") for k in ("model", "prompt") if k not in body
    ]
    items += [
        detail_item(k, "Extra inputs are not permitted", "extra_forbidden")
        for k in body
        if k not in FIREWORKS_RULES
    ]
    items += [_fireworks_item(v) for v in check_all(body, FIREWORKS_RULES)]
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in RESPONSE_FORMAT_TYPES:
        allowed = ", ".join(f"'{t}'" for t in RESPONSE_FORMAT_TYPES)
        items.append(
            {
                "loc": ["body", "response_format", "type"],
                "msg": f"Input should be {allowed}",
                "type": "literal_error",
            }
        )
    return items


def parse_fireworks(body: Any, window: int) -> Params:
    if not isinstance(body, dict):
        raise validation_error([detail_item(0, "JSON decode error", "json_invalid")])
    items = _fireworks_items(body)
    if items:
        raise validation_error(items)
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise fireworks_request_error(
            400, "Only one of max_tokens and max_completion_tokens may be set."
        )
    params = _fireworks_params(body)
    _fireworks_context(params, window)
    return params


def _fireworks_params(body: Mapping[str, Any]) -> Params:
    prompts = parse_prompts(body.get("prompt"))
    stops = parse_stops(body.get("stop"))
    if prompts is None or stops is None:
        name = "prompt" if prompts is None else "stop"
        raise validation_error(
            [detail_item(name, "Input should be a valid string or list", "union_tag_invalid")]
        )
    logprobs, top = body.get("logprobs"), body.get("top_logprobs") or 0
    max_tokens = body.get("max_tokens")
    max_tokens = body.get("max_completion_tokens") if max_tokens is None else max_tokens
    return Params(
        model=body["model"],
        prompts=prompts,
        n=body.get("n") or 1,
        max_tokens=or_default(max_tokens, DEFAULT_MAX_TOKENS),
        stops=stops,
        stream=bool(body.get("stream")),
        echo=_fireworks_echo(body),
        logprobs=None if isinstance(logprobs, bool) else logprobs,
        content_logprobs=top if logprobs is True else None,
        seed=body.get("seed"),
        ignore_eos=bool(body.get("ignore_eos")),
        truncate=body.get("context_length_exceeded_behavior") != "error",
        raw_output=bool(body.get("raw_output")),
        return_token_ids=bool(body.get("return_token_ids")),
        perf_metrics=bool(body.get("perf_metrics_in_response")),
    )


def _fireworks_echo(body: Mapping[str, Any]) -> int | None:
    if body.get("echo_last") is not None:
        return int(body["echo_last"])
    return ECHO_ALL if body.get("echo") else None


def _fireworks_context(params: Params, window: int) -> None:
    for prompt in params.prompts:
        if len(prompt) >= window:
            raise fireworks_request_error(
                400,
                f"The prompt is too long: {len(prompt)} tokens, the model's maximum "
                f"context length is {window} tokens.",
            )
        total = len(prompt) + params.max_tokens
        if total > window and not params.truncate:
            raise fireworks_request_error(
                400,
                f"The prompt plus max_tokens is too long: {len(prompt)} + "
                f"{params.max_tokens} = {total} tokens, the model's maximum context length is "
                f"{window} tokens.",
            )


class FireworksDialect(Dialect):
    name = "fireworks"
    include_stop = True
    default_models = ("accounts/fireworks/models/llama-v3p1-8b-instruct",)

    def parse(self, body: Any, window: int) -> Params:
        return parse_fireworks(body, window)

    def new_id(self) -> str:
        return str(uuid.uuid4())

    def auth_error(self, authorization: str | None) -> UpstreamError:
        return fireworks_request_error(401, "The API key you provided is invalid.")

    def status_error(self, status: int, quota: bool) -> UpstreamError:
        return fireworks_status_error(status)

    def model_not_found(self, model: str) -> UpstreamError:
        return fireworks_request_error(
            404, f"Model not found, inaccessible, and/or not deployed: {model}"
        )

    def headers(self, params: Params, result: Result) -> dict[str, str]:
        return {
            "fireworks-prompt-tokens": str(result.prompt_tokens),
            "fireworks-server-time-to-first-token": "0.002",
            "fireworks-server-processing-time": "0.005",
        }

    def usage(self, result: Result) -> Json:
        return {**result.usage(), "prompt_tokens_details": {"cached_tokens": 0}}

    def choice_logprobs(self, params: Params, delta: Delta) -> Json | None:
        if params.content_logprobs is not None:
            return content_logprobs(delta.tokens, delta.offset, params.content_logprobs)
        if params.logprobs is None:
            return None
        return legacy_logprobs(delta.tokens, delta.offset, params.logprobs, with_ids=True)

    def full_choice(self, params: Params, c: ChoiceOut) -> Json:
        out = super().full_choice(params, c)
        if params.return_token_ids:
            out["prompt_token_ids"] = list(c.prompt.token_ids)
            out["token_ids"] = [t.token_id for t in c.sample.tokens]
        if params.raw_output:
            out["raw_output"] = {
                "prompt_fragments": [c.prompt.text],
                "prompt_token_ids": list(c.prompt.token_ids),
                "completion": c.sample.text,
                "completion_token_ids": [t.token_id for t in c.sample.tokens],
                "completion_logprobs": None,
                "grammar": None,
            }
        return out

    def body(self, params: Params, result: Result) -> Json:
        out = super().body(params, result)
        if params.perf_metrics:
            out["perf_metrics"] = self.perf_metrics(result)
        return out

    def perf_metrics(self, result: Result) -> Json:
        return {
            "prompt-tokens": result.prompt_tokens,
            "cached-prompt-tokens": 0,
            "server-time-to-first-token": 0.002,
            "server-processing-time": 0.005,
        }

    def chunk(self, params: Params, head: Json, delta: Delta) -> Json:
        return {**super().chunk(params, head, delta), "usage": None}

    def finish_stream(
        self, params: Params, result: Result, head: Json, chunks: list[Json]
    ) -> list[Json]:
        if chunks:
            chunks[-1]["usage"] = self.usage(result)
            if params.perf_metrics:
                chunks[-1]["perf_metrics"] = self.perf_metrics(result)
        return chunks

    def model_card(self, name: str) -> Json:
        return {**super().model_card(name), "owned_by": "fireworks"}

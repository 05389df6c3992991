"""The scripted OpenAI upstream: `cmpl-` ids, stop strings removed, `best_of`, usage as a
separate `choices: []` chunk only with `stream_options.include_usage`, nested errors with string
codes, 400 `Unrecognized request argument supplied: <name>` for unknown fields."""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping
from typing import Any, ClassVar

from .dialect import Dialect, Json
from .errors import SERVER_ERROR_MESSAGE, UpstreamError, openai_error, openai_status_error
from .render import Delta, Result
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

_ALNUM = string.ascii_letters + string.digits

OPENAI_RULES: dict[str, Rule] = {
    **COMMON_RULES,
    "best_of": Rule("int", 0, 20),
    "stream_options": Rule("object"),
    "suffix": Rule("str"),
}


def _openai_violation(v: Violation) -> UpstreamError:
    shown = repr(v.value) if isinstance(v.value, str) else v.value
    names = {"int": "integer", "number": "number", "bool": "boolean", "str": "string"}
    messages = {
        "type": f"{shown} is not of type '{names.get(v.rule.kind, 'object')}' - '{v.name}'",
        "min": f"{shown} is less than the minimum of {num_text(v.rule.lo)} - '{v.name}'",
        "max": f"{shown} is greater than the maximum of {num_text(v.rule.hi)} - '{v.name}'",
    }
    return openai_error(400, messages[v.problem], param=v.name)


def _openai_unknown(body: Mapping[str, Any]) -> None:
    unknown = [k for k in body if k not in OPENAI_RULES]
    if len(unknown) == 1:
        raise openai_error(400, f"Unrecognized request argument supplied: {unknown[0]}")
    if unknown:
        raise openai_error(400, f"Unrecognized request arguments supplied: {', '.join(unknown)}")


def _openai_cross_checks(body: Mapping[str, Any]) -> None:
    stream = bool(body.get("stream"))
    if body.get("stream_options") is not None and not stream:
        message = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise openai_error(400, message, param="stream_options")
    n, best = body.get("n") or 1, body.get("best_of")
    if best is not None and best > 1 and stream:
        raise openai_error(400, "Cannot stream results with best_of > 1.", param="best_of")
    if best is not None and best < n:
        raise openai_error(400, "best_of must be greater than or equal to n.", param="best_of")


def parse_openai(body: Any, window: int) -> Params:
    if not isinstance(body, dict):
        raise openai_error(400, "We could not parse the JSON body of your request.")
    _openai_unknown(body)
    violations = check_all(body, OPENAI_RULES)
    if violations:
        raise _openai_violation(violations[0])
    if not body.get("model"):
        raise openai_error(400, "you must provide a model parameter")
    _openai_cross_checks(body)
    params = _openai_params(body)
    _openai_context(params, window)
    return params


def _openai_params(body: Mapping[str, Any]) -> Params:
    raw_prompt = body.get("prompt", "<|endoftext|>")
    prompts = parse_prompts("<|endoftext|>" if raw_prompt is None else raw_prompt)
    if prompts is None:
        raise openai_error(
            400,
            "Invalid prompt: expected a string, a list of strings, "
            "a list of token ids or a list of lists of token ids.",
            param="prompt",
        )
    stops = parse_stops(body.get("stop"))
    if stops is None:
        raise openai_error(
            400,
            f"{body.get('stop')!r} is not valid under any of the given schemas - 'stop'",
            param="stop",
        )
    n = body.get("n") or 1
    options = body.get("stream_options") or {}
    return Params(
        model=body["model"],
        prompts=prompts,
        n=n,
        best_of=body.get("best_of") or n,
        max_tokens=or_default(body.get("max_tokens"), DEFAULT_MAX_TOKENS),
        stops=stops,
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        echo=ECHO_ALL if body.get("echo") else None,
        logprobs=body.get("logprobs"),
        seed=body.get("seed"),
    )


def _openai_context(params: Params, window: int) -> None:
    for prompt in params.prompts:
        total = len(prompt) + params.max_tokens
        if total > window:
            message = (
                f"This model's maximum context length is {window} tokens, however you requested "
                f"{total} tokens ({len(prompt)} in your prompt; {params.max_tokens} for the "
                "completion). Please reduce your prompt; or completion length."
            )
            raise openai_error(400, message, code="context_length_exceeded")


class OpenAIDialect(Dialect):
    name = "openai"
    finish_separately = True
    default_models: ClassVar[tuple[str, ...]] = (
        "gpt-3.5-turbo-instruct",
        "davinci-002",
        "babbage-002",
    )

    def parse(self, body: Any, window: int) -> Params:
        return parse_openai(body, window)

    def new_id(self) -> str:
        return "cmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(29))

    def head(self, params: Params) -> Json:
        return {**super().head(params), "system_fingerprint": "fp_scripted01"}

    def auth_error(self, authorization: str | None) -> UpstreamError:
        if not authorization:
            message = (
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                "YOUR_KEY)."
            )
            return openai_error(401, message)
        key = authorization.removeprefix("Bearer ").strip()
        message = (
            f"Incorrect API key provided: {key[:3]}***{key[-4:]}. You can find your "
            "API key at https://platform.openai.com/account/api-keys."
        )
        return openai_error(401, message, code="invalid_api_key")

    def status_error(self, status: int, quota: bool) -> UpstreamError:
        return openai_status_error(status, quota)

    def model_not_found(self, model: str) -> UpstreamError:
        message = f"The model `{model}` does not exist or you do not have access to it."
        return openai_error(404, message, code="model_not_found")

    def headers(self, params: Params, result: Result) -> dict[str, str]:
        return {
            "openai-version": "2020-10-01",
            "openai-organization": "scripted-org",
            "openai-processing-ms": "3",
            "x-request-id": "req_" + secrets.token_hex(16),
            "x-ratelimit-limit-requests": "3500",
            "x-ratelimit-remaining-requests": "3499",
            "x-ratelimit-reset-requests": "17ms",
            "x-ratelimit-limit-tokens": "90000",
            "x-ratelimit-remaining-tokens": "89000",
            "x-ratelimit-reset-tokens": "6m0s",
        }

    def chunk(self, params: Params, head: Json, delta: Delta) -> Json:
        out = super().chunk(params, head, delta)
        if params.include_usage:
            out["usage"] = None
        return out

    def finish_stream(
        self, params: Params, result: Result, head: Json, chunks: list[Json]
    ) -> list[Json]:
        if params.include_usage:
            chunks.append({**head, "choices": [], "usage": self.usage(result)})
        return chunks

    def midstream_error_event(self) -> Json | None:
        return {
            "error": {
                "message": SERVER_ERROR_MESSAGE,
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }

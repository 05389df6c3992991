"""Answers written in the shape their provider answers in (core.provider.AnswerShape).

OpenAI's shape leaves out what is not set. vLLM's own server (0.32) writes answers from its
pydantic models: a whole answer has every field of its model, null when not set; a stream's chunk
has the fields its server set for that kind of chunk (null ones included), and the
`system_fingerprint` only on the chunks that end a choice, or on the usage chunk when the caller
asked for usage. Callers written against `vllm serve` read those fields (`choice.stop_reason`,
`choice.prompt_logprobs`, …) and get None, not an AttributeError, through the gateway too.

The tables list, per part of an answer, the fields vLLM's server writes with their value when
not set; a canonical answer's own values win over them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from types import MappingProxyType

import orjson

from core.answers import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatLogprobs,
    Completion,
    ResponseAnswer,
    Usage,
)
from core.provider import AnswerShape
from gateway.asgi import Send
from gateway.pipeline.sse import CHAT_CHUNK, Envelope, Head, K, StreamResult, pump

Unset = Mapping[str, None]


def _unset(*names: str) -> Unset:
    return MappingProxyType(dict.fromkeys(names))


# Whole answers: `CompletionResponse`, `ChatCompletionResponse` (their fields after `model`,
# in order) and the parts they hold.
COMPLETION = (
    "choices", "service_tier", "system_fingerprint", "usage",
    "kv_transfer_params", "ec_transfer_params", "metrics",
)  # fmt: skip
COMPLETION_CHOICE = _unset(
    "stop_reason", "token_ids", "prompt_logprobs", "prompt_token_ids", "routed_experts"
)
CHAT = (
    "choices", "service_tier", "system_fingerprint", "usage", "prompt_logprobs",
    "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics",
)  # fmt: skip
CHAT_CHOICE = _unset("stop_reason", "token_ids", "routed_experts")
CHAT_MESSAGE = _unset("annotations", "audio", "function_call", "reasoning")
USAGE = _unset("prompt_tokens_details", "completion_tokens_details")
# Stream chunks' choices: a completion's delta; a chat's content delta, and its last one.
COMPLETION_DELTA = _unset("stop_reason", "prompt_token_ids", "token_ids")
CHAT_DELTA = _unset("token_ids")
CHAT_LAST_DELTA = _unset("stop_reason", "token_ids")


def completion_document(
    out: Completion, model: str, cid: str, created: int, shape: AnswerShape
) -> dict[str, object]:
    doc = _answer("text_completion", cid, created, model, out)
    fingerprint = out.get("system_fingerprint")
    if shape == "vllm":
        doc["choices"] = [_filled(COMPLETION_CHOICE, c) for c in out["choices"]]
        doc["usage"] = _usage(out["usage"])
        doc["system_fingerprint"] = fingerprint
        return _ordered(doc, COMPLETION)
    if fingerprint is not None:
        doc["system_fingerprint"] = fingerprint
    for key in UPSTREAM_ANSWER_KEYS:
        if key in out:
            doc[key] = out[key]  # type: ignore[literal-required]  # a provider's own
    return doc


def chat_document(
    out: ChatCompletion, model: str, cid: str, created: int, shape: AnswerShape
) -> dict[str, object]:
    doc = _answer("chat.completion", cid, created, model, out)
    for key in CHAT_ANSWER_KEYS:
        if key in out:
            doc[key] = out[key]  # type: ignore[literal-required]  # keys of ChatCompletion
    if shape == "vllm":
        doc["choices"] = [_chat_choice(c) for c in out["choices"]]
        doc["usage"] = _usage(out["usage"])
        return _ordered(doc, CHAT)
    return doc


# What an answer may carry that its provider added unasked, written as it came (Azure's
# content filter's verdicts on the prompts).
UPSTREAM_ANSWER_KEYS = ("prompt_filter_results",)
# What a chat answer may carry besides its choices and usage (vLLM's extras among them).
CHAT_ANSWER_KEYS = (
    "system_fingerprint", "prompt_token_ids", "prompt_logprobs", *UPSTREAM_ANSWER_KEYS,
)  # fmt: skip


def envelope(
    cid: str, created: int, model: str, include_usage: bool, kind: str, shape: AnswerShape
) -> Envelope:
    """The stream's chunk writer for the shape."""
    if shape == "vllm":
        return VllmEnvelope(cid, created, model, include_usage, kind)
    return Envelope(cid, created, model, include_usage, kind)


def pump_chunks(
    send: Send, first: list[K], rest: AsyncIterator[list[K]], head: Head, result: StreamResult
) -> Awaitable[None]:
    """A completions or chat stream written: its chunks in the envelope of its shape."""
    env = envelope(head.id, head.created, head.model, head.include_usage, head.kind, head.shape)
    return pump(send, first, rest, env, head.include_usage, result)


class VllmEnvelope(Envelope):
    """Chunks as vLLM's server writes them: each kind of chunk with its fields, no `usage:
    null` on content chunks, and the fingerprint on the chunks that end a choice (or on the
    usage chunk, when the caller asked for usage)."""

    __slots__ = ("_chat", "_fingerprint")

    def __init__(
        self, completion_id: str, created: int, model: str, include_usage: bool, kind: str
    ) -> None:
        super().__init__(completion_id, created, model, include_usage, kind)
        self._fingerprint: str | None = None
        self._chat = kind == CHAT_CHUNK

    def fingerprint(self, value: str) -> None:
        self._fingerprint = value

    def chunk(
        self,
        choices: Sequence[Mapping[str, object]],
        usage: Usage | None = None,
        prompt_ids: list[int] | None = None,
        prompt_filters: object = None,
    ) -> bytes:
        doc: dict[str, object] = {**self._fixed}
        if self._chat:
            doc["choices"] = [_chat_delta(c) for c in choices]
            if any("role" in c["delta"] for c in choices):  # type: ignore[operator]
                doc["prompt_token_ids"], doc["prompt_text"] = prompt_ids, None
        else:
            doc["choices"] = [_filled(COMPLETION_DELTA, c) for c in choices]
        if usage is not None:  # the choice's usage so far (a chat's with its details' null)
            doc["usage"] = {**usage, "completion_tokens_details": None} if self._chat else usage
        ends = any(c.get("finish_reason") is not None for c in choices)
        if ends and not self.include_usage and self._fingerprint is not None:
            doc["system_fingerprint"] = self._fingerprint
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def usage(self, usage: Usage) -> bytes:
        doc: dict[str, object] = {**self._fixed, "choices": [], "usage": usage}
        if self._fingerprint is not None:
            doc["system_fingerprint"] = self._fingerprint
        return b"data: " + orjson.dumps(doc) + b"\n\n"


def _answer(
    kind: str, cid: str, created: int, model: str, out: Completion | ChatCompletion
) -> dict[str, object]:
    """A whole answer as OpenAI writes it: its own fields, the choices and the usage."""
    head = {"id": cid, "object": kind, "created": created, "model": model}
    return {**head, "choices": out["choices"], "usage": out["usage"]}


def _ordered(doc: dict[str, object], after_model: tuple[str, ...]) -> dict[str, object]:
    """A whole answer's fields in the order of vLLM's model, null where not set."""
    head = {"id": doc["id"], "object": doc["object"], "created": doc["created"]}
    return {**head, "model": doc["model"], **{k: doc.get(k) for k in after_model}}


def _filled(unset: Unset, part: Mapping[str, object]) -> dict[str, object]:
    return {**part, **{k: None for k in unset if k not in part}}


def _usage(usage: Usage | None) -> dict[str, object] | None:
    return None if usage is None else _filled(USAGE, usage)


def _chat_choice(choice: ChatChoice) -> dict[str, object]:
    out = _filled(CHAT_CHOICE, choice)
    out["logprobs"] = _chat_logprobs(choice["logprobs"])
    message = _filled(CHAT_MESSAGE, choice["message"])
    if not message.get("tool_calls", True):  # vLLM's server leaves an empty list out
        del message["tool_calls"]
    out["message"] = message
    return out


def _chat_logprobs(logprobs: ChatLogprobs | None) -> Mapping[str, object] | None:
    """vLLM's chat logprobs have their `content` only (OpenAI's add `refusal`)."""
    if logprobs is None or "refusal" not in logprobs:
        return logprobs
    return {"content": logprobs["content"]}


def _chat_delta(choice: Mapping[str, object]) -> Mapping[str, object]:
    """A chat chunk's choice: the role's first delta as it is; a content delta with its
    `token_ids`, the last one with its `stop_reason` too."""
    delta: ChatChunkChoice = choice  # type: ignore[assignment]
    if "role" in delta["delta"]:
        return choice
    out = _filled(CHAT_DELTA if delta["finish_reason"] is None else CHAT_LAST_DELTA, choice)
    out["logprobs"] = _chat_logprobs(delta["logprobs"])
    return out


# ---------------------------------------------------------------- responses


def response_document(
    out: ResponseAnswer, model: str, rid: str, created: int, shape: AnswerShape
) -> dict[str, object]:
    """A response object as OpenAI writes it: the gateway's id, time and the caller's model,
    then what the target answered, its usage in the Responses API's words. vLLM's server's
    response has no `error`."""
    doc: dict[str, object] = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": out["status"],
        "error": out["error"],
        "incomplete_details": out["incomplete_details"],
        **out["echo"],
        "model": model,
        "output": out["output"],
        "usage": response_usage(out["usage"]),
    }
    if shape == "vllm" and out["error"] is None:
        del doc["error"]
    return doc


def response_usage(usage: Usage | None) -> dict[str, object] | None:
    """The canonical usage in the Responses API's words: its details as the target gave them
    (an upstream's own, as it wrote them), cached and reasoning tokens 0 where it did not
    count them."""
    if usage is None:
        return None
    prompt = usage.get("prompt_tokens_details") or {}
    completion = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {**prompt, "cached_tokens": prompt.get("cached_tokens") or 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {
            **completion,
            "reasoning_tokens": completion.get("reasoning_tokens") or 0,
        },
        "total_tokens": usage["total_tokens"],
    }

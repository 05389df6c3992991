"""Upstream chat answers → the canonical chat shape of core/answers.py.

Canonical output is OpenAI's: choices in index order, each with its assistant `message`
(`content`, `refusal`, `tool_calls` when the model called tools), `logprobs` as
`{"content": [...], "refusal": null}` (or null when not asked for), and `finish_reason`
`stop|length|tool_calls|content_filter`. In streams each choice's deltas carry the role first,
then content or tool-call pieces by index, and a last delta with the finish_reason. vLLM's answers
to its extras (`stop_reason`, `token_ids`, the prompt's token ids and logprobs) ride along when
asked for and not null, and so do what a dialect's upstream adds unasked (Azure's content filter
results, per choice and per answer); other provider extras are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from core.answers import (
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatCompletion,
    ChatDelta,
    ChatLogprobs,
    ChatMessage,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
)
from providers.openai_compat.chat_stops import ChatStopHoldBack, strip_chat_stop
from providers.openai_compat.normalize import (
    FILTER_RESULTS,
    FINISH,
    FingerprintWait,
    finish_reason,
    keep,
    pending,
    usage,
)
from providers.transport.errors import bad_answer

CHAT_FINISH: Mapping[str, str] = MappingProxyType(
    {**FINISH, "tool_calls": "tool_calls", "function_call": "tool_calls"}
)
# vLLM's answers to its extras: which request field asks for each, per choice and per answer.
CHOICE_EXTRAS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"return_token_ids": ("token_ids",)}
)
ANSWER_EXTRAS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"return_token_ids": ("prompt_token_ids",), "prompt_logprobs": ("prompt_logprobs",)}
)
DELTA_TEXT = ("content", "refusal")


@dataclass(slots=True)  # built per request: a frozen one takes 4x as long to build
class ChatNormalization:
    """What the caller asked for that decides the canonical chat output."""

    label: str  # the target, for error messages
    want_logprobs: bool
    continuous_usage: bool = False  # vLLM's per-chunk usage went upstream
    choice_extras: tuple[str, ...] = ("stop_reason",)  # per-choice keys kept when not null
    answer_extras: tuple[str, ...] = ()  # top-level keys kept when not null
    stops: tuple[str, ...] = ()  # stop strings to cut (dialects that may include them)
    # The chunks that end a choice wait for the upstream's system_fingerprint (FingerprintWait).
    await_fingerprint: bool = False
    # Top-level keys the upstream adds unasked, kept when not null (Azure's
    # prompt_filter_results); a stream's, from an event without choices, ride on the next chunk.
    upstream_extras: tuple[str, ...] = ()


def chat_extras(
    fields: Mapping[str, Any], plain: tuple[str, ...] = ("stop_reason",)
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The per-choice and top-level extras a chat request asks for; `plain`: the per-choice
    ones of every request (the dialect's own among them)."""
    per_choice, per_answer = list(plain), list[str]()
    for field, keys in CHOICE_EXTRAS.items():
        if fields.get(field):
            per_choice.extend(keys)
    for field, keys in ANSWER_EXTRAS.items():
        value = fields.get(field)
        if value is not None and value is not False:  # prompt_logprobs=0 asks too
            per_answer.extend(keys)
    if fields.get("echo") and "prompt_logprobs" not in per_answer:
        per_answer.append(
            "prompt_logprobs"
        )  # vLLM's server asks for them with echo, and shows them
    return tuple(per_choice), tuple(per_answer)


# ---------------------------------------------------------------- pieces


def chat_logprobs(raw: Any) -> ChatLogprobs | None:
    """`{"content": [...], "refusal": null}`, each token with its bytes and alternatives."""
    if not isinstance(raw, dict):
        return None
    content = raw.get("content")
    entries = (
        [_token(e) for e in content if isinstance(e, dict)] if isinstance(content, list) else []
    )
    refusal = raw.get("refusal")
    refused = (
        [_token(e) for e in refusal if isinstance(e, dict)] if isinstance(refusal, list) else None
    )
    return {"content": entries, "refusal": refused}


def _token(entry: Mapping[str, Any]) -> TokenLogprob:
    top = entry.get("top_logprobs")
    alternatives = [_top(a) for a in top if isinstance(a, dict)] if isinstance(top, list) else []
    return {**_top(entry), "top_logprobs": alternatives}


def _top(entry: Mapping[str, Any]) -> TopLogprob:
    token = str(entry.get("token", ""))
    raw = entry.get("bytes")
    return {
        "token": token,
        "logprob": entry.get("logprob", 0.0),
        "bytes": raw if isinstance(raw, list) else list(token.encode()),
    }


def tool_calls(raw: Any, label: str) -> list[ToolCall] | None:
    """A message's tool calls as OpenAI writes them; arguments always a JSON string."""
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise bad_answer(label, "tool_calls that are not an array")
    out: list[ToolCall] = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_answer(label, "a tool call without a function name")
        out.append(
            {
                "id": str(call.get("id") or ""),
                "type": "function",
                "function": {"name": function["name"], "arguments": _arguments(function)},
            }
        )
    return out


def _arguments(function: Mapping[str, Any]) -> str:
    arguments = function.get("arguments")
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def message(raw: Any, label: str) -> ChatMessage:
    if not isinstance(raw, dict):
        raise bad_answer(label, "a choice without a message")
    content, refusal = raw.get("content"), raw.get("refusal")
    out: ChatMessage = {
        "role": "assistant",
        "content": content if isinstance(content, str) else None,
        "refusal": refusal if isinstance(refusal, str) else None,
    }
    calls = tool_calls(raw.get("tool_calls"), label)
    if calls is not None:
        out["tool_calls"] = calls
    return out


def _index(raw: Mapping[str, Any], position: int) -> int:
    index = raw.get("index")
    return index if type(index) is int else position


# ---------------------------------------------------------------- whole answers


def chat_answer(body: Mapping[str, Any], shape: ChatNormalization) -> ChatCompletion:
    raw = body.get("choices")
    if not isinstance(raw, list):
        raise bad_answer(shape.label, "a response without choices")
    picked = [_choice(c, i, shape) for i, c in enumerate(raw)]
    picked.sort(key=lambda c: c["index"])
    for c in picked if shape.stops else ():
        strip_chat_stop(c, shape.stops)
    out: ChatCompletion = {"choices": picked, "usage": usage(body.get("usage"))}
    fingerprint = body.get("system_fingerprint")
    if isinstance(fingerprint, str):
        out["system_fingerprint"] = fingerprint
    keep(body, out, shape.answer_extras)
    keep(body, out, shape.upstream_extras)
    return out


def _choice(raw: Any, position: int, shape: ChatNormalization) -> ChatChoice:
    if not isinstance(raw, dict):
        raise bad_answer(shape.label, "a choice that is not a JSON object")
    index = _index(raw, position)
    reason = finish_reason(raw.get("finish_reason"), index, shape.label, CHAT_FINISH)
    out: ChatChoice = {
        "index": index,
        "message": message(raw.get("message"), shape.label),
        "logprobs": chat_logprobs(raw.get("logprobs")) if shape.want_logprobs else None,
        "finish_reason": reason or "stop",
    }
    keep(raw, out, shape.choice_extras)
    return out


# ---------------------------------------------------------------- streams


class ChatStreamNormalizer:
    """Upstream chat stream events → canonical chunks: content chunks carry `choices` (and, with
    continuous usage, the usage so far); the request's usage, wherever the upstream put it, becomes
    one final `{"choices": [], "usage": …}`. The fingerprint rides on the first chunk out after it
    appears or changes, and so do the upstream's top-level extras that come on an event without
    choices; vLLM's prompt token ids on the first chunk that carries them."""

    __slots__ = ("_fingerprint", "_hold", "_pending", "_shape", "_usage", "_wait")

    def __init__(self, shape: ChatNormalization) -> None:
        self._shape = shape
        self._hold = ChatStopHoldBack(shape.stops) if shape.stops else None
        self._usage: Any = None
        self._fingerprint: str | None = None
        # What the next chunk out carries: a new fingerprint, the upstream's extras.
        self._pending: dict[str, Any] | None = None
        self._wait = FingerprintWait() if shape.await_fingerprint else None

    def feed(self, event: Mapping[str, Any]) -> list[ChatChunk]:
        # Every event of every chat stream passes here: the common case goes straight through.
        if event.get("usage") is not None:
            self._usage = event["usage"]
        fingerprint = event.get("system_fingerprint")
        if fingerprint is not None and fingerprint != self._fingerprint:
            self._fingerprint = str(fingerprint)
            self._pending = {**(self._pending or {}), "system_fingerprint": self._fingerprint}
        raw = event.get("choices")
        if not raw or type(raw) is not list:
            if self._shape.upstream_extras:  # Azure's prompt_filter_results come first, alone
                self._pending = pending(self._pending, event, self._shape.upstream_extras)
            # (A dialect with upstream extras has no fingerprint to wait for.)
            return self._waited() if self._pending is not None else []
        deltas = []
        for i, c in enumerate(raw):
            d = self._delta(c, i)
            if d is not None:
                deltas.append(d)
        if not deltas:
            return []
        chunk: ChatChunk = {"choices": deltas}
        shape = self._shape
        if shape.answer_extras and "prompt_token_ids" in shape.answer_extras:
            keep(event, chunk, ("prompt_token_ids",))
        if shape.continuous_usage:
            so_far = usage(event.get("usage"))
            if so_far is not None:
                chunk["usage"] = so_far
        if self._wait is not None:
            if self._wait.holds(chunk, self._fingerprint is not None):
                return []
            return [*self._waited(), self._stamp(chunk)]
        return [chunk if self._pending is None else self._stamp(chunk)]

    def _waited(self) -> list[ChatChunk]:
        """The chunks that waited for the fingerprint, the first one carrying it."""
        if self._wait is None:
            return []
        return [self._stamp(chunk) for chunk in self._wait.release()]

    def end(self) -> list[ChatChunk]:
        out: list[ChatChunk] = self._waited()
        held = self._hold.flush() if self._hold is not None else []
        if held:
            out.append(self._stamp({"choices": held}))
        final = usage(self._usage)
        if final is not None:
            out.append(self._stamp({"choices": [], "usage": final}))
        return out

    def _delta(self, raw: Any, position: int) -> ChatChunkChoice | None:
        """One choice's delta; None when it carries nothing. (Every event of every stream
        passes here: the common cases are tested first.)"""
        shape = self._shape
        if type(raw) is not dict:
            raise bad_answer(shape.label, "a choice that is not a JSON object")
        index = raw.get("index")
        if type(index) is not int:
            index = position
        reason = raw.get("finish_reason")
        if reason is not None:
            reason = finish_reason(reason, index, shape.label, CHAT_FINISH)
        out: ChatChunkChoice = {
            "index": index,
            "delta": _chat_delta(raw.get("delta"), shape.label),
            "logprobs": chat_logprobs(raw.get("logprobs")) if shape.want_logprobs else None,
            "finish_reason": reason,
        }
        for key in shape.choice_extras:
            if raw.get(key) is not None:
                out[key] = raw[key]  # type: ignore[literal-required]  # keys of CHOICE_EXTRAS
        if self._hold is not None:
            held = self._hold.feed(out)
            if held is None:
                return None
            out = held
        return out if out["delta"].get("content") or _carries(out) else None

    def _stamp(self, chunk: ChatChunk) -> ChatChunk:
        if self._pending is not None:
            chunk.update(self._pending)  # type: ignore[typeddict-item]  # fingerprint, extras
            self._pending = None
        return chunk


def _chat_delta(raw: Any, label: str) -> ChatDelta:
    if type(raw) is not dict:
        return {}
    content = raw.get("content")
    if len(raw) == 1 and type(content) is str:
        return {"content": content}  # the common case: one piece of text
    out: ChatDelta = {}
    if raw.get("role") is not None:
        out["role"] = "assistant"
    for key in DELTA_TEXT:
        if key in raw and (raw[key] is None or type(raw[key]) is str):
            out[key] = raw[key]  # type: ignore[literal-required]  # content or refusal
    calls = raw.get("tool_calls")
    if type(calls) is list and calls:
        out["tool_calls"] = [_call_delta(c, i, label) for i, c in enumerate(calls)]
    return out


def _call_delta(raw: Any, position: int, label: str) -> ToolCallDelta:
    if not isinstance(raw, dict):
        raise bad_answer(label, "a tool call delta that is not a JSON object")
    out: ToolCallDelta = {"index": _index(raw, position)}
    if raw.get("id"):
        out["id"] = str(raw["id"])
        out["type"] = "function"
    function = raw.get("function")
    if isinstance(function, dict):
        piece = {}
        if isinstance(function.get("name"), str):
            piece["name"] = function["name"]
        if function.get("arguments") is not None:
            piece["arguments"] = _arguments(function)
        out["function"] = piece  # type: ignore[typeddict-item]
    return out


def _carries(choice: ChatChunkChoice) -> bool:
    """Deltas with nothing in them (keep-alives, chunked prefill) are not worth a chunk; the
    first one, with the role, is, even with empty content."""
    delta = choice["delta"]
    if delta.get("content") or choice["finish_reason"] is not None or len(delta) > 1:
        return True
    lp = choice["logprobs"]
    return (
        "role" in delta
        or bool(delta.get("refusal"))
        or "tool_calls" in delta
        or bool(lp and lp["content"])
        or bool(choice.get("token_ids"))
        or bool(choice.get(FILTER_RESULTS))  # an asynchronous filter's verdicts (Azure)
    )

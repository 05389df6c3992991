"""A stream and the whole answer it means, both ways, for completions, chat and the Responses
API: a response cache keeps one answer and replays it as JSON or as a stream, whichever way the
request that filled it was answered. Pure functions: no I/O, inputs never changed, and what they
return shares no dict or list with what they were given (the gateway's SSE writers may change
what they write in place).

* `completion_of`, `chat_of`: a stream's chunks merged, choice by choice (by `index`), into the
  answer; None when a choice did not end (no `finish_reason`) or there was none: a stream cut
  short is no answer to keep. The usage is the usage chunk's (`choices: []`): a content chunk's
  own is vLLM's continuous usage, its choice's so far.
* `completion_chunks`, `chat_chunks`: the stream of a whole answer, as OpenAI writes it, one
  chunk (chat: two) per choice, then the usage chunk.
* `response_of`: the response a Responses stream ended with (`response.completed` or
  `response.incomplete`); `response_events`: OpenAI's event sequence for a whole response, as
  `core.chat_events` writes it for a chat, each item's text or arguments in one delta.

Merging rules, per field a stream may carry on several deltas (`_merged`'s tables): a text is
concatenated; a list (token ids, logprobs) too; a value said once (`prompt_token_ids`) is the
first delta's; a value a later delta may say again (`stop_reason`, `system_fingerprint`) the
last one's. A null says nothing, but a field carried only as null is kept as null.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar, cast

from core.answers import (
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatCompletion,
    ChatMessage,
    Choice,
    Chunk,
    Completion,
    ResponseAnswer,
    ResponseEvent,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from core.chat_bridge import output_text
from core.wire import Json

_T = TypeVar("_T")
_C = TypeVar("_C", Choice, ChatChunkChoice)
Rule = Callable[[list[Any]], Any]


def _fresh(value: _T) -> _T:
    """A copy of JSON data that shares no dict or list with it."""
    if isinstance(value, dict):
        return cast(_T, {k: _fresh(v) for k, v in value.items()})
    if isinstance(value, list):
        return cast(_T, [_fresh(v) for v in value])
    return value


def _first(values: list[Any]) -> Any:
    """A value said once (vLLM's prompt token ids, on a choice's first delta)."""
    return _fresh(next((v for v in values if v is not None), None))


def _last(values: list[Any]) -> Any:
    """A value a later delta may say again (it holds from there on)."""
    return _fresh(next((v for v in reversed(values) if v is not None), None))


def _joined(values: list[Any]) -> Any:
    """Lists said in pieces: concatenated (null when no piece was a list)."""
    lists = [v for v in values if v is not None]
    return [_fresh(x) for v in lists for x in v] if lists else None


def _text(values: list[Any]) -> str | None:
    """Strings said in pieces: concatenated (null when no piece was a string)."""
    pieces = [v for v in values if isinstance(v, str)]
    return "".join(pieces) if pieces else None


def _merged(parts: Iterable[Mapping[str, Any]], rules: Mapping[str, Rule]) -> dict[str, Any]:
    """The fields `rules` names that some part carries, each merged by its rule."""
    parts = list(parts)
    out: dict[str, Any] = {}
    for key, rule in rules.items():
        values = [p[key] for p in parts if key in p]
        if values:
            out[key] = rule(values)
    return out


def _ro(rules: dict[str, Rule]) -> Mapping[str, Rule]:
    return MappingProxyType(rules)


LEGACY_LOGPROBS = _ro(
    {k: _joined for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
)
CHAT_LOGPROBS = _ro({"content": _joined, "refusal": _joined})
# vLLM's extras on a choice's deltas.
COMPLETION_EXTRAS = _ro(
    {"stop_reason": _last, "prompt_logprobs": _first, "prompt_token_ids": _first,
     "token_ids": _joined}
)  # fmt: skip
CHAT_EXTRAS = _ro({"stop_reason": _last, "token_ids": _joined})
# A chunk's own fields (the usage aside).
COMPLETION_TOP = _ro({"system_fingerprint": _last})
CHAT_TOP = _ro({"system_fingerprint": _last, "prompt_token_ids": _first})
# A chat delta's fields that are not a string said in pieces (reasoning_content, reasoning, …).
DELTA_OWN = frozenset(("role", "tool_calls", "content", "refusal"))


# ---------------------------------------------------------------- a stream's answer


def _choices(choices: Iterable[_C]) -> list[list[_C]]:
    """Each choice's deltas in stream order, the choices in index order."""
    by: dict[int, list[_C]] = {}
    for choice in choices:
        by.setdefault(choice["index"], []).append(choice)
    return [by[i] for i in sorted(by)]


def _ended(choices: Sequence[Sequence[Choice] | Sequence[ChatChunkChoice]]) -> bool:
    ends = ([d["finish_reason"] for d in deltas] for deltas in choices)
    return bool(choices) and all(_last(reasons) is not None for reasons in ends)


def _usage(chunks: Sequence[Chunk] | Sequence[ChatChunk]) -> Usage | None:
    """The usage chunk's (the last one's): not a content chunk's usage so far."""
    usages = [c.get("usage") for c in chunks if not c["choices"]]
    return cast("Usage | None", _last(usages))


def _logprobs(
    deltas: Sequence[Choice] | Sequence[ChatChunkChoice], rules: Mapping[str, Rule]
) -> Any:
    carried = [d["logprobs"] for d in deltas if d["logprobs"] is not None]
    return _merged(carried, rules) if carried else None


def completion_of(chunks: Sequence[Chunk]) -> Completion | None:
    """The whole answer a completions stream meant; None when it did not end every choice."""
    return cast("Completion | None", _whole(chunks, _completion_choice, COMPLETION_TOP))


def _completion_choice(deltas: list[Choice]) -> Choice:
    choice = {
        "text": "".join(d["text"] for d in deltas),
        "index": deltas[0]["index"],
        "logprobs": _logprobs(deltas, LEGACY_LOGPROBS),
        "finish_reason": _last([d["finish_reason"] for d in deltas]),
        **_merged(deltas, COMPLETION_EXTRAS),
    }
    return cast(Choice, choice)


def chat_of(chunks: Sequence[ChatChunk]) -> ChatCompletion | None:
    """The whole answer a chat stream meant; None when it did not end every choice."""
    return cast("ChatCompletion | None", _whole(chunks, _chat_choice, CHAT_TOP))


def _whole(
    chunks: Sequence[Any], choice: Callable[[list[Any]], Any], top: Mapping[str, Rule]
) -> dict[str, Any] | None:
    """A stream's answer: each choice made whole from its deltas by `choice`, the usage
    chunk's usage, and the chunks' own fields by `top`; None unless every choice ended."""
    choices = _choices(c for chunk in chunks for c in chunk["choices"])
    if not _ended(choices):
        return None
    return {
        "choices": [choice(deltas) for deltas in choices],
        "usage": _usage(chunks),
        **_merged(chunks, top),
    }


def _chat_choice(deltas: list[ChatChunkChoice]) -> ChatChoice:
    choice = {
        "index": deltas[0]["index"],
        "message": _message([d["delta"] for d in deltas]),
        "logprobs": _logprobs(deltas, CHAT_LOGPROBS),
        "finish_reason": _last([d["finish_reason"] for d in deltas]),
        **_merged(deltas, CHAT_EXTRAS),
    }
    return cast(ChatChoice, choice)


def _message(deltas: Sequence[Mapping[str, Any]]) -> ChatMessage:
    # Content and refusal are always there (null when not said); the other strings (vLLM's
    # reasoning) only when some delta said them.
    others = dict.fromkeys(
        k for d in deltas for k, v in d.items() if k not in DELTA_OWN and isinstance(v, str)
    )
    message: dict[str, Any] = {
        "role": _first([d.get("role") for d in deltas]) or "assistant",
        "content": _text([d.get("content") for d in deltas]),
        "refusal": _text([d.get("refusal") for d in deltas]),
        **{k: _text([d.get(k) for d in deltas]) for k in others},
    }
    calls = _tool_calls(deltas)
    if calls:
        message["tool_calls"] = calls
    return cast(ChatMessage, message)


def _tool_calls(deltas: Sequence[Mapping[str, Any]]) -> list[ToolCall]:
    """The tool calls streamed, merged by their index, in index order."""
    pieces: dict[int, list[ToolCallDelta]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls") or ():
            pieces.setdefault(call["index"], []).append(call)
    return [_tool_call(pieces[i]) for i in sorted(pieces)]


def _said(values: Iterable[str | None], default: str) -> str:
    """A tool call's id, type or name: said on its first delta (an empty one says nothing)."""
    return next((v for v in values if v), default)


def _tool_call(pieces: list[ToolCallDelta]) -> ToolCall:
    functions = [p.get("function") or {} for p in pieces]
    return {
        "id": _said((p.get("id") for p in pieces), ""),
        "type": _said((p.get("type") for p in pieces), "function"),
        "function": {
            "name": _said((f.get("name") for f in functions), ""),
            "arguments": "".join(f.get("arguments") or "" for f in functions),
        },
    }


# ---------------------------------------------------------------- an answer's stream


def _framed(
    chunks: list[dict[str, Any]], answer: Mapping[str, Any], top: Iterable[str]
) -> list[dict[str, Any]]:
    """The choices' chunks, then the usage chunk; the answer's chunk-level fields on the first
    chunk (each holds for every later chunk)."""
    if answer["usage"] is not None:
        chunks.append({"choices": [], "usage": _fresh(answer["usage"])})
    if chunks:
        chunks[0].update({k: _fresh(answer[k]) for k in top if k in answer})
    return chunks


def completion_chunks(answer: Completion) -> list[Chunk]:
    """The stream that means `answer`: one chunk per choice, holding the whole choice."""
    chunks: list[dict[str, Any]] = [{"choices": [_fresh(c)]} for c in answer["choices"]]
    return cast(list[Chunk], _framed(chunks, answer, COMPLETION_TOP))


def chat_chunks(answer: ChatCompletion) -> list[ChatChunk]:
    """The stream that means `answer`, in OpenAI's order: per choice a chunk with the role and
    the whole message, then one with its end."""
    chunks: list[dict[str, Any]] = [
        {"choices": [part]} for c in answer["choices"] for part in (_opening(c), _closing(c))
    ]
    return cast(list[ChatChunk], _framed(chunks, answer, CHAT_TOP))


def _opening(choice: ChatChoice) -> dict[str, Any]:
    message = choice["message"]
    # Content is said even when null: OpenAI's tool-call-only message opens with content null.
    delta: dict[str, Any] = {"role": message["role"], "content": message["content"]}
    if message["refusal"] is not None:
        delta["refusal"] = message["refusal"]
    delta.update((k, v) for k, v in message.items() if k not in DELTA_OWN and isinstance(v, str))
    calls = message.get("tool_calls")
    if calls:
        delta["tool_calls"] = [{"index": i, **_fresh(call)} for i, call in enumerate(calls)]
    return {
        "index": choice["index"],
        "delta": delta,
        "logprobs": _fresh(choice["logprobs"]),
        "finish_reason": None,
    }


def _closing(choice: ChatChoice) -> dict[str, Any]:
    view: Mapping[str, Any] = choice
    return {
        "index": choice["index"],
        "delta": {},
        "logprobs": None,
        "finish_reason": choice["finish_reason"],
        **{k: _fresh(view[k]) for k in CHAT_EXTRAS if k in view},
    }


# ---------------------------------------------------------------- the Responses API

# The events that end a Responses stream, and whether the response they end with is an answer.
RESPONSE_ENDINGS: Mapping[str, bool] = MappingProxyType(
    {"response.completed": True, "response.incomplete": True, "response.failed": False,
     "error": False}
)  # fmt: skip
# A response's status → the event that ends its stream.
ENDING_EVENT: Mapping[str, str] = MappingProxyType(
    {"completed": "response.completed", "incomplete": "response.incomplete",
     "failed": "response.failed"}
)  # fmt: skip


def response_of(events: Sequence[ResponseEvent]) -> ResponseAnswer | None:
    """The response a Responses stream ended with; None when it failed or did not end."""
    ends = [e for e in events if e["type"] in RESPONSE_ENDINGS]
    if not ends or not RESPONSE_ENDINGS[ends[-1]["type"]] or "response" not in ends[-1]:
        return None
    return _fresh(ends[-1]["response"])


@dataclass(frozen=True, slots=True)
class PartStream:
    """How a content part streams: the field that holds its text, the events' prefix, the part
    as it begins (no text yet), and whether its deltas carry logprobs."""

    field: str
    events: str
    begun: Callable[[], Json]
    logprobs: bool = False


PART_STREAMS: Mapping[str, PartStream] = MappingProxyType(
    {
        "output_text": PartStream(
            "text", "response.output_text", lambda: output_text("", []), True
        ),
        "refusal": PartStream("refusal", "response.refusal", lambda: {"refusal": ""}),
        "reasoning_text": PartStream("text", "response.reasoning_text", lambda: {"text": ""}),
    }
)
# What an item holds as it begins, of what it has (OpenAI's `output_item.added`): its parts and
# arguments come after.
ITEM_BEGUN: Mapping[str, Callable[[], Json]] = MappingProxyType(
    {
        "message": lambda: {"content": []},
        "reasoning": lambda: {"content": []},
        "function_call": lambda: {"arguments": ""},
    }
)


def response_events(answer: ResponseAnswer) -> list[ResponseEvent]:
    """OpenAI's event sequence for a whole response (unnumbered: the writer numbers them)."""
    ending = ENDING_EVENT.get(answer["status"])
    if ending is None:
        raise ValueError(f"A response {answer['status']} has no stream that ends it.")
    began: ResponseAnswer = {
        **answer,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "incomplete_details": None,
        "error": None,
    }
    events: list[Json] = [
        {"type": "response.created", "response": _fresh(began)},
        {"type": "response.in_progress", "response": _fresh(began)},
    ]
    for index, item in enumerate(answer["output"]):
        events += _item_events(item, index)
    events.append({"type": ending, "response": _fresh(answer)})
    return cast(list[ResponseEvent], events)


def _item_events(item: Json, index: int) -> list[Json]:
    kind = item.get("type", "")
    begun = {k: v for k, v in ITEM_BEGUN.get(kind, dict)().items() if k in item}
    at = {"item_id": item.get("id", ""), "output_index": index}
    body = ITEM_BODIES.get(kind, _nothing)(item, at)
    return [
        {"type": "response.output_item.added", "output_index": index,
         "item": {**_fresh(item), "status": "in_progress", **begun}},
        *body,
        {"type": "response.output_item.done", "output_index": index, "item": _fresh(item)},
    ]  # fmt: skip


def _nothing(item: Json, at: Json) -> list[Json]:
    return []


def _parts(item: Json, at: Json) -> list[Json]:
    """A message's (or reasoning's) parts, each added, its text in one delta, done."""
    parts = item.get("content") or []
    return [
        e for i, part in enumerate(parts) for e in _part_events(part, {**at, "content_index": i})
    ]


def _part_events(part: Json, at: Json) -> list[Json]:
    stream = PART_STREAMS.get(part.get("type", ""))
    if stream is None:  # a part that does not stream: added whole, done
        added = [{"type": "response.content_part.added", **at, "part": _fresh(part)}]
        return [*added, {"type": "response.content_part.done", **at, "part": _fresh(part)}]
    text = part.get(stream.field) or ""
    said = {"logprobs": _fresh(part.get("logprobs") or [])} if stream.logprobs else {}
    events: list[Json] = [
        {"type": "response.content_part.added", **at, "part": {**_fresh(part), **stream.begun()}}
    ]
    if text:
        events.append({"type": stream.events + ".delta", **at, "delta": text, **_fresh(said)})
    events.append({"type": stream.events + ".done", **at, stream.field: text, **_fresh(said)})
    events.append({"type": "response.content_part.done", **at, "part": _fresh(part)})
    return events


def _arguments(item: Json, at: Json) -> list[Json]:
    """A function call's arguments, in one delta."""
    arguments = item.get("arguments") or ""
    delta = [{"type": "response.function_call_arguments.delta", **at, "delta": arguments}]
    done = {"type": "response.function_call_arguments.done", **at, "arguments": arguments,
            "name": item.get("name", "")}  # fmt: skip
    return [*(delta if arguments else []), done]


# What streams between an item's added and done events, by its type (others: nothing).
ITEM_BODIES: Mapping[str, Callable[[Json, Json], list[Json]]] = MappingProxyType(
    {"message": _parts, "reasoning": _parts, "function_call": _arguments}
)

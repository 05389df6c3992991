"""What the scripted OpenAI upstream answers on `POST …/responses`: the response object and its
stream's events, from a chat result of the fake model (chat_render), in OpenAI's shapes (the
openai SDK's types in openai/types/responses/).

* The response: `resp_<48 hex>`, `object: "response"`, `status` "completed", or "incomplete"
  with `incomplete_details: {"reason": "max_output_tokens"}` when the token bound cut the output
  (`is_cut`); the request's fields echoed with OpenAI's defaults (`temperature`/`top_p` 1.0,
  `tool_choice` "auto", `truncation` "disabled", `text.format` text, verbosity medium, `reasoning`
  `{effort: null, summary: null}`, `store` true, `metadata` {}); `usage` in the Responses API's
  words (`input_tokens`, `output_tokens`, their details 0).
* Output: a text or JSON answer is one message item (`msg_…`, role assistant, one `output_text`
  part with `annotations: []` and `logprobs`: chat's `logprobs.content` entries with
  `include: ["message.output_text.logprobs"]`, else []); tool calls are `function_call` items
  (`fc_…`, `call_id` `call_…`, `arguments` chat_fake.fake_arguments).
* Stream: `response.created`, `response.in_progress`, then per item `response.output_item.added`,
  for a message `response.content_part.added`, one `response.output_text.delta` per token,
  `response.output_text.done`, `response.content_part.done`, for a call one
  `response.function_call_arguments.delta` per piece and `response.function_call_arguments.done`,
  then `response.output_item.done`; last `response.completed` or `response.incomplete` with the
  whole response. Deltas carry an `obfuscation` padding unless
  `stream_options.include_obfuscation` is false. Events are numbered by `numbered`.
* A failure mid-stream (`__midstream_error__`, `failed_stream`): the events up to the second
  delta, then `response.failed`, the response OpenAI's API reference shows for it: `status:
  "failed"`, `error: {"code": "server_error", "message": "The model failed to generate a
  response."}`, `output: []`, `usage: null`. (OpenAI's separate `error` event is for a request
  that fails as a whole; a response that fails while it is generated ends `response.failed`.)
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson

from .chat_dialects import openai_entry
from .chat_fake import fake_arguments
from .chat_render import CallOut, ChatChoiceOut, ChatResult
from .fakegen import Token
from .responses_request import ResponsesParams

Json = dict[str, Any]
MIDSTREAM_DELTAS = 2
FAILED_ERROR: Json = {"code": "server_error", "message": "The model failed to generate a response."}


def message_kinds(deltas: int) -> list[str]:
    """OpenAI's events of one streamed message of `deltas` text deltas, as a test expects them
    (a response's opening and closing events are the caller's to add)."""
    return [
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]


OPENING = ["response.created", "response.in_progress"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass(frozen=True)
class Delta:
    """One stream delta: its text (or argument piece) and its tokens' log-probs (event shape)."""

    text: str
    logprobs: tuple[Json, ...] = ()


@dataclass(frozen=True)
class OutputItem:
    """An output item as the answer holds it, and the deltas a stream writes it in."""

    item: Json
    deltas: tuple[Delta, ...]

    @property
    def kind(self) -> str:
        kind: str = self.item["type"]
        return kind


@dataclass(frozen=True)
class Answer:
    response: Json
    items: tuple[OutputItem, ...]


# ---------------------------------------------------------------- output items


def is_cut(params: ResponsesParams, choice: ChatChoiceOut) -> bool:
    """Whether the token bound cut the output: `max_output_tokens` reached, or structured output
    longer than the default bound. Without `max_output_tokens` a text ends on its own: the fake
    model says RESPONSES_DEFAULT_MAX_OUTPUT_TOKENS words, and the response is complete."""
    if choice.finish_reason != "length":
        return False
    return params.bound is not None or bool(choice.calls) or params.chat.json_format is not None


def stream_logprob(entry: Json) -> Json:
    """An output_text log-prob as the stream's text events carry it (no bytes)."""
    tops = [{"token": t["token"], "logprob": t["logprob"]} for t in entry["top_logprobs"]]
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": tops}


def message_item(params: ResponsesParams, tokens: tuple[Token, ...], cut: bool) -> OutputItem:
    top = params.chat.top_logprobs
    entries = [openai_entry(t, top) for t in tokens] if params.logprobs else []
    part = {
        "type": "output_text",
        "annotations": [],
        "logprobs": entries,
        "text": "".join(t.text for t in tokens),
    }
    item = {
        "id": new_id("msg"),
        "type": "message",
        "status": "incomplete" if cut else "completed",
        "content": [part],
        "role": "assistant",
    }
    logprobs = [(stream_logprob(e),) for e in entries] if entries else [()] * len(tokens)
    deltas = tuple(Delta(t.text, lp) for t, lp in zip(tokens, logprobs, strict=True))
    return OutputItem(item, deltas)


def _parameters(params: ResponsesParams, name: str) -> Any:
    for tool in params.chat.tools:
        if tool["function"]["name"] == name:
            return tool["function"].get("parameters")
    return None


def call_item(params: ResponsesParams, call: CallOut) -> OutputItem:
    whole = call.arguments == fake_arguments(_parameters(params, call.name))
    item = {
        "id": new_id("fc"),
        "type": "function_call",
        "status": "completed" if whole else "incomplete",
        "arguments": call.arguments,
        "call_id": call.id,
        "name": call.name,
    }
    return OutputItem(item, tuple(Delta(p) for p in call.pieces))


def output_items(params: ResponsesParams, choice: ChatChoiceOut, cut: bool) -> list[OutputItem]:
    if choice.calls:
        return [call_item(params, call) for call in choice.calls]
    return [message_item(params, choice.tokens, cut)]


# ---------------------------------------------------------------- the response object


def _given(body: Json, key: str, default: Any) -> Any:
    value = body.get(key)
    return default if value is None else value


def echoed_tools(body: Json) -> list[Json]:
    """Function tools as OpenAI repeats them (strict by default in the Responses API)."""
    tools = body.get("tools") or []
    return [{"type": "function", "description": None, "strict": True, **t} for t in tools]


def usage(result: ChatResult) -> Json:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def response_object(
    params: ResponsesParams, rid: str, status: str, output: list[Json], used: Json | None
) -> Json:
    """The response object; `incomplete_details` and `completed_at` follow `status`."""
    body = params.body
    reasoning = body.get("reasoning") or {}
    text = body.get("text") or {}
    now = int(time.time())
    return {
        "id": rid,
        "object": "response",
        "created_at": now,
        "status": status,
        "background": False,
        "completed_at": now if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": _given(body, "parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default",
        "store": params.store,
        "temperature": _given(body, "temperature", 1.0),
        "text": {
            "format": _given(text, "format", {"type": "text"}),
            "verbosity": _given(text, "verbosity", "medium"),
        },
        "tool_choice": _given(body, "tool_choice", "auto"),
        "tools": echoed_tools(body),
        "top_logprobs": _given(body, "top_logprobs", 0),
        "top_p": _given(body, "top_p", 1.0),
        "truncation": _given(body, "truncation", "disabled"),
        "usage": used,
        "user": body.get("user"),
        "metadata": _given(body, "metadata", {}),
    }


def render(params: ResponsesParams, result: ChatResult) -> Answer:
    """The whole answer to a request (its stream writes the same response)."""
    choice = result.choices[0]
    cut = is_cut(params, choice)
    items = output_items(params, choice, cut)
    status = "incomplete" if cut else "completed"
    output = [i.item for i in items]
    return Answer(
        response_object(params, new_id("resp"), status, output, usage(result)), tuple(items)
    )


# ---------------------------------------------------------------- stream events


def event(kind: str, **fields: Any) -> Json:
    return {"type": kind, **fields}


def _obfuscation() -> str:
    # OpenAI pads each delta with random characters, so a delta's size tells nothing.
    return secrets.token_urlsafe(1 + secrets.randbelow(12))[:16]


def _padding(obfuscate: bool) -> Json:
    return {"obfuscation": _obfuscation()} if obfuscate else {}


def message_events(index: int, out: OutputItem, obfuscate: bool) -> list[Json]:
    item, part = out.item, out.item["content"][0]
    where = {"item_id": item["id"], "output_index": index}
    head = {**item, "status": "in_progress", "content": []}
    empty = {**part, "logprobs": [], "text": ""}
    deltas = [
        event(
            "response.output_text.delta",
            **where,
            content_index=0,
            delta=d.text,
            logprobs=list(d.logprobs),
            **_padding(obfuscate),
        )
        for d in out.deltas
    ]
    every = [lp for d in out.deltas for lp in d.logprobs]
    return [
        event("response.output_item.added", output_index=index, item=head),
        event("response.content_part.added", **where, content_index=0, part=empty),
        *deltas,
        event(
            "response.output_text.done", **where, content_index=0, text=part["text"], logprobs=every
        ),
        event("response.content_part.done", **where, content_index=0, part=part),
    ]


def call_events(index: int, out: OutputItem, obfuscate: bool) -> list[Json]:
    item = out.item
    where = {"item_id": item["id"], "output_index": index}
    head = {**item, "status": "in_progress", "arguments": ""}
    return [
        event("response.output_item.added", output_index=index, item=head),
        *(
            event(
                "response.function_call_arguments.delta",
                **where,
                delta=d.text,
                **_padding(obfuscate),
            )
            for d in out.deltas
        ),
        event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
    ]


ITEM_EVENTS = {"message": message_events, "function_call": call_events}


def in_progress(response: Json) -> Json:
    """The response as the first events show it: nothing generated yet."""
    return {
        **response,
        "status": "in_progress",
        "completed_at": None,
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }


def stream_events(answer: Answer, obfuscate: bool) -> list[Json]:
    """The events of a stream that ends well (not yet numbered)."""
    final = answer.response
    start = in_progress(final)
    events = [
        event("response.created", response=start),
        event("response.in_progress", response=start),
    ]
    for index, out in enumerate(answer.items):
        events += ITEM_EVENTS[out.kind](index, out, obfuscate)
        events.append(event("response.output_item.done", output_index=index, item=out.item))
    terminal = "response.completed" if final["status"] == "completed" else "response.incomplete"
    return [*events, event(terminal, response=final)]


def failed_response(response: Json) -> Json:
    return {**in_progress(response), "status": "failed", "error": FAILED_ERROR}


def failed_stream(events: list[Json], response: Json) -> tuple[list[Json], Json]:
    """`__midstream_error__`: the events up to the MIDSTREAM_DELTAS-th delta (or up to the first
    item's end, when it has fewer), then `response.failed`; and the failed response."""
    kept, deltas = [], 0
    for ev in events[:-1]:
        if ev["type"].endswith(".done") or deltas == MIDSTREAM_DELTAS:
            break
        kept.append(ev)
        deltas += ev["type"].endswith(".delta")
    failed = failed_response(response)
    return [*kept, event("response.failed", response=failed)], failed


def numbered(events: list[Json]) -> list[Json]:
    """Each event with its `sequence_number` (from 0), after its type, as OpenAI writes them."""
    return [
        {"type": ev["type"], "sequence_number": n, **{k: v for k, v in ev.items() if k != "type"}}
        for n, ev in enumerate(events)
    ]


def sse(ev: Json) -> bytes:
    """`event: <type>` and `data: <json>`: OpenAI's Responses streams name each event."""
    kind: str = ev["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"

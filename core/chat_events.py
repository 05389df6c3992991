"""A Responses stream made from a chat stream: OpenAI's event sequence, synthesized from the
chat's deltas as they come.

    response.created, response.in_progress                      once the chat stream began
    response.output_item.added, response.content_part.added    a message's text begins
    response.output_text.delta …                                its pieces
    response.output_text.done, response.content_part.done,
    response.output_item.done                                   it ends (a tool call begins, or
                                                                the stream ends)
    response.output_item.added, response.function_call_arguments.delta …,
    response.function_call_arguments.done, response.output_item.done     each tool call
    response.completed | response.incomplete                    the chat's end, with its usage
    response.failed                                             a failure after the first event

The first events wait for the chat's first batch, so that a target that fails before it began
can still be retried or fall back. The events carry no `sequence_number`: the gateway numbers
what it writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from core.answers import ChatChunk, ChatChunkChoice, ResponseAnswer, ResponseEvent, Usage
from core.chat_bridge import (
    echo,
    ending,
    function_call,
    item_id,
    output_message,
    output_text,
    usage_of,
)
from core.errors import GatewayError
from core.responses import ResponsesRequest
from core.wire import Json


class _Open:
    """The output item being streamed: a message's text, or a tool call's arguments."""

    __slots__ = ("call", "item", "logprobs", "pieces")

    def __init__(self, item: Json, call: int | None) -> None:
        self.item = item
        self.call = call  # the chat's tool call index, for a function call
        self.pieces: list[str] = []
        self.logprobs: list[Any] = []


class Synthesis:
    """One stream's events, as its chat chunks come."""

    def __init__(self, req: ResponsesRequest) -> None:
        self.echo = echo(req)
        self.output: list[Json] = []
        self.open: _Open | None = None
        self.usage: Usage | None = None
        self.finish: str | None = None

    def response(self, status: str, incomplete: Json | None = None) -> ResponseAnswer:
        return {
            "status": status,
            "output": list(self.output),
            "usage": self.usage if status != "in_progress" else None,
            "incomplete_details": incomplete,
            "error": None,
            "echo": self.echo,
        }

    def start(self) -> list[ResponseEvent]:
        began = self.response("in_progress")
        return [
            {"type": "response.created", "response": began},
            {"type": "response.in_progress", "response": began},
        ]

    def chunks(self, batch: list[ChatChunk]) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        for chunk in batch:
            if "usage" in chunk and chunk["usage"] is not None:
                self.usage = usage_of(chunk["usage"])
            for choice in chunk["choices"]:
                if choice["index"] == 0:  # a Responses request has one choice
                    self._choice(choice, events)
        return events

    def _choice(self, choice: ChatChunkChoice, events: list[ResponseEvent]) -> None:
        delta = choice["delta"]
        text = delta.get("content")
        if text:
            logprobs = choice["logprobs"]
            tokens = (logprobs["content"] if logprobs is not None else None) or []
            self._text(text, list(tokens), events)
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            held = self.open
            if held is None or held.call != call["index"]:
                self._close(events)
                fid, cid = item_id("fc"), call.get("id") or item_id("call")
                item = function_call(fid, cid, function.get("name") or "", "", "in_progress")
                self._begin(_Open(item, call["index"]), events)
            arguments = function.get("arguments")
            if arguments:
                self._arguments(arguments, events)
        if choice["finish_reason"] is not None:
            self.finish = choice["finish_reason"]

    def _begin(self, held: _Open, events: list[ResponseEvent]) -> None:
        self.open = held
        index = len(self.output)
        events.append({"type": "response.output_item.added", "output_index": index,
                       "item": {**held.item}})  # fmt: skip
        if held.call is None:
            events.append({"type": "response.content_part.added", "item_id": held.item["id"],
                           "output_index": index, "content_index": 0,
                           "part": output_text("", [])})  # fmt: skip

    def _text(self, text: str, logprobs: list[Any], events: list[ResponseEvent]) -> None:
        held = self.open
        if held is None or held.call is not None:
            self._close(events)
            held = _Open(output_message(item_id("msg"), [], "in_progress"), None)
            self._begin(held, events)
        held.pieces.append(text)
        held.logprobs.extend(logprobs)
        events.append({"type": "response.output_text.delta", "item_id": held.item["id"],
                       "output_index": len(self.output), "content_index": 0, "delta": text,
                       "logprobs": logprobs})  # fmt: skip

    def _arguments(self, piece: str, events: list[ResponseEvent]) -> None:
        held = self.open
        assert held is not None
        held.pieces.append(piece)
        events.append({"type": "response.function_call_arguments.delta",
                       "item_id": held.item["id"], "output_index": len(self.output),
                       "delta": piece})  # fmt: skip

    def _close(self, events: list[ResponseEvent], status: str = "completed") -> None:
        """The open item's end events; it joins the output (`status`: the message's, when the
        response ends with it)."""
        held, self.open = self.open, None
        if held is None:
            return
        index, whole = len(self.output), "".join(held.pieces)
        item, iid = held.item, held.item["id"]
        if held.call is None:
            part = output_text(whole, held.logprobs)
            events.append({"type": "response.output_text.done", "item_id": iid,
                           "output_index": index, "content_index": 0, "text": whole,
                           "logprobs": held.logprobs})  # fmt: skip
            events.append({"type": "response.content_part.done", "item_id": iid,
                           "output_index": index, "content_index": 0, "part": part})  # fmt: skip
            done = {**item, "status": status, "content": [part]}
        else:
            events.append({"type": "response.function_call_arguments.done", "item_id": iid,
                           "output_index": index, "name": item["name"],
                           "arguments": whole})  # fmt: skip
            done = {**item, "status": "completed", "arguments": whole}
        self.output.append(done)
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})

    def end(self) -> list[ResponseEvent]:
        """The chat ended: the open item closed, and the response's last event."""
        events: list[ResponseEvent] = []
        status, incomplete = ending(self.finish)
        self._close(events, "incomplete" if status == "incomplete" else "completed")
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append({"type": kind, "response": self.response(status, incomplete)})
        return events

    def failed(self, err: GatewayError) -> list[ResponseEvent]:
        """The chat failed after the first event: the response as far as it went, failed."""
        events: list[ResponseEvent] = []
        self._close(events, "incomplete")
        response = self.response("failed")
        response["error"] = {"code": err.code or err.type, "message": err.message}
        events.append({"type": "response.failed", "response": response})
        return events


async def events(
    chat: AsyncIterator[list[ChatChunk]], req: ResponsesRequest
) -> AsyncIterator[list[ResponseEvent]]:
    """The Responses stream of a chat stream (its events in batches as the chunks came). A
    failure after the first event is a `response.failed` event; the error is raised after it,
    so that the gateway counts it."""
    made = Synthesis(req)
    batches = chat.__aiter__()
    try:
        try:
            first = await batches.__anext__()
        except StopAsyncIteration:
            first = []
        yield made.start() + made.chunks(first)
        try:
            async for batch in batches:
                out = made.chunks(batch)
                if out:
                    yield out
        except GatewayError as err:
            yield made.failed(err)
            raise
        yield made.end()
    finally:
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            await aclose()

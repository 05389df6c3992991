"""A Responses stream written as OpenAI writes it: each event `event: <type>` and its
`data:` line, numbered by `sequence_number` from 0, an event that carries the response with the
response object as its document (the gateway's id, time and the caller's model); no `[DONE]`.

A failure after the first event that the stream did not end itself (with `response.failed`)
becomes OpenAI's `error` event: the stream always ends with an event the caller can act on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping

import orjson

from core.answers import ResponseEvent
from core.errors import GatewayError, internal
from gateway.asgi import Send
from gateway.pipeline.shapes import response_document
from gateway.pipeline.sse import Head, StreamResult

log = logging.getLogger("gateway.sse")
# The events that end a response: after one, a failure has been told already.
ENDINGS = frozenset(("response.completed", "response.incomplete", "response.failed"))


class Events:
    """One stream's event writer: its numbering and the response's fixed fields."""

    __slots__ = ("ended", "head", "sequence")

    def __init__(self, head: Head) -> None:
        self.head = head
        self.sequence = 0
        self.ended = False

    def render(self, event: ResponseEvent) -> bytes:
        """The event written: its number added to its JSON (not to a copy of it), a response
        in it as its document."""
        kind = event["type"]
        out: Mapping[str, object] = event
        if "response" in event:
            head = self.head
            document = response_document(
                event["response"], head.model, head.id, head.created, head.shape
            )
            out = {**event, "response": document}
            self.ended = self.ended or kind in ENDINGS
        body = orjson.dumps(out)[:-1] + b',"sequence_number":%d}' % self.sequence
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    def error(self, err: GatewayError) -> bytes:
        body = err.body()["error"]
        event: ResponseEvent = {
            "type": "error",
            "code": body["code"] or body["type"],
            "message": body["message"],
            "param": body["param"],
        }
        return self.render(event)


async def pump_events(
    send: Send,
    first: list[ResponseEvent],
    rest: AsyncIterator[list[ResponseEvent]],
    head: Head,
    result: StreamResult,
) -> None:
    """Send each batch of events as one body; the usage of the response's last event kept."""
    events = Events(head)
    try:
        await _write(send, first, events, result)
        async for batch in rest:
            await _write(send, batch, events, result)
    except GatewayError as err:
        result.error = err
        if not events.ended:
            await _body(send, events.error(err))
    except Exception as exc:  # an adapter bug must still end the stream properly
        log.exception("stream failed")
        result.error = internal(exc)
        if not events.ended:
            await _body(send, events.error(result.error))
    finally:
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _write(
    send: Send, batch: list[ResponseEvent], events: Events, result: StreamResult
) -> None:
    if not batch:
        return
    began = time.perf_counter()
    body = b"".join([events.render(event) for event in batch])
    for event in batch:
        response = event.get("response")
        if response is not None and response["usage"] is not None:
            result.usage = response["usage"]
        elif not result.first_at and event["type"].endswith(".delta"):
            result.first_at = time.perf_counter()
    await _body(send, body)
    result.write_s += time.perf_counter() - began


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})

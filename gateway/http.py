"""Raw ASGI request/response helpers for the hot path (no Request/Response objects)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, MutableMapping
from typing import Any, TypeVar

from gateway.errors import GatewayError, PayloadTooLarge, UnsupportedMediaType, error_json

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
RawHeaders = list[tuple[bytes, bytes]]
T = TypeVar("T")

JSON_HEADERS: RawHeaders = [(b"content-type", b"application/json")]
SSE_HEADERS: RawHeaders = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def header_map(scope: Scope) -> dict[str, str]:
    """Lower-case header name → value (last one wins), decoded once per request."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def read_body(headers: dict[str, str], receive: Receive, limit: int) -> bytes:
    ctype = headers.get("content-type")
    if ctype is not None and ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got '{ctype[:60]}'.", param="content-type"
        )
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body exceeds the limit of {limit} bytes.", param="body")


class ClientGone(Exception):
    """The caller disconnected; nothing is left to answer."""


async def send_bytes(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]]
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": list(headers)})
    await send({"type": "http.response.body", "body": body})


def error_headers(err: GatewayError, extra: RawHeaders) -> RawHeaders:
    out = [*JSON_HEADERS, *extra]
    out.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items())
    return out


async def send_error(send: Send, err: GatewayError, extra: RawHeaders) -> None:
    await send_bytes(send, err.status, error_json(err), error_headers(err, extra))


async def until_disconnect(coro: Coroutine[Any, Any, T], receive: Receive) -> T:
    """Run `coro`; if the caller disconnects first, cancel it (which closes the upstream
    request it is waiting on) and raise ClientGone. Needs the body to be read already."""
    task = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        abandoned = not task.done()
        if abandoned:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if abandoned:
        raise ClientGone()
    return task.result()


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass

"""Raw ASGI request/response helpers for the hot path (no Request/Response objects)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, TypeVar

from core.errors import GatewayError, PayloadTooLarge, UnsupportedMediaType, error_json

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
    if ctype not in (None, "application/json") and _media_type(ctype) != "application/json":
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


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body exceeds the limit of {limit} bytes.", param="body")


class ClientGone(Exception):
    """The caller disconnected; nothing is left to answer."""


async def send_bytes(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]]
) -> None:
    # A content-length spares the caller chunked framing (uvicorn chunks a body without one).
    out = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


def error_headers(err: GatewayError, extra: RawHeaders) -> RawHeaders:
    out = [*JSON_HEADERS, *extra]
    out.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items())
    return out


async def send_error(send: Send, err: GatewayError, extra: RawHeaders) -> None:
    await send_bytes(send, err.status, error_json(err), error_headers(err, extra))


async def caller_stays() -> Message:
    """The `receive` of a request whose caller never leaves (a batch's line): no watch."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


# Where the gateway's protocol (gateway.server.protocol) puts a request's DisconnectWatch in its
# scope.
WATCH = "gateway.disconnect"


class DisconnectWatch:
    """A request's connection, as its protocol sees it: what is registered runs when the
    connection is lost (at once if it already was). `task`: the task the protocol serves the
    request in (asyncio.current_task() costs a system call a request on Python 3.11)."""

    __slots__ = ("_callbacks", "gone", "task")

    def __init__(self, task: asyncio.Task[Any] | None = None) -> None:
        self._callbacks: list[Callable[[], object]] = []
        self.gone = False
        self.task = task

    def add(self, callback: Callable[[], object]) -> None:
        if self.gone:
            callback()
        else:
            self._callbacks.append(callback)

    def discard(self, callback: Callable[[], object]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def lost(self) -> None:
        self.gone = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class WatchedReceive:
    """A request's `receive` with its connection's DisconnectWatch: until_disconnect listens
    to the watch instead of running a task on `receive`."""

    __slots__ = ("_receive", "watch")

    def __init__(self, receive: Receive, watch: DisconnectWatch) -> None:
        self._receive = receive
        self.watch = watch

    def __call__(self) -> Awaitable[Message]:
        return self._receive()


def watched(scope: Scope, receive: Receive) -> Receive:
    """`receive`, with the request's DisconnectWatch when its protocol gave it one."""
    watch = scope.get("extensions", {}).get(WATCH)
    return receive if watch is None else WatchedReceive(receive, watch)


def until_disconnect(coro: Awaitable[T], receive: Receive) -> Awaitable[T]:
    """`coro`, to await; if the caller disconnects first, it is cancelled (which closes the
    upstream request it is waiting on) and ClientGone raised. Needs the body to be read already.

    With the gateway's protocol the connection's watch cancels the awaiting task; otherwise a
    watcher task waits on `receive` (it cancels the awaiting task, which is cheaper than running
    `coro` in a task of its own and waiting on both). A plain function: no coroutine of its
    own between the caller and `coro`."""
    if receive is caller_stays:
        return coro
    if isinstance(receive, WatchedReceive):
        seen = receive.watch
        return _watched(coro, seen.task or _current(), seen)
    return _task_watched(coro, receive)


async def _task_watched(coro: Awaitable[T], receive: Receive) -> T:
    task = _current()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await coro
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientGone() from None
    finally:
        watcher.cancel()


def _current() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    assert task is not None
    return task


async def _watched(coro: Awaitable[T], task: asyncio.Task[Any], watch: DisconnectWatch) -> T:
    cancel = task.cancel
    watch.add(cancel)
    try:
        return await coro
    except asyncio.CancelledError:
        if not watch.gone:
            raise
        task.uncancel()
        raise ClientGone() from None
    finally:
        watch.discard(cancel)

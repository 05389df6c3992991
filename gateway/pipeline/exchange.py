"""One request's context, in two parts: what the request is (`Inbound`: the runtime it began on,
its headers and ids, the way to hear the caller leave) and how its answer is written (`Reply`:
the headers every response of it carries, and whether the response has begun).

The app builds both once per request and hands them to the handler; everything below takes
what it uses of them as arguments.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

from core.errors import GatewayError
from gateway.asgi import RawHeaders, Receive, Send, send_bytes, send_error
from gateway.runtime import Runtime


class Ids:
    """Unique ids without a system call per request: a random per-process prefix and a counter.
    They identify; they are not secrets."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._count: Iterator[int] = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):010x}"


@dataclass(slots=True)
class Inbound:
    """What the request is."""

    # The runtime it began on: it keeps it, whatever a reload swaps in meanwhile.
    runtime: Runtime
    method: str
    path: str
    headers: dict[str, str]  # lower-case name → value, decoded once
    request_id: str
    ids: Ids  # for the ids of what it creates (completions)
    receive: Receive  # the body, then the caller's disconnect
    query: bytes = b""  # the query string, as sent
    background: bool = False  # a batch's line: its providers serve live requests first
    batch: tuple[str, str] | None = None  # a batch's line: its batch's id and its custom_id


@dataclass(slots=True)
class Reply:
    """How the answer is written."""

    send: Send
    headers: RawHeaders = field(default_factory=list)  # on every response: ids, limits, …
    status: int = 0  # the status sent; 0 until the response has begun

    @property
    def started(self) -> bool:
        return self.status != 0

    def add_headers(self, headers: RawHeaders) -> None:
        if headers:
            self.headers = [*self.headers, *headers]

    async def respond(self, status: int, body: bytes, headers: RawHeaders) -> None:
        self.status = status
        await send_bytes(self.send, status, body, headers + self.headers)

    async def start_stream(self, headers: RawHeaders) -> None:
        self.status = 200
        start = {"type": "http.response.start", "status": 200, "headers": headers + self.headers}
        await self.send(start)

    async def error(self, err: GatewayError) -> None:
        """The error as the response, if none has begun (after that, a stream ends with it)."""
        if not self.started:
            await send_error(self.send, err, self.headers)

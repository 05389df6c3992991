"""The gateway's HTTP protocol under uvicorn: uvicorn's own (httptools), with its writes gathered.

uvicorn writes a response's head as soon as the app sends `http.response.start`, and its body
apart: two system calls for every JSON answer, and on loopback each one hands the bytes to the
peer at once. Measured with a profiler, those writes were a quarter of the gateway's time per
request. Here every write a connection makes during one turn of the event loop goes out as one,
at the end of that turn: a JSON answer's head and body leave together, while a stream's head
still leaves at once (the turn ends while the stream waits on its upstream). `make bench` runs
the gateway on uvicorn's stock protocol beside this one (bench/README.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GatheredWrites:
    """A transport that holds what is written until the end of the loop's turn, then writes it
    in one call; everything else passes through to the real one."""

    __slots__ = ("_held", "_loop", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._held.append(bytes(data))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        self._scheduled = False
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()  # what was written goes out before the close
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a transport whose writes are gathered per loop turn."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        gathered = GatheredWrites(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(gathered)  # type: ignore[arg-type]

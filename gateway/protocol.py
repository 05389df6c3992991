"""The gateway's HTTP protocol under uvicorn: uvicorn's own (httptools), with its writes gathered.

uvicorn writes a response's head as soon as the app sends `http.response.start`, and its body
apart: two system calls for every JSON answer, and on loopback each one hands the bytes to the
peer at once. Measured with a profiler, those writes were a quarter of the gateway's time per
request. Here a response's head waits for its body (a JSON answer's two leave together, at
once), and while other requests are served every write waits for the end of the event loop's
turn (GatheredWrites says why). `make bench` runs
the gateway on uvicorn's stock protocol beside this one (bench/README.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http import WATCH, DisconnectWatch


class GatheredWrites:
    """A transport that holds some writes to send them with the next or at the end of the
    loop's turn; everything else passes through to the real one.

    A response's head is held, and leaves with its body when that follows in the same turn (a
    JSON answer: one system call, no turn waited). While other requests are being served
    (`busy`), every write is held to the end of the turn: the turn's writes then leave after
    all its work, which measured faster under load than writing each as it comes. Idle, a
    write other than a head leaves at once (a stream's event is not held)."""

    __slots__ = ("_busy", "_held", "_loop", "_scheduled", "_transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        busy: Callable[[], bool],
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._busy = busy
        self._held: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._busy():
            self._hold(data)
        elif self._held:  # the body of a held head: both now
            self._held.append(bytes(data))
            self.flush()
        elif data[:5] == b"HTTP/":
            self._hold(data)
        else:
            self._transport.write(data)

    def _hold(self, data: bytes | bytearray | memoryview) -> None:
        self._held.append(bytes(data))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._end_of_turn)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _end_of_turn(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
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
    """uvicorn's httptools protocol on a transport whose writes are gathered (GatheredWrites),
    busy while more than one request is being served; each request gets a DisconnectWatch in
    its scope, which the connection's loss sets off (the app then needs no task per request to
    learn that its caller left)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tasks = self.server_state.tasks  # the requests being served, all connections'
        gathered = GatheredWrites(transport, self.loop, lambda: len(tasks) > 1)  # type: ignore[arg-type]
        super().connection_made(gathered)  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None:
            _extensions(self.cycle.scope)[WATCH] = DisconnectWatch()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.cycle is not None:
            watch = _extensions(self.cycle.scope).get(WATCH)
            if isinstance(watch, DisconnectWatch):
                watch.lost()


def _extensions(scope: Any) -> dict[str, Any]:
    """The scope's ASGI extensions (uvicorn types their values loosely)."""
    return cast(dict[str, Any], scope.setdefault("extensions", {}))

"""The gateway's HTTP/1.1 server protocol under uvicorn: httptools parses, ASGI 3 to the app.

Its own because uvicorn's httptools protocol costs more than the gateway can spend: measured on
a trivial ASGI app under wrk on this machine, ~15 µs of CPU a request in uvicorn's Python (a
timer armed and cancelled per request for the keep-alive timeout, an asyncio.Event and a cycle
object of eleven arguments per request, two regular-expression searches per response header,
the head and the body written apart). `make bench` runs the gateway on uvicorn's own protocol
beside this one (`--http uvicorn`; bench/README.md).

It keeps uvicorn's behaviour: keep-alive with its timeout, pipelined requests answered in
order, bodies by length or chunked, `Expect: 100-continue`, HEAD, the date header, flow control
both ways, a 400 for a malformed request, a 500 when the app fails before answering, graceful
shutdown (`shutdown`), the access log. And what the gateway adds:

- a response's head waits for its body (a JSON answer's two leave in one write); a stream's head
  leaves at the end of the event loop's turn at the latest;
- while other requests are being served, every write waits for the end of the turn: the turn's
  writes then leave after all its work, which measured faster under load than writing each as
  it comes. Idle, a stream's event leaves at once;
- each request's scope carries a DisconnectWatch (gateway/http.py), set off by the
  connection's loss, so the app needs no task per request to learn that its caller left;
- the keep-alive timeout is one timer per connection, moved only when it fires early.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
import urllib.parse
from collections import deque
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.http import WATCH, DisconnectWatch, Message

HEADER_NAME_BAD = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
HEADER_VALUE_BAD = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
HIGH_WATER = 65536  # bytes of a request body buffered before reading pauses
# Writes at least this long leave as they are (one writev), not copied into one: measured with
# the bench's embeddings, a 520 kB answer went faster so and a 131 kB one slower.
COPY_LIMIT = 262144
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


class GatewayHttpProtocol(asyncio.Protocol):
    """One connection: its requests parsed as they arrive, each served by the app in a task of
    its own (`Cycle`), one after the other."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.logger = logging.getLogger("uvicorn.error")
        self.access_logger = logging.getLogger("uvicorn.access")
        self.access_log = self.access_logger.hasHandlers()
        self.root_path = config.root_path
        self.keep_alive_s: float = config.timeout_keep_alive
        self.limit = config.limit_concurrency
        self.server_state = server_state
        self.connections = server_state.connections
        self.tasks = server_state.tasks
        self.app_state = app_state
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport | None = None
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.cycle: Cycle | None = None  # the request being answered
        self.pipeline: deque[Cycle] = deque()  # requests that arrived behind it
        self.read_paused = False
        self.writable: asyncio.Future[None] | None = None  # set while writing is paused
        self.held: list[bytes] = []  # writes waiting for the end of the turn
        self.flush_scheduled = False
        self.last_active = 0.0  # the loop's time of the last request's end or bytes in
        self.idle_timer: asyncio.TimerHandle | None = None
        # the request being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100 = False

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connections.add(self)  # type: ignore[arg-type]
        self.transport = transport  # type: ignore[assignment]
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        self.last_active = self.loop.time()
        self._arm_idle_timer(self.keep_alive_s)

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol to upgrade to: the request is served as a plain one
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self._bad_request("Invalid HTTP request received.")

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        cycle = self.cycle
        if cycle is not None:
            cycle.lost()
        self.held = []
        self._resume_writing()

    def eof_received(self) -> None:
        pass

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        self._resume_writing()

    def _resume_writing(self) -> None:
        writable, self.writable = self.writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: idle, close now; else after the response under way."""
        assert self.transport is not None
        if self.cycle is None or self.cycle.complete:
            self._flush()
            self.transport.close()
        else:
            self.cycle.keep_alive = False

    # ---------------------------------------------------------------- httptools callbacks

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect_100 = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100 = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        path, raw_path, query = _target(self.url)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": self.root_path,
            "path": self.root_path + path,
            "raw_path": self.root_path.encode("ascii") + raw_path,
            "query_string": query,
            "headers": self.headers,
            "state": self.app_state.copy(),
            "extensions": {WATCH: DisconnectWatch()},
        }
        keep_alive = version != "1.0" and parser.should_keep_alive()
        cycle = Cycle(self, scope, keep_alive, self.expect_100)
        if self.cycle is None or self.cycle.complete:
            self._start(cycle)
        else:  # pipelined: answered after the one before it
            self._pause_reading()
            self.pipeline.appendleft(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self._receiving()
        if cycle is not None:
            cycle.body.append(body)
            cycle.buffered += len(body)
            if cycle.buffered > HIGH_WATER:
                self._pause_reading()
            cycle.wake()

    def on_message_complete(self) -> None:
        cycle = self._receiving()
        if cycle is not None:
            cycle.more_body = False
            cycle.wake()

    def _receiving(self) -> Cycle | None:
        """The request whose body is arriving: the last one begun (None once answered)."""
        cycle = self.pipeline[0] if self.pipeline else self.cycle
        return None if cycle is None or cycle.complete else cycle

    # ---------------------------------------------------------------- requests

    def _start(self, cycle: Cycle) -> None:
        self.cycle = cycle
        app = self.app
        if self.limit is not None and (
            len(self.connections) >= self.limit or len(self.tasks) >= self.limit
        ):
            self.logger.warning("Exceeded concurrency limit.")
            app = _unavailable
        task = self.loop.create_task(cycle.run(app))
        cycle.task = cycle.scope["extensions"][WATCH].task = task
        self.tasks.add(task)

    def response_done(self) -> None:
        """The response under way has ended: the next pipelined request's turn, or idle."""
        self.server_state.total_requests += 1
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self._resume_reading()
        if self.pipeline:
            self._start(self.pipeline.pop())
        else:
            self.last_active = self.loop.time()

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.read_paused and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()

    def _bad_request(self, message: str) -> None:
        assert self.transport is not None
        body = message.encode("ascii")
        head = b"".join(
            [
                STATUS_LINES[400],
                *(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers),
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body),
            ]
        )
        self.write(head + body)
        self.close()

    # ---------------------------------------------------------------- keep-alive

    def _arm_idle_timer(self, seconds: float) -> None:
        self.idle_timer = self.loop.call_later(seconds, self._idle_check)

    def _idle_check(self) -> None:
        """Close a connection idle for the keep-alive timeout; else look again when it would
        have been."""
        self.idle_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        busy = self.cycle is not None and not self.cycle.complete
        idle_for = self.loop.time() - self.last_active
        if busy or idle_for < self.keep_alive_s:
            self._arm_idle_timer(self.keep_alive_s - (0 if busy else idle_for))
        else:
            self._flush()
            transport.close()

    # ---------------------------------------------------------------- writes

    def write(self, data: bytes) -> None:
        """`data` now, or at the end of the turn while other requests are being served."""
        if len(self.tasks) > 1:
            self.hold(data)
        elif self.held:
            self.held.append(data)
            self._flush()
        elif self.transport is not None:
            self.transport.write(data)

    def hold(self, data: bytes) -> None:
        """`data` at the end of the turn, with whatever else is written until then."""
        self.held.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._end_of_turn)

    def _end_of_turn(self) -> None:
        self.flush_scheduled = False
        self._flush()

    def _flush(self) -> None:
        held, self.held = self.held, []
        transport = self.transport
        if not held or transport is None or transport.is_closing():
            return
        if len(held) == 1:
            transport.write(held[0])
        elif sum(map(len, held)) < COPY_LIMIT:
            transport.write(b"".join(held))
        else:  # one system call all the same (writev), without copying a large body
            transport.writelines(held)

    def close(self) -> None:
        """Close once what was written has left."""
        self._flush()
        if self.transport is not None:
            self.transport.close()

    async def drain(self) -> None:
        writable = self.writable
        if writable is not None:
            await writable


class Cycle:
    """One request and its response: the app's `receive` and `send`."""

    __slots__ = (
        "body",
        "buffered",
        "chunked",
        "complete",
        "conn",
        "disconnected",
        "expect_100",
        "given",
        "head",
        "keep_alive",
        "left",
        "more_body",
        "scope",
        "started",
        "status",
        "task",
        "waiter",
    )

    def __init__(
        self, conn: GatewayHttpProtocol, scope: dict[str, Any], keep_alive: bool, expect: bool
    ) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_100 = expect
        self.body: list[bytes] = []
        self.buffered = 0
        self.more_body = True
        self.given = False  # the whole body has gone to the app
        self.disconnected = False
        self.waiter: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.started = False
        self.complete = False
        self.status = 0
        self.head = b""  # the response's head, held until its body (or the turn's end)
        self.chunked = False
        self.left = 0  # bytes of a response body by content-length still to come

    # ---------------------------------------------------------------- connection events

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def lost(self) -> None:
        if not self.complete:
            self.disconnected = True
        self.scope["extensions"][WATCH].lost()
        self.wake()

    async def _wait(self) -> None:
        self.waiter = self.conn.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    # ---------------------------------------------------------------- ASGI

    async def run(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            self.conn.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.started:
                await self._internal_error()
            else:
                self.conn.close()
        else:
            if not self.started and not self.disconnected:
                self.conn.logger.error("ASGI callable returned without starting response.")
                await self._internal_error()
            elif not self.complete and not self.disconnected:
                self.conn.logger.error("ASGI callable returned without completing response.")
                self.conn.close()
        finally:
            self.conn.tasks.discard(self.task)

    async def receive(self) -> Message:
        conn = self.conn
        if self.expect_100:
            self.expect_100 = False
            if conn.transport is not None and not conn.transport.is_closing():
                conn.write(CONTINUE)
        if not self.given:
            while self.more_body and not self.body and not self.disconnected:
                conn._resume_reading()
                await self._wait()
            if not self.disconnected and not self.complete:
                body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
                self.body = []
                if self.buffered > HIGH_WATER:
                    conn._resume_reading()
                self.buffered = 0
                self.given = not self.more_body
                return {"type": "http.request", "body": body, "more_body": self.more_body}
        while not self.disconnected and not self.complete:  # after the body: the caller's end
            await self._wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        conn = self.conn
        if conn.writable is not None and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected 'http.response.start', but got '{kind}'.")
            self._start(message["status"], message.get("headers", ()))
        elif not self.complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected 'http.response.body', but got '{kind}'.")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected '{kind}' sent after the response was complete.")

    def _start(self, status: int, given: Any) -> None:
        conn = self.conn
        self.started = True
        self.expect_100 = False
        self.status = status
        headers = [*conn.server_state.default_headers, *given]
        if HEADER_NAME_BAD.search(b"".join([n for n, _ in headers])):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_BAD.search(b"".join([v for _, v in headers])):
            raise RuntimeError("Invalid HTTP header value.")
        parts = [STATUS_LINES[status]]
        length: int | None = None
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and length is None and not self.chunked:
                length = int(value.decode())
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.chunked = True
            elif name == b"connection" and b"close" in [
                token.strip() for token in value.lower().split(b",")
            ]:
                self.keep_alive = False
                parts.append(b"connection: close\r\n")
                continue
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive and b"connection: close\r\n" not in parts:
            parts.append(b"connection: close\r\n")
        bodiless = self.scope["method"] == "HEAD" or status in (204, 304)
        if length is None and not self.chunked and not bodiless:
            self.chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        self.left = 0 if self.chunked or length is None else length
        parts.append(b"\r\n")
        self.head = b"".join(parts)
        if length is None:  # a stream: its head leaves by the end of the turn
            conn.hold(self.head)
            self.head = b""
        if conn.access_log:
            self._log(status)

    def _log(self, status: int) -> None:
        """uvicorn's access log line."""
        scope = self.scope
        query = scope["query_string"].decode("latin-1")
        client = scope["client"]
        self.conn.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            f"{client[0]}:{client[1]}" if client else "-",
            scope["method"],
            urllib.parse.quote(scope["path"]) + (f"?{query}" if query else ""),
            scope["http_version"],
            status,
        )

    def _body(self, body: bytes, more: bool) -> None:
        conn = self.conn
        if self.scope["method"] == "HEAD" or self.status in (204, 304):
            out = b""
            self.left = 0
        elif self.chunked:
            out = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                out += b"0\r\n\r\n"
        else:
            if len(body) > self.left:
                raise RuntimeError("Response content longer than Content-Length")
            self.left -= len(body)
            out = body
        if self.head:  # with its body, in one write
            if len(out) < COPY_LIMIT:
                out = self.head + out
            else:
                conn.hold(self.head)
            self.head = b""
        if out:
            conn.write(out)
        if not more:
            if self.left:
                raise RuntimeError("Response content shorter than Content-Length")
            self.complete = True
            self.wake()
            if not self.keep_alive:
                conn.close()
            conn.response_done()

    async def _internal_error(self) -> None:
        await _closing_answer(self.send, 500, b"Internal Server Error")


def _target(url: bytes) -> tuple[str, bytes, bytes]:
    """A request target's path (decoded), raw path and query string."""
    if url[:1] == b"/" and b"#" not in url:
        raw_path, _, query = url.partition(b"?")
    else:  # absolute form, or a fragment
        parsed = httptools.parse_url(url)
        raw_path, query = parsed.path or b"/", parsed.query or b""
    path = raw_path.decode("ascii")
    return (urllib.parse.unquote(path) if "%" in path else path), raw_path, query


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, (tuple, list)) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


async def _unavailable(scope: Any, receive: Any, send: Any) -> None:
    await _closing_answer(send, 503, b"Service Unavailable")


async def _closing_answer(send: Any, status: int, text: bytes) -> None:
    """A plain-text answer after which the connection closes (the server's own errors)."""
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", b"%d" % len(text)),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})

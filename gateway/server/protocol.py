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
- each request's scope carries a DisconnectWatch (gateway/asgi.py), set off by the
  connection's loss, so the app needs no task per request to learn that its caller left;
- the listener's limits (`ListenerLimits`, carried by `GatewayConfig`; a plain uvicorn Config
  gives the defaults): a request's head (its line and headers) is counted as it arrives and
  refused with a 431 past its size or its count of headers, before the parser has taken more
  than a read beyond the size; a head not complete in time, or a body the app waits for whose
  next bytes do not come in time, is answered 408 (or cut, once the answer has begun);
- the timeouts (keep-alive, head, body) are one timer per connection, moved only when it fires
  early;
- with `server.tls` (`GatewayConfig.tls`), each connection is handed over once its handshake is
  done (gateway.server.tls), its scheme https.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
import urllib.parse
from collections import deque
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.asgi import WATCH, DisconnectWatch, Message
from gateway.config.tls import TlsConfig
from gateway.server.tls import Certificates, TlsConnection, TlsListener

HEADER_NAME_BAD = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
HEADER_VALUE_BAD = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
HIGH_WATER = 65536  # bytes of a request body buffered before reading pauses
# Writes at least this long leave as they are (one writev), not copied into one: measured with
# the bench's embeddings, a 520 kB answer went faster so and a 131 kB one slower.
COPY_LIMIT = 262144
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A head's bytes besides its URL and headers (a colon and a line's end each), at the least: the
# shortest method, the spaces around the URL, the version, the request line's end and the head's.
HEAD_FRAME = len(b"GET  HTTP/1.1\r\n\r\n")


@dataclass(frozen=True)
class ListenerLimits:
    """What one request may take of a connection before it is refused (`server:` in the
    config). The keep-alive timeout and the cap on connections are uvicorn's own settings
    (`timeout_keep_alive`, `limit_concurrency`), which its protocols honour too."""

    max_head_bytes: int = 65536  # the request line and headers, 431 past it
    max_headers: int = 100  # 431 past it
    head_s: float = 10.0  # from a request's first byte until its head is complete; then 408
    body_s: float = 30.0  # the longest wait for a body's next bytes while the app waits; 408


DEFAULT_LIMITS = ListenerLimits()


class GatewayConfig(Config):
    """uvicorn's Config with the listener's limits and its TLS: it goes to spawned workers whole
    (pickled), so each worker reads them once, from here."""

    def __init__(
        self,
        *args: Any,
        listener: ListenerLimits = DEFAULT_LIMITS,
        tls: TlsConfig | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.listener = listener
        self.tls = tls
        self.tls_listener: TlsListener | None = None  # made by load(), in the serving process

    def load(self) -> None:
        """uvicorn's, in each serving process; with TLS, the certificates are read there (an
        SSLContext does not pickle), and each connection begins with its handshake
        (gateway.server.tls), under either HTTP protocol."""
        super().load()
        if self.tls is not None:
            handshake_s = min(self.timeout_keep_alive, self.listener.head_s)
            certificates = Certificates(self.tls)
            self.tls_listener = TlsListener(certificates, self.http_protocol_class, handshake_s)
            # uvicorn calls it as it calls the HTTP protocol's class (an SSL protocol is a
            # BufferedProtocol, which its annotation leaves out)
            self.http_protocol_class = TlsConnection  # type: ignore[assignment]


HIDDEN_QUERY = "?..."


class QueryHidden(logging.Filter):
    """The access log's lines (uvicorn's protocols' too) with each request's query string left
    out: a caller may put a key in it (`?api_key=sk-...`), and keys are never logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and "?" in str(args[2]):
            path = str(args[2]).split("?", 1)[0]
            record.args = (args[0], args[1], path + HIDDEN_QUERY, args[3], args[4])
        return True


class _Refused(Exception):
    """Raised in a parser callback to stop the parser: the head is refused."""


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

    # Slots: with more than 30 attributes in its dict, an instance's attribute reads all slowed
    # (CPython 3.11 shares a dict's keys among instances up to 30), ~1.5 µs a request as
    # measured. "__dict__": a subclass, or a test, may still add its own.
    __slots__ = (
        "__dict__",
        "access_log",
        "access_logger",
        "app",
        "app_state",
        "asgi_version",
        "body_s",
        "client",
        "codings",
        "completed_at",
        "config",
        "connections",
        "cycle",
        "expect_100",
        "flush_scheduled",
        "head_began",
        "head_left",
        "head_s",
        "headers",
        "held",
        "in_head",
        "keep_alive_s",
        "last_active",
        "limit",
        "logger",
        "loop",
        "max_head_bytes",
        "max_headers",
        "parser",
        "pipeline",
        "read_paused",
        "refused",
        "root_path",
        "scheme",
        "server",
        "server_state",
        "tasks",
        "timer",
        "timer_due",
        "transport",
        "url",
        "writable",
    )

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
        self.asgi_version = config.asgi_version
        self.keep_alive_s: float = config.timeout_keep_alive
        self.limit = config.limit_concurrency
        limits = config.listener if isinstance(config, GatewayConfig) else DEFAULT_LIMITS
        self.max_head_bytes = limits.max_head_bytes
        self.max_headers = limits.max_headers
        self.head_s = limits.head_s
        self.body_s = limits.body_s
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
        self.timer: asyncio.TimerHandle | None = None  # the timeouts' one timer
        self.timer_due = 0.0  # the loop's time it fires at
        # the request being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100 = False
        self.codings: bytes | None = None  # its Transfer-Encoding, all its lines together
        # Its head is counted by whole reads, from the one it began in or before: the parser
        # never takes more than `head_left` of them. A head that began inside a read, after
        # another request, is counted from the next read on, and once complete, by what the
        # parser gave of it (`_head_size`).
        self.in_head = True  # a head is awaited or under way: reads count against head_left
        self.head_left = limits.max_head_bytes
        self.head_began: float | None = None  # the loop's time of (the read of) its first byte
        self.completed_at = -1.0  # and of the last request's end: the same if it began after
        self.refused = False  # a head was refused (or the request was malformed): parsing ends

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connections.add(self)  # type: ignore[arg-type]
        self.transport = transport  # type: ignore[assignment]
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        self.last_active = self.loop.time()
        self._arm(min(self.keep_alive_s, self.head_s))

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        if self.in_head:
            left = self.head_left - len(data)
            if left < 0:
                self._overflow(data)
                return
            self.head_left = left
        try:  # _feed's, inline: every read of every request comes here
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass
        except httptools.HttpParserError:
            if not self.refused:
                self.logger.warning("Invalid HTTP request received.")
                self._bad_request("Invalid HTTP request received.")

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol to upgrade to: the request is served as a plain one
        except httptools.HttpParserError:
            if not self.refused:  # else a callback refused the head, and stopped the parser
                self.logger.warning("Invalid HTTP request received.")
                self._bad_request("Invalid HTTP request received.")

    def _overflow(self, data: bytes) -> None:
        """A read longer than the head under way may still take: only that much is fed. A head
        that goes on past it is refused; one that ended within it is followed by the rest (a
        body, or the next request, counted afresh)."""
        rest = memoryview(data)  # its parts fed uncopied
        while rest and not self.refused:
            if not self.in_head or len(rest) <= self.head_left:
                if self.in_head:
                    self.head_left -= len(rest)
                self._feed(rest)
                return
            cut, self.head_left = self.head_left, 0
            if cut:
                self._feed(rest[:cut])
                rest = rest[cut:]
            if self.in_head and self.head_left == 0 and not self.refused:
                self._refuse_head()  # the same head, going on past its limit

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
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
        self.codings = None
        self.head_began = self.last_active

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100 = True
        elif name == b"transfer-encoding":
            self.codings = value if self.codings is None else self.codings + b"," + value
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if len(self.headers) > self.max_headers or (
            self.head_began == self.completed_at and self._head_size() > self.max_head_bytes
        ):
            self._refuse_head()
            raise _Refused
        if self.codings is not None and self.codings.strip().lower() != b"chunked":
            # A coding besides chunked ("gzip, chunked"): the parser would frame the body by
            # its chunks and hand on what is still encoded. RFC 9112 6.1: a coding the server
            # does not take is a 501; the connection closes, so nothing after it is read.
            self._refuse_head(_not_implemented)
            raise _Refused
        self.in_head = False
        self.head_began = None
        parser = self.parser
        version = parser.get_http_version()
        path, raw_path, query = _target(self.url)
        scope = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
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
        self.in_head = True  # the next request's head, with a count of its own
        self.head_left = self.max_head_bytes
        self.completed_at = self.last_active
        cycle = self._receiving()
        if cycle is not None:
            cycle.more_body = False
            cycle.wake()

    def _head_size(self) -> int:
        """The head's bytes as parsed: short only by the spaces after its headers' colons."""
        return HEAD_FRAME + len(self.url) + sum([len(n) + len(v) + 3 for n, v in self.headers])

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
        self._answer_and_close(400, message)

    def _answer_and_close(self, status: int, message: str) -> None:
        """The server's own answer, with nothing more parsed after it."""
        assert self.transport is not None
        self._stop_parsing()
        body = message.encode("ascii")
        head = b"".join(
            [
                STATUS_LINES[status],
                *(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers),
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body),
            ]
        )
        self.write(head + body)
        self.close()

    def _stop_parsing(self) -> None:
        """What else arrives goes past the parser (every read takes the slow path, which drops
        it)."""
        self.refused = True
        self.in_head, self.head_left, self.head_began = True, -1, None

    def _refuse_head(self, answer: Any = None) -> None:
        """A head refused (over the limits: `_too_large`, a 431; or `answer`): answered in its
        turn (after the answer under way, if any), and nothing more is read."""
        self._stop_parsing()
        self._pause_reading()
        scope = {
            "type": "http",
            "http_version": "1.1",
            "client": self.client,
            "method": "-",  # not known, or not to be trusted: the access log's line says so
            "path": "-",
            "query_string": b"",
            "extensions": {WATCH: DisconnectWatch()},
        }
        refusal = Refusal(self, scope, False, False)
        refusal.answer = answer or _too_large
        if self.cycle is None or self.cycle.complete:
            self._start(refusal)
        else:
            self.pipeline.appendleft(refusal)

    # ---------------------------------------------------------------- timeouts

    def _arm(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_due = self.loop.time() + seconds
        self.timer = self.loop.call_later(seconds, self._check)

    def _check(self) -> None:
        """The connection's one timer: whichever timeout its state is under. Idle, the
        keep-alive's (closed without a word); reading a head, the head's; the app waiting for
        the body, the body's (408). Otherwise it looks again later, soon enough for a head that
        may begin meanwhile (a body's wait moves it sooner itself: `expect_body`)."""
        self.timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        now = self.loop.time()
        cycle = self.cycle
        if cycle is not None and not cycle.complete:
            if cycle.more_body and cycle.waiter is not None and not cycle.body:
                self._until(self.last_active + self.body_s, now)
            else:
                self._arm(min(self.keep_alive_s, self.head_s))
        elif self.head_began is not None:
            self._until(self.head_began + self.head_s, now)
        elif now - self.last_active < self.keep_alive_s:
            self._arm(min(self.keep_alive_s - (now - self.last_active), self.head_s))
        else:
            self._flush()
            transport.close()

    def _until(self, due: float, now: float) -> None:
        if now < due:
            self._arm(due - now)
        else:
            self._time_out()

    def expect_body(self) -> None:
        """The app waits for the body's next bytes: the body's timeout counts from now (or from
        the bytes that come next), and the timer fires by then."""
        self.last_active = now = self.loop.time()
        if self.timer is None or now + self.body_s < self.timer_due:
            self._arm(self.body_s)

    def _time_out(self) -> None:
        """A head, or a body the app waits for, not come in time: a 408 if no answer has
        begun, else the connection is cut; the app's request is gone either way."""
        cycle = self.cycle if self.cycle is not None and not self.cycle.complete else None
        if cycle is None or not cycle.started:
            self._answer_and_close(408, "Request Timeout")
        else:
            self._stop_parsing()
            self.close()
        if cycle is not None:
            cycle.lost()

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
            returned = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            self.conn.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.started:
                await self._internal_error()
            else:
                self.conn.close()
        else:
            if returned is not None:  # a broken app: what it left on the connection is unknown
                self.conn.logger.error(
                    "ASGI callable should return None, but returned '%s'.", returned
                )
                self.conn.close()
            elif not self.started and not self.disconnected:
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
                conn.expect_body()
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
        """uvicorn's access log line, the query string's values left out (QueryHidden)."""
        scope = self.scope
        client = scope["client"]
        self.conn.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            f"{client[0]}:{client[1]}" if client else "-",
            scope["method"],
            urllib.parse.quote(scope["path"]) + (HIDDEN_QUERY if scope["query_string"] else ""),
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


class Refusal(Cycle):
    """A head refused before the app sees it, answered in its turn (a 431 for one over the
    listener's limits, a 501 for a transfer coding not taken), and the connection closes."""

    __slots__ = ("answer",)
    answer: Any  # the ASGI app that answers it

    async def run(self, app: Any) -> None:
        await super().run(self.answer)


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


async def _too_large(scope: Any, receive: Any, send: Any) -> None:
    await _closing_answer(send, 431, b"Request Header Fields Too Large")


async def _not_implemented(scope: Any, receive: Any, send: Any) -> None:
    await _closing_answer(send, 501, b"Transfer-Encoding other than chunked is not supported")


async def _closing_answer(send: Any, status: int, text: bytes) -> None:
    """A plain-text answer after which the connection closes (the server's own errors)."""
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", b"%d" % len(text)),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})

"""HTTP/1.1 to one upstream origin over pooled keep-alive connections, on asyncio and httptools.

Written here because no client library fits this path (measured in `make bench`, whose
pass-throughs run on each, and in bench/README.md): aiohttp's request machinery cost about a
third of the gateway's CPU per request; rnet (hyper) hands every chunk of a stream across threads
(an SSE stream of 64 events took ten times as long as on aiohttp); pyreqwest (reqwest) cannot
call off a request it sent, so an upstream would go on generating for a caller who left. What
is left to write is small: httptools (the parser uvicorn uses) reads the responses, the
standard library's ssl and asyncio carry the bytes.

A request is one write (head and body together), held to the end of the event loop's turn: the
requests of a turn then leave one after the other, after all its work. Writing each as it came
cost more under load, measured with the bench (about 10 µs of CPU a request more for the
gateway, and for the upstream too): each write would wake the upstream on its own, between
stretches of Python. Its response is read by the connection's protocol as it arrives: the head,
then the body whole (`read`) or as it comes (`chunk`, which returns everything that has arrived,
so a stream is read in as few steps as the network allows). A request cancelled under way aborts
its connection, so the upstream sees the caller leave; a response read to its end gives its
connection back to the pool, any other is closed.

One exchange at a time, and nothing of one exchange may reach the next (a pooled connection
carries every caller's requests in turn): interim 1xx heads are skipped, the connection goes back
to the pool only when a final response was read to its end with nothing after it, and bytes that
come while it is idle, or wait unread on its socket when it is taken from the pool, close it.
What an upstream sends is bounded: the head (all its interim heads together) to MAX_HEAD_BYTES and
MAX_HEADERS, the body, once decoded, to the pool's `max_body_bytes`.

Deadlines are the connection's (`Connection.until`): what is awaited next (the head, the body,
a stream's next part) must come by the time the caller set, or the response fails with
ResponseTimeout and the connection is aborted. One timer per connection, moved only when a
deadline comes sooner than it: most responses end long before it fires, and when it fires early
it is set again for what is due then. An asyncio.timeout per request (a timer set and cancelled
each time, twice for a JSON call, once per read of a stream) measured a tenth of the gateway's
CPU a request.

Idle connections expire: one timer per pool, set only while some connection is idle, closes each
once it has been idle for the pool's `idle_s` (the oldest first, as they were given back), so an
unused connection is not held open on the upstream or a proxy; a connection taken from the pool
is checked against the same time, whatever the timer's lateness.

TLS and proxies: an https origin's connections use the pool's SSL context (tls.py builds it from
a provider's settings). Through a proxy (proxy.py), an https origin's connections are tunnels:
CONNECT, then TLS over it, verified for the origin's host name, each tunnel pooled and reused as
any connection; an http origin's requests go to the proxy in absolute-form. The connect timeout
covers it all (the proxy's connection, its answer to CONNECT, the TLS handshake).
"""

from __future__ import annotations

import asyncio
import math
import os
import select
import socket
import ssl
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from providers.transport.proxy import LASTING, BadAnswer, Opening, Proxy, connect_request, refusal

READ_HIGH = 256 * 1024  # bytes buffered before the connection stops reading (backpressure)
READ_LOW = 64 * 1024
DECODED = frozenset({"gzip", "deflate"})  # content encodings read (and announced)
# The headers that say how a response's body is framed, read by the connection itself.
FRAMING = frozenset({b"content-encoding", b"transfer-encoding", b"content-length"})
MAX_HEAD_BYTES = 64 * 1024  # a response's head with its interim heads: more is no upstream's
MAX_HEADERS = 100  # header lines of one head
MAX_BODY_BYTES = 64 * 1024 * 1024  # a body once decoded, unless the pool is given another bound
# Where the connection is in its exchange. What an upstream sends outside WAITING and BODY was
# not asked for: it is never read as anyone's answer.
IDLE, WAITING, BODY, DONE, FAILED = range(5)


class HttpClientError(Exception):
    """A request that got no complete answer: the connection, not the upstream, failed.
    `lasting`: the same upstream would fail the same way (its certificate refused, a proxy's
    refusal of the gateway's credentials): another try of it is no use."""

    def __init__(self, message: str = "", lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting


class ConnectFailed(HttpClientError):
    """No connection could be opened (its reason: the operating system's words)."""


class ProxyRefused(ConnectFailed):
    """The proxy refused to reach the upstream (`status`: its answer)."""

    def __init__(self, proxy: Proxy, status: int, what: str) -> None:
        why = f"its proxy {proxy.shown} refused {what}: {refusal(status)}"
        super().__init__(why, lasting=status in LASTING)
        self.status = status


class ConnectTimeout(HttpClientError, TimeoutError):
    """No connection within the connect timeout."""


class ConnectionClosed(HttpClientError):
    """The connection ended before the response began."""


class ResponseIncomplete(HttpClientError):
    """The connection ended, or the bytes stopped making sense, before the response's end."""


class ResponseTooLarge(HttpClientError):
    """The body, once decoded, passed the pool's bound (`limit`: that bound, in bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a response body over {limit} bytes")
        self.limit = limit


class ResponseTimeout(HttpClientError, TimeoutError):
    """What was awaited (a connection of the pool, the head, the body or its next part) did not
    come by the deadline set for it."""


# A timer may fire this much before its time (the loop's clock has a resolution): it is due.
TIMER_SLACK_S = 0.001


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        default = 443 if parts.scheme == "https" else 80
        return cls(parts.scheme, parts.hostname, parts.port or default)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class Response:
    """A response whose head has arrived; its body is read from the connection as it comes."""

    __slots__ = ("_conn", "_headers", "_raw", "status")

    def __init__(self, conn: Connection, status: int, raw: list[tuple[bytes, bytes]]) -> None:
        self._conn: Connection | None = conn
        self.status = status
        self._raw = raw
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """Lower-cased names; repeated ones joined by ", ". Decoded when first asked for: a
        JSON answer's are not read unless it is an error."""
        if self._headers is None:
            self._headers = _decoded(self._raw)
        return self._headers

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    def until(self, deadline: float) -> None:
        """What is read next must come by `deadline` (the loop's time; math.inf: no bound)."""
        if self._conn is not None:
            self._conn.until(deadline)

    async def chunk(self) -> bytes | None:
        """All the body that has arrived since the last call (waiting for some if none has);
        None at its end."""
        if self._conn is None:
            raise ResponseIncomplete("the response was closed")
        return await self._conn.body_chunk()

    async def read(self, limit: int | None = None) -> bytes:
        """The body to its end, or its first `limit` bytes (the rest is not waited for)."""
        conn = self._conn
        if limit is None and conn is not None and conn.all_in():
            return conn.take()  # the usual JSON answer: in whole by the time its head is read
        parts: list[bytes] = []
        size = 0
        while limit is None or size < limit:
            chunk = await self.chunk()
            if chunk is None:
                break
            parts.append(chunk)
            size += len(chunk)
        body = b"".join(parts)
        return body if limit is None else body[:limit]

    def close(self) -> None:
        """Done with it: the connection goes back to the pool if the body was read to its end
        and the upstream keeps it alive, else it is closed. Once: the connection may be another
        response's by a second call."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.release()


class Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its response parsed as it arrives."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._socket: select.poll | None = None  # asks the socket if bytes wait unread
        self._parser = httptools.HttpResponseParser(self)
        self._phase = IDLE
        self._head: asyncio.Future[Response] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []
        # The heads (interim ones too) of this request's answer: the bytes of the reads that
        # ended inside a head keep one that never ends from being buffered by the parser
        # without bound; a head that ends within a read is measured when it could be over the
        # bound (those bytes and the read's, `_reading`, are more than it).
        self._head_bytes = 0
        self._reading = 0
        self._interim_bytes = 0  # the interim heads', measured
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._decoded = 0  # body bytes so far, after decoding: bounded by the pool
        self._paused = False
        self._decoder: zlib._Decompress | None = None
        self._encoded = False  # the decoder was given some of the body
        self._until_eof = False  # a body delimited by the connection's end
        self._keep_alive = False  # the upstream keeps the connection open after it
        self._leftover = False  # bytes came after the response's end: never reused
        self._error: HttpClientError | None = None
        self._deadline = math.inf  # by when what the response awaits must come (loop time)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.closed = False
        self.idle_since = 0.0

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not a subclass of asyncio's, but has its methods).
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._socket = select.poll()
            self._socket.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == IDLE:
            self.abort()  # nobody asked: whatever it is, it must not answer the next request
            return
        if phase >= DONE:
            self._leftover = phase == DONE  # after the response's end: not reused
            return
        self._reading = len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:  # HttpParserUpgrade too: a 101
            if self._phase == DONE:  # bytes after the whole answer, in the same read
                self._leftover = True
            else:
                self._fail(ResponseIncomplete(f"an answer that is not HTTP/1.1 ({exc})"))
        if self._phase == WAITING:  # all head: the parser holds it until the head's end
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(ResponseIncomplete(f"a response head over {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if self._phase == BODY and self._until_eof:
            self.on_message_complete()  # the body's end is the connection's
        elif self._phase == WAITING:
            self._fail(ConnectionClosed(_closed_why(exc), lasting=_lasting(exc)))
        elif self._phase == BODY:
            self._fail(ResponseIncomplete("the connection ended before the response's end"))

    def pause_writing(self) -> None:  # a request is one small write: nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # ---------------------------------------------------------------- httptools callbacks
    # Called only while a request waits for its answer (data_received feeds nothing else); a
    # message that begins after the answer's end, in the same read, is left over.

    def on_message_begin(self) -> None:
        if self._phase != WAITING:
            self._leftover = True
        self._raw_headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase == WAITING:
            self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._phase != WAITING:
            return
        raw = self._raw_headers
        if len(raw) > MAX_HEADERS:
            self._fail(ResponseIncomplete(f"a response head of over {MAX_HEADERS} headers"))
            return
        if (
            self._head_bytes + self._reading > MAX_HEAD_BYTES
            and self._interim_bytes + _size(raw) > MAX_HEAD_BYTES
        ):
            self._fail(ResponseIncomplete(f"a response head over {MAX_HEAD_BYTES} bytes"))
            return
        status = self._parser.get_status_code()
        if status < 200:  # interim (103 Early Hints, 100 Continue): the answer is still to come
            if status == 101:
                self._fail(ResponseIncomplete("a 101 (switching protocols) nobody asked for"))
            self._interim_bytes += _size(raw)
            return
        framing: dict[bytes, bytes] = {}
        for name, value in raw:  # repeated ones joined, as one list
            key = name.lower()
            if key in FRAMING:
                framing[key] = value if key not in framing else framing[key] + b"," + value
        if framing:  # else: a body to the connection's end, neither encoded nor chunked
            encoding = framing.get(b"content-encoding", b"").strip().lower().decode("latin-1")
            if encoding in DECODED:
                self._decoder = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15)
            coding = framing.get(b"transfer-encoding")
            if coding is not None and coding.strip().lower() != b"chunked":
                # gzip, chunked: its chunks would be read as the body, still encoded
                self._fail(ResponseIncomplete("a transfer coding other than chunked"))
                return
            self._until_eof = coding is None and b"content-length" not in framing
        else:
            self._until_eof = True
        self._phase = BODY
        head = self._head
        if head is not None and not head.done():
            head.set_result(Response(self, status, raw))

    def on_body(self, body: bytes) -> None:
        if self._phase != BODY:
            return
        room = self._pool.max_body_bytes - self._decoded
        if self._decoder is not None:
            self._encoded = True
            try:  # inflated at most one byte past the bound: a small bomb stays small
                body = self._decoder.decompress(body, room + 1)
            except zlib.error:
                self._fail(ResponseIncomplete("a compressed body that does not decompress"))
                return
            if not body:
                return
        if len(body) > room:
            self._fail(ResponseTooLarge(self._pool.max_body_bytes))
            return
        self._decoded += len(body)
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > READ_HIGH and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._phase != BODY:
            return  # an interim response's end, or one nobody asked for
        # Asked now: the parser forgets once the message is behind it. HTTP/1.0 is not kept,
        # whatever its Connection header says.
        parser = self._parser
        self._keep_alive = parser.should_keep_alive() and parser.get_http_version() == "1.1"
        if self._decoder is not None:
            if self._decoder.unconsumed_tail:  # held back by the bound: the body is too large
                self._fail(ResponseTooLarge(self._pool.max_body_bytes))
                return
            if self._encoded and not self._decoder.eof:
                self._fail(ResponseIncomplete("a compressed body cut short of its end"))
                return
            tail = self._decoder.flush()
            if len(tail) > self._pool.max_body_bytes - self._decoded:
                self._fail(ResponseTooLarge(self._pool.max_body_bytes))
                return
            if tail:
                self._body.append(tail)
        self._phase = DONE
        self._wake()

    # ---------------------------------------------------------------- deadlines

    def until(self, deadline: float) -> None:
        """What the response awaits next must come by `deadline` (the loop's time)."""
        self._deadline = deadline
        if deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._due)

    def _due(self) -> None:
        self._timer, self._timer_at = None, math.inf
        if self._phase not in (WAITING, BODY) or self.closed:
            return  # idle, or the response is all in: nothing is awaited
        if self._deadline <= self._loop.time() + TIMER_SLACK_S:
            self._fail(ResponseTimeout("no answer by the deadline"))
        elif self._deadline < math.inf:
            self.until(self._deadline)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf

    # ---------------------------------------------------------------- the request

    async def exchange(self, head: bytes, body: bytes) -> Response:
        """Send one request; its response once its head is in."""
        assert self._transport is not None
        self._head = self._loop.create_future()
        self._phase = WAITING
        try:
            self._pool.post(self._transport, head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                self._pool.post(self._transport, body)
            return await self._head
        except BaseException:
            self.abort()
            raise

    def all_in(self) -> bool:
        """The whole body has arrived (and nothing went wrong): `take` returns it."""
        return self._phase == DONE

    def take(self) -> bytes:
        """What of the body has arrived, at once (all of it, once `all_in`)."""
        if len(self._body) == 1:
            data = self._body.popleft()
        else:
            data = b"".join(self._body)
            self._body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def body_chunk(self) -> bytes | None:
        while not self._body:
            if self._phase == DONE:
                return None
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            except BaseException:
                self.abort()  # cancelled mid-body: the upstream must see the caller leave
                raise
            finally:
                self._waiter = None
        return self.take()

    def release(self) -> None:
        """Back to the pool only after a final response read to its end, kept alive by the
        upstream, with nothing after it; any other connection is closed."""
        if self._phase != DONE or not self._keep_alive or self._leftover or self.closed:
            self.abort()
            return
        self._reset()
        self._pool.give_back(self)

    def abort(self) -> None:
        """Close at once (an RST rather than waiting on unsent bytes): the upstream sees it."""
        if not self.closed and self._transport is not None:
            self._transport.abort()
        self.closed = True
        self._stop_timer()
        self._pool.forget(self)

    def unread(self) -> bool:
        """Bytes (or the upstream's close) wait on the socket, not yet read: an idle connection
        taken from the pool with them would read them as the next request's answer."""
        return self._socket is None or bool(self._socket.poll(0))

    # ---------------------------------------------------------------- state

    def _reset(self) -> None:
        # The parser stays: it reads the next response of the connection as it read this one.
        self._phase = IDLE
        self._head = None
        self._raw_headers = []
        self._head_bytes = self._interim_bytes = self._decoded = 0
        self._body.clear()
        self._buffered = 0
        self._decoder = None
        self._until_eof = self._keep_alive = self._encoded = False
        self._deadline = math.inf  # the timer stays: the next request's deadline may use it
        self.idle_since = self._loop.time()

    def _fail(self, error: HttpClientError) -> None:
        self._phase = FAILED
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()
        if not self.closed and self._transport is not None:
            self._transport.abort()
            self.closed = True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _size(raw: list[tuple[bytes, bytes]]) -> int:
    """A head's bytes, near enough: each header's name, value, colon, space and line end."""
    return sum([len(name) + len(value) + 4 for name, value in raw])


def _decoded(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in raw:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        known = headers.get(key)
        headers[key] = text if known is None else f"{known}, {text}"
    return headers


# What a failed certificate check means, by OpenSSL's verify code (X509_V_ERR_*).
CERT_PROBLEMS = {
    2: "it is signed by an unknown CA",  # unable to get issuer certificate
    9: "it is not valid yet",
    10: "it has expired",
    18: "it is self-signed and not trusted",
    19: "it is signed by an unknown CA (a self-signed CA in the chain)",
    20: "it is signed by an unknown CA",  # unable to get local issuer certificate
    21: "it is signed by an unknown CA",  # unable to verify the first certificate
    62: "it does not match the host name",
    64: "it does not match the host name",  # an IP address
}
# TLS alerts an upstream sends when it wants a certificate from the gateway: in TLS 1.3 the
# alert comes after the handshake, when the request is read, so it ends the connection, not the
# connect.
CLIENT_CERT_ALERTS = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "PEER_DID_NOT_RETURN_A_CERTIFICATE",
    }
)
CLIENT_CERT_REQUIRED = "it requires a client certificate"


def _why(exc: OSError) -> str:
    """Why a connection failed, in the system's words ("Connection refused"); for TLS, what
    was wrong with the upstream's certificate, or that it wants one of the gateway's."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        problem = CERT_PROBLEMS.get(exc.verify_code, "it failed verification")
        return f"TLS: its certificate was refused: {problem} ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        if exc.reason in CLIENT_CERT_ALERTS:
            return f"TLS: {CLIENT_CERT_REQUIRED} ({exc.reason})"
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)
    if exc.errno and exc.errno > 0:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


def _lasting(exc: BaseException | None) -> bool:
    """The upstream's certificate refused, or one of the gateway's wanted: the same upstream
    would fail the same way on another try."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    return isinstance(exc, ssl.SSLError) and exc.reason in CLIENT_CERT_ALERTS


def _closed_why(exc: Exception | None) -> str:
    """The words of a connection's end before its response began (a TLS alert says why)."""
    ended = "the connection ended before the response began"
    if isinstance(exc, ssl.SSLError):
        return f"{ended}: {_why(exc)}"
    return ended


class Slots:
    """The pool's connections in use, at most `limit`: a request beyond that waits for one to
    come back, first come first served. asyncio.Semaphore's, without a coroutine to await when
    one is free (every request takes one)."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiting: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        """A slot at once, if one is free and nobody waits for one."""
        if self._free and not self._waiting:
            self._free -= 1
            return True
        return False

    async def wait(self) -> None:
        """A slot, once one comes back for this waiter."""
        handed = asyncio.get_running_loop().create_future()
        self._waiting.append(handed)
        try:
            await handed
        except BaseException:
            if handed.done() and not handed.cancelled():
                self.give()  # given one as it was called off: the next waiter's
            raise

    def give(self) -> None:
        while self._waiting:
            handed = self._waiting.popleft()
            if not handed.done():  # not called off
                handed.set_result(None)
                return
        self._free += 1


class Pool:
    """Keep-alive connections to one origin, at most `limit` in use at once (a request waits
    for one beyond that), idle ones closed after `idle_s`; a response's body, decoded, at most
    `max_body_bytes`. An https origin's connections use the `tls` context (the standard
    library's default one when None). Through a `proxy`, an https origin's connections are
    tunnels (CONNECT, then TLS over it), pooled as any other; an http origin's requests go to
    the proxy in absolute-form (`target`)."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        limit: int,
        idle_s: float,
        max_body_bytes: int = MAX_BODY_BYTES,
        *,
        tls: ssl.SSLContext | None = None,
        proxy: Proxy | None = None,
    ) -> None:
        self.origin = Origin.of(url)
        self.max_body_bytes = max_body_bytes
        self._loop = asyncio.get_running_loop()
        self.clock = self._loop.time  # the time deadlines are given in
        self._idle: list[Connection] = []  # oldest first: given back in turn, reused newest first
        self._busy: set[Connection] = set()
        self._slots = Slots(limit)
        self._idle_s = idle_s
        self._expiry: asyncio.TimerHandle | None = None  # set while connections are idle
        https = self.origin.scheme == "https"
        self._ssl = (tls or ssl.create_default_context()) if https else None
        self.proxy = proxy
        forwarded = proxy is not None and not https  # absolute-form requests to the proxy
        self._prefix = f"http://{self.origin.authority}" if forwarded else ""
        announced = {"host": self.origin.authority, "accept-encoding": ", ".join(sorted(DECODED))}
        if forwarded and proxy is not None and proxy.authorization is not None:
            announced["proxy-authorization"] = proxy.authorization  # the proxy reads every one
        fixed = {**announced, **{k.lower(): v for k, v in headers.items()}}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._closed = False
        self._outbox: list[tuple[asyncio.Transport, bytes]] = []  # writes held to the turn's end

    def target(self, path: str) -> str:
        """The request target of `path` ("/v1/completions?x=1"): the path itself, or, sent to a
        forward proxy, the whole URL (absolute-form). Made once per path by the caller."""
        return self._prefix + path

    def refused(self, status: int) -> ProxyRefused | None:
        """A forward proxy's 407 to a request sent through it: its refusal, not an answer of
        the upstream's (which has no reason to ask for proxy credentials)."""
        if status == 407 and self._prefix and self.proxy is not None:
            return ProxyRefused(self.proxy, status, "to forward the request")
        return None

    async def request(
        self,
        method: str,
        path: str,
        body: bytes,
        connect_s: float,
        deadline: float = math.inf,
        extra: bytes = b"",
    ) -> Response:
        """The response to one request (`path`: its target, see `target`), its head in by
        `deadline` (the loop's time), a connection within `connect_s` when a new one is needed;
        the connection stays the response's until `Response.close()`. `extra`: this request's
        own header lines, each ending in CRLF, made by the gateway (never a caller's bytes).
        Raises HttpClientError subclasses."""
        head = b"%s %s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n" % (
            method.encode(), path.encode(), self._fixed, extra, len(body),
        )  # fmt: skip
        if not self._slots.take():
            await self._slot(deadline)
        try:
            conn = self._reuse() or await self._connect(connect_s)
        except BaseException:
            self._slots.give()
            raise
        self._busy.add(conn)  # its slot is given back with it (or when it is aborted)
        conn.until(deadline)
        return await conn.exchange(head, body)

    def post(self, transport: asyncio.Transport, data: bytes) -> None:
        """`data` written at the end of the loop's turn, with the turn's other requests."""
        if not self._outbox:
            self._loop.call_soon(self._send)
        self._outbox.append((transport, data))

    def _send(self) -> None:
        outbox, self._outbox = self._outbox, []
        for transport, data in outbox:
            if not transport.is_closing():  # aborted meanwhile (its request was called off)
                transport.write(data)

    async def _slot(self, deadline: float) -> None:
        """A connection's slot when none was free: waited for until `deadline`."""
        try:
            async with asyncio.timeout_at(None if deadline == math.inf else deadline):
                await self._slots.wait()
        except TimeoutError:
            raise ResponseTimeout("no connection of the pool came free by the deadline") from None

    def _reuse(self) -> Connection | None:
        now = self.clock()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self._idle_s and not conn.unread():
                return conn
            conn.abort()
        return None

    async def _connect(self, seconds: float) -> Connection:
        """A new connection: to the upstream, to its forward proxy, or a tunnel through its
        proxy; all of it (a tunnel's CONNECT exchange and TLS too) within `seconds`."""
        origin, proxy = self.origin, self.proxy
        try:
            async with asyncio.timeout(seconds):
                if proxy is None:
                    return await self._open(origin.host, origin.port, self._ssl)
                if self._ssl is None:
                    return await self._to_proxy(proxy)
                return await self._tunnel(proxy, self._ssl)
        except TimeoutError:
            via = "" if proxy is None else f" through its proxy {proxy.shown}"
            raise ConnectTimeout(f"no connection{via} within {seconds:g} s") from None
        except OSError as exc:  # ssl.SSLError included
            raise ConnectFailed(_why(exc), lasting=_lasting(exc)) from None

    async def _open(self, host: str, port: int, tls: ssl.SSLContext | None) -> Connection:
        _, conn = await self._loop.create_connection(
            lambda: Connection(self),
            host,
            port,
            ssl=tls,
            server_hostname=self.origin.host if tls is not None else None,
        )
        return conn

    async def _to_proxy(self, proxy: Proxy) -> Connection:
        try:
            return await self._open(proxy.host, proxy.port, None)
        except OSError as exc:
            raise ConnectFailed(f"its proxy {proxy.shown} is unreachable: {_why(exc)}") from None

    async def _tunnel(self, proxy: Proxy, tls: ssl.SSLContext) -> Connection:
        """CONNECT through the proxy, then TLS to the upstream over the tunnel, verified for the
        upstream's host name (the proxy never sees inside)."""
        request = connect_request(self.origin.host, self.origin.port, proxy)
        try:
            transport, opening = await self._loop.create_connection(
                lambda: Opening(request), proxy.host, proxy.port
            )
        except OSError as exc:
            raise ConnectFailed(f"its proxy {proxy.shown} is unreachable: {_why(exc)}") from None
        try:
            status = await opening.answered
            if not 200 <= status < 300:
                raise ProxyRefused(proxy, status, "the tunnel")
            conn = Connection(self)
            wrapped = await self._loop.start_tls(
                transport, conn, tls, server_hostname=self.origin.host
            )
        except BadAnswer as exc:
            transport.abort()
            raise ConnectFailed(f"its proxy {proxy.shown} {exc}") from None
        except BaseException:
            opening.answered.cancel()  # nobody waits for it now
            transport.abort()
            raise
        if wrapped is None:  # the connection ended as TLS began
            transport.abort()
            raise ConnectionClosed("the tunnel ended as TLS began")
        conn.connection_made(wrapped)  # start_tls leaves that to its caller
        return conn

    def give_back(self, conn: Connection) -> None:
        if conn in self._busy:
            self._busy.discard(conn)
            self._slots.give()
        if self._closed:
            conn.abort()
            return
        self._idle.append(conn)
        if self._expiry is None:
            self._expiry = self._loop.call_at(conn.idle_since + self._idle_s, self._expire)

    def _expire(self) -> None:
        """Closes the connections idle for `idle_s`, the oldest first; set again for the next
        one due while any is idle (one timer for the pool, none while none is idle)."""
        self._expiry = None
        due = self.clock() - self._idle_s + TIMER_SLACK_S
        expired = 0
        while expired < len(self._idle) and self._idle[expired].idle_since <= due:
            expired += 1
        for conn in self._idle[:expired]:
            conn.abort()  # out of the pool with it (forget)
        if self._idle and not self._closed:
            self._expiry = self._loop.call_at(self._idle[0].idle_since + self._idle_s, self._expire)

    def forget(self, conn: Connection) -> None:
        if conn in self._busy:
            self._busy.discard(conn)
            self._slots.give()
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        """Closes the idle connections now, and those in use as their responses end."""
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for conn in list(self._idle):
            conn.abort()

"""What the differential tests of the gateway's upstream client (providers/transport/http1.py,
tests/security/test_http1_differential.py) are made of:

- `Message`, `Exchange`: an upstream's answer to one request, as data: interim 1xx heads, the
  final response (its framing, encoding, headers, body, or a defect), what follows it, where it
  is cut off, where its bytes are split into writes; rendered to bytes with the request's body
  echoed in it (in a header of every head and in the body), so that an answer read by the wrong
  caller shows;
- the hypothesis strategies that draw them: valid HTTP/1.1, malformed, oversized;
- `LocalServer`: a TCP server on 127.0.0.1 (the base of the scripted upstreams and proxies);
  `Upstream`: one that answers the n-th request it reads with the n-th exchange, its parts
  written a few turns of the loop apart (`write_apart`);
- `oracle`: what h11's client side makes of the same bytes (the independent reading);
- `ask` and `settle`: the client under test driven as the provider drives it (client.py), and
  the loop let run until it has read all the upstream sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import select
import ssl
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, Self

import h11
from hypothesis import strategies as st

from providers.transport import http1

PATH = "/v1/completions"
# Turns of the loop between two writes of an exchange: enough for the client to read each part
# on its own, so that a split point is also a read boundary (not a timed wait).
TURNS = 5
PLAYED_S = 2.0  # a bound on the wait for an exchange the upstream may never have been asked for
SETTLE_TURNS = 200  # a bound on the turns waited for the client to read what was sent
MAX_HEAD_BYTES = 64 * 1024  # the client's bounds (the issue's): a head, all its interim heads
MAX_HEADERS = 100  # together; the header lines of one head
Framing = Literal["length", "chunked", "eof", "none"]
Headers = tuple[tuple[bytes, bytes], ...]


# ---------------------------------------------------------------- messages as data


@dataclass(frozen=True)
class Chunking:
    """How a chunked body is laid out: where it is cut into chunks (positions taken modulo its
    length), each chunk's extension (in turn), the sizes' case and zero padding, the trailer."""

    cuts: tuple[int, ...] = ()
    extensions: tuple[bytes, ...] = (b"",)
    upper: bool = False
    padding: int = 0
    trailers: Headers = ()

    def frame(self, payload: bytes) -> bytes:
        n = len(payload)
        points = sorted({cut % n for cut in self.cuts if n} | {0, n})
        pieces = [payload[a:b] for a, b in itertools.pairwise(points) if b > a]
        out = [self._size(len(piece), i) + piece + b"\r\n" for i, piece in enumerate(pieces)]
        out.append(self._size(0, len(pieces)))
        out.extend(name + b": " + value + b"\r\n" for name, value in self.trailers)
        return b"".join(out) + b"\r\n"

    def _size(self, size: int, index: int) -> bytes:
        digits = f"{size:x}".rjust(len(f"{size:x}") + self.padding, "0")
        digits = digits.upper() if self.upper else digits
        return digits.encode() + self.extensions[index % len(self.extensions)] + b"\r\n"


@dataclass(frozen=True)
class Wire:
    """A message's parts before they are joined: what a defect rewrites."""

    status_line: bytes
    lines: list[bytes]  # the header lines, framing ones excluded
    payload: bytes  # the body as sent, encoded, not yet framed
    separator: bytes

    def joined(self, framing: list[bytes], body: bytes, eol: bytes = b"\r\n") -> bytes:
        head = [self.status_line, *self.lines, *framing]
        return b"".join(line + eol for line in head) + eol + body


@dataclass(frozen=True)
class Defect:
    """A way the final response is malformed (a key of DEFECTS) and which variant of it."""

    kind: str
    variant: int = 0


@dataclass(frozen=True)
class Message:
    """One response head (and body): an interim 1xx, a 101, or a final response."""

    status: int
    version: bytes = b"HTTP/1.1"
    reason: bytes | None = b"OK"  # None: the status line ends after the code
    headers: Headers = ()
    separator: bytes = b": "
    echo_header: bool = True  # an x-request header carrying the request's body
    framing: Framing = "length"
    length_name: bytes = b"Content-Length"
    chunked_name: bytes = b"Transfer-Encoding"
    chunked_value: bytes = b"chunked"
    declared: int | None = None  # a body-less response's Content-Length (a 304's would-be size)
    encoding: bytes | None = None  # the Content-Encoding sent (gzip, deflate, identity, any case)
    body: bytes = b""
    echo_body: bool = True  # the request's body follows `body`
    chunking: Chunking = Chunking()
    connection: bytes | None = None  # the Connection header's value
    defect: Defect | None = None

    def render(self, echo: bytes) -> bytes:
        sep = self.separator
        lines = [name + sep + value for name, value in self.headers]
        if self.echo_header:
            lines.append(b"x-request" + sep + echo)
        if self.connection is not None:
            lines.append(b"Connection" + sep + self.connection)
        payload = b""
        if self.framing != "none":
            payload = encoded(self.body + (echo if self.echo_body else b""), self.encoding)
            if self.encoding is not None:
                lines.append(b"Content-Encoding" + sep + self.encoding)
        wire = Wire(self._status_line(), lines, payload, sep)
        if self.defect is not None:
            return DEFECTS[self.defect.kind](wire, self.defect.variant)
        return wire.joined(self._framing(len(payload)), self._framed(payload))

    def _status_line(self) -> bytes:
        line = b"%s %d" % (self.version, self.status)
        return line if self.reason is None else line + b" " + self.reason

    def _framing(self, size: int) -> list[bytes]:
        sep = self.separator
        if self.framing == "length":
            return [self.length_name + sep + b"%d" % size]
        if self.framing == "chunked":
            return [self.chunked_name + sep + self.chunked_value]
        if self.declared is not None:  # "none": no body whatever the length says
            return [self.length_name + sep + b"%d" % self.declared]
        return []

    def _framed(self, payload: bytes) -> bytes:
        return self.chunking.frame(payload) if self.framing == "chunked" else payload


def encoded(plain: bytes, encoding: bytes | None) -> bytes:
    coding = (encoding or b"").strip().lower()
    if coding == b"gzip":
        return gzip.compress(plain, mtime=0)
    if coding == b"deflate":  # HTTP's deflate is the zlib format
        return zlib.compress(plain)
    return plain


@dataclass(frozen=True)
class Exchange:
    """The upstream's side of one request: its messages (interim heads, then the final
    response), what follows them, where they are cut off, and how they are written."""

    messages: tuple[Message, ...]
    after: bytes | Message | None = None  # sent after the final response: bytes nobody asked for
    cut: int | None = None  # only this many of the messages' bytes (modulo), then the close
    closes: bool = False  # the upstream closes the connection after the exchange
    splits: tuple[int, ...] = ()  # where the bytes are split into writes (modulo their length)
    apart: bool = False  # `after` written on its own, once the client has read the answer

    def wire(self, echo: bytes) -> bytes:
        return b"".join(self.parts(echo))

    def parts(self, echo: bytes) -> list[bytes]:
        """The writes: the messages' bytes split where `splits` say, `after` with the last
        of them or on its own."""
        data = b"".join(message.render(echo) for message in self.messages)
        if self.cut is not None:
            data = data[: self.cut % (len(data) + 1)]
        after = self.after.render(echo) if isinstance(self.after, Message) else self.after
        if self.cut is not None or not after:
            return _split(data, self.splits)
        if self.apart:
            return [*_split(data, self.splits), after]
        return _split(data + after, self.splits)

    def ends_connection(self) -> bool:
        """The upstream closes the connection after it: told to, cut off, or a body delimited
        by the connection's end."""
        last = self.messages[-1]
        return self.closes or self.cut is not None or (last.status >= 200 and last.framing == "eof")


def _split(data: bytes, splits: tuple[int, ...]) -> list[bytes]:
    n = len(data)
    points = sorted({split % n for split in splits if n} | {0, n})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


# ---------------------------------------------------------------- defects (malformed finals)


def _length(wire: Wire, value: bytes) -> bytes:
    return b"Content-Length" + wire.separator + value


def _by_length(wire: Wire, *extra: bytes) -> bytes:
    """The message with `extra` header lines, its payload framed by its length."""
    lines = replace(wire, lines=[*wire.lines, *extra])
    return lines.joined([_length(wire, b"%d" % len(wire.payload))], wire.payload)


def _chunked(payload: bytes) -> bytes:
    return Chunking().frame(payload)


def _duplicate_length(wire: Wire, variant: int) -> bytes:
    n = len(wire.payload)
    second = n if variant % 2 == 0 else n + 1
    return wire.joined([_length(wire, b"%d" % n), _length(wire, b"%d" % second)], wire.payload)


def _length_and_chunked(wire: Wire, variant: int) -> bytes:
    body = _chunked(wire.payload)
    size = len(wire.payload) if variant % 2 == 0 else len(body)
    te = b"Transfer-Encoding" + wire.separator + b"chunked"
    return wire.joined([_length(wire, b"%d" % size), te], body)


BAD_CODINGS = (b"gzip, chunked", b"chunked, gzip", b"identity", b"chunked, chunked", b"xchunked")


def _bad_transfer_coding(wire: Wire, variant: int) -> bytes:
    value = BAD_CODINGS[variant % len(BAD_CODINGS)]
    body = _chunked(wire.payload) if value.endswith(b"chunked") else wire.payload
    return wire.joined([b"Transfer-Encoding" + wire.separator + value], body)


BAD_LENGTHS = (b"abc", b"-1", b"+%d", b"%d %d", b"0x%x", b"9" * 25, b"%d,", b"%d.0")


def _bad_length(wire: Wire, variant: int) -> bytes:
    n = len(wire.payload)
    form = BAD_LENGTHS[variant % len(BAD_LENGTHS)]
    value = form % ((n,) * form.count(b"%")) if b"%" in form else form
    return wire.joined([_length(wire, value)], wire.payload)


def _bad_chunk_size(wire: Wire, variant: int) -> bytes:
    size = (b"zz", b"f" * 20, b"-1", b"0x5", b" 5")[variant % 5]
    body = size + b"\r\n" + wire.payload + b"\r\n0\r\n\r\n"
    return wire.joined([b"Transfer-Encoding: chunked"], body)


def _chunk_overrun(wire: Wire, variant: int) -> bytes:
    data = wire.payload + b"x" * (1 + variant % 3)  # more data than the size line says
    body = b"%x\r\n" % (len(data) - 1) + data + b"\r\n0\r\n\r\n"
    return wire.joined([b"Transfer-Encoding: chunked"], body)


def _chunk_without_crlf(wire: Wire, variant: int) -> bytes:
    ends = (b"XX", b"\n", b"")[variant % 3]
    body = b"%x\r\n" % len(wire.payload) + wire.payload + ends + b"0\r\n\r\n"
    return wire.joined([b"Transfer-Encoding: chunked"], body)


def _obs_fold(wire: Wire, variant: int) -> bytes:
    fold = (b" folded", b"\tfolded")[variant % 2]
    return _by_length(wire, b"x-folded" + wire.separator + b"a", fold)


def _space_before_colon(wire: Wire, variant: int) -> bytes:
    line = (b"Content-Length : %d", b"Content-Length\t: %d")[variant % 2] % len(wire.payload)
    return wire.joined([line], wire.payload)


def _bare_lf(wire: Wire, variant: int) -> bytes:
    return wire.joined([_length(wire, b"%d" % len(wire.payload))], wire.payload, eol=b"\n")


CONTROLS = (b"\x00", b"\x01", b"\x7f", b"\r", b"\x1b")


def _control_in_value(wire: Wire, variant: int) -> bytes:
    control = CONTROLS[variant % len(CONTROLS)]
    return _by_length(wire, b"x-control" + wire.separator + b"a" + control + b"b")


# Not among them: a control character in the reason phrase, which llhttp passes and h11 does
# not; the client never reads the reason.
BAD_STATUS_LINES = (
    b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK", b"HTTP/2 200 OK", b"ICY 200 OK", b"http/1.1 200 OK",
    b"HTTP/1.1  200 OK", b"HTTP/1.1 -200 OK", b"HTTP/1.1 099 OK", b"HTTP/1.1 600 OK", b"HTTP/1.1",
    b"HTTP/0.9 200 OK",
)  # fmt: skip


def _bad_status_line(wire: Wire, variant: int) -> bytes:
    line = BAD_STATUS_LINES[variant % len(BAD_STATUS_LINES)]
    return _by_length(replace(wire, status_line=line))


BAD_LINES = (b"x-no-colon", b"x bad: v", b": no name", b"x-\x00: v", b'x"q": v', b" leading: v")


def _bad_header_line(wire: Wire, variant: int) -> bytes:
    return _by_length(wire, BAD_LINES[variant % len(BAD_LINES)])


def _corrupt_compression(wire: Wire, variant: int) -> bytes:
    coding = (b"gzip", b"deflate")[variant % 2]
    packed = bytearray(encoded(wire.payload + b"{padding}", coding))
    if variant % 4 < 2:
        packed[len(packed) // 2] ^= 0xFF  # a flipped byte
    else:
        del packed[len(packed) // 2 :]  # cut short
    lines = [*wire.lines, b"Content-Encoding" + wire.separator + coding]
    body = bytes(packed)
    return replace(wire, lines=lines).joined([_length(wire, b"%d" % len(body))], body)


DEFECTS: dict[str, Callable[[Wire, int], bytes]] = {
    "duplicate-length": _duplicate_length,
    "length-and-chunked": _length_and_chunked,
    "bad-transfer-coding": _bad_transfer_coding,
    "bad-length": _bad_length,
    "bad-chunk-size": _bad_chunk_size,
    "chunk-overrun": _chunk_overrun,
    "chunk-without-crlf": _chunk_without_crlf,
    "obs-fold": _obs_fold,
    "space-before-colon": _space_before_colon,
    "bare-lf": _bare_lf,
    "control-in-value": _control_in_value,
    "bad-status-line": _bad_status_line,
    "bad-header-line": _bad_header_line,
    "corrupt-compression": _corrupt_compression,
}


# ---------------------------------------------------------------- strategies


def cased(name: str) -> st.SearchStrategy[bytes]:
    """A header name as upstreams write it: lower, title, upper or any mix of cases."""
    whole = st.sampled_from((name.lower(), name.title(), name.upper()))
    mixed = st.integers(0, (1 << len(name)) - 1).map(  # a bit a letter: upper or not
        lambda bits: "".join(c.upper() if bits >> i & 1 else c for i, c in enumerate(name))
    )
    return st.one_of(whole, mixed).map(str.encode)


# Field values: visible ASCII, spaces inside, obs-text (RFC 9110 5.5); none at either end.
VALUE_CHARS = "".join(map(chr, range(0x20, 0x7F))) + "\xe9\xff"
values = st.text(alphabet=VALUE_CHARS, max_size=24).map(lambda text: text.strip().encode("latin-1"))
NAMES = (
    "content-type", "x-request-id", "x-thing", "link", "server", "date", "cache-control",
    "retry-after", "openai-processing-ms", "vary", "set-cookie", "x-ratelimit-remaining-requests",
)  # fmt: skip
# Names drawn from a few: repeated ones come often.
headers = st.lists(st.tuples(st.sampled_from(NAMES).flatmap(cased), values), max_size=6)
separators = st.sampled_from((b": ", b":", b":\t", b":  "))
reasons = st.sampled_from((b"OK", None, b"", b"Early Hints", b"Anything At All", b"\xe9t\xe9"))
bodies = st.tuples(st.binary(max_size=40), st.sampled_from((1, 1, 1, 50, 400))).map(
    lambda drawn: drawn[0] * drawn[1]
)  # up to 16 KB: several reads, several chunks
chunkings = st.builds(
    Chunking,
    cuts=st.lists(st.integers(1, 1 << 16), max_size=6).map(tuple),
    extensions=st.lists(
        st.sampled_from((b"", b";ext", b";name=value", b";a=1;b=2", b';q="quoted value"')),
        min_size=1,
        max_size=3,
    ).map(tuple),
    upper=st.booleans(),
    padding=st.integers(0, 3),
    trailers=st.lists(st.tuples(cased("x-trailer"), values), max_size=2).map(tuple),
)
encodings = st.sampled_from((None, b"gzip", b"deflate", b"GZIP", b"Deflate", b"identity"))
# Kept alive three times in four: the pooled connection is what is under test.
KEEP = (None, None, None, b"keep-alive", b"Keep-Alive", b"keep-alive") * 3 + (
    b"close", b"Close", b"CLOSE", b"keep-alive, close", b"close", b"Close",
)  # fmt: skip


def sometimes(one_in: int) -> st.SearchStrategy[bool]:
    """True once in `one_in` draws (shrinking to False)."""
    return st.integers(0, one_in - 1).map(lambda drawn: drawn == one_in - 1)


@st.composite
def finals(draw: st.DrawFn) -> Message:
    """A final response: any status, framing and encoding, HTTP/1.1 or 1.0."""
    status = draw(st.sampled_from((200, 201, 400, 401, 404, 429, 500, 503, 204, 304)))
    version = b"HTTP/1.0" if draw(sometimes(6)) else b"HTTP/1.1"
    declared: int | None = None
    if status in (204, 304):  # no body, whatever the head says of one
        framing: Framing = "none"
        declared = draw(st.sampled_from((None, 0, 0 if status == 204 else 1234)))
    elif version == b"HTTP/1.0":  # no chunks in 1.0
        framing = draw(st.sampled_from(("length", "eof")))
    else:
        framing = draw(st.sampled_from(("length", "chunked") * 3 + ("eof",)))
    return Message(
        status,
        version=version,
        reason=draw(reasons),
        headers=tuple(draw(headers)),
        separator=draw(separators),
        echo_header=draw(st.booleans()),
        framing=framing,
        length_name=draw(cased("content-length")),
        chunked_name=draw(cased("transfer-encoding")),
        chunked_value=draw(st.sampled_from((b"chunked", b"Chunked", b"CHUNKED"))),
        declared=declared,
        encoding=draw(encodings),
        body=draw(bodies),
        echo_body=draw(st.booleans()),
        chunking=draw(chunkings),
        connection=draw(st.sampled_from(KEEP)),
    )


interims = st.builds(
    Message,
    st.sampled_from((103, 100, 102)),
    reason=reasons,
    headers=st.lists(
        st.tuples(cased("link"), st.just(b"</style.css>; rel=preload; as=style")), max_size=2
    ).map(tuple),
    separator=separators,
    echo_header=st.booleans(),
    framing=st.just("none"),
)
SWITCH = Message(
    101,
    reason=b"Switching Protocols",
    headers=((b"Upgrade", b"websocket"),),
    connection=b"Upgrade",
    framing="none",
)
garbage = st.one_of(
    st.just(b"\r\n"),
    st.binary(min_size=1, max_size=16),
    finals(),  # a second answer to the same request
    interims,  # an interim head after the final one
    st.just(b"HTTP/1.1 200 OK\r\n"),  # a head begun
)


@st.composite
def exchanges(draw: st.DrawFn, final: st.SearchStrategy[Message] | None = None) -> Exchange:
    """Interim heads (a 101 sometimes among them or instead of the final), a final response,
    sometimes bytes after it, sometimes cut off, written in parts."""
    messages = draw(st.lists(interims, max_size=3))
    last = draw(final if final is not None else finals())
    switch = draw(st.sampled_from(("no",) * 16 + ("before", "instead")))
    if switch == "before":
        messages.insert(draw(st.integers(0, len(messages))), SWITCH)
    messages.append(SWITCH if switch == "instead" else last)
    delimited = last.framing != "eof" or switch == "instead"  # else what follows is its body
    return Exchange(
        tuple(messages),
        after=draw(garbage) if delimited and draw(st.booleans()) else None,
        cut=draw(st.integers(0, 1 << 20)) if draw(sometimes(8)) else None,
        closes=draw(sometimes(5)),
        splits=tuple(draw(st.lists(st.integers(1, 1 << 20), max_size=8))),
        apart=draw(st.booleans()),
    )


defects = st.builds(Defect, st.sampled_from(sorted(DEFECTS)), st.integers(0, 11))
malformed = exchanges(
    st.tuples(finals(), defects).map(lambda drawn: replace(drawn[0], defect=drawn[1]))
)


# ---------------------------------------------------------------- the scripted upstream


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's body (by its content-length); None once the client has gone."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def write_apart(writer: asyncio.StreamWriter, parts: Iterable[bytes]) -> bool:
    """Each part written, a few turns of the loop apart; False when the connection closed
    before all were."""
    for part in parts:
        if writer.transport.is_closing():  # uvloop raises on a write to a closed one
            return False
        writer.write(part)
        await writer.drain()
        for _ in range(TURNS):
            await asyncio.sleep(0)
    return True


class LocalServer:
    """A TCP server on 127.0.0.1 (TLS with `tls`, a server context), `async with`: its `port`
    and `url` (http(s)://127.0.0.1:port); each connection served by `_serve` and aborted after
    it, or at the end of the `async with` if it is still open."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.port = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []  # aborted at the end

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'http' if self.tls is None else 'https'}://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()
        for _ in range(TURNS):  # the transports' ends run before the loop does
            await asyncio.sleep(0)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            await self._serve(reader, writer)
        finally:
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class Upstream(LocalServer):
    """A TCP server on 127.0.0.1 that answers a request (on whichever connection) with the
    exchange scripted for its body, its parts written a few turns of the loop apart, the body
    echoed in it; `played[body]` is set once that exchange is all written (and its connection
    closed, if it ends it). By body, not by order: a request the client gave up on before the
    upstream read it (its connection reset) takes no other caller's script."""

    def __init__(self, exchanges: Mapping[bytes, Exchange]) -> None:
        super().__init__()
        self.exchanges = exchanges
        self.played = {body: asyncio.Event() for body in exchanges}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (body := await read_request(reader)) is not None:
            if body not in self.exchanges or not await self._play(body, writer):
                return

    async def _play(self, echo: bytes, writer: asyncio.StreamWriter) -> bool:
        """The exchange written; False when the connection is over."""
        exchange = self.exchanges[echo]
        try:
            if not await write_apart(writer, exchange.parts(echo)):
                return False
            if exchange.ends_connection():
                writer.close()  # a FIN after what was written (an abort could lose it)
                await writer.wait_closed()
                return False
            return True
        except ConnectionError:  # the client gave up on the connection
            return False
        finally:
            self.played[echo].set()


# ---------------------------------------------------------------- both readings


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names lower-cased, repeated ones joined by ", " (as http1's)
    body: bytes  # decoded


@dataclass(frozen=True)
class Failed:
    why: str


Outcome = Answer | Failed


@dataclass(frozen=True)
class Verdict:
    """What h11 made of an exchange's bytes: the answer (or why there is none), whether the
    connection could carry another request after it, and what came after the answer's end."""

    outcome: Outcome
    reusable: bool = False
    leftover: bytes = b""


def oracle(data: bytes, closed: bool, body: bytes, max_head: int = MAX_HEAD_BYTES) -> Verdict:
    """h11's client side after sending the same request, fed `data` (then the close)."""
    conn = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=max_head)
    headers = [("host", "upstream.test"), ("content-length", str(len(body)))]
    conn.send(h11.Request(method="POST", target=PATH, headers=headers))
    conn.send(h11.Data(data=body))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    if closed:
        conn.receive_data(b"")
    final: h11.Response | None = None
    parts: list[bytes] = []
    try:
        while not isinstance(event := conn.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                return Verdict(Failed("h11: the bytes end before the response does"))
            if isinstance(event, h11.InformationalResponse):
                continue  # a 1xx other than 101 (h11 refuses a 101 nobody asked for)
            if isinstance(event, h11.Response):
                final = event
            elif isinstance(event, h11.Data):
                parts.append(event.data)
            else:
                return Verdict(Failed(f"h11: {event!r} before the response's end"))
    except h11.RemoteProtocolError as exc:
        return Verdict(Failed(f"h11: {exc}"))
    assert final is not None
    merged = _merged(final.headers)
    try:
        decoded = _decoded(b"".join(parts), merged.get("content-encoding", ""))
    except (OSError, EOFError, zlib.error) as exc:
        return Verdict(Failed(f"the body does not decode: {exc}"))
    reusable = conn.our_state is h11.DONE and conn.their_state is h11.DONE
    return Verdict(Answer(final.status_code, merged, decoded), reusable, conn.trailing_data[0])


def _merged(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name, value in headers:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        merged[key] = text if key not in merged else f"{merged[key]}, {text}"
    return merged


def _decoded(body: bytes, coding: str) -> bytes:
    coding = coding.strip().lower()
    if not body or coding not in ("gzip", "deflate"):
        return body
    return gzip.decompress(body) if coding == "gzip" else zlib.decompress(body)


async def ask(pool: http1.Pool, body: bytes, within_s: float) -> Outcome:
    """One request as the provider makes it (client.py's call_raw): the head, the body read
    whole, the response closed; any HttpClientError is the outcome. `within_s` bounds both, so
    that a client waiting for bytes that never come fails instead of hanging."""
    deadline = pool.clock() + within_s
    try:
        resp = await pool.request("POST", PATH, body, within_s, deadline)
    except http1.HttpClientError as exc:
        return Failed(f"{type(exc).__name__}: {exc}")
    try:
        headers = dict(resp.headers)  # read at once, as an error answer's are
        resp.until(deadline)
        data = await resp.read()
    except http1.HttpClientError as exc:
        return Failed(f"{type(exc).__name__}: {exc}")
    finally:
        resp.close()
    return Answer(resp.status, headers, data)


def _unread(conn: http1.Connection) -> bool:
    """Bytes (or the upstream's close) wait on the connection's socket, not yet read."""
    transport = conn._transport
    sock = None if conn.closed or transport is None else transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return False
    readable, _, _ = select.select([sock.fileno()], [], [], 0)
    return bool(readable)


async def settle(pool: http1.Pool, played: asyncio.Event) -> None:
    """Once the upstream has written all of an exchange (and closed, if it does), the loop
    runs until the client has read all of it: nothing waits unread on any of its sockets. A
    request the upstream never read (the client reset its connection first, when its deadline
    passed on a loaded machine) has nothing to wait for: the wait for it is bounded."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(PLAYED_S):
            await played.wait()
    for _ in range(SETTLE_TURNS):
        if not any(_unread(conn) for conn in [*pool._idle, *pool._busy]):
            break
        await asyncio.sleep(0)
    for _ in range(TURNS):  # a close read: the transport's end runs a turn later
        await asyncio.sleep(0)


def pooled(pool: http1.Pool) -> bool:
    """A connection waits in the pool for the next request."""
    return any(not conn.closed for conn in pool._idle)

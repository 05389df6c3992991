"""The gateway's HTTP/1.1 client (providers/transport/http1.py) against a server that says
exactly what each test scripts, byte for byte: keep-alive reuse, bodies by length, chunks or
the connection's end, compression, streaming as bytes arrive, backpressure, the pool's limit
and idle expiry, and every way a connection can fail (refused, closed before the answer, cut
mid-body, not HTTP, cancelled by the caller), and the requests of a turn held to its end."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from providers.transport import http1

pytestmark = pytest.mark.asyncio
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
DEADLINE_S = 5.0


@dataclass
class Server:
    """Accepts connections and hands each to `handler` (set by the test); counts them and keeps
    what each request's head said."""

    handler: Handler | None = None
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # a connection reached its end
    url: str = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        assert self.handler is not None
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's head (its body read by its content-length); None at the end."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.gone.set()
            return None
        self.heads.append(head)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return await reader.readexactly(length)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    listening = await asyncio.start_server(srv.serve, "127.0.0.1", 0)
    srv.url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
    yield srv
    listening.close()


def json_answer(body: bytes, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    return head + b"content-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def answering(server: Server, *answers: bytes) -> Handler:
    """Answers each request on a connection with the next of `answers`, keeping it open."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            if await server.request(reader) is None:
                return
            writer.write(answer)
            await writer.drain()
        await reader.read()  # until the client closes

    return handle


def use(server: Server, handler: Handler, limit: int = 4, idle_s: float = 30.0) -> http1.Pool:
    server.handler = handler
    return make_pool(server.url, limit, idle_s)


def make_pool(url: str, limit: int = 4, idle_s: float = 30.0) -> http1.Pool:
    return http1.Pool(url, {"content-type": "application/json", "x-team": "t"}, limit, idle_s)


async def post(pool: http1.Pool, path: str = "/v1/completions") -> http1.Response:
    async with asyncio.timeout(DEADLINE_S):
        return await pool.request("POST", path, b'{"x":1}', 2.0)


async def whole(resp: http1.Response) -> bytes:
    async with asyncio.timeout(DEADLINE_S):
        try:
            return await resp.read()
        finally:
            resp.close()


# ---------------------------------------------------------------- answers


async def test_a_json_answer_and_the_connection_kept_for_the_next(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b'{"a":1}'), json_answer(b'{"b":2}')))
    first = await post(pool)
    assert (first.status, first.content_type) == (200, "application/json")
    assert await whole(first) == b'{"a":1}'
    assert await whole(await post(pool, "/v1/embeddings")) == b'{"b":2}'
    assert server.connections == 1
    head = server.heads[0].decode()
    assert head.startswith("POST /v1/completions HTTP/1.1\r\n")
    assert f"host: {server.url.removeprefix('http://')}\r\n" in head
    assert "x-team: t\r\n" in head and "content-length: 7\r\n" in head
    assert "accept-encoding: deflate, gzip\r\n" in head
    assert server.heads[1].startswith(b"POST /v1/embeddings HTTP/1.1\r\n")


async def test_headers_are_lower_cased_and_repeated_ones_joined(server: Server) -> None:
    extra = b"Retry-After: 2\r\nX-Thing: a\r\nx-thing: b\r\n"
    pool = use(server, answering(server, json_answer(b"{}", extra)))
    resp = await post(pool)
    assert resp.headers["retry-after"] == "2" and resp.headers["x-thing"] == "a, b"
    await whole(resp)


async def test_a_chunked_stream_arrives_as_it_is_sent(server: Server) -> None:
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"))
        await writer.drain()
        await release.wait()
        writer.write(chunk(b"data: 2\n\n") + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    pool = use(server, handle)
    resp = await post(pool)
    assert resp.content_type == "text/event-stream"
    async with asyncio.timeout(DEADLINE_S):
        assert await resp.chunk() == b"data: 1\n\n"  # before the rest was even sent
        release.set()
        assert await resp.chunk() == b"data: 2\n\n"
        assert await resp.chunk() is None
    resp.close()
    assert len(pool._idle) == 1  # read to its end: kept


async def test_what_arrived_together_is_read_together(server: Server) -> None:
    events = b"".join(chunk(b"data: %d\n\n" % i) for i in range(5)) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    pool = use(server, answering(server, head + events))
    resp = await post(pool)
    async with asyncio.timeout(DEADLINE_S):
        assert await resp.chunk() == b"".join(b"data: %d\n\n" % i for i in range(5))
    assert await whole(resp) == b""


async def test_gzip_and_deflate_bodies_are_decoded(server: Server) -> None:
    packed = gzip.compress(b'{"zipped":true}')
    zipped = json_answer(packed, b"content-encoding: gzip\r\n")
    deflated = json_answer(zlib.compress(b'{"deflated":1}'), b"content-encoding: deflate\r\n")
    pool = use(server, answering(server, zipped, deflated))
    assert await whole(await post(pool)) == b'{"zipped":true}'
    assert await whole(await post(pool)) == b'{"deflated":1}'
    assert server.connections == 1


async def test_a_body_to_the_connections_end(server: Server) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"all":')
        await writer.drain()
        writer.write(b'"of it"}')
        writer.close()

    pool = use(server, handle)
    assert await whole(await post(pool)) == b'{"all":"of it"}'
    assert pool._idle == []  # its end was the connection's


async def test_connection_close_is_not_kept(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b"{}", b"connection: close\r\n")))
    await whole(await post(pool))
    assert pool._idle == []


async def test_a_large_body_is_read_through_backpressure(server: Server) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB, eight times the read-ahead
    pool = use(server, answering(server, json_answer(body)))
    resp = await post(pool)
    await asyncio.sleep(0.05)  # the connection reads ahead, then pauses
    assert resp._conn is not None and resp._conn._paused
    assert await whole(resp) == body


# ---------------------------------------------------------------- the pool


async def test_requests_beyond_the_limit_wait_for_a_connection(server: Server) -> None:
    pool = use(server, answering(server, *(json_answer(b"{}") for _ in range(3))), limit=1)
    first = await post(pool)
    waiting = asyncio.create_task(post(pool))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await whole(first)
    await whole(await waiting)
    assert server.connections == 1


async def test_idle_connections_expire(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b"{}")), idle_s=0.05)
    await whole(await post(pool))
    await asyncio.sleep(0.1)
    await whole(await post(pool))
    assert server.connections == 2


async def test_idle_connections_are_closed_when_they_expire(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b"{}"), json_answer(b"{}")), idle_s=0.05)
    first, second = await post(pool), await post(pool)  # two connections
    await whole(first)
    await whole(second)
    assert len(pool._idle) == 2 and pool._expiry is not None  # one timer for the pool
    async with asyncio.timeout(DEADLINE_S):
        await server.gone.wait()  # the upstream sees the pool close one, unasked
        while pool._idle:  # noqa: ASYNC110 - the other's close has no event of its own
            await asyncio.sleep(0.01)
    assert pool._expiry is None  # nothing idle: no timer


async def test_a_connection_reused_before_it_expires_is_kept(server: Server) -> None:
    pool = use(server, answering(server, *(json_answer(b"{}") for _ in range(3))), idle_s=30.0)
    for _ in range(3):
        await whole(await post(pool))
    assert server.connections == 1 and len(pool._idle) == 1
    pool.close()
    assert pool._expiry is None


async def test_a_connection_the_upstream_closed_while_idle_is_not_used(server: Server) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(json_answer(b"{}"))
        await writer.drain()  # then closes, as an upstream's keep-alive timeout does

    pool = use(server, handle)
    await whole(await post(pool))
    async with asyncio.timeout(DEADLINE_S):
        while not pool._idle[0].closed:  # noqa: ASYNC110 - a connection's close has no event
            await asyncio.sleep(0.01)
    await whole(await post(pool))
    assert server.connections == 2


async def test_a_closed_pool_closes_what_comes_back(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b"{}")))
    resp = await post(pool)
    pool.close()
    await whole(resp)
    assert pool._idle == []


# ---------------------------------------------------------------- failures


async def test_a_refused_connection(server: Server) -> None:
    pool = make_pool("http://127.0.0.1:1")
    with pytest.raises(http1.ConnectFailed) as caught:
        await post(pool)
    assert "refused" in str(caught.value).lower()


async def test_closed_before_the_answer(server: Server) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)

    with pytest.raises(http1.ConnectionClosed):
        await post(use(server, handle))


async def test_cut_mid_body(server: Server) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"a":')
        await writer.drain()

    resp = await post(use(server, handle))
    with pytest.raises(http1.ResponseIncomplete):
        await whole(resp)


async def test_an_answer_that_is_not_http(server: Server) -> None:
    pool = use(server, answering(server, b"SSH-2.0-OpenSSH_9.2\r\n\r\n"))
    with pytest.raises(http1.ResponseIncomplete):
        await post(pool)


async def test_the_requests_of_a_turn_leave_at_its_end(server: Server) -> None:
    pool = use(server, answering(server, *(json_answer(b"{}") for _ in range(2))))
    assert await whole(await post(pool)) == b"{}"  # a connection to reuse: no connect to await
    second = asyncio.create_task(post(pool))
    await asyncio.sleep(0)  # its request is made, and held until the turn ends
    assert len(pool._outbox) == 1 and server.heads == [server.heads[0]]
    assert await whole(await second) == b"{}"
    assert pool._outbox == [] and len(server.heads) == 2


async def test_a_request_whose_connection_ends_before_the_turn_does_is_not_sent(
    server: Server,
) -> None:
    pool = use(server, answering(server, json_answer(b"{}"), json_answer(b"{}")))
    assert await whole(await post(pool)) == b"{}"
    second = asyncio.create_task(post(pool))
    await asyncio.sleep(0)
    (conn,) = pool._busy
    conn.abort()  # before the turn's writes leave
    with pytest.raises(http1.ConnectionClosed):
        await second
    async with asyncio.timeout(DEADLINE_S):
        await server.gone.wait()  # the connection ended with no second request on it
    assert len(server.heads) == 1


async def test_a_cancelled_request_aborts_its_connection(server: Server) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        await reader.read()  # no answer: waits for the client to leave
        server.gone.set()

    pool = use(server, handle)
    waiting = asyncio.create_task(post(pool))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    async with asyncio.timeout(DEADLINE_S):
        await server.gone.wait()  # the upstream saw the caller leave
    assert pool._busy == set() and pool._idle == []


def one_chunk_then_held(server: Server) -> Handler:
    """Answers the head and one chunk of a stream, then nothing until the client leaves."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"x"))
        await writer.drain()
        await reader.read()
        server.gone.set()

    return handle


async def test_a_response_left_unread_aborts_its_connection(server: Server) -> None:
    pool = use(server, one_chunk_then_held(server))
    resp = await post(pool)
    resp.close()
    async with asyncio.timeout(DEADLINE_S):
        await server.gone.wait()
    resp.close()  # a second close is nothing
    assert pool._idle == []


# ---------------------------------------------------------------- deadlines


def after(pool: http1.Pool, seconds: float) -> float:
    return pool.clock() + seconds


async def test_a_head_not_in_by_its_deadline_fails_and_aborts_the_connection(
    server: Server,
) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        await reader.read()  # never answers: waits for the client to leave
        server.gone.set()

    pool = use(server, handle)
    with pytest.raises(http1.ResponseTimeout):
        async with asyncio.timeout(DEADLINE_S):
            await pool.request("POST", "/v1/completions", b"{}", 2.0, after(pool, 0.1))
    async with asyncio.timeout(DEADLINE_S):
        await server.gone.wait()  # the upstream saw the request given up
    assert pool._busy == set() and pool._idle == []


async def test_a_body_that_stops_coming_fails_by_its_deadline(server: Server) -> None:
    pool = use(server, one_chunk_then_held(server))
    resp = await post(pool)
    resp.until(after(pool, 0.1))
    assert await resp.chunk() == b"x"
    with pytest.raises(http1.ResponseTimeout):
        async with asyncio.timeout(DEADLINE_S):
            await resp.chunk()
    async with asyncio.timeout(DEADLINE_S):
        await server.gone.wait()  # the connection was aborted: the upstream saw it
    resp.close()
    assert pool._idle == []


async def test_a_sooner_deadline_on_a_reused_connection_holds(server: Server) -> None:
    """The connection's timer was set for the first request's far deadline; the second's
    sooner one moves it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(json_answer(b"{}"))
        await writer.drain()
        await server.request(reader)
        await reader.read()  # the second is never answered

    pool = use(server, handle)
    first = await pool.request("POST", "/", b"{}", 2.0, after(pool, 60.0))
    await whole(first)
    with pytest.raises(http1.ResponseTimeout):
        async with asyncio.timeout(DEADLINE_S):
            await pool.request("POST", "/", b"{}", 2.0, after(pool, 0.1))
    assert server.connections == 1


async def test_a_later_deadline_outlives_the_timer_of_a_sooner_one(server: Server) -> None:
    """The timer set for the first request's near deadline fires during the second, whose
    deadline is later: it is set again, and the answer that comes before it is read."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(json_answer(b'{"a":1}'))
        await server.request(reader)
        await asyncio.sleep(0.3)  # past the first deadline, before the second
        writer.write(json_answer(b'{"b":2}'))
        await reader.read()

    pool = use(server, handle)
    assert await whole(await pool.request("POST", "/", b"{}", 2.0, after(pool, 0.1))) == b'{"a":1}'
    second = await pool.request("POST", "/", b"{}", 2.0, after(pool, DEADLINE_S))
    assert await whole(second) == b'{"b":2}'
    assert server.connections == 1


async def test_a_response_all_in_is_not_failed_by_its_deadline(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b'{"a":1}'), json_answer(b"{}")))
    resp = await pool.request("POST", "/", b"{}", 2.0, after(pool, 0.05))
    await asyncio.sleep(0.1)  # the deadline passes with the body read in, not yet taken
    assert await whole(resp) == b'{"a":1}'
    assert pool._idle and not pool._idle[0].closed  # kept for the next request
    await whole(await post(pool))
    assert server.connections == 1


async def test_waiting_for_a_free_connection_ends_at_the_deadline(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b"{}")), limit=1)
    held = await post(pool)
    with pytest.raises(http1.ResponseTimeout):
        async with asyncio.timeout(DEADLINE_S):
            await pool.request("POST", "/", b"{}", 2.0, after(pool, 0.1))
    await whole(held)
    assert pool._idle  # the slot came back with the connection


async def test_slots_are_handed_in_order_and_passed_on_by_a_waiter_called_off() -> None:
    slots = http1.Slots(1)
    assert slots.take() and not slots.take()
    first, second, third = (asyncio.create_task(slots.wait()) for _ in range(3))
    await asyncio.sleep(0)
    second.cancel()  # called off while waiting: skipped
    slots.give()
    first.cancel()  # called off once handed the slot: it passes it on
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert third.done() and not third.cancelled()
    assert not slots.take()  # third holds it
    slots.give()
    assert slots.take()
    for task in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await task


# ---------------------------------------------------------------- isolation between exchanges


async def test_interim_heads_are_skipped_for_the_final_answer(server: Server) -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
    pool = use(server, answering(server, early + json_answer(b'{"a":1}'), json_answer(b"{}")))
    first = await post(pool)
    assert first.status == 200 and "link" not in first.headers
    assert await whole(first) == b'{"a":1}'
    assert await whole(await post(pool)) == b"{}"
    assert server.connections == 1  # read to its end: kept


async def test_an_unasked_for_switch_of_protocols_fails(server: Server) -> None:
    switch = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n"
    pool = use(server, answering(server, switch + json_answer(b"{}")))
    with pytest.raises(http1.ResponseIncomplete, match="101"):
        await post(pool)
    assert pool._idle == []


async def test_bytes_after_the_answer_keep_the_connection_out_of_the_pool(server: Server) -> None:
    pool = use(server, answering(server, json_answer(b"{}") + json_answer(b'{"stray":1}')))
    assert await whole(await post(pool)) == b"{}"
    assert pool._idle == []


async def test_bytes_on_an_idle_connection_close_it(server: Server) -> None:
    released, sent = asyncio.Event(), asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await server.request(reader) is None:
            return
        writer.write(json_answer(b'{"mine":1}'))
        await released.wait()
        writer.write(json_answer(b'{"someone else":1}'))  # nobody asked
        await writer.drain()
        sent.set()
        await reader.read()

    pool = use(server, handle)
    assert await whole(await post(pool)) == b'{"mine":1}'
    (conn,) = pool._idle
    released.set()
    async with asyncio.timeout(DEADLINE_S):
        await sent.wait()
    # Read by then or waiting on the socket: either way it never answers the next request.
    assert conn.closed or conn.unread()
    server.handler = answering(server, json_answer(b'{"yours":1}'))
    assert await whole(await post(pool)) == b'{"yours":1}'
    assert conn.closed and server.connections == 2


async def test_a_decoded_body_past_the_bound_fails(server: Server) -> None:
    bomb = gzip.compress(b"0" * 100_000)
    server.handler = answering(
        server, json_answer(b"x" * 2048), json_answer(bomb, b"content-encoding: gzip\r\n")
    )
    pool = http1.Pool(server.url, {}, 4, 30.0, max_body_bytes=1024)
    for _ in range(2):
        with pytest.raises(http1.ResponseTooLarge) as caught:
            await whole(await post(pool))
        assert caught.value.limit == 1024
    assert pool._idle == []


async def test_a_body_at_the_bound_is_read(server: Server) -> None:
    server.handler = answering(
        server, json_answer(gzip.compress(b"1" * 1024), b"content-encoding: gzip\r\n")
    )
    pool = http1.Pool(server.url, {}, 4, 30.0, max_body_bytes=1024)
    assert await whole(await post(pool)) == b"1" * 1024


@pytest.mark.parametrize(
    "extra",
    [
        b"".join(b"x-h%d: v\r\n" % i for i in range(http1.MAX_HEADERS + 1)),
        b"x-big: " + b"v" * http1.MAX_HEAD_BYTES + b"\r\n",
    ],
    ids=["count", "size"],
)
async def test_an_oversized_head_fails(server: Server, extra: bytes) -> None:
    pool = use(server, answering(server, json_answer(b"{}", extra)))
    with pytest.raises(http1.ResponseIncomplete, match="head"):
        await post(pool)


async def test_a_head_that_never_ends_fails_at_the_bound(server: Server) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
        for _ in range(2 * http1.MAX_HEAD_BYTES // 4096):
            writer.write(b"v" * 4096)
            await writer.drain()
        await reader.read()

    pool = use(server, handle)
    with pytest.raises(http1.ResponseIncomplete, match="head over"):
        await post(pool)

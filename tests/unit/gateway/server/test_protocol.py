"""The gateway's HTTP protocol (gateway/server/protocol.py), driven byte for byte over a recording
transport: a response's head leaves with its body, a stream's by the end of the turn, a busy
loop's writes at the end of its turn; keep-alive, pipelining, chunked and 100-continue bodies,
HEAD, `Connection: close` and HTTP/1.0, a malformed request, a failing app, the caller's
disconnect (its DisconnectWatch), the keep-alive timeout and graceful shutdown; the listener's
limits (a head's size and count of headers, counted as it arrives and never fed to the parser
past its size; the head's and the body's timeouts). Then the watch itself (gateway/asgi.py)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.asgi import (
    WATCH,
    ClientGone,
    DisconnectWatch,
    Message,
    WatchedReceive,
    until_disconnect,
    watched,
)
from gateway.server.protocol import (
    DEFAULT_LIMITS,
    GatewayConfig,
    GatewayHttpProtocol,
    ListenerLimits,
)

pytestmark = pytest.mark.asyncio


class Recorder:
    """The real transport's side: what was written, in how many calls, and the close."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.lines: list[list[bytes]] = []  # writelines' calls, each one system call
        self.closed = self.reading_paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after the close"
        self.writes.append(data)

    def writelines(self, lines: list[bytes]) -> None:
        assert not self.closed, "a write after the close"
        self.lines.append(list(lines))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def get_extra_info(self, name: str) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name)

    @property
    def sent(self) -> bytes:
        return b"".join(self.writes)


App = Callable[[Any, Any, Any], Awaitable[None]]


def connect(
    app: App, keep_alive_s: float = 5.0, limits: ListenerLimits | None = None
) -> tuple[GatewayHttpProtocol, Recorder]:
    """A connection on uvicorn's own Config, or on the gateway's with `limits`."""
    if limits is None:
        config = uvicorn.Config(app, proxy_headers=False, log_config=None)
    else:
        config = GatewayConfig(app, proxy_headers=False, log_config=None, listener=limits)
    config.load()
    conn = GatewayHttpProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    conn.keep_alive_s = keep_alive_s  # uvicorn's setting is whole seconds
    real = Recorder()
    conn.connection_made(cast(asyncio.Transport, real))
    return conn, real


async def settle() -> None:
    """Let the request's task run as far as it can."""
    for _ in range(10):
        await asyncio.sleep(0)


def answering(body: bytes = b"{}", status: int = 200, read: bool = True) -> App:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if read:
            await receive()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


GET = b"GET /v1/models?x=1 HTTP/1.1\r\nhost: h\r\n\r\n"


def post(body: bytes, *extra: bytes) -> bytes:
    head = b"POST /v1/completions HTTP/1.1\r\nhost: h\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(extra) + b"\r\n" + body


# ---------------------------------------------------------------- writes


async def test_a_head_and_its_body_leave_as_one_at_once() -> None:
    conn, real = connect(answering(b'{"a":1}'))
    conn.data_received(GET)
    await settle()
    assert len(real.writes) == 1
    assert real.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert real.writes[0].endswith(b'content-length: 7\r\n\r\n{"a":1}')
    assert not real.closed


async def test_a_large_body_leaves_with_its_head_uncopied() -> None:
    body = b"x" * (1 << 20)
    conn, real = connect(answering(body))
    conn.data_received(GET)
    await settle()
    assert real.writes == [] and len(real.lines) == 1
    head, sent = real.lines[0]
    assert head.endswith(b"content-length: 1048576\r\n\r\n") and sent is body


async def test_a_streams_head_leaves_by_the_turns_end_and_idle_events_at_once() -> None:
    go = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await go.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    conn, real = connect(app)
    conn.data_received(GET)
    await settle()
    assert len(real.writes) == 1 and b"transfer-encoding: chunked\r\n" in real.writes[0]
    go.set()
    await settle()
    assert real.writes[1:] == [b"9\r\ndata: 1\n\n\r\n", b"0\r\n\r\n"]


async def test_busy_the_turns_writes_leave_at_its_end_in_one() -> None:
    conn, real = connect(answering())
    others = [asyncio.create_task(asyncio.sleep(60)) for _ in range(2)]
    conn.tasks.update(others)  # this request's and another's
    conn.write(b"a")
    conn.write(b"b")
    assert real.writes == []
    await asyncio.sleep(0)
    assert real.writes == [b"ab"]
    for task in others:
        task.cancel()


# ---------------------------------------------------------------- requests


async def test_the_scope_and_the_body_as_asgi_gives_them() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.extend([scope, await receive(), asyncio.current_task()])
        await answering()(scope, receive, send)

    conn, _ = connect(app)
    conn.data_received(post(b'{"x":1}', b"content-type: application/json\r\n"))
    await settle()
    scope, message, task = seen
    assert (scope["method"], scope["path"], scope["query_string"]) == (
        "POST",
        "/v1/completions",
        b"",
    )
    assert (b"content-type", b"application/json") in scope["headers"]
    assert scope["client"] == ("127.0.0.1", 5000) and scope["http_version"] == "1.1"
    assert isinstance(scope["extensions"][WATCH], DisconnectWatch)
    assert scope["extensions"][WATCH].task is task  # the request's task, for until_disconnect
    assert message == {"type": "http.request", "body": b'{"x":1}', "more_body": False}


async def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    order: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        order.append(scope["path"])
        await asyncio.sleep(0.01 if scope["path"] == "/first" else 0)
        await answering(scope["path"].encode())(scope, receive, send)

    conn, real = connect(app)
    first = b"GET /first HTTP/1.1\r\nhost: h\r\n\r\n"
    conn.data_received(first + b"GET /second HTTP/1.1\r\nhost: h\r\n\r\n")
    async with asyncio.timeout(5):
        while real.sent.count(b"HTTP/1.1 200") < 2:  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.005)
    assert order == ["/first", "/second"]
    assert real.sent.index(b"/first") < real.sent.index(b"/second")
    assert not real.closed and conn.server_state.total_requests == 2


def collecting(bodies: list[Any]) -> Any:
    """An app that keeps each part of the body it reads in `bodies`, then answers."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            bodies.append(message["body"])
            if not message["more_body"]:
                break
        await answering(read=False)(scope, receive, send)

    return app


async def test_a_chunked_body_in_pieces() -> None:
    bodies: list[Any] = []
    app = collecting(bodies)

    conn, real = connect(app)
    conn.data_received(
        b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"
    )
    await settle()
    conn.data_received(b"2\r\nde\r\n0\r\n\r\n")
    await settle()
    assert b"".join(bodies) == b"abcde" and b"HTTP/1.1 200" in real.sent


async def test_expect_100_continue_is_answered_when_the_body_is_read() -> None:
    conn, real = connect(answering())
    conn.data_received(post(b"", b"expect: 100-continue\r\n"))
    await settle()
    assert real.writes[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert real.writes[1].startswith(b"HTTP/1.1 200 OK")


async def test_head_has_no_body() -> None:
    conn, real = connect(answering(b"12345"))
    conn.data_received(b"HEAD / HTTP/1.1\r\nhost: h\r\n\r\n")
    await settle()
    assert real.sent.endswith(b"content-length: 5\r\n\r\n")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET / HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
    ],
)
async def test_a_connection_not_kept_is_closed_after_its_answer(request_bytes: bytes) -> None:
    conn, real = connect(answering())
    conn.data_received(request_bytes)
    await settle()
    assert b"connection: close\r\n" in real.sent and real.sent.endswith(b"{}") and real.closed


async def test_a_malformed_request_is_a_400_and_closes() -> None:
    conn, real = connect(answering())
    conn.data_received(b"NOT HTTP AT ALL\r\n\r\n")
    assert real.sent.startswith(b"HTTP/1.1 400 Bad Request\r\n") and real.closed


async def test_an_app_that_fails_before_answering_is_a_500() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("boom")

    conn, real = connect(app)
    conn.data_received(GET)
    await settle()
    assert real.sent.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and real.closed


async def test_a_bad_header_from_the_app_closes_the_connection() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"x-bad", b"a\r\nb")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

    conn, real = connect(app)
    conn.data_received(GET)
    await settle()
    assert real.closed and b"x-bad" not in real.sent


# ---------------------------------------------------------------- the connection's end


async def test_a_lost_connection_sets_off_the_watch_and_ends_receive() -> None:
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append(await receive())
        got.append(await receive())  # after the body: waits for the caller to leave
        got.append(scope["extensions"][WATCH].gone)
        await send({"type": "http.response.start", "status": 200, "headers": []})

    conn, real = connect(app)
    conn.data_received(post(b"{}"))
    await settle()
    conn.connection_lost(None)
    await settle()
    assert got[1] == {"type": "http.disconnect"} and got[2] is True
    assert not real.writes  # nothing is written for a caller who left


async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    conn, real = connect(answering(), keep_alive_s=0.05)
    conn.data_received(GET)
    await settle()
    assert not real.closed
    async with asyncio.timeout(5):
        while not real.closed:  # noqa: ASYNC110 - the close is a timer's
            await asyncio.sleep(0.01)


async def test_a_request_under_way_outlives_the_keep_alive_timeout() -> None:
    go = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await go.wait()
        await answering()(scope, receive, send)

    conn, real = connect(app, keep_alive_s=0.02)
    conn.data_received(GET)
    await asyncio.sleep(0.1)
    assert not real.closed
    go.set()
    await settle()
    assert real.sent.endswith(b"{}")


async def test_shutdown_closes_an_idle_connection_and_a_busy_one_after_its_answer() -> None:
    idle, idle_real = connect(answering())
    idle.shutdown()
    assert idle_real.closed
    go = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await go.wait()
        await answering()(scope, receive, send)

    busy, busy_real = connect(app)
    busy.data_received(GET)
    await settle()
    busy.shutdown()
    assert not busy_real.closed
    go.set()
    await settle()
    assert b"connection: close\r\n" in busy_real.sent and busy_real.closed


# ---------------------------------------------------------------- the listener's limits


class Counting:
    """The connection's parser, counting what it is fed."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.fed = 0

    def feed_data(self, data: bytes) -> None:
        self.fed += len(data)
        self.real.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def counted(
    app: App, limits: ListenerLimits = DEFAULT_LIMITS
) -> tuple[GatewayHttpProtocol, Recorder, Counting]:
    conn, real = connect(app, limits=limits)
    parser = Counting(conn.parser)
    conn.parser = cast(Any, parser)
    return conn, real, parser


def with_header(size: int, end: bytes = b"\r\n\r\n") -> bytes:
    """A GET whose head is `size` bytes long (with `end`), most of them one header's value."""
    bare = b"GET / HTTP/1.1\r\nx: " + end
    return b"GET / HTTP/1.1\r\nx: " + b"a" * (size - len(bare)) + end


LIMIT = DEFAULT_LIMITS.max_head_bytes
TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\n"


@pytest.mark.parametrize(("size", "status"), [(LIMIT, b"200"), (LIMIT + 1, b"431")])
async def test_a_head_is_served_up_to_its_limit(size: int, status: bytes) -> None:
    conn, real = connect(answering(), limits=DEFAULT_LIMITS)
    conn.data_received(with_header(size))
    await settle()
    assert real.sent.startswith(b"HTTP/1.1 " + status)
    assert real.closed is (status == b"431")


async def test_a_head_past_its_limit_is_a_431_and_the_parser_gets_no_more() -> None:
    conn, real, parser = counted(answering())
    conn.data_received(with_header(4 * LIMIT))
    await settle()
    assert real.sent.startswith(TOO_LARGE) and real.closed
    assert b"connection: close\r\n" in real.sent
    assert parser.fed == LIMIT


async def test_a_head_in_many_reads_is_counted_across_them() -> None:
    """One byte of header value after another, never ending: the parser never holds more than
    the limit (httptools gathers a header's value whole before handing it over)."""
    conn, real, parser = counted(answering())
    conn.data_received(b"GET / HTTP/1.1\r\nx: ")
    for _ in range(LIMIT + 100):
        conn.data_received(b"a")
    await settle()
    assert real.sent.startswith(TOO_LARGE) and real.closed
    assert parser.fed == LIMIT


async def test_more_headers_than_the_limit_are_a_431() -> None:
    limits = ListenerLimits(max_headers=3)
    for count, status in ((3, b"200"), (4, b"431")):
        conn, real = connect(answering(), limits=limits)
        lines = b"".join(b"x-%d: v\r\n" % i for i in range(count))
        conn.data_received(b"GET / HTTP/1.1\r\n" + lines + b"\r\n")
        await settle()
        assert real.sent.startswith(b"HTTP/1.1 " + status)


async def test_pipelined_heads_are_counted_each_on_its_own() -> None:
    """In one read: two heads that together pass the limit are both served; a head past it
    behind a small one is refused, in its turn (after the first's answer), though it began
    inside the read."""
    conn, real = connect(answering(read=False))
    conn.data_received(with_header(LIMIT * 3 // 4) * 2)
    async with asyncio.timeout(5):
        while real.sent.count(b"HTTP/1.1 200") < 2:  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.005)
    assert not real.closed
    conn, real = connect(answering(read=False))
    conn.data_received(GET + with_header(LIMIT + 10))
    await settle()
    assert real.sent.startswith(b"HTTP/1.1 200 OK\r\n")
    assert real.sent.index(b"{}") < real.sent.index(TOO_LARGE) and real.closed


async def test_a_431_behind_an_answer_under_way_waits_for_it() -> None:
    go = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await go.wait()
        await answering()(scope, receive, send)

    conn, real = connect(app)
    conn.data_received(GET)
    await settle()
    conn.data_received(with_header(2 * LIMIT, end=b""))
    await settle()
    assert real.writes == [] and real.reading_paused
    go.set()
    await settle()
    assert real.sent.startswith(b"HTTP/1.1 200 OK\r\n") and TOO_LARGE in real.sent
    assert real.closed


async def test_a_body_in_the_heads_read_is_no_part_of_the_head() -> None:
    bodies: list[bytes] = []
    app = collecting(bodies)

    conn, real = connect(app)
    body = b"b" * (3 * LIMIT)
    conn.data_received(post(body))
    await settle()
    assert b"".join(bodies) == body and real.sent.startswith(b"HTTP/1.1 200 OK\r\n")


QUICK = ListenerLimits(head_s=0.05, body_s=0.05)


async def until_closed(real: Recorder) -> None:
    async with asyncio.timeout(5):
        while not real.closed:  # noqa: ASYNC110 - the close is a timer's
            await asyncio.sleep(0.01)


async def test_a_head_not_complete_in_time_is_a_408() -> None:
    """The head's timeout (0.05 s) is shorter than the keep-alive's (5 s): the timer fires for
    the head all the same."""
    conn, real = connect(answering(), limits=QUICK)
    conn.data_received(b"GET / HTTP/1.1\r\nhost: h\r\n")
    await until_closed(real)
    assert real.sent.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert real.sent.endswith(b"Request Timeout")


@pytest.mark.parametrize("sent", [b"", b"12345"])
async def test_a_body_the_app_waits_for_in_vain_is_a_408_and_its_caller_gone(sent: bytes) -> None:
    """No body, or half of it: the app reads what came, then waits in vain; it is told its
    caller is gone, and ends without answering (no 500 for it)."""
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (message := await receive())["type"] == "http.request":
            got.append(message["body"])
        got.append(scope["extensions"][WATCH].gone)

    conn, real = connect(app, limits=QUICK)
    conn.data_received(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 10\r\n\r\n" + sent)
    await until_closed(real)
    await settle()
    assert got == ([sent] if sent else []) + [True]
    assert real.sent == (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: 15\r\nconnection: close\r\n\r\nRequest Timeout"
    )


async def test_a_body_timeout_once_the_answer_began_cuts_the_connection() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"

    conn, real = connect(app, limits=QUICK)
    conn.data_received(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 10\r\n\r\n")
    await until_closed(real)
    assert real.sent.startswith(b"HTTP/1.1 200 OK\r\n") and b"408" not in real.sent


async def test_the_body_timeout_counts_from_when_the_app_waits() -> None:
    """An app busy longer than the body's timeout before it reads is not timed out for it."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.1)
        while (await receive())["more_body"]:
            pass
        await answering(read=False)(scope, receive, send)

    conn, real = connect(app, limits=QUICK)
    conn.data_received(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\n")
    await asyncio.sleep(0.12)
    conn.data_received(b"ok")
    await settle()
    assert real.sent.startswith(b"HTTP/1.1 200 OK\r\n") and not real.closed


async def test_a_plain_uvicorn_config_gives_the_default_limits() -> None:
    conn, _ = connect(answering())
    assert (conn.max_head_bytes, conn.max_headers) == (65536, 100)
    assert (conn.head_s, conn.body_s, conn.keep_alive_s) == (10.0, 30.0, 5.0)


async def test_a_connections_attributes_are_all_slots() -> None:
    """Each attribute the protocol sets is one of its slots (its reads are slower from a dict of
    more than 30: gateway/server/protocol.py)."""
    conn, _ = connect(answering(), limits=QUICK)
    conn.data_received(post(b"{}"))
    await settle()
    assert vars(conn) == {}


async def test_the_limits_go_to_spawned_workers_with_the_config() -> None:
    """uvicorn pickles its Config to each worker it spawns."""
    limits = ListenerLimits(max_head_bytes=2048, max_headers=7, head_s=1.5, body_s=2.5)
    config = GatewayConfig("gateway.server.factory:app_from_env", factory=True, listener=limits)
    assert cast(GatewayConfig, pickle.loads(pickle.dumps(config))).listener == limits


# ---------------------------------------------------------------- the caller's disconnect


async def test_the_watch_cancels_what_waits_on_the_upstream() -> None:
    """A request whose connection is lost: its wait on the upstream is cancelled and the
    caller is gone; no task watched `receive` meanwhile."""
    watch = DisconnectWatch()

    async def never() -> Message:
        raise AssertionError("received: the watch should have been used")

    receive = WatchedReceive(never, watch)
    upstream = asyncio.Event()

    async def request() -> None:
        await until_disconnect(upstream.wait(), receive)

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    watch.lost()
    with pytest.raises(ClientGone):
        await task


async def test_a_watch_set_off_after_the_wait_changes_nothing() -> None:
    watch = DisconnectWatch()

    async def answer() -> str:
        return "done"

    async def never() -> Message:
        raise AssertionError("received")

    assert await until_disconnect(answer(), WatchedReceive(never, watch)) == "done"
    watch.lost()  # after: nothing is registered any more
    assert watch.gone


async def test_a_cancel_from_elsewhere_is_not_a_disconnect() -> None:
    watch = DisconnectWatch()

    async def never() -> Message:
        raise AssertionError("received")

    task = asyncio.ensure_future(
        until_disconnect(asyncio.Event().wait(), WatchedReceive(never, watch))
    )
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_request_of_the_gateways_protocol_carries_its_watch() -> None:
    watch = DisconnectWatch()

    async def receive() -> Message:
        return {"type": "http.request"}

    scope = {"type": "http", "extensions": {WATCH: watch}}
    assert isinstance(watched(scope, receive), WatchedReceive)
    assert watched({"type": "http"}, receive) is receive  # uvicorn's own: the task-based watch

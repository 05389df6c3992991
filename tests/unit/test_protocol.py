"""The gateway's HTTP protocol (gateway/protocol.py), driven byte for byte over a recording
transport: a response's head leaves with its body, a stream's by the end of the turn, a busy
loop's writes at the end of its turn; keep-alive, pipelining, chunked and 100-continue bodies,
HEAD, `Connection: close` and HTTP/1.0, a malformed request, a failing app, the caller's
disconnect (its DisconnectWatch), the keep-alive timeout and graceful shutdown. Then the watch
itself (gateway/http.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.http import (
    WATCH,
    ClientGone,
    DisconnectWatch,
    Message,
    WatchedReceive,
    until_disconnect,
    watched,
)
from gateway.protocol import GatewayHttpProtocol

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


def connect(app: App, keep_alive_s: float = 5.0) -> tuple[GatewayHttpProtocol, Recorder]:
    config = uvicorn.Config(app, proxy_headers=False, log_config=None)
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


async def test_a_chunked_body_in_pieces() -> None:
    bodies: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            bodies.append(message["body"])
            if not message["more_body"]:
                break
        await answering(read=False)(scope, receive, send)

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

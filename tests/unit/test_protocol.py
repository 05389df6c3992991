"""The gateway's HTTP protocol (gateway/protocol.py): a response's head leaves with its body,
a busy loop's writes at the end of its turn, and nothing written is lost or reordered by a
close; a request's DisconnectWatch cancels what waits for its caller (gateway/http.py)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gateway.http import (
    WATCH,
    ClientGone,
    DisconnectWatch,
    Message,
    WatchedReceive,
    until_disconnect,
    watched,
)
from gateway.protocol import GatheredWrites

pytestmark = pytest.mark.asyncio


class Recorder:
    """The real transport's side: what was written, in how many calls, and the close."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


def gathered(busy: bool = False) -> tuple[GatheredWrites, Recorder]:
    real = Recorder()
    loop = asyncio.get_running_loop()
    return GatheredWrites(cast(asyncio.Transport, real), loop, lambda: busy), real


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_a_head_and_its_body_leave_as_one_at_once() -> None:
    out, real = gathered()
    out.write(HEAD)
    assert real.writes == [] and out.get_write_buffer_size() == len(HEAD)
    out.write(b"{}")
    assert real.writes == [HEAD + b"{}"]
    await asyncio.sleep(0)
    assert len(real.writes) == 1


async def test_idle_a_streams_head_leaves_within_its_turn_and_events_at_once() -> None:
    out, real = gathered()
    out.write(HEAD)
    await asyncio.sleep(0)
    assert real.writes == [HEAD]
    out.write(b"event 1")
    assert real.writes == [HEAD, b"event 1"]


async def test_busy_a_turns_writes_leave_at_its_end() -> None:
    out, real = gathered(busy=True)
    out.write(b"event 1")
    assert real.writes == []
    out.writelines([b"event 2", b"event 3"])
    await asyncio.sleep(0)
    assert real.writes == [b"event 1event 2event 3"]


async def test_a_close_sends_what_was_written_first() -> None:
    out, real = gathered()
    out.write(HEAD)
    out.close()
    assert real.writes == [HEAD] and real.closed
    await asyncio.sleep(0)
    assert real.writes == [HEAD]


async def test_an_abort_drops_what_was_held() -> None:
    out, real = gathered()
    out.write(HEAD)
    out.abort()
    await asyncio.sleep(0)
    assert real.writes == [] and real.aborted


async def test_everything_else_is_the_real_transports() -> None:
    out, _ = gathered()
    assert out.get_extra_info("peername") == ("127.0.0.1", 1)
    assert not out.is_closing()


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

    task = asyncio.create_task(
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

"""The gateway's HTTP protocol (gateway/protocol.py): a connection's writes during one turn of
the event loop leave as one, and nothing written is lost or reordered by a close."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

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


def gathered() -> tuple[GatheredWrites, Recorder]:
    real = Recorder()
    return GatheredWrites(cast(asyncio.Transport, real), asyncio.get_running_loop()), real


async def test_one_turns_writes_leave_as_one() -> None:
    out, real = gathered()
    out.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    out.write(b"{}")
    assert real.writes == [] and out.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


async def test_a_later_turns_write_leaves_apart() -> None:
    """A stream's head goes at once; its events, as they come."""
    out, real = gathered()
    out.write(b"head")
    await asyncio.sleep(0)
    out.writelines([b"event 1", b"event 2"])
    await asyncio.sleep(0)
    assert real.writes == [b"head", b"event 1event 2"]


async def test_a_close_sends_what_was_written_first() -> None:
    out, real = gathered()
    out.write(b"the answer")
    out.close()
    assert real.writes == [b"the answer"] and real.closed
    await asyncio.sleep(0)
    assert real.writes == [b"the answer"]


async def test_an_abort_drops_what_was_held() -> None:
    out, real = gathered()
    out.write(b"never sent")
    out.abort()
    await asyncio.sleep(0)
    assert real.writes == [] and real.aborted


async def test_everything_else_is_the_real_transports() -> None:
    out, _ = gathered()
    assert out.get_extra_info("peername") == ("127.0.0.1", 1)
    assert not out.is_closing()

"""The request log's file: lines appended in order off the event loop; a writer that is behind
makes lines wait, then drop (counted), never a caller; a write that fails loses its batch,
counted and warned once; a file moved away (logrotate) keeps what the old log still held, and
a log opened anew on the path writes a new file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

import pytest

from gateway.observability import logfile
from gateway.observability.logfile import LogFile

pytestmark = pytest.mark.asyncio


class Drops:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, n: int) -> None:
        self.n += n


def lines(n: int, start: int = 0) -> list[bytes]:
    return [b'{"n": %d}\n' % i for i in range(start, start + n)]


async def test_lines_are_appended_in_order(tmp_path: Path) -> None:
    path = tmp_path / "requests.log"
    path.write_bytes(b"kept\n")  # appended to, never truncated
    log = LogFile(str(path))
    written = lines(5000)
    for i, line in enumerate(written):
        log.write(line)
        if i % 1000 == 0:
            await asyncio.sleep(0)  # batches handed over while lines keep coming
    await log.aclose()
    assert path.read_bytes() == b"kept\n" + b"".join(written)


def held(path: Path) -> bytes:
    return path.read_bytes()  # a few bytes: no need to leave the event loop


async def written(path: Path, expected: bytes) -> None:
    """Until the file holds `expected`: a probe, each turn a tenth of the flush interval."""
    for _ in range(1000):
        if held(path) == expected:
            return
        await asyncio.sleep(logfile.FLUSH_S / 10)
    assert held(path) == expected


async def test_a_line_is_written_without_waiting_for_more(tmp_path: Path) -> None:
    path = tmp_path / "requests.log"
    log = LogFile(str(path))
    try:
        log.write(b"one\n")
        await written(path, b"one\n")  # by the timer, not by aclose
    finally:
        await log.aclose()


async def test_a_writer_behind_makes_lines_drop_not_callers_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = logfile._write_all

    def stuck(fd: int, data: bytes) -> None:
        release.wait(10)
        real(fd, data)

    monkeypatch.setattr(logfile, "_write_all", stuck)
    monkeypatch.setattr(logfile, "MAX_QUEUED_BYTES", 1000)
    path, drops = tmp_path / "requests.log", Drops()
    log = LogFile(str(path), drops)
    line = b"x" * 99 + b"\n"  # 100 bytes: ten fit
    log.write(line)
    log._hand_over()  # the writer takes it and is stuck
    for _ in range(20):
        log.write(line)  # returns at once: queued, or dropped
    assert drops.n == 11  # the stuck batch and nine more fill the 1000 bytes
    release.set()
    await log.aclose()
    assert path.read_bytes() == line * 10


async def test_a_failed_write_loses_its_batch_counted_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    drops = Drops()
    log = LogFile("/dev/full", drops)  # every write fails: ENOSPC
    with caplog.at_level(logging.WARNING, "gateway.observability"):
        for batch in range(3):
            for line in lines(4, batch * 4):
                log.write(line)
            log._hand_over()
            assert log._writing is not None
            with contextlib.suppress(OSError):  # the writer's failure, which the log takes
                await log._writing
            await asyncio.sleep(0)
        await log.aclose()
    assert drops.n == 12
    warned = [r for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(warned) == 1 and "/dev/full" in warned[0].getMessage()


async def test_a_rotated_file_keeps_the_old_lines_and_a_new_log_writes_a_new_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "requests.log"
    old = LogFile(str(path))
    old.write(b"before\n")
    await written(path, b"before\n")
    path.rename(tmp_path / "requests.log.1")  # logrotate moves it, then signals a reload
    old.write(b"still old\n")  # the old runtime's last requests
    new = LogFile(str(path))  # the reloaded runtime's log
    new.write(b"after\n")
    await old.aclose()
    await new.aclose()
    assert (tmp_path / "requests.log.1").read_bytes() == b"before\nstill old\n"
    assert path.read_bytes() == b"after\n"


async def test_lines_after_close_are_dropped(tmp_path: Path) -> None:
    drops = Drops()
    log = LogFile(str(tmp_path / "requests.log"), drops)
    await log.aclose()
    log.write(b"late\n")
    assert drops.n == 1
    assert (tmp_path / "requests.log").read_bytes() == b""

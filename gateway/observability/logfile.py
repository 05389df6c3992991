"""Where the request log's lines go: stdout or a file, written off the request path.

A request's line is serialized where the request ends and queued here (an append to a list);
a writer thread appends the queued lines to the file in batches, in order. While the writer is
behind (a slow or full disk), lines wait up to MAX_QUEUED_BYTES; past that they are dropped
and counted rather than making any request wait. A file is opened in append mode, and opened
anew by the runtime of each config reload (SIGHUP), so that logrotate's move-then-signal
works: the old runtime's log writes what it still holds to the moved file and closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("gateway.observability")
STDOUT = "stdout"
MAX_QUEUED_BYTES = 16 * 1024 * 1024  # lines waiting for the writer; past it, dropped
BATCH_BYTES = 256 * 1024  # a batch is handed to the writer at once when it is this large
FLUSH_S = 0.05  # else this long after its first line


class LogFile:
    """Lines appended to one file (or stdout, or a pipe), in the order they were given."""

    def __init__(
        self, path: str, dropped: Callable[[int], None] = lambda n: None, fd: int | None = None
    ) -> None:
        """`dropped`: told how many lines (or what they weigh: `write`) were dropped, a metric's
        counter. `fd`: an open file the log owns (a pipe), instead of opening `path`."""
        self.path = path
        self._dropped = dropped
        self._fd = fd if fd is not None else 1 if path == STDOUT else _open(path)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="request-log")
        self._lines: list[bytes] = []
        self._weight = 0  # what the lines in _lines weigh
        self._queued = 0  # bytes in _lines and in the batch being written
        self._writing: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._failing = False  # the last write failed (warned once until one succeeds)

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, line: bytes, weight: int = 1) -> None:
        """Queues one line (its newline included), which counts as `weight` when dropped (a
        line of spans: how many). Never waits: a full queue drops it."""
        if self._closed or self._queued + len(line) > MAX_QUEUED_BYTES:
            self._dropped(weight)
            return
        self._lines.append(line)
        self._weight += weight
        self._queued += len(line)
        if self._writing is None:
            self._queue()

    def _hand_over(self) -> None:
        """The queued lines to the writer thread, unless it is busy (it takes them when done)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writing is not None or not self._lines:
            return
        count, batch, self._lines, self._weight = self._weight, b"".join(self._lines), [], 0
        loop = asyncio.get_running_loop()
        self._writing = loop.run_in_executor(self._writer, _write_all, self._fd, batch)
        self._writing.add_done_callback(lambda done: self._written(done, count, len(batch)))

    def _written(self, done: asyncio.Future[None], count: int, size: int) -> None:
        self._writing = None
        self._queued -= size
        exc = None if done.cancelled() else done.exception()
        failed = done.cancelled() or exc is not None
        if failed:  # a full disk, say: the batch is lost and counted; the next one tries again
            self._dropped(count)
            if not self._failing:
                log.warning("the request log %s cannot be written: %r", self.path, exc)
        self._failing = failed
        if self._lines:
            self._queue()

    def _queue(self) -> None:
        """Hands the lines over when they make a batch, else once FLUSH_S has passed: so a fast
        file (/dev/null) is not handed a few lines at each turn of the loop."""
        if self._queued >= BATCH_BYTES:
            self._hand_over()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self._hand_over)

    async def aclose(self) -> None:
        """Writes what is queued, then closes the file (stdout stays open). Once."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._writing is not None or self._lines:
            if self._writing is None:
                self._hand_over()
            if self._writing is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._writing)
        self._writer.shutdown(wait=True)
        if self._fd != 1:
            os.close(self._fd)


def _open(path: str) -> int:
    return os.open(os.path.expanduser(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

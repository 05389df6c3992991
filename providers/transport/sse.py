"""Incremental decoder of an upstream's server-sent events (the WHATWG rules the SDK follows).

Lines end in `\\n`, `\\r\\n` or `\\r`; `data:` lines of one event are joined by `\\n`; a blank line
ends the event; lines starting with `:` are comments (keep-alives); other fields (`event:`,
`id:`, `retry:`) carry nothing a completion needs and are ignored.
"""

from __future__ import annotations

DONE = b"[DONE]"


class SSEDecoder:
    __slots__ = ("_data", "_rest")

    def __init__(self) -> None:
        self._rest = b""  # an unfinished line (and a `\r` whose `\n` may be in the next chunk)
        self._data: list[bytes] | None = None  # data lines of the event being read

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event completed by `chunk`, in order."""
        buf = self._rest + chunk if self._rest else chunk
        if self._data is None and b"\r" not in buf:
            end = buf.rfind(b"\n\n") + 2  # the events `buf` completes, if all are plain
            events = (_plain(buf, end) or _named(buf, end)) if end > 1 else None
            if events is not None:
                self._rest = b""
                return events + self._lines(buf[end:]) if end < len(buf) else events
        return self._lines(buf)

    def _lines(self, buf: bytes) -> list[bytes]:
        hold = b""
        if buf.endswith(b"\r"):
            buf, hold = buf[:-1], b"\r"
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, rest = buf.split(b"\n")
        self._rest = rest + hold
        events: list[bytes] = []
        for line in lines:
            self._line(line, events)
        return events

    def flush(self) -> list[bytes]:
        """At end of stream: an event without its final blank line is still delivered (lenient
        towards servers that close right after the last `data:` line)."""
        events: list[bytes] = []
        rest, self._rest = self._rest.rstrip(b"\r"), b""
        if rest:
            self._line(rest, events)
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data is not None:
                events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                self._data = None
            return
        if line.startswith(b"data:"):
            value = line[6:] if line.startswith(b"data: ") else line[5:]
        elif line == b"data":
            value = b""
        else:
            return  # a comment or a field a completion does not use
        if self._data is None:
            self._data = [value]
        else:
            self._data.append(value)


def _named(buf: bytes, end: int) -> list[bytes] | None:
    """As `_plain`, for events that are each an `event: ` line then one `data: ` line (the
    Responses API's streams); None if any is not."""
    if not buf.startswith(b"event: "):
        return None
    values: list[bytes] = []
    for block in buf[: end - 2].split(b"\n\n"):
        name, named, data = block.partition(b"\ndata: ")
        if not named or not name.startswith(b"event: ") or b"\n" in name or b"\n" in data:
            return None
        values.append(data)
    return values


def _plain(buf: bytes, end: int) -> list[bytes] | None:
    """The data of the events before `end` (just after a blank line) when each is one `data: `
    line (what servers send), split in C; None if any is not: an event's data holding a newline
    is one of several lines, or several events."""
    if not buf.startswith(b"data: "):
        return None
    values = buf[6 : end - 2].split(b"\n\ndata: ")
    return None if b"\n" in b"".join(values) else values

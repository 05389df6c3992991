"""The memory backend: entries in this process, least recently used first out, bounded by
their number and their bytes. An expired entry is dropped when it is found, or when it reaches
the old end of the order."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple


class Held(NamedTuple):
    expires: float  # Unix time
    data: bytes


class MemoryBackend:
    name = "memory"

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._held: OrderedDict[bytes, Held] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def get(self, key: bytes, now: float) -> bytes | None:
        held = self._held.get(key)
        if held is None:
            return None
        if held.expires <= now:
            self._drop(key)
            return None
        self._held.move_to_end(key)
        return held.data

    def put(self, key: bytes, data: bytes, expires: float) -> None:
        if key in self._held:
            self._drop(key)
        self._held[key] = Held(expires, data)
        self.bytes += len(data)
        self.shrink()

    def shrink(self) -> None:
        """The oldest entries out until both bounds hold."""
        held = self._held
        while len(held) > self.max_entries or self.bytes > self.max_bytes:
            _, gone = held.popitem(last=False)
            self.bytes -= len(gone.data)

    def bounded(self, max_entries: int, max_bytes: int) -> MemoryBackend:
        """A copy under new bounds (a reload's, which may yet be refused): this one's entries,
        as many as fit."""
        copy = MemoryBackend(max_entries, max_bytes)
        copy._held = self._held.copy()
        copy.bytes = self.bytes
        copy.shrink()
        return copy

    def _drop(self, key: bytes) -> None:
        self.bytes -= len(self._held.pop(key).data)

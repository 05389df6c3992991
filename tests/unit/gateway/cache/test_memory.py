"""The memory backend: least recently used out first, bounded by entries and by bytes; expired
entries gone; a reload's bounds applied to a copy."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.cache.memory import MemoryBackend

NOW = 1_000.0


def test_the_least_recently_used_goes_first() -> None:
    m = MemoryBackend(max_entries=2, max_bytes=100)
    m.put(b"a", b"1", NOW + 10)
    m.put(b"b", b"2", NOW + 10)
    assert m.get(b"a", NOW) == b"1"  # a is now the most recent
    m.put(b"c", b"3", NOW + 10)
    assert (m.get(b"a", NOW), m.get(b"b", NOW), m.get(b"c", NOW)) == (b"1", None, b"3")


def test_bytes_bound_the_entries_too() -> None:
    m = MemoryBackend(max_entries=100, max_bytes=10)
    m.put(b"a", b"x" * 6, NOW + 10)
    m.put(b"b", b"y" * 6, NOW + 10)
    assert m.get(b"a", NOW) is None and m.get(b"b", NOW) == b"y" * 6 and m.bytes == 6


def test_an_expired_entry_is_gone() -> None:
    m = MemoryBackend(max_entries=10, max_bytes=100)
    m.put(b"a", b"1", NOW + 1)
    assert m.get(b"a", NOW + 0.5) == b"1"
    assert m.get(b"a", NOW + 1) is None and len(m) == 0 and m.bytes == 0


def test_a_put_replaces_the_key() -> None:
    m = MemoryBackend(max_entries=10, max_bytes=100)
    m.put(b"a", b"12345", NOW + 10)
    m.put(b"a", b"1", NOW + 10)
    assert (m.get(b"a", NOW), len(m), m.bytes) == (b"1", 1, 1)


def test_new_bounds_shrink_a_copy() -> None:
    m = MemoryBackend(max_entries=10, max_bytes=100)
    for k in (b"a", b"b", b"c"):
        m.put(k, b"12", NOW + 10)
    smaller = m.bounded(2, 100)
    assert len(smaller) == 2 and smaller.get(b"a", NOW) is None and smaller.get(b"c", NOW)
    assert len(m) == 3  # a reload that is refused leaves the running cache as it was


@given(st.lists(st.tuples(st.sampled_from(b"abcdefgh"), st.integers(0, 30)), max_size=60))
def test_the_bounds_always_hold(puts: list[tuple[int, int]]) -> None:
    m = MemoryBackend(max_entries=4, max_bytes=50)
    for key, size in puts:
        m.put(bytes([key]), b"x" * size, NOW + 10)
        assert len(m) <= 4 and m.bytes <= 50
        assert m.bytes == sum(len(m.get(bytes([k]), NOW) or b"") for k in b"abcdefgh")

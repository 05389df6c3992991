"""Ids no file or batch can have, for the tests that ask the gateway about them: text of any kind,
path characters, the right prefix before anything, and over-long ones of ASCII and of a
four-byte digit (which a check by characters rather than bytes lets through)."""

from __future__ import annotations

from hypothesis import strategies as st

WIDE_DIGIT = "\U0001d7d8"  # MATHEMATICAL DOUBLE-STRUCK DIGIT ZERO: str.isdigit(), 4 bytes


def odd_ids(longest: int) -> st.SearchStrategy[str]:
    """Odd ids, the longest of `longest` characters after the prefix."""
    return st.one_of(
        st.text(max_size=longest),
        st.text(alphabet=st.sampled_from("./%\\\x00:e2fF-_"), max_size=40),
        st.builds(lambda s: "file-" + s, st.text(max_size=longest)),
        st.builds(lambda s: "batch_" + s, st.text(max_size=longest)),
        st.integers(1, longest).map(lambda n: "file-" + "a" * n),
        st.integers(1, longest).map(lambda n: "batch_" + WIDE_DIGIT * n),
        st.integers(1, longest).map(lambda n: "batch_" + "a" * n),
        st.integers(1, longest).map(lambda n: "file-" + WIDE_DIGIT * n),
    )

"""Primitive request checks, from which the request declarations (`core.fields`) build theirs:
each returns the value it was given or raises a 400 naming the field (`param`) and saying what
was expected."""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from core.errors import Inexact, InvalidRequest

Validator = Callable[[Any, str], Any]


@dataclass(frozen=True, slots=True)
class IdShape:
    """The ids the gateway makes for one kind of object (files, batches): its prefix, the
    creation time in nanoseconds (16 hex digits until the year 2554, so that ids sort as they
    were made) and 8 random hex digits. Nothing of another shape can name such an object, so no
    path, dot, NUL or over-long name reaches a store."""

    prefix: str

    def new(self) -> str:
        return f"{self.prefix}{time.time_ns():016x}{secrets.token_hex(4)}"

    def matches(self, value: str) -> bool:
        return (
            len(value) == len(self.prefix) + 24
            and value.startswith(self.prefix)
            and _HEX24.fullmatch(value, len(self.prefix)) is not None
        )


_HEX24 = re.compile(r"[0-9a-f]{24}")


def bad(name: str, what: str, value: Any) -> InvalidRequest:
    shown = orjson.dumps(value).decode()[:80] if jsonable(value) else type(value).__name__
    return InvalidRequest(f"Invalid value for '{name}': expected {what}, got {shown}.", param=name)


def jsonable(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


# The integers JSON carries through the gateway (orjson reads and writes these): a larger integer
# literal is read as a float, and could not be written upstream.
WIRE_LO, WIRE_HI = -(2**63), 2**64 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # OpenAI's and vLLM's integers (a seed, a priority)


def integer(lo: int | None = None, hi: int | None = None, *, wire: bool = True) -> Validator:
    """An integer in [lo, hi]; without a bound, the wire's (unless `wire` is off: a field whose
    range each target checks, in its own words, before anything is written)."""
    low = WIRE_LO if lo is None and wire else lo
    high = WIRE_HI if hi is None and wire else hi

    def check(v: Any, name: str) -> int:
        if type(v) is not int:
            if type(v) is float and v.is_integer() and not WIRE_LO < v <= WIRE_HI:
                raise Inexact(bad(name, "an integer", v).message, param=name)
            raise bad(name, "an integer", v)
        within(v, low, high, name)
        return v

    return check


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Validator:
    def check(v: Any, name: str) -> float | int:
        if type(v) not in (int, float) or not math.isfinite(v):
            raise bad(name, "a number", v)
        if lo_open and lo is not None and v <= lo:
            raise InvalidRequest(f"'{name}' must be greater than {lo}, got {v}.", param=name)
        within(v, None if lo_open else lo, hi, name)
        return v  # type: ignore[no-any-return]

    return check


def within(v: float, lo: float | None, hi: float | None, name: str) -> None:
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        lo_s = "-inf" if lo is None else shown_number(lo)
        hi_s = "inf" if hi is None else shown_number(hi)
        raise InvalidRequest(f"'{name}' must be between {lo_s} and {hi_s}, got {v}.", param=name)


def shown_number(v: float) -> str:
    """A bound as written: integers exactly, other numbers short."""
    return str(v) if type(v) is int else f"{v:g}"


def boolean(v: Any, name: str) -> bool:
    if type(v) is not bool:
        raise bad(name, "a boolean", v)
    return v


def string(v: Any, name: str) -> str:
    if type(v) is not str:
        raise bad(name, "a string", v)
    return v


def choice(*options: str) -> Validator:
    def check(v: Any, name: str) -> str:
        if v not in options:
            raise bad(name, "one of " + ", ".join(repr(o) for o in options), v)
        return str(v)

    return check


def obj(v: Any, name: str) -> dict[str, Any]:
    if type(v) is not dict:
        raise bad(name, "an object", v)
    return v


def token_ids(v: list[Any], name: str) -> None:
    for i, t in enumerate(v):
        if type(t) is not int or t < 0:
            raise bad(f"{name}[{i}]", "a token id (integer >= 0)", t)


def batch(v: list[Any], name: str, empty_strings: bool) -> None:
    """A non-empty array of inputs in one of OpenAI's three array forms: strings, token ids (one
    input), or arrays of token ids. `empty_strings`: whether "" is a valid string item."""
    first = type(v[0])
    if first is str:
        for i, item in enumerate(v):
            if type(item) is not str or (not item and not empty_strings):
                raise bad(
                    f"{name}[{i}]", "a string" if empty_strings else "a non-empty string", item
                )
    elif first is int:
        token_ids(v, name)
    elif first is list:
        for i, item in enumerate(v):
            if type(item) is not list or not item:
                raise bad(f"{name}[{i}]", "a non-empty array of token ids", item)
            token_ids(item, f"{name}[{i}]")
    else:
        raise bad(f"{name}[0]", "a string, a token id or an array of token ids", v[0])

"""A line of what a caller sent is written whatever it holds: orjson's, or the standard
library's for integers past 64 bits, with the time as orjson writes it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import orjson

from gateway.observability import jsonline

OPTION = orjson.OPT_APPEND_NEWLINE | orjson.OPT_UTC_Z
WHEN = datetime(2026, 11, 28, 17, 49, 49, 990221, tzinfo=UTC)


def test_a_line_is_orjsons_when_orjson_can_write_it() -> None:
    value = {"time": WHEN, "seed": 2**64 - 1, "text": "é"}
    assert jsonline.dumps(value, OPTION) == orjson.dumps(value, option=OPTION)


def test_an_integer_past_64_bits_is_written_exactly_with_the_same_time() -> None:
    line = jsonline.dumps({"time": WHEN, "seed": -(2**70), "text": "é"}, OPTION)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "time": "2026-11-28T17:49:49.990221Z",
        "seed": -(2**70),
        "text": "é",
    }
    assert "é".encode() in line

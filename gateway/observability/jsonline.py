"""A JSON line holding what a caller sent (the request log's lines, the traced records): orjson
writes it, except for what orjson cannot write, integers past 64 bits (a `seed` of 2**70 that
validation refuses is still logged); then the standard library does, exactly."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import orjson


def dumps(value: Any, option: int) -> bytes:
    """`value` as one line (its newline included: `option` holds OPT_APPEND_NEWLINE)."""
    try:
        return orjson.dumps(value, option=option)
    except TypeError:
        text = json.dumps(value, default=_plain, ensure_ascii=False, separators=(",", ":"))
        return text.encode() + b"\n"


def _plain(value: Any) -> str:
    """What the standard library cannot write: a time (the log's, in UTC) as orjson writes it."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)

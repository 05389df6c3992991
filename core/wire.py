"""JSON as it crosses the wire: the type of a parsed JSON object, and the one parse of a request
body."""

from __future__ import annotations

from typing import Any

import orjson

from core.errors import InvalidRequest

# A JSON object as parsed, before anything is known of its fields (a request body, an upstream's
# answer): its values are whatever JSON holds.
Json = dict[str, Any]


def parse_json(body: bytes) -> Json:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON ({exc.msg}, at character {exc.pos}).",
            code="invalid_json",
        ) from None
    if type(data) is not dict:
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return data

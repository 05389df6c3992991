"""JSON as it crosses the wire: the type of a parsed JSON object, and the one parse of a request
body (a second, exact one only for a body that is refused for an integer too large for the
first)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from core.errors import Inexact, InvalidRequest

T = TypeVar("T")

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


def validated(body: bytes, validate: Callable[[Json], T]) -> T:
    """`validate` on the body as parsed; when a declared integer was written beyond what orjson
    reads as an integer (it reads such a literal as a float), on the body parsed again by
    Python's own JSON, whose integers are exact, so that the error shows what was sent."""
    try:
        return validate(parse_json(body))
    except Inexact:
        return validate(_exact(body))


def _exact(body: bytes) -> Json:
    try:
        data = json.loads(body)
    except ValueError as exc:  # an integer literal longer than Python converts (4300 digits)
        raise InvalidRequest(
            f"The request body is not valid JSON ({str(exc)[:120]}).", code="invalid_json"
        ) from None
    if type(data) is not dict:
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return data

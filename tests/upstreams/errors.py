"""Error bodies of the scripted upstreams, in each provider's own shape.

OpenAI: `{"error": {"message", "type", "param", "code"}}` with string/null codes.
Fireworks: three shapes, as seen in the wild (Portkey handles all three): FastAPI validation
`{"detail": [{loc, msg, type}]}` (422), `{"detail": "..."}` for scripted 4xx,
`{"fault": {"faultstring", "detail": {"errorcode"}}}` for 5xx, and
`{"error": {"object": "error", "type", "code", "message"}}` for request errors (context, auth).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RETRY_AFTER_S = 7
SERVER_ERROR_MESSAGE = "The server had an error while processing your request. Sorry about that!"


class UpstreamError(Exception):
    """A complete error response: status, body (JSON value or text) and extra headers."""

    def __init__(
        self, status: int, body: Any, headers: dict[str, str] | None = None, text: bool = False
    ) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.text = text

    def override_headers(self, extra: Mapping[str, str]) -> None:
        """Add `extra`, replacing same-named headers whatever their case."""
        replaced = {name.lower() for name in extra}
        kept = {k: v for k, v in self.headers.items() if k.lower() not in replaced}
        self.headers = {**kept, **extra}


_OPENAI_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout", None),
    409: ("invalid_request_error", None),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


def openai_error(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> UpstreamError:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return UpstreamError(status, body, headers)


def openai_status_error(status: int, quota: bool = False) -> UpstreamError:
    """The body OpenAI would send for a bare status (magic `__status_<code>__`)."""
    if quota:
        message = "You exceeded your current quota, please check your plan and billing details."
        return openai_error(
            429,
            message,
            "insufficient_quota",
            None,
            "insufficient_quota",
            {"x-should-retry": "false"},
        )
    type_, code = _OPENAI_TYPES.get(status, ("server_error", None))
    headers = {}
    if status == 429:
        headers = {"retry-after": str(RETRY_AFTER_S), "retry-after-ms": str(RETRY_AFTER_S * 1000)}
        message = "Rate limit reached for requests. Please try again in 7s."
    elif status >= 500:
        message = SERVER_ERROR_MESSAGE
    else:
        message = f"Scripted error {status}."
    return openai_error(status, message, type_, None, code, headers)


def fireworks_request_error(status: int, message: str) -> UpstreamError:
    body = {
        "error": {
            "object": "error",
            "type": "invalid_request_error",
            "code": "invalid_request_error",
            "message": message,
        }
    }
    return UpstreamError(status, body)


def fireworks_status_error(status: int) -> UpstreamError:
    """Fireworks' shapes: `{"fault": …}` for 5xx, `{"detail": "..."}` for 4xx."""
    headers = {"retry-after": str(RETRY_AFTER_S)} if status == 429 else {}
    if status >= 500:
        body: Any = {
            "fault": {"faultstring": "Internal error", "detail": {"errorcode": "internal"}}
        }
    elif status == 429:
        body = {"detail": "Request rate limit exceeded, please try again later"}
    else:
        body = {"detail": f"Scripted error {status}"}
    return UpstreamError(status, body, headers)


def validation_error(items: list[dict[str, Any]]) -> UpstreamError:
    """FastAPI/pydantic 422: `{"detail": [{"loc": ["body", name], "msg", "type"}]}`."""
    return UpstreamError(422, {"detail": items})


def detail_item(name: str | int, msg: str, type_: str) -> dict[str, Any]:
    return {"loc": ["body", name], "msg": msg, "type": type_}


def not_json_error(status: int) -> UpstreamError:
    return UpstreamError(status, "upstream exploded", text=True)

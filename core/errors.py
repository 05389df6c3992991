"""The one error tree of the gateway, and the one renderer of any error.

    GatewayError                      500 server_error
    ├── InvalidRequest                400 invalid_request_error   (param names the field)
    │   ├── ContextLengthExceeded     400 code=context_length_exceeded
    │   └── UnsupportedParameter      400 code=unsupported_parameter (param + target named)
    ├── PayloadTooLarge               413
    ├── UnsupportedMediaType          415
    ├── AuthenticationFailed          401 code=invalid_api_key
    ├── PermissionDenied              403 code=permission_denied
    ├── NotFound                      404 (route)
    │   └── ModelNotFound             404 code=model_not_found
    ├── MethodNotAllowed              405
    ├── Conflict                      409 code=conflict (an id taken; a team with keys)
    ├── RateLimited                   429 code=rate_limit_exceeded (+ retry-after)
    ├── InsufficientQuota             429 insufficient_quota (a budget spent; not retried)
    ├── ServiceUnavailable            503 (not ready / shutting down)
    └── UpstreamError                 status mapped from the upstream's (see providers)
        ├── UpstreamUnreachable       502
        ├── UpstreamTimeout           504
        ├── RequestTimeout            408 (Portkey's request_timeout ran out)
        └── CircuitOpen               503 code=circuit_open (every target skipped)

Before the first byte an error is a JSON response; after it, an SSE `data: {"error": …}` event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None
    upstream_status: int | None = None  # the status an upstream answered, when it did
    lasting: bool = False  # the same target would fail the same way: no retry of it (fallback may)

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if type is not None:
            self.type = type
        if status is not None:
            self.status = status
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Inexact(InvalidRequest):
    """An integer literal beyond what the fast JSON parse reads as an integer (it reads it as a
    float): the body is parsed again exactly (`core.wire.validated`), so that the answer shows
    the integer as it was sent."""


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


def too_long(window: int, prompt_tokens: int, max_tokens: int, where: str = "") -> str:
    """OpenAI's wording for legacy completions, with both numbers."""
    return (
        f"This model's maximum context length is {window} tokens, however you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in your prompt{where}; "
        f"{max_tokens} for the completion). Please reduce your prompt; or completion length."
    )


def too_long_chat(window: int, prompt_tokens: int, max_tokens: int) -> str:
    """OpenAI's wording for chat."""
    return (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in "
        "the completion). Please reduce the length of the messages or completion."
    )


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "invalid_request_error"
    code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Conflict(GatewayError):
    """What the call asks contradicts what exists: an id already taken, a team still in use."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class RateLimited(GatewayError):
    status = 429
    type = "requests"
    code = "rate_limit_exceeded"


class InsufficientQuota(GatewayError):
    """A budget is spent: OpenAI's 429 for an account out of credit, which clients do not retry."""

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "service_unavailable"


class UpstreamError(GatewayError):
    """An upstream answered with an error, or could not be used; `target` names it."""

    status = 502
    type = "upstream_error"

    def __init__(self, message: str, *, target: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.target = target


class UpstreamUnreachable(UpstreamError):
    status = 502
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "timeout_error"
    code = "upstream_timeout"


class RequestTimeout(UpstreamError):
    """Portkey's `request_timeout` ran out: a 408 as Portkey fabricates it (the openai SDK
    retries a 408)."""

    status = 408
    type = "timeout_error"
    code = None


class CircuitOpen(UpstreamError):
    """The target was skipped: its circuit breaker is open after repeated failures."""

    status = 503
    type = "server_error"
    code = "circuit_open"


class ConfigError(ValueError):
    """A config value is wrong (not an HTTP error); `path` is its YAML path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def error_json(err: GatewayError) -> bytes:
    return orjson.dumps(err.body())


def error_event(err: GatewayError) -> bytes:
    """The SSE form used once the 200 and headers have gone out; `[DONE]` follows it."""
    return b"data: " + orjson.dumps(err.body()) + b"\n\n"


def internal(exc: BaseException) -> GatewayError:
    """Any unexpected exception, without its details: those go to the log, not to the caller."""
    return GatewayError(
        f"The gateway failed to process the request ({type(exc).__name__}).",
        code="internal_error",
    )

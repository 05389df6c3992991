"""Upstream failures → the gateway's error tree (gateway/errors.py).

Every message names the target (`provider/model`) so the caller and the operator can tell which
upstream failed. Upstream bodies come in several shapes:

    {"error": {"message", "type", "param", "code"}}      OpenAI, new vLLM (code may be an int)
    {"error": "Unauthorized"}                            vLLM --api-key
    {"object": "error", "message", "type", "param", "code": 400}    old vLLM (flat)
    {"detail": "…"} | {"detail": [{"loc", "msg", "type"}]}          FastAPI (Fireworks 422)
    {"fault": {"faultstring", "detail": {"errorcode"}}}             API gateways in front
    plain text / HTML                                                proxies, load balancers
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from core.provider import Target
from providers.transport import http1

MAX_MESSAGE = 1000  # upstream texts can be whole HTML pages
# OpenAI's refusal of unknown fields, then their names (", " between them)
UNRECOGNIZED = (
    "Unrecognized request argument supplied: ",
    "Unrecognized request arguments supplied: ",
)
RETRY_HEADERS = ("retry-after", "retry-after-ms", "x-should-retry")
CONTEXT_MARKERS = (
    "maximum context length",
    "context length",
    "context window",
    "prompt is too long",
)
NOT_CALLERS = (
    " (the upstream refused the gateway's own credentials or configuration for this provider; "
    "this is for the gateway operator to fix, not the caller)"
)


@dataclass(frozen=True, slots=True)
class Detail:
    """The parts of an upstream error body, whatever its shape."""

    message: str
    type: str | None = None
    param: str | None = None
    code: str | None = None  # string codes only: the OpenAI shape has string-or-null codes


@dataclass(frozen=True, slots=True)
class StatusKind:
    """How one upstream status surfaces to the caller."""

    cls: type[GatewayError]
    status: int  # what the caller gets
    keep_param: bool = False  # the upstream's `param` is about the caller's request
    keep_type: bool = False  # the upstream's `type`/`code` mean something to the caller
    retry_headers: bool = False  # pass retry-after & co through: the caller should back off
    code: str | None = None  # our code when the upstream's is not kept
    hint: str = ""


_INVALID = StatusKind(InvalidRequest, 400, keep_param=True, keep_type=True)
_SERVER = StatusKind(UpstreamError, 502, retry_headers=True, code="upstream_server_error")

# Status table; anything not listed is handled as an upstream server failure.
KINDS: Mapping[int, StatusKind] = MappingProxyType(
    {
        400: _INVALID,
        422: _INVALID,  # FastAPI validation; OpenAI clients expect 400
        401: StatusKind(
            UpstreamError, 502, code="upstream_authentication_failed", hint=NOT_CALLERS
        ),
        403: StatusKind(UpstreamError, 502, code="upstream_permission_denied", hint=NOT_CALLERS),
        404: StatusKind(UpstreamError, 502, code="upstream_not_found", hint=NOT_CALLERS),
        408: StatusKind(UpstreamTimeout, 504, retry_headers=True),
        409: StatusKind(UpstreamError, 409, keep_type=True, retry_headers=True, code="conflict"),
        413: StatusKind(PayloadTooLarge, 413),
        429: StatusKind(RateLimited, 429, keep_type=True, retry_headers=True),
    }
)


# ---------------------------------------------------------------- body shapes


def parse_body(raw: bytes) -> Detail:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Detail(_text(raw.decode("utf-8", "replace")))
    return detail_of(data)


def detail_of(data: Any) -> Detail:
    if not isinstance(data, dict):
        return Detail(_text(orjson.dumps(data).decode()))
    error = data.get("error")
    if isinstance(error, dict):
        return _fields(error)
    if isinstance(error, str):
        return Detail(_text(error))
    if "detail" in data:
        return _fastapi(data["detail"])
    fault = data.get("fault")
    if isinstance(fault, dict):
        inner = fault.get("detail")
        code = inner.get("errorcode") if isinstance(inner, dict) else None
        return Detail(_text(str(fault.get("faultstring", ""))), code=_str(code))
    if "message" in data:
        return _fields(data)  # old vLLM: {"object": "error", "message", "type", "code": 400}
    return Detail(_text(orjson.dumps(data).decode()))


def _fields(e: Mapping[str, Any]) -> Detail:
    raw = str(e.get("message") or "")
    param = _str(e.get("param")) or _unrecognized(raw)
    return Detail(_text(raw), _str(e.get("type")), param, _str(e.get("code")))


def _unrecognized(message: str) -> str | None:
    """The first field OpenAI's refusal of unknown fields lists (it names none in `param`),
    so that the caller's error names one."""
    for prefix in UNRECOGNIZED:
        if message.startswith(prefix):
            return message[len(prefix) :].split(", ", 1)[0]
    return None


def _fastapi(detail: Any) -> Detail:
    if not isinstance(detail, list):
        return Detail(_text(str(detail)))
    items = [d for d in detail if isinstance(d, dict)]
    message = "; ".join(f"{_loc(d.get('loc'))}: {d.get('msg', '')}" for d in items)
    param = _loc(items[0].get("loc")) if items else None
    return Detail(_text(message), param=param or None)


def _loc(loc: Any) -> str:
    """FastAPI's ["body", "top_k"] → "top_k"; ["body", "stop", 1] → "stop[1]"."""
    parts = list(loc) if isinstance(loc, list) else []
    if parts and parts[0] in ("body", "query", "header"):
        parts = parts[1:]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _text(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


# ---------------------------------------------------------------- to the error tree


def upstream_error(
    status: int,
    detail: Detail,
    headers: Mapping[str, str],
    label: str,
    secret: str = "",
) -> GatewayError:
    """One upstream error answer as a gateway error; `secret` (the api key) never leaks."""
    message = detail.message.replace(secret, "***") if secret else detail.message
    text = f"Upstream {label} returned {status}: {message or 'no error message'}"
    err = _from_kind(status, detail, headers, text)
    err.upstream_status = status
    if isinstance(err, UpstreamError):
        err.target = label
    return err


def _from_kind(status: int, detail: Detail, headers: Mapping[str, str], text: str) -> GatewayError:
    kind = KINDS.get(status, _SERVER)
    if kind.cls is InvalidRequest and is_context_length(detail):
        return ContextLengthExceeded(text, param="prompt")
    kw: dict[str, Any] = {"status": kind.status, "headers": _retry_headers(headers, kind)}
    if kind.keep_param:
        kw["param"] = detail.param
    if kind.keep_type and kind.cls is not InvalidRequest:
        kw["type"] = detail.type
    kw["code"] = (detail.code if kind.keep_type else None) or kind.code
    if kind.cls is RateLimited and detail.code == "insufficient_quota":
        kw["headers"].setdefault("x-should-retry", "false")  # out of credit is not transient
    return kind.cls(text + kind.hint, **kw)


def is_context_length(detail: Detail) -> bool:
    if detail.code == "context_length_exceeded":
        return True
    lowered = detail.message.lower()
    return any(marker in lowered for marker in CONTEXT_MARKERS)


def _retry_headers(headers: Mapping[str, str], kind: StatusKind) -> dict[str, str]:
    if not kind.retry_headers:
        return {}
    return {name: headers[name] for name in RETRY_HEADERS if name in headers}


def event_error(data: Mapping[str, Any], label: str, secret: str = "") -> GatewayError:
    """An `{"error": …}` event inside a 200 stream (vLLM sends one, then `[DONE]`)."""
    detail = detail_of(data)
    error = data.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    status = code if type(code) is int and 400 <= code < 600 else 500
    return upstream_error(status, detail, {}, label, secret)


def transport_error(exc: BaseException, label: str, answering: bool = False) -> UpstreamError:
    """The HTTP client's failures (http1.py), or a deadline's; `answering`: the response had
    begun. Their text names no request header, hence no key."""
    who = f"Upstream {label}"
    if isinstance(exc, http1.ConnectTimeout):
        return UpstreamTimeout(f"{who} did not accept a connection in time.", target=label)
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"{who} did not answer in time.", target=label)
    if isinstance(exc, http1.ResponseTooLarge):
        provider = label.split("/", 1)[0]
        return UpstreamError(
            f"{who} sent a response body over {exc.limit} bytes, the limit set by "
            f"providers.{provider}.max_response_bytes.",
            target=label,
            code="upstream_response_too_large",
        )
    if answering or isinstance(exc, http1.ResponseIncomplete):
        # Framing or a cut connection, not the caller's request: the client's words about it
        # would only mislead.
        return UpstreamError(
            f"{who} broke off its response before the end.",
            target=label,
            code="upstream_response_incomplete",
        )
    if isinstance(exc, http1.ConnectFailed):
        err = UpstreamUnreachable(f"{who} is unreachable: {_text(str(exc))}", target=label)
    elif isinstance(exc, http1.ConnectionClosed):
        why = str(exc).partition(": TLS: ")[2]  # a TLS alert says why it closed
        said = f" (TLS: {_text(why)})" if why else ""
        err = UpstreamUnreachable(f"{who} closed the connection{said}.", target=label)
    else:
        return UpstreamError(f"{who} request failed ({type(exc).__name__}).", target=label)
    err.lasting = exc.lasting  # a refused certificate: no retry of this target
    return err


def first_byte_timeout(target: Target) -> UpstreamTimeout:
    return UpstreamTimeout(
        f"Upstream {target.label} did not start answering within {target.first_byte_s:g} s.",
        target=target.label,
    )


def bad_answer(label: str, what: str) -> UpstreamError:
    return UpstreamError(
        f"Upstream {label} sent {what}.", target=label, code="upstream_bad_response"
    )

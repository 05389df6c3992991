"""Upstream error bodies and statuses → the gateway's error tree; the SSE decoder."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from core.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from providers.transport import http1
from providers.transport.errors import (
    Detail,
    event_error,
    parse_body,
    transport_error,
    upstream_error,
)
from providers.transport.proxy import Proxy
from providers.transport.sse import SSEDecoder

LABEL = "fireworks/accounts/x/models/y"


def err(status: int, body: Any, headers: dict[str, str] | None = None, secret: str = "") -> Any:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return upstream_error(status, parse_body(raw), headers or {}, LABEL, secret)


# ---------------------------------------------------------------- body shapes

SHAPES: list[tuple[bytes, Detail]] = [
    (
        b'{"error": {"message": "bad top_p", "type": "invalid_request_error", "param": "top_p", '
        b'"code": "invalid_value"}}',
        Detail("bad top_p", "invalid_request_error", "top_p", "invalid_value"),
    ),
    (
        b'{"error": {"message": "m", "type": "BadRequestError", "param": "input_tokens", '
        b'"code": 400}}',
        Detail("m", "BadRequestError", "input_tokens", None),
    ),
    (
        b'{"error": {"message": "Unrecognized request arguments supplied: a.b, c", '
        b'"type": "invalid_request_error", "param": null, "code": null}}',
        Detail("Unrecognized request arguments supplied: a.b, c", "invalid_request_error", "a.b"),
    ),
    (
        b'{"error": {"message": "Unrecognized request argument supplied: x y", "param": null}}',
        Detail("Unrecognized request argument supplied: x y", param="x y"),
    ),
    (b'{"error": "Unauthorized"}', Detail("Unauthorized")),
    (
        b'{"object": "error", "message": "old", "type": "BadRequestError", "param": null, '
        b'"code": 400}',
        Detail("old", "BadRequestError", None, None),
    ),
    (b'{"detail": "Model not found"}', Detail("Model not found")),
    (
        b'{"detail": [{"loc": ["body", "top_k"], "msg": "must be <= 100", "type": "value_error"}, '
        b'{"loc": ["body", "stop", 1], "msg": "too long", "type": "x"}]}',
        Detail("top_k: must be <= 100; stop[1]: too long", param="top_k"),
    ),
    (
        b'{"fault": {"faultstring": "Rate limit quota violation", '
        b'"detail": {"errorcode": "policies.ratelimit"}}}',
        Detail("Rate limit quota violation", code="policies.ratelimit"),
    ),
    (
        b"<html><body>502 Bad   Gateway</body></html>\n",
        Detail("<html><body>502 Bad Gateway</body></html>"),
    ),
    (b"[1, 2]", Detail("[1,2]")),
]


@pytest.mark.parametrize(("raw", "detail"), SHAPES)
def test_body_shapes(raw: bytes, detail: Detail) -> None:
    assert parse_body(raw) == detail


def test_long_text_is_cut() -> None:
    assert len(parse_body(b"x" * 5000).message) == 1000


# ---------------------------------------------------------------- statuses


def test_400_keeps_param_and_code_normalizes_type() -> None:
    e = err(
        400, {"error": {"message": "bad", "type": "BadRequestError", "param": "top_p", "code": 400}}
    )
    assert type(e) is InvalidRequest
    assert e.body() == {
        "error": {
            "message": f"Upstream {LABEL} returned 400: bad",
            "type": "invalid_request_error",
            "param": "top_p",
            "code": None,
        }
    }


def test_422_fastapi_becomes_400_with_param() -> None:
    e = err(422, {"detail": [{"loc": ["body", "foo"], "msg": "extra fields not permitted"}]})
    assert (type(e), e.status, e.param) == (InvalidRequest, 400, "foo")
    assert e.message == f"Upstream {LABEL} returned 422: foo: extra fields not permitted"


@pytest.mark.parametrize(
    "body",
    [
        {
            "error": {
                "message": "This model's maximum context length is 4097 tokens, however you "
                "requested 4116 tokens (3860 in your prompt; 256 for the completion).",
                "type": "invalid_request_error",
                "param": None,
                "code": "context_length_exceeded",
            }
        },
        {
            "error": {
                "message": "This model's maximum context length is 131072 tokens. However, you "
                "requested 105924 output tokens and your prompt contains at least 25149 input "
                "tokens",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        },
        {"error": {"message": "prompt too long", "code": "context_length_exceeded"}},
        {
            "error": {
                "object": "error",
                "type": "invalid_request_error",
                "code": "invalid_request_error",
                "message": "The prompt is too long: 3000 tokens, the model's maximum context "
                "length is 2048 tokens.",
            }
        },
    ],
)
def test_context_length_errors(body: dict[str, Any]) -> None:
    e = err(400, body)
    assert type(e) is ContextLengthExceeded
    assert (e.status, e.type, e.param, e.code) == (
        400,
        "invalid_request_error",
        "prompt",
        "context_length_exceeded",
    )
    assert e.message.startswith(f"Upstream {LABEL} returned 400: ")


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (401, "upstream_authentication_failed"),
        (403, "upstream_permission_denied"),
        (404, "upstream_not_found"),
    ],
)
def test_credential_and_config_problems_are_502(status: int, code: str) -> None:
    e = err(
        status,
        {"error": {"message": "Invalid API key sk-secret-1", "code": "invalid_api_key"}},
        secret="sk-secret-1",
    )
    assert type(e) is UpstreamError
    assert (e.status, e.code, e.target) == (502, code, LABEL)
    assert "sk-secret-1" not in e.message
    assert "Invalid API key ***" in e.message
    assert "not the caller" in e.message
    assert e.message.startswith(f"Upstream {LABEL} returned {status}: ")


def test_429_keeps_retry_headers_type_and_code() -> None:
    headers = {
        "retry-after": "3",
        "retry-after-ms": "2500",
        "x-should-retry": "true",
        "x-other": "no",
    }
    e = err(
        429,
        {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}},
        headers,
    )
    assert type(e) is RateLimited
    assert (e.status, e.type, e.code) == (429, "requests", "rate_limit_exceeded")
    assert e.headers == {"retry-after": "3", "retry-after-ms": "2500", "x-should-retry": "true"}
    assert e.message == f"Upstream {LABEL} returned 429: slow down"


def test_429_insufficient_quota_is_not_retried() -> None:
    e = err(
        429,
        {"error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}},
    )
    assert (e.type, e.code) == ("insufficient_quota", "insufficient_quota")
    assert e.headers == {"x-should-retry": "false"}


def test_429_without_body_details_gets_defaults() -> None:
    e = err(429, b"Too Many Requests")
    assert (e.type, e.code, e.headers) == ("requests", "rate_limit_exceeded", {})


@pytest.mark.parametrize("status", [500, 502, 503, 529])
def test_5xx_is_502_keeping_retry_after(status: int) -> None:
    e = err(status, b"oops", {"retry-after": "7"})
    assert type(e) is UpstreamError
    assert (e.status, e.code, e.target) == (502, "upstream_server_error", LABEL)
    assert e.headers == {"retry-after": "7"}
    assert e.message == f"Upstream {LABEL} returned {status}: oops"


def test_other_statuses() -> None:
    assert (type(e := err(408, b"")), e.status) == (UpstreamTimeout, 504)
    assert e.message == f"Upstream {LABEL} returned 408: no error message"
    e = err(409, {"error": {"message": "busy", "code": "conflict_x"}})
    assert (type(e), e.status, e.code) == (UpstreamError, 409, "conflict_x")
    assert (type(e := err(413, b"too big")), e.status) == (PayloadTooLarge, 413)
    assert (type(e := err(402, b"pay")), e.status) == (UpstreamError, 502)


def test_event_error_uses_int_code_as_status() -> None:
    e = event_error(
        {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}, LABEL
    )
    assert (type(e), e.status) == (UpstreamError, 502)
    assert e.message == f"Upstream {LABEL} returned 500: engine died"
    e = event_error({"error": {"message": "bad", "code": 400}}, LABEL)
    assert type(e) is InvalidRequest
    e = event_error({"error": {"message": "x", "code": "weird"}}, LABEL)
    assert e.status == 502


def test_transport_errors() -> None:
    """The client's failures: the operating system's words where they say why."""
    e = transport_error(http1.ConnectFailed("Connection refused"), LABEL)
    assert (type(e), e.status, e.target) == (UpstreamUnreachable, 502, LABEL)
    assert e.message == f"Upstream {LABEL} is unreachable: Connection refused"
    e = transport_error(http1.ConnectionClosed("ended"), LABEL)
    assert (type(e), e.message) == (UpstreamUnreachable, f"Upstream {LABEL} closed the connection.")
    e = transport_error(TimeoutError(), LABEL)
    assert (type(e), e.status, e.message) == (
        UpstreamTimeout,
        504,
        f"Upstream {LABEL} did not answer in time.",
    )
    e = transport_error(http1.ConnectTimeout("no connection within 2 s"), LABEL)
    assert (type(e), e.status) == (UpstreamTimeout, 504)
    assert e.message == f"Upstream {LABEL} did not accept a connection in time."
    for cut, answering in ((http1.ResponseIncomplete("ended"), False),
                           (http1.ConnectionClosed("ended"), True)):  # fmt: skip
        e = transport_error(cut, LABEL, answering=answering)
        assert (type(e), e.status, e.code) == (UpstreamError, 502, "upstream_response_incomplete")
        assert e.message == f"Upstream {LABEL} broke off its response before the end."
    e = transport_error(http1.HttpClientError("odd"), LABEL)
    assert e.message == f"Upstream {LABEL} request failed (HttpClientError)."


def test_a_lasting_failure_is_marked_so() -> None:
    """A refused certificate, or a proxy's refusal of the gateway's credentials: not worth
    another try of the same target (gateway.routing.retry reads `lasting`)."""
    refused = "TLS: its certificate was refused: it has expired (certificate has expired)"
    e = transport_error(http1.ConnectFailed(refused, lasting=True), LABEL)
    assert (type(e), e.lasting) == (UpstreamUnreachable, True)
    assert e.message == f"Upstream {LABEL} is unreachable: {refused}"
    wants = "the connection ended before the response began: TLS: it requires a client certificate"
    assert transport_error(http1.ConnectionClosed(wants, lasting=True), LABEL).lasting
    assert not transport_error(http1.ConnectFailed("Connection refused"), LABEL).lasting
    proxy = Proxy.of("http://user:secret@proxy.corp:3128")
    e = transport_error(http1.ProxyRefused(proxy, 407, "the tunnel"), LABEL)
    assert e.lasting and e.status == 502
    assert e.message == (
        f"Upstream {LABEL} is unreachable: its proxy http://proxy.corp:3128 refused the tunnel: "
        "407 (proxy authentication required)"
    )
    assert not transport_error(http1.ProxyRefused(proxy, 502, "the tunnel"), LABEL).lasting


# ---------------------------------------------------------------- SSE decoding


def decode(*chunks: bytes) -> list[bytes]:
    d = SSEDecoder()
    out: list[bytes] = []
    for c in chunks:
        out.extend(d.feed(c))
    return out + d.flush()


def test_sse_lf_and_crlf_and_cr() -> None:
    assert decode(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [b'{"a":1}', b"[DONE]"]
    assert decode(b'data: {"a":1}\r\n\r\ndata:{"b":2}\r\n\r\n') == [b'{"a":1}', b'{"b":2}']
    assert decode(b"data: x\r\rdata: y\r\r") == [b"x", b"y"]


def test_sse_split_anywhere() -> None:
    raw = b'data: {"a":1}\r\n\r\n: keepalive\r\n\r\ndata: {"b":2}\r\n\r\n'
    for i in range(1, len(raw)):
        assert decode(raw[:i], raw[i:]) == [b'{"a":1}', b'{"b":2}'], i
    assert decode(*[raw[i : i + 1] for i in range(len(raw))]) == [b'{"a":1}', b'{"b":2}']


def test_sse_plain_events_split_anywhere() -> None:
    # What servers send: one `data: ` line an event (read in bulk), and around it what is not.
    raw = (
        b'data: {"a":1}\n\ndata: {"b":"data: x"}\n\ndata: \n\ndata:{"c":3}\n\n'
        b": ka\n\ndata: [DONE]\n\n"
    )
    want = [b'{"a":1}', b'{"b":"data: x"}', b"", b'{"c":3}', b"[DONE]"]
    assert decode(raw) == want
    for i in range(1, len(raw)):
        for j in range(i, len(raw)):
            assert decode(raw[:i], raw[i:j], raw[j:]) == want, (i, j)
    assert decode(b"data: a\ndata: b\n\ndata: c\n\n") == [b"a\nb", b"c"]
    assert decode(b"data: a\n\n\ndata: b\n\n") == [b"a", b"b"]


def test_sse_named_events_split_anywhere() -> None:
    """The Responses API's streams: an `event: ` line before each `data: ` line (read in bulk),
    and around them what is not so plain; each split as the line-by-line reading has it."""
    raw = (
        b'event: response.created\ndata: {"a":1}\n\nevent: x\ndata: {"b":"event: y"}\n\n'
        b"event: z\ndata: a\ndata: b\n\n: ka\n\nevent: w\nid: 3\ndata: c\n\nevent: v\n\n"
        b"data: d\n\n"
    )
    want = [b'{"a":1}', b'{"b":"event: y"}', b"a\nb", b"c", b"d"]
    assert decode(raw) == want
    for i in range(1, len(raw)):
        for j in range(i, len(raw), 7):
            assert decode(raw[:i], raw[i:j], raw[j:]) == want, (i, j)
    lines = SSEDecoder()
    assert lines._lines(raw) == want  # the slow path, whole: the same events


def test_sse_multiline_comments_and_other_fields() -> None:
    raw = b': ping\n\nevent: completion\nid: 7\ndata: {"a":\ndata: 1}\nretry: 10\n\n'
    assert decode(raw) == [b'{"a":\n1}']


def test_sse_last_event_without_blank_line() -> None:
    assert decode(b"data: a\n\ndata: b") == [b"a", b"b"]
    assert decode(b"data: a\r") == [b"a"]

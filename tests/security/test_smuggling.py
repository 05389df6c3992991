"""Request smuggling and pipelining, in raw bytes on one connection (probes that held from the
start, kept so that they hold).

Every framing that two HTTP parsers could read two ways (Content-Length and Transfer-Encoding
together, two lengths, folded or bare-LF header lines, bad chunk sizes, codings beside chunked,
whitespace before a colon, …) is the protocol's own 400, after which the connection closes (a
transfer coding the gateway does not implement: a 400, or RFC 9112's 501). Behind each probe's
body come two requests that run whenever the bytes before them are taken as a whole request: a
completion that reaches the upstream with the probe's marker as its prompt, and an upload that
stores the marker as a file. Neither may run, nor the outer request: the upstream sees nothing
and no stored file holds the marker (`test_the_smuggled_requests_run_when_sent_alone` shows both
would be seen). Pipelined requests are answered, all of them, in order.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gateway_proc import GatewayProcess
from tests.security.held_support import (
    OPENAI_MODEL,
    PARSER_400_BODY,
    RawResponse,
    bearer,
    exchange,
    json_request,
    request_bytes,
    upstream,  # noqa: F401  (a pytest fixture)
    upstream_prompts,
)
from tests.upstreams.fakegen import expected_text
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream

KEY = "sk-smuggling-probe"
ALIAS = "oa"
BOUNDARY = "held-probe-boundary"
PIPELINED = 100


@pytest.fixture(scope="module")
def gateway(
    upstream: ScriptedUpstream,  # noqa: F811  (the imported fixture)
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("smuggling")
    config = f"""
auth:
  keys: [{{id: prober, key: {KEY}, models: ["*"]}}]
providers:
  oai: {{type: openai, base_url: "{upstream.url}", api_key: {OPENAI_TEST_KEY}}}
models:
  {ALIAS}: {{targets: [{{provider: oai, model: {OPENAI_MODEL}}}]}}
files: {{store: "{workdir / "store"}"}}
"""
    with GatewayProcess(config, workdir) as gw:
        yield gw


@pytest.fixture
def marker() -> str:
    return f"SMUGGLED-{uuid.uuid4().hex}"


def stored_with(gateway: GatewayProcess, marker: str) -> list[Path]:
    """The stored files whose bytes hold the marker."""
    store = gateway.config.parent / "store"
    return [p for p in store.rglob("*.data") if marker.encode() in p.read_bytes()]


def smuggled(marker: str) -> bytes:
    """Two complete requests: a completion whose prompt is the marker, and an upload of it."""
    completion = json_request(
        "/v1/completions", KEY, {"model": ALIAS, "prompt": marker, "max_tokens": 1}
    )
    form = (
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\n'
        f"batch\r\n--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="file"; filename="smuggled.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
        f"{marker}\r\n--{BOUNDARY}--\r\n"
    ).encode()
    content_type = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    upload = request_bytes("POST", "/v1/files", {**bearer(KEY), **content_type}, form)
    return completion + upload


# The outer request's head, up to its framing headers: a completion the gateway would serve.
HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer "
    + KEY.encode()
    + b"\r\nContent-Type: application/json\r\n"
)
CHUNKED = b"Transfer-Encoding: chunked\r\n"
LAST = b"0\r\n\r\n"  # the last chunk: where a chunked body would end


def _cl(n: int) -> bytes:
    return b"Content-Length: %d\r\n" % n


# Each probe: the whole connection's bytes, given what is smuggled behind the outer request.
Probe = Callable[[bytes], bytes]
PROBES: dict[str, Probe] = {
    # Content-Length against Transfer-Encoding, either first
    "cl-and-te": lambda s: HEAD + _cl(len(LAST + s)) + CHUNKED + b"\r\n" + LAST + s,
    "te-and-cl": lambda s: HEAD + CHUNKED + _cl(4) + b"\r\n" + LAST + s,
    # two lengths, or one length that is not one number
    "two-content-lengths": lambda s: HEAD + _cl(0) + _cl(len(s)) + b"\r\n" + s,
    "two-equal-content-lengths": lambda s: HEAD + _cl(0) + _cl(0) + b"\r\n" + s,
    "content-length-list": lambda s: HEAD + b"Content-Length: 0, %d\r\n\r\n" % len(s) + s,
    "content-length-plus-sign": lambda s: HEAD + b"Content-Length: +0\r\n\r\n" + s,
    "content-length-negative": lambda s: HEAD + b"Content-Length: -1\r\n\r\n" + s,
    "content-length-overflow": lambda s: HEAD + b"Content-Length: %s\r\n\r\n" % (b"9" * 24) + s,
    # header lines that a lenient parser joins or splits otherwise
    "obs-fold-transfer-encoding": lambda s: (
        HEAD + b"Transfer-Encoding:\r\n chunked\r\n\r\n" + LAST + s
    ),
    "obs-fold-other-header": lambda s: HEAD + b"X-Folded: a\r\n b\r\n" + _cl(0) + b"\r\n" + s,
    "line-starting-with-space": lambda s: HEAD + b" " + CHUNKED + b"\r\n" + LAST + s,
    "bare-lf-line-endings": lambda s: (HEAD + _cl(0)).replace(b"\r\n", b"\n") + b"\n" + s,
    "bare-cr-line-endings": lambda s: (HEAD + _cl(0)).replace(b"\r\n", b"\r") + b"\r" + s,
    "space-before-colon-te": lambda s: (
        HEAD + b"Transfer-Encoding : chunked\r\n" + _cl(len(LAST + s)) + b"\r\n" + LAST + s
    ),
    "space-before-colon-cl": lambda s: HEAD + b"Content-Length : 0\r\n\r\n" + s,
    "vertical-tab-in-te": lambda s: HEAD + b"Transfer-Encoding:\x0bchunked\r\n\r\n" + LAST + s,
    "nul-in-header-value": lambda s: HEAD + b"X-Nul: a\x00b\r\n" + _cl(0) + b"\r\n" + s,
    # chunk sizes and chunk framing
    "chunk-size-not-hex": lambda s: HEAD + CHUNKED + b"\r\nzz\r\nhello\r\n" + LAST + s,
    "chunk-size-negative": lambda s: HEAD + CHUNKED + b"\r\n-1\r\nhello\r\n" + LAST + s,
    "chunk-size-0x-prefix": lambda s: HEAD + CHUNKED + b"\r\n0x5\r\nhello\r\n" + LAST + s,
    "chunk-size-overflow-64-bit": lambda s: (
        HEAD + CHUNKED + b"\r\n10000000000000000\r\nhello\r\n" + LAST + s
    ),
    "chunk-size-overflow-long": lambda s: (
        HEAD + CHUNKED + b"\r\n%s\r\nhello\r\n" % (b"F" * 18) + LAST + s
    ),
    "chunk-size-trailing-space": lambda s: HEAD + CHUNKED + b"\r\n5 \r\nhello\r\n" + LAST + s,
    "chunk-longer-than-its-size": lambda s: HEAD + CHUNKED + b"\r\n5\r\nhelloXX" + LAST + s,
    "chunk-size-bare-lf": lambda s: HEAD + CHUNKED + b"\r\n5\nhello\r\n" + LAST + s,
    "last-chunk-bare-lf": lambda s: HEAD + CHUNKED + b"\r\n0\n\n" + s,
    "chunk-extension-bare-lf": lambda s: HEAD + CHUNKED + b"\r\n0;a=b\nc\r\n\r\n" + s,
    "bad-trailer-line": lambda s: HEAD + CHUNKED + b"\r\n0\r\nX Bad: y\r\n\r\n" + s,
    # transfer codings: chunked with others, unknown ones, and twice
    "chunked-then-gzip": lambda s: HEAD + b"Transfer-Encoding: chunked, gzip\r\n\r\n" + LAST + s,
    "chunked-twice": lambda s: HEAD + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + LAST + s,
    "chunked-and-identity-headers": lambda s: (
        HEAD + CHUNKED + b"Transfer-Encoding: identity\r\n\r\n" + LAST + s
    ),
    "gzip-with-content-length": lambda s: (
        HEAD + b"Transfer-Encoding: gzip\r\n" + _cl(0) + b"\r\n" + s
    ),
}

# Codings the gateway does not implement, before a final chunked: RFC 9112 (6.1) frames the body
# by the chunked coding, but a server that does not understand a coding SHOULD answer 501, and
# this one does not undo gzip (nor know `foo`), so it must not serve such a body as it came.
CODINGS: dict[str, Probe] = {
    "gzip-then-chunked": lambda s: HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + LAST + s,
    "unknown-then-chunked": lambda s: HEAD + b"Transfer-Encoding: foo, chunked\r\n\r\n" + LAST + s,
    "gzip-and-chunked-headers": lambda s: (
        HEAD + b"Transfer-Encoding: gzip\r\n" + CHUNKED + b"\r\n" + LAST + s
    ),
    # codings that are not chunked at all (the parser's 400, or the gateway's 501 first)
    "identity": lambda s: HEAD + b"Transfer-Encoding: identity\r\n\r\n" + s,
    "xchunked": lambda s: HEAD + b"Transfer-Encoding: xchunked\r\n\r\n" + LAST + s,
}


@pytest.mark.parametrize("name", PROBES)
def test_ambiguous_framing_is_a_400_that_closes_and_runs_nothing(
    gateway: GatewayProcess, up: ScriptedUpstream, marker: str, name: str
) -> None:
    reply = exchange(gateway.port, PROBES[name](smuggled(marker)), methods=("POST",) * 3)
    assert [r.status for r in reply.responses] == [400], reply
    (refused,) = reply.responses
    assert refused.body == PARSER_400_BODY
    assert refused.header("connection") == "close"
    assert reply.closed and reply.rest == b""
    assert up.requests() == []
    assert stored_with(gateway, marker) == []


@pytest.mark.parametrize("name", CODINGS)
def test_a_coding_the_gateway_does_not_undo_is_refused_and_runs_nothing(
    gateway: GatewayProcess, up: ScriptedUpstream, marker: str, name: str
) -> None:
    reply = exchange(gateway.port, CODINGS[name](smuggled(marker)), methods=("POST",) * 3)
    assert [r.status for r in reply.responses] in ([400], [501]), reply
    assert reply.responses[0].header("connection") == "close"
    assert reply.closed and reply.rest == b""
    assert up.requests() == []
    assert stored_with(gateway, marker) == []


def test_transfer_encoding_in_http_1_0_closes_after_one_answer(
    gateway: GatewayProcess, up: ScriptedUpstream, marker: str
) -> None:
    """HTTP/1.0 has no chunked coding: RFC 9112 (6.1) has the message's framing treated as
    faulty and the connection closed after it. Whatever the one answer says, nothing behind it
    runs."""
    probe = HEAD.replace(b"HTTP/1.1", b"HTTP/1.0") + CHUNKED + b"\r\n" + LAST + smuggled(marker)
    reply = exchange(gateway.port, probe, methods=("POST",) * 3)
    assert [r.status for r in reply.responses] == [400]
    assert reply.closed and reply.rest == b""
    assert up.requests() == []
    assert stored_with(gateway, marker) == []


def test_the_smuggled_requests_run_when_sent_alone(
    gateway: GatewayProcess, up: ScriptedUpstream, marker: str
) -> None:
    """The probes' observation works: the same bytes, as requests of their own, reach the
    upstream and the store."""
    reply = exchange(gateway.port, smuggled(marker), methods=("POST", "POST"), until_close=False)
    assert [r.status for r in reply.responses] == [200, 200]
    assert upstream_prompts(up) == [marker]
    assert len(stored_with(gateway, marker)) == 1


# ---------------------------------------------------------------- pipelining


def _prompt(i: int) -> str:
    return f"pipelined request {i}"


@dataclass(frozen=True)
class Kind:
    """A kind of request in the pipeline: how request i is written, what of its answer tells
    it apart, and what that must be."""

    method: str
    request: Callable[[int, dict[str, str]], bytes]
    answer: Callable[[RawResponse], object]
    expected: Callable[[int], object]


KINDS = (
    Kind(
        "GET",
        lambda i, rid: request_bytes("GET", "/livez", rid),
        RawResponse.json,
        lambda i: {"status": "ok"},
    ),
    Kind(  # no body: the next answer's bytes must not be taken for one
        "HEAD",
        lambda i, rid: request_bytes("HEAD", "/livez", rid),
        lambda r: r.body,
        lambda i: b"",
    ),
    Kind(
        "GET",
        lambda i, rid: request_bytes("GET", f"/v1/models/{ALIAS}", {**rid, **bearer(KEY)}),
        lambda r: r.json()["id"],
        lambda i: ALIAS,
    ),
    Kind(
        "POST",
        lambda i, rid: json_request(
            "/v1/completions", KEY, {"model": ALIAS, "prompt": _prompt(i), "max_tokens": 2}, rid
        ),
        lambda r: r.json()["choices"][0]["text"],
        lambda i: expected_text(_prompt(i), 0, 2),
    ),
)


def test_a_hundred_pipelined_requests_are_answered_in_order(
    gateway: GatewayProcess, up: ScriptedUpstream
) -> None:
    kinds = [KINDS[i % len(KINDS)] for i in range(PIPELINED)]
    ids = [f"pipe-{i:03d}" for i in range(PIPELINED)]
    data = b"".join(k.request(i, {"X-Request-Id": ids[i]}) for i, k in enumerate(kinds))
    reply = exchange(gateway.port, data, methods=[k.method for k in kinds], until_close=False)
    assert len(reply.responses) == PIPELINED
    assert [r.header("x-request-id") for r in reply.responses] == ids
    assert [r.status for r in reply.responses] == [200] * PIPELINED
    answers = [k.answer(r) for k, r in zip(kinds, reply.responses, strict=True)]
    assert answers == [k.expected(i) for i, k in enumerate(kinds)]
    completions = [i for i, k in enumerate(kinds) if k.method == "POST"]
    assert upstream_prompts(up) == [_prompt(i) for i in completions]
    assert reply.rest == b""

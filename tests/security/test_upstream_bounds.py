"""P5: what an upstream sends is bounded. A body, once decoded, stops at the provider's
`max_response_bytes` (default 64 MiB): a gzip bomb of a few hundred kB that inflates past it is a
502 naming the limit, and the gateway never holds the inflated whole. A head over 64 KB or 100
headers is a 502 too. Before, a 204 KB gzip body inflated to 200 MB (496 MB peak RSS)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.gateway_proc import GatewayProcess
from tests.security.raw_upstream import RawUpstream, Request, completion, gateway_config, response

KEY = "sk-bounds"
SMALL_LIMIT = 1 << 20
DEFAULT_LIMIT = 64 << 20
# Zeros inside a JSON string: a valid answer's shape, a few hundred kB compressed.
BOMB = gzip.compress(completion("0" * (DEFAULT_LIMIT + (4 << 20))), compresslevel=9)
JUST_FITS = gzip.compress(completion("0" * (SMALL_LIMIT - 512)))


def _bomb(request: Request) -> bytes:
    return response(200, BOMB, ("content-encoding", "gzip"), ("content-type", "application/json"))


def _fits(request: Request) -> bytes:
    return response(200, JUST_FITS, ("content-encoding", "gzip"))


def _big_stream(request: Request) -> bytes:
    event = b"data: " + completion("x" * 60_000) + b"\n\n"
    chunk = b"%x\r\n%s\r\n" % (len(event), event)
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    return head + chunk * 40 + b"0\r\n\r\n"  # ~2.4 MB of events, no [DONE]


def _many_headers(request: Request) -> bytes:
    return response(200, completion("x"), *[(f"x-h{i}", "v") for i in range(101)])


def _huge_head(request: Request) -> bytes:
    return response(200, completion("x"), ("x-big", "v" * (80 * 1024)))


ANSWERS = {
    "bomb": _bomb,
    "bomb-small": _bomb,
    "fits": _fits,
    "stream": _big_stream,
    "headers": _many_headers,
    "head": _huge_head,
}
SMALL = ("bomb-small", "fits", "stream")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("bounds")
    with ExitStack() as stack:
        urls = {n: stack.enter_context(RawUpstream(a)).url for n, a in ANSWERS.items()}
        small = {name: f", max_response_bytes: {SMALL_LIMIT}" for name in SMALL}
        yield stack.enter_context(GatewayProcess(gateway_config(urls, {"b": KEY}, small), workdir))


def _ask(gw: GatewayProcess, alias: str, streamed: bool = False) -> httpx.Response:
    body = {"model": alias, "prompt": "hi", "max_tokens": 1, "stream": streamed}
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(gw.url + "/v1/completions", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(("alias", "limit"), [("bomb", DEFAULT_LIMIT), ("bomb-small", SMALL_LIMIT)])
def test_a_gzip_bomb_is_a_502_naming_the_limit(
    gateway: GatewayProcess, alias: str, limit: int
) -> None:
    assert len(BOMB) < 512 * 1024
    resp = _ask(gateway, alias)
    assert resp.status_code == 502, resp.text
    error = resp.json()["error"]
    assert error["code"] == "upstream_response_too_large"
    assert f"over {limit} bytes" in error["message"]
    assert f"providers.{alias}.max_response_bytes" in error["message"]


def test_a_body_within_the_limit_is_served(gateway: GatewayProcess) -> None:
    resp = _ask(gateway, "fits")
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"][0]["text"]) == SMALL_LIMIT - 512


def test_a_stream_past_the_limit_is_cut_with_an_error(gateway: GatewayProcess) -> None:
    resp = _ask(gateway, "stream", streamed=True)
    assert resp.status_code == 200  # the stream had begun
    assert "upstream_response_too_large" in resp.text
    assert len(resp.content) < 2 * SMALL_LIMIT


@pytest.mark.parametrize("alias", ["headers", "head"])
def test_an_oversized_head_is_a_502(gateway: GatewayProcess, alias: str) -> None:
    resp = _ask(gateway, alias)
    assert resp.status_code == 502, resp.text

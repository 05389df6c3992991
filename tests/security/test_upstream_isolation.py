"""P1: an upstream's interim reply must never hand one caller's answer to another key.

The upstream answers every request with an interim head (103 Early Hints, 100 Continue, 102
Processing) before its final 200, which echoes the request's prompt. Two keys take turns on the
gateway's one pooled connection to it: each must get its own prompt back, every time, as JSON and
as a stream. Before the fix, the gateway took the 1xx for the answer (a 502), pooled the
connection with the 200 still to come, and the next caller got the previous caller's completion.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.gateway_proc import GatewayProcess
from tests.security.raw_upstream import (
    RawUpstream,
    Request,
    completion,
    gateway_config,
    response,
    stream,
)

KEYS = {"tenant-a": "sk-tenant-a", "tenant-b": "sk-tenant-b"}
INTERIM = (
    b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n",
)


def _answer(request: Request) -> bytes:
    body = request.json
    prompt = str(body["prompt"])
    interim = INTERIM[len(prompt) % len(INTERIM)]
    final = stream(prompt) if body.get("stream") else response(200, completion(prompt))
    return interim + final


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayProcess, RawUpstream]]:
    with RawUpstream(_answer) as upstream:
        workdir: Path = tmp_path_factory.mktemp("isolation")
        config = gateway_config({"up": upstream.url}, KEYS)
        with GatewayProcess(config, workdir) as gw:
            yield gw, upstream


def _ask(http: httpx.Client, key: str, prompt: str, streamed: bool) -> str:
    body = {"model": "up", "prompt": prompt, "max_tokens": 4, "stream": streamed}
    headers = {"authorization": f"Bearer {key}"}
    resp = http.post("/v1/completions", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    if not streamed:
        return str(resp.json()["choices"][0]["text"])
    texts = [
        line.removeprefix("data: ") for line in resp.text.splitlines() if line.startswith("data: {")
    ]
    return "".join(str(orjson.loads(t)["choices"][0]["text"]) for t in texts)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_each_caller_gets_its_own_answer(
    gateway: tuple[GatewayProcess, RawUpstream], streamed: bool
) -> None:
    gw, upstream = gateway
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        for turn in range(12):
            for kid, key in KEYS.items():
                prompt = f"secret of {kid} #{turn}{'!' * (turn % 3)}"
                assert _ask(http, key, prompt, streamed) == prompt
    # Taking turns, the callers shared the gateway's connections to the upstream: the test
    # exercised the pool, not one connection each.
    assert len({r.connection for r in upstream.requests}) < len(upstream.requests)

"""A caller that goes away must not leave the upstream working: the gateway closes its upstream
request, during a stream and before the first byte. Each test waits (≤ 10 s) for the scripted
upstream to *notice*; without the gateway closing it, the upstream would keep going for 60 s
(`__slow_stream__`) or 30 s (`__sleep_30000__`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Env
from tests.e2e.support import DIALECT_ALIASES, FW, OA, auth, gateway_config, poll_stats
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import free_port

CLIENT_TIMEOUT_S = 0.5


@pytest.mark.parametrize("alias", [OA, FW])
def test_disconnect_mid_stream_closes_the_upstream(env: Env, alias: str) -> None:
    upstream = env.upstream(alias)
    body = {"model": alias, "prompt": "__slow_stream__", "stream": True}
    with (
        httpx.Client(timeout=30.0, trust_env=False) as http,
        http.stream("POST", env.url + "/v1/completions", json=body, headers=auth()) as resp,
    ):
        assert resp.status_code == 200
        first = next(resp.iter_bytes())
        assert first.startswith(b"data: {")
    stats = poll_stats(upstream, lambda s: s["disconnects"] >= 1)
    assert (stats["streams_started"], stats["disconnects"], stats["completed_streams"]) == (1, 1, 0)
    assert upstream.requests()[0]["outcome"] == "disconnect"


@pytest.mark.parametrize("alias", DIALECT_ALIASES)
def test_disconnect_before_the_first_byte_cancels_the_upstream(env: Env, alias: str) -> None:
    upstream = env.upstream(alias)
    body = {"model": alias, "prompt": "__sleep_30000__ hello", "max_tokens": 2}
    with (
        httpx.Client(timeout=CLIENT_TIMEOUT_S, trust_env=False) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        http.post(env.url + "/v1/completions", json=body, headers=auth())
    stats = poll_stats(upstream, lambda s: s["cancelled"] >= 1)
    assert (stats["requests"], stats["cancelled"]) == (1, 1)
    assert upstream.requests()[0]["outcome"] == "cancelled"


def test_disconnect_before_the_first_byte_of_a_stream(env: Env) -> None:
    body = {"model": OA, "prompt": "__sleep_30000__", "stream": True}
    with (
        httpx.Client(timeout=CLIENT_TIMEOUT_S, trust_env=False) as http,
        pytest.raises(httpx.ReadTimeout),
        http.stream("POST", env.url + "/v1/completions", json=body, headers=auth()),
    ):
        pass
    stats = poll_stats(env.openai, lambda s: s["cancelled"] >= 1)
    assert (stats["requests"], stats["cancelled"], stats["streams_started"]) == (1, 1, 0)


def test_gateway_still_serves_after_disconnects(env: Env) -> None:
    """The pool is not poisoned by the connections closed above."""
    for alias in (OA, FW):
        resp = env.http.post(
            "/v1/completions",
            json={"model": alias, "prompt": "hi", "max_tokens": 1},
            headers=auth(),
        )
        assert resp.status_code == 200, resp.text


def test_on_uvicorns_own_protocol_a_disconnect_still_cancels(env: Env, tmp_path: Path) -> None:
    """`gateway serve --http uvicorn`: no watch from the protocol; a task waits on `receive`."""
    text = gateway_config(env.openai.url, env.fireworks.url, free_port())
    with GatewayProcess(text, tmp_path, extra_args=("--http", "uvicorn")) as gw:
        body = {"model": OA, "prompt": "__sleep_30000__ hello", "max_tokens": 2}
        with (
            httpx.Client(timeout=CLIENT_TIMEOUT_S, trust_env=False) as http,
            pytest.raises(httpx.ReadTimeout),
        ):
            http.post(gw.url + "/v1/completions", json=body, headers=auth())
        stats = poll_stats(env.openai, lambda s: s["cancelled"] >= 1)
        assert (stats["requests"], stats["cancelled"]) == (1, 1)

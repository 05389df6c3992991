"""Limits shared by four gateway processes through one real redis-server, in front of the
scripted OpenAI upstream: exact admission under a burst, token reservation and settlement
(streams included), parallel slots, and Redis dying and coming back."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import pytest
from openai import OpenAI

from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.redis_proc import RedisServer
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream, free_port, start_scripted

REPLICAS = 4
KEYS = {
    "burst": "rpm: 20",
    "tokens": "tpm: 300",
    "stream": "tpm: 300",
    "par": "max_parallel: 2",
    "outage": "rpm: 8",
    "after": "rpm: 12",
}


def config(upstream: str, redis_url: str) -> str:
    keys = "\n".join(
        f"    - {{id: {name}, key: k-{name}, limits: {{{limit}}}}}" for name, limit in KEYS.items()
    )
    return f"""
auth:
  keys:
{keys}
providers:
  up: {{type: openai, base_url: "{upstream}", api_key: "{OPENAI_TEST_KEY}"}}
models:
  m: {{targets: [{{provider: up, model: gpt-test}}]}}
rate_limit:
  backend: redis
  redis_url: "{redis_url}"
  replicas: {REPLICAS}
  breaker: {{failures: 1, cooldown_s: 0.2}}
"""


@dataclass
class Cluster:
    redis: RedisServer
    upstream: ScriptedUpstream
    gateways: list[GatewayProcess]

    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with RedisServer() as redis, start_scripted("openai", api_key=OPENAI_TEST_KEY) as up:
        text = config(up.url, redis.url)
        gateways = [
            GatewayProcess(text, tmp_path_factory.mktemp(f"gw{i}")) for i in range(REPLICAS)
        ]
        try:
            yield Cluster(redis, up, gateways)
        finally:
            for g in gateways:
                g.stop()


def body(**kw: object) -> dict[str, object]:
    return {"model": "m", "prompt": "one two three", "max_tokens": 5, **kw}


async def burst(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    """`count` requests at once, spread round-robin over the gateways."""
    headers = {"authorization": f"Bearer k-{key}"}
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
        gateways = itertools.cycle(urls)
        return await asyncio.gather(
            *(
                client.post(f"{next(gateways)}/v1/completions", json=body(), headers=headers)
                for _ in range(count)
            )
        )


def test_four_gateways_admit_exactly_the_limit_under_a_burst(cluster: Cluster) -> None:
    answers = asyncio.run(burst(cluster.urls(), "burst", 4 * 20))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 20 + [429] * 60
    for r in answers:
        assert r.headers["x-ratelimit-limit-requests"] == "20"
        if r.status_code == 429:
            err = r.json()["error"]
            assert err["type"] == "requests" and err["code"] == "rate_limit_exceeded"
            assert "key 'burst'" in err["message"]
            assert int(r.headers["retry-after"]) >= 1 and int(r.headers["retry-after-ms"]) > 0
            assert r.headers["x-ratelimit-remaining-requests"] == "0"


class Answer(Protocol):
    """A response from httpx, or from the httpx the openai SDK uses (its own copy)."""

    @property
    def headers(self) -> Mapping[str, str]: ...


def remaining_tokens(r: Answer) -> int:
    return int(r.headers["x-ratelimit-remaining-tokens"])


def estimate(prompt: str, max_tokens: int) -> int:
    """The gateway's reservation for an upstream without a tokenizer: 4 bytes a token."""
    return math.ceil(len(prompt.encode()) / 4) + max_tokens


def test_tokens_are_reserved_then_settled_across_gateways(cluster: Cluster) -> None:
    a, b = cluster.urls()[:2]
    headers = {"authorization": "Bearer k-tokens"}
    prompt = "w " * 30 + "__eos_3__"  # the fake model: 31 prompt tokens, then 3 generated
    first = httpx.post(f"{a}/v1/completions", json=body(prompt=prompt, max_tokens=100),
                       headers=headers)  # fmt: skip
    assert first.status_code == 200, first.text
    used = first.json()["usage"]["total_tokens"]
    assert used == 31 + 3
    assert remaining_tokens(first) == 300 - estimate(prompt, 100)  # reserved at admission
    second = httpx.post(f"{b}/v1/completions", json=body(prompt="x", max_tokens=50),
                        headers=headers)  # fmt: skip
    # the first request was settled to what it used; refill since then adds at most a few
    expected = 300 - used - estimate("x", 50)
    assert expected <= remaining_tokens(second) <= expected + 3


def test_a_stream_is_settled_with_the_usage_the_gateway_asked_for(cluster: Cluster) -> None:
    a, b = cluster.urls()[2:]
    prompt = "w " * 20 + "__eos_4__"
    with OpenAI(base_url=f"{a}/v1", api_key="k-stream", max_retries=0) as sdk:
        raw = sdk.completions.with_raw_response.create(
            model="m",
            prompt=prompt,
            max_tokens=200,
            stream=True,  # no include_usage asked
        )
        chunks = list(raw.parse())
    assert all(c.usage is None for c in chunks)  # the caller did not ask for usage
    assert remaining_tokens(raw.http_response) == 300 - estimate(prompt, 200)
    second = httpx.post(f"{b}/v1/completions", json=body(prompt="x", max_tokens=10),
                        headers={"authorization": "Bearer k-stream"})  # fmt: skip
    expected = 300 - (21 + 4) - estimate("x", 10)
    assert expected <= remaining_tokens(second) <= expected + 3


def test_parallel_slots_are_shared_and_given_back(cluster: Cluster) -> None:
    a, b, c, _ = cluster.urls()
    headers = {"authorization": "Bearer k-par"}
    slow = body(prompt="__slow_stream__", stream=True, max_tokens=500)
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        with client.stream("POST", f"{a}/v1/completions", json=slow, headers=headers) as one:
            assert one.status_code == 200
            with client.stream("POST", f"{b}/v1/completions", json=slow, headers=headers) as two:
                assert two.status_code == 200
                third = client.post(f"{c}/v1/completions", json=body(), headers=headers)
                assert third.status_code == 429
                assert "parallel requests" in third.json()["error"]["message"]
        # both streams were dropped by the client: their slots come back
        for _ in range(100):
            if client.post(f"{c}/v1/completions", json=body(), headers=headers).is_success:
                break
        else:
            pytest.fail("the parallel slots never came back")


def test_redis_down_then_back(cluster: Cluster) -> None:
    gw = cluster.urls()[0]
    headers = {"authorization": "Bearer k-outage"}
    before = scrape(gw)
    cluster.redis.kill()
    try:
        # on_backend_error: local → this gateway alone admits 8 / 4 replicas
        answers = [httpx.post(f"{gw}/v1/completions", json=body(), headers=headers)
                   for _ in range(4)]  # fmt: skip
        assert httpx.get(f"{gw}/readyz").status_code == 200  # Redis is not readiness
    finally:
        cluster.redis.start()  # empty, on the same port
    assert [r.status_code for r in answers] == [200, 200, 429, 429]
    assert answers[0].headers["x-ratelimit-limit-requests"] == "2"
    during = scrape(gw)
    assert during.value("gateway_ratelimit_backend_errors_total", mode="local") >= 1 + (
        before.value("gateway_ratelimit_backend_errors_total", mode="local")
    )
    assert during.value("gateway_ratelimit_backend_up") == 0
    assert during.delta(before, "gateway_ratelimit_decisions_total", backend="local") == 4

    # each gateway finds Redis again on its breaker's next probe, with no restart
    for url in cluster.urls():
        for _ in range(200):
            r = httpx.post(f"{url}/v1/completions", json=body(), headers=headers)
            if r.headers.get("x-ratelimit-limit-requests") == "8":
                break
        else:
            pytest.fail(f"{url} never used Redis again")
    assert scrape(gw).value("gateway_ratelimit_backend_up") == 1
    answers = asyncio.run(burst(cluster.urls(), "after", 4 * 12))
    assert sorted(r.status_code for r in answers) == [200] * 12 + [429] * 36


@pytest.mark.parametrize(("mode", "status"), [("closed", 503), ("open", 200)])
def test_a_gateway_starts_and_answers_without_redis(
    cluster: Cluster, tmp_path: Path, mode: str, status: int
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    text = config(cluster.upstream.url, dead).replace(
        "  replicas: 4", f"  replicas: 4\n  on_backend_error: {mode}"
    )
    with GatewayProcess(text, tmp_path) as gw:  # ready without Redis
        headers = {"authorization": "Bearer k-burst"}
        answers = [
            httpx.post(f"{gw.url}/v1/completions", json=body(), headers=headers) for _ in range(3)
        ]
        assert [r.status_code for r in answers] == [status] * 3
        if mode == "closed":
            err = answers[0].json()["error"]
            assert err["code"] == "service_unavailable"
            assert int(answers[0].headers["retry-after"]) >= 1
        else:
            assert "x-ratelimit-limit-requests" not in answers[0].headers  # nothing was checked
        metrics = scrape(gw.url)
        assert metrics.value("gateway_ratelimit_backend_errors_total", mode=mode) >= 1
        result = "unavailable" if mode == "closed" else "open"
        assert metrics.value("gateway_ratelimit_decisions_total", result=result) == 3

"""What a request costs, through the pipeline: reserved at admission at the highest prices of
the plan's targets, then settled to the price of the target that answered times its usage,
added to the key's, team's and model's spend. A budget that cannot hold the reservation is a
429 insufficient_quota before any provider is called."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from core.chat import ChatRequest
from core.completions import CompletionRequest
from core.errors import UpstreamError
from core.provider import Prepared
from gateway import config
from gateway.api.app import create_app
from gateway.governance.budgets import window
from gateway.governance.ledger import day_hash
from gateway.governance.money import usd
from gateway.runtime import Runtime
from tests.unit.gateway.api.test_app import FakeProvider

pytestmark = pytest.mark.asyncio

# What the cheap target reports: 1200 prompt tokens (1000 of them cached), 300 completion
# tokens (200 of them reasoning: inside the 300, as OpenAI counts them).
USAGE = {
    "prompt_tokens": 1200,
    "prompt_tokens_details": {"cached_tokens": 1000},
    "completion_tokens": 300,
    "completion_tokens_details": {"reasoning_tokens": 200},
    "total_tokens": 1500,
}
# at cheap/small's prices ($1 in, $0.50 cached, $2 out per million tokens):
CHEAP_COST = 200 * 1_000_000 + 1000 * 500_000 + 300 * 2_000_000  # 1.3e9 pico: $0.0013
# what premium/big would have charged for the same usage ($10 in and cached, $30 out):
PREMIUM_COST = 1200 * 10_000_000 + 300 * 30_000_000
PICO = 10**12

CONFIG = """
providers:
  premium:
    type: openai-compatible
    base_url: "http://127.0.0.1:1/v1"
    pricing:
      big: {input: 10, output: 30}
  cheap:
    type: openai-compatible
    base_url: "http://127.0.0.1:1/v1"
    pricing:
      small: {input: 1, cached_input: 0.5, output: 2}
  free: {type: openai-compatible, base_url: "http://127.0.0.1:1/v1"}
  flaky:
    type: openai-compatible
    base_url: "http://127.0.0.1:1/v1"
    pricing:
      "*": {input: 0.1, output: 0.1}
models:
  fb:
    strategy: fallback
    targets: [{provider: premium, model: big}, {provider: cheap, model: small}]
  down:
    strategy: fallback
    targets: [{provider: premium, model: big}, {provider: premium, model: big}]
  gratis: {targets: [{provider: free, model: any}]}
  rev:
    strategy: fallback
    targets: [{provider: flaky, model: tiny}, {provider: cheap, model: small}]
teams:
  t: {}
auth:
  keys:
    - {id: a, key: sk-a, team: t, budget: {usd: 1, period: day}}
    - {id: poor, key: sk-poor, budget: {usd: 0.001, period: day}}
    - {id: free, key: sk-free}
"""


class Priced(FakeProvider):
    """The scripted provider, reporting USAGE for every answer (JSON and streams)."""

    async def complete(self, prepared: Prepared[CompletionRequest]) -> Any:
        answer = await super().complete(prepared)
        return {**answer, "usage": USAGE}

    async def complete_chat(self, prepared: Prepared[ChatRequest]) -> Any:
        answer = await super().complete_chat(prepared)
        return {**answer, "usage": USAGE}

    async def stream_chat(self, prepared: Prepared[ChatRequest]) -> AsyncIterator[Any]:
        async for batch in super().stream_chat(prepared):
            yield [{**c, "usage": USAGE} if "usage" in c else c for c in batch]


Gateway = tuple[httpx.AsyncClient, Runtime, dict[str, "Priced"]]  # client, runtime, providers


def priced_providers() -> dict[str, Priced]:
    """CONFIG's providers: premium and flaky fail, cheap and free answer."""
    return {
        "premium": Priced(
            "premium", UpstreamError("Upstream premium/big returned 503", status=502)
        ),
        "cheap": Priced("cheap"),
        "free": Priced("free"),
        "flaky": Priced("flaky", UpstreamError("Upstream flaky/tiny returned 500", status=502)),
    }


@contextlib.asynccontextmanager
async def serving(text: str) -> AsyncIterator[Gateway]:
    """The app of this config on priced_providers(), started, and a client of it."""
    providers = priced_providers()
    app = create_app(config.parse(text), build=lambda block: providers[block.name])
    rt = app.runtime
    await rt.start()
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client, rt, providers
    finally:
        await app.runtime.aclose()


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    async with serving(CONFIG) as served:
        yield served


def chat(model: str = "fb", stream: bool = False) -> bytes:
    # 40 x's: 42 bytes of JSON, 11 tokens at 4 bytes a token, and 4 for the message
    body = {"model": model, "messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 100}
    return orjson.dumps({**body, "stream": True} if stream else body)


RESERVED = 15 * 10_000_000 + 100 * 30_000_000  # 15 prompt, 100 output tokens at the ceiling


async def post(client: httpx.AsyncClient, key: str, body: bytes, path: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return await client.post(path, content=body, headers=headers)


def spent(rt: Runtime, scope: str = "k:a") -> int:
    """A budget counter of this UTC day (memory backend)."""
    memory = rt.limiter.memory
    assert memory is not None
    stamp = window("day", dt.datetime.now(dt.UTC)).stamp
    return memory.spent.get(f"b:{scope}:{stamp}", 0)


async def day_ledger(rt: Runtime) -> dict[str, int]:
    day = day_hash(dt.datetime.now(dt.UTC).date())
    return (await rt.limiter.read_ledger([day]))[day]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_request_is_charged_the_price_of_the_target_that_answered(
    gateway: Gateway, stream: bool
) -> None:
    client, rt, providers = gateway
    r = await post(client, "sk-a", chat(stream=stream), "/v1/chat/completions")
    assert r.status_code == 200, r.text
    assert providers["premium"].calls == 1 and providers["cheap"].calls == 1  # fell back
    # admitted at the plan's ceiling (premium's prices), before it was known who answers
    assert r.headers["x-gateway-budget-remaining-usd"] == usd(PICO - RESERVED) == "0.99685"
    # settled to cheap's price x usage, not premium's, and not the reservation
    assert CHEAP_COST == 1_300_000_000 and PREMIUM_COST == 21_000_000_000
    assert spent(rt) == CHEAP_COST
    assert await day_ledger(rt) == {"k:a": CHEAP_COST, "m:fb": CHEAP_COST, "t:t": CHEAP_COST}
    labels = {"team": "t", "model": "fb", "provider": "cheap"}
    rt.metrics.flush()
    assert rt.metrics.registry.get_sample_value("gateway_spend_usd_total", labels) == 0.0013


async def test_the_reservation_is_at_the_highest_price_wherever_it_is_in_the_plan(
    gateway: Gateway,
) -> None:
    """flaky ($0.10 a million) is tried first, cheap ($1 in, $2 out) after it: the request may
    cost cheap's prices, so it reserves at them."""
    client, rt, providers = gateway
    r = await post(client, "sk-a", chat("rev"), "/v1/chat/completions")
    assert r.status_code == 200, r.text
    assert providers["flaky"].calls == 1 and providers["cheap"].calls == 1
    reserved = 15 * 1_000_000 + 100 * 2_000_000
    assert r.headers["x-gateway-budget-remaining-usd"] == usd(PICO - reserved) == "0.999785"
    assert spent(rt) == CHEAP_COST
    assert await day_ledger(rt) == {"k:a": CHEAP_COST, "m:rev": CHEAP_COST, "t:t": CHEAP_COST}


async def test_costs_add_up_per_key_team_and_model(
    gateway: Gateway,
) -> None:
    client, rt, _ = gateway
    for _ in range(3):
        assert (await post(client, "sk-a", chat(), "/v1/chat/completions")).status_code == 200
    completion = orjson.dumps({"model": "fb", "prompt": "x" * 8, "max_tokens": 10, "best_of": 3})
    r = await post(client, "sk-a", completion, "/v1/completions")
    assert r.status_code == 200, r.text
    # 2 prompt tokens, 10 x 3 candidates: reserved at the ceiling on what 3 requests left
    left = PICO - 3 * CHEAP_COST - (2 * 10_000_000 + 30 * 30_000_000)
    assert r.headers["x-gateway-budget-remaining-usd"] == usd(left)
    assert spent(rt) == 4 * CHEAP_COST  # usage already holds every candidate: priced once
    assert await day_ledger(rt) == {
        "k:a": 4 * CHEAP_COST,
        "m:fb": 4 * CHEAP_COST,
        "t:t": 4 * CHEAP_COST,
    }


async def test_a_budget_too_small_for_the_reservation_is_refused_before_any_call(
    gateway: Gateway,
) -> None:
    client, rt, providers = gateway
    r = await post(client, "sk-poor", chat(), "/v1/chat/completions")
    assert r.status_code == 429
    assert r.headers["x-should-retry"] == "false"
    assert r.headers["x-gateway-budget-remaining-usd"] == "0"
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert error["message"].startswith(
        "Budget exceeded for key 'poor': $0.001 a day, $0.00 spent or reserved by requests in "
        f"flight, and this request may cost up to ${usd(RESERVED)}. It resets at "
    )
    assert providers["premium"].calls == providers["cheap"].calls == 0
    assert spent(rt, "k:poor") == 0 and await day_ledger(rt) == {}


async def test_a_request_nobody_answered_gives_its_reservation_back(
    gateway: Gateway,
) -> None:
    client, rt, _ = gateway
    r = await post(client, "sk-a", chat("down"), "/v1/chat/completions")
    assert r.status_code == 502
    assert spent(rt) == 0 and await day_ledger(rt) == {}


async def test_an_unpriced_target_costs_nothing(
    gateway: Gateway,
) -> None:
    client, rt, _ = gateway
    r = await post(client, "sk-a", chat("gratis"), "/v1/chat/completions")
    assert r.status_code == 200
    assert r.headers["x-gateway-budget-remaining-usd"] == "1"  # nothing to reserve
    assert spent(rt) == 0 and await day_ledger(rt) == {}
    rt.metrics.flush()
    labels = {"model": "gratis", "provider": "free"}
    assert rt.metrics.registry.get_sample_value("gateway_unpriced_requests_total", labels) == 1


async def test_a_key_without_a_budget_is_charged_to_the_ledger(
    gateway: Gateway,
) -> None:
    client, rt, _ = gateway
    r = await post(client, "sk-free", chat(), "/v1/chat/completions")
    assert r.status_code == 200
    assert "x-gateway-budget-remaining-usd" not in r.headers
    assert await day_ledger(rt) == {"k:free": CHEAP_COST, "m:fb": CHEAP_COST}


async def test_a_stream_that_breaks_before_its_usage_is_charged_its_reservation(
    gateway: Gateway,
) -> None:
    client, rt, providers = gateway
    body = orjson.dumps({"model": "fb", "prompt": "break", "max_tokens": 10, "stream": True})
    r = await post(client, "sk-a", body, "/v1/completions")
    assert r.status_code == 200 and "Upstream x/y broke mid-stream" in r.text
    assert providers["cheap"].calls == 1
    reserved = 2 * 10_000_000 + 10 * 30_000_000  # 5 bytes: 2 tokens; 10 at the ceiling
    assert spent(rt) == reserved
    assert await day_ledger(rt) == {"k:a": reserved, "m:fb": reserved, "t:t": reserved}

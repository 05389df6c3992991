"""Budgets and spend across two gateway processes sharing one real redis-server, in front of the
scripted OpenAI upstream: a concurrent burst against a small budget, spend equal to the answers'
usage at the configured prices, the refusal as the openai SDK sees it, the remaining-budget
header.

Prompts are token ids, so the gateway's estimate of a prompt is exact and every reservation
covers its request's cost: the guarantee then reads spend <= budget exactly.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from openai import DefaultHttpxClient, OpenAI, RateLimitError

from tests.gateway_proc import GatewayProcess
from tests.redis_proc import RedisServer
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream, start_scripted

# USD per million tokens: high, so that a few requests spend a small budget.
INPUT, CACHED, OUTPUT = Decimal(1000), Decimal(500), Decimal(2000)
PROMPT = [11, 12, 13]  # three tokens, counted exactly by gateway and upstream alike
MAX_TOKENS = 5
BURST_BUDGET = Decimal("0.1")
PREFIX = "{llmgw}:"  # the limiter's hash tag (rate_limit.key_prefix)
ADMIN = "sk-e2e-admin"
PROPAGATION_S = 1.0  # a change made on one replica is seen by every other within this


def config(upstream: str, redis_url: str) -> str:
    price = f"{{input: {INPUT}, cached_input: {CACHED}, output: {OUTPUT}}}"
    return f"""
teams:
  search: {{models: ["m*"], budget: {{usd: 5, period: month}}}}
auth:
  admin_keys: [{{id: ops, key: {ADMIN}}}]
  keys:
    - {{id: burst, key: k-burst, budget: {{usd: {BURST_BUDGET}, period: day}}}}
    - {{id: spender, key: k-spender, team: search, budget: {{usd: 5, period: total}}}}
    - {{id: header, key: k-header, budget: {{usd: 1, period: week}}}}
    - {{id: sdk, key: k-sdk, budget: {{usd: 0.000001, period: day}}}}
    - {{id: outage, key: k-outage, budget: {{usd: 1, period: total}}}}
providers:
  up:
    type: openai
    base_url: "{upstream}"
    api_key: "{OPENAI_TEST_KEY}"
    pricing: {{gpt-test: {price}, "*": {{input: 0, output: 0}}}}
models:
  m: {{targets: [{{provider: up, model: gpt-test}}]}}
  m-embed: {{targets: [{{provider: up, model: text-embedding-3-small}}], endpoint: embeddings}}
rate_limit:
  backend: redis
  redis_url: "{redis_url}"
  on_backend_error: local
  breaker: {{failures: 1, cooldown_s: 0.2}}
"""


@dataclass
class Pair:
    server: RedisServer
    upstream: ScriptedUpstream
    gateways: list[GatewayProcess]
    store: redis.Redis  # to read what the gateways wrote
    config: str
    workdirs: list[Path]

    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with RedisServer() as server, start_scripted("openai", api_key=OPENAI_TEST_KEY) as up:
        text = config(up.url, server.url)
        dirs = [tmp_path_factory.mktemp(f"gw{i}") for i in range(2)]
        gateways = [GatewayProcess(text, d) for d in dirs]
        try:
            with redis.Redis.from_url(server.url) as store:
                made = Pair(server, up, gateways, store, text, dirs)
                yield made
        finally:
            for g in made.gateways if "made" in locals() else gateways:
                g.stop()


def cost(usage: Mapping[str, Any]) -> Decimal:
    """An answer's cost in dollars at the configured prices, from its usage."""
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    prompt, completion = usage["prompt_tokens"], usage.get("completion_tokens", 0)
    per_token = Decimal(1_000_000)
    return Decimal((prompt - cached) * INPUT + cached * CACHED + completion * OUTPUT) / per_token


def reservation() -> Decimal:
    """What the gateway reserves for one burst request: the prompt at the input price, plus
    max_tokens at the output price."""
    return (len(PROMPT) * INPUT + MAX_TOKENS * OUTPUT) / Decimal(1_000_000)


def today() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d")


def ledger(pair: Pair, name: str) -> Decimal:
    raw = pair.store.hget(f"{PREFIX}s:{today()}", name)
    return Decimal(int(raw or 0)) / Decimal(10**12)


def settled(pair: Pair, name: str, expected: Decimal, wait_s: float = 10) -> Decimal:
    """The ledger's amount once the gateways' settlements (sent after each answer) arrived."""
    deadline = time.monotonic() + wait_s
    while (found := ledger(pair, name)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


async def burst(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": "m", "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
        gateways = itertools.cycle(urls)
        return await asyncio.gather(
            *(
                client.post(f"{next(gateways)}/v1/completions", json=body, headers=headers)
                for _ in range(count)
            )
        )


def test_a_burst_across_two_gateways_never_spends_past_the_budget(pair: Pair) -> None:
    answers = asyncio.run(burst(pair.urls(), "k-burst", 64))
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    spent = sum((cost(r.json()["usage"]) for r in ok), Decimal(0))
    # Every reservation covers its request's cost, so the bound is the budget itself; and no
    # request was refused while the budget could hold one more reservation.
    assert spent <= BURST_BUDGET
    assert len(ok) >= BURST_BUDGET // reservation()
    assert refused and {r.status_code for r in refused} == {429}
    for r in refused:
        err = r.json()["error"]
        assert err["type"] == "insufficient_quota" and err["code"] == "insufficient_quota"
        assert "key 'burst'" in err["message"] and "$0.10 a day" in err["message"]
        assert r.headers["x-should-retry"] == "false"
    # The ledger and the budget's counter hold exactly what the answers cost.
    assert settled(pair, "k:burst", spent) == spent
    counter = pair.store.get(f"{PREFIX}b:k:burst:d{today()}")
    assert Decimal(int(counter or 0)) / Decimal(10**12) == spent


def test_spend_is_the_usage_of_every_endpoint_at_the_configured_prices(pair: Pair) -> None:
    first, second = (g.url + "/v1" for g in pair.gateways)
    with (
        OpenAI(base_url=first, api_key="k-spender", max_retries=0) as client,
        OpenAI(base_url=second, api_key="k-spender", max_retries=0) as other,
    ):
        usages: list[Mapping[str, Any]] = []
        done = client.completions.create(model="m", prompt="hello there", max_tokens=7)
        usages.append(done.model_dump()["usage"])
        chat = other.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        usages.append(chat.model_dump()["usage"])
        stream = client.completions.create(
            model="m", prompt="a stream", max_tokens=6, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        usages += [c.model_dump()["usage"] for c in stream if c.usage is not None]
        expected = sum((cost(u) for u in usages), Decimal(0))
        assert expected > 0
        assert settled(pair, "k:spender", expected) == expected
        assert ledger(pair, "t:search") == expected
        # The embeddings target is priced 0 ("*"): it costs nothing, and adds nothing.
        client.embeddings.create(model="m-embed", input="free")
        assert settled(pair, "k:spender", expected) == expected


def test_answers_carry_what_the_budget_has_left(pair: Pair) -> None:
    headers = {"authorization": "Bearer k-header"}
    body = {"model": "m", "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    first = httpx.post(f"{pair.urls()[0]}/v1/completions", json=body, headers=headers)
    assert first.status_code == 200
    # At admission: the budget less the request's reservation.
    assert Decimal(first.headers["x-gateway-budget-remaining-usd"]) == 1 - reservation()
    spent = settled(pair, "k:header", cost(first.json()["usage"]))
    second = httpx.post(f"{pair.urls()[1]}/v1/completions", json=body, headers=headers)
    left = Decimal(second.headers["x-gateway-budget-remaining-usd"])
    assert left == 1 - spent - reservation()


def test_the_openai_sdk_does_not_retry_a_spent_budget(pair: Pair) -> None:
    sent: list[object] = []  # the requests the SDK's own httpx sent
    with DefaultHttpxClient(event_hooks={"request": [sent.append]}, trust_env=False) as http:
        client = OpenAI(
            base_url=pair.gateways[0].url + "/v1", api_key="k-sdk", max_retries=3, http_client=http
        )
        with pytest.raises(RateLimitError) as raised:
            client.completions.create(model="m", prompt=PROMPT, max_tokens=MAX_TOKENS)
    assert raised.value.status_code == 429
    assert raised.value.code == "insufficient_quota"
    assert len(sent) == 1


def admin(url: str, method: str, path: str, body: object = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, url + path, json=body, headers=headers, timeout=10.0)


def serves(url: str, key: str) -> int:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 1}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(url + "/v1/completions", json=body, headers=headers).status_code


def until(url: str, key: str, status: int) -> bool:
    """Whether the gateway at `url` answers `key` with `status` within PROPAGATION_S."""
    deadline = time.monotonic() + PROPAGATION_S
    while serves(url, key) != status:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_key_made_on_one_gateway_serves_on_the_other_and_outlives_their_restart(
    pair: Pair,
) -> None:
    one, other = pair.urls()
    body = {
        "id": "runtime",
        "models": ["m"],
        "budget": {"usd": "2", "period": "day"},
        "model_budgets": {"m*": {"usd": "1", "period": "week"}},
    }
    made = admin(one, "POST", "/admin/keys", body)
    assert made.status_code == 200, made.text
    secret = made.json()["key"]
    assert secret.startswith("sk-gw-") and len(secret) >= len("sk-gw-") + 43  # 32 bytes
    assert until(other, secret, 200)
    stored = pair.store.hgetall(f"{PREFIX}accounts:keys")
    assert stored and secret not in repr(stored)  # only its digest is kept
    for g in pair.gateways:  # both restarted: the key lives in Redis
        g.stop()
    pair.gateways = [GatewayProcess(pair.config, d) for d in pair.workdirs]
    one, other = pair.urls()
    assert serves(one, secret) == serves(other, secret) == 200
    shown = admin(other, "GET", "/admin/keys/runtime").json()
    assert shown["source"] == "runtime"
    rows = {(b["scope"], b.get("model"), b["usd"], b["period"]) for b in shown["budgets"]}
    assert rows == {
        ("key", None, "2", "day"),
        ("key_model", "m", "1", "week"),  # each alias the glob covers counts apart
        ("key_model", "m-embed", "1", "week"),
    }
    assert admin(one, "DELETE", "/admin/keys/runtime").status_code == 200
    assert until(one, secret, 401) and until(other, secret, 401)


def test_bad_admin_input_is_a_400_naming_the_field(pair: Pair) -> None:
    url = pair.urls()[0]
    cases = {
        "budget.period": {"id": "bad", "budget": {"usd": 1, "period": "fortnight"}},
        "budget.usd": {"id": "bad", "budget": {"usd": -1, "period": "day"}},
        "team": {"id": "bad", "team": "nobody"},
        "limits.rpm": {"id": "bad", "limits": {"rpm": 0}},
        "providers[0]": {"id": "bad", "providers": ["nowhere"]},
    }
    for param, body in cases.items():
        r = admin(url, "POST", "/admin/keys", body)
        assert r.status_code == 400, (param, r.text)
        assert r.json()["error"]["param"] == param, r.text
    assert admin(url, "GET", "/admin/spend?group_by=nothing").json()["error"]["param"] == (
        "group_by"
    )


def test_admin_spend_reports_the_ledger_by_key_team_and_model(pair: Pair) -> None:
    url = pair.urls()[1]
    day = dt.datetime.now(dt.UTC).date().isoformat()
    by_key = admin(url, "GET", f"/admin/spend?group_by=key&start={day}&end={day}").json()
    rows = {r["key"]: Decimal(r["spend_usd"]) for r in by_key["data"]}
    assert rows["burst"] == ledger(pair, "k:burst") and rows["spender"] > 0
    by_team = admin(url, "GET", "/admin/spend?group_by=team").json()
    assert {r["team"]: Decimal(r["spend_usd"]) for r in by_team["data"]} == {
        "search": ledger(pair, "t:search")
    }
    by_model = admin(url, "GET", "/admin/spend?group_by=model").json()
    assert sum(Decimal(r["spend_usd"]) for r in by_model["data"]) == sum(rows.values())


def test_what_is_spent_while_redis_is_away_reaches_it_when_it_is_back(pair: Pair) -> None:
    """Last: it restarts Redis, whose state is gone. While Redis is away the key's budget is
    enforced in each process (on_backend_error: local); what those requests cost is added to
    the ledger and to the budget's counter once Redis answers again."""
    url = pair.urls()[0] + "/v1/completions"
    headers = {"authorization": "Bearer k-outage"}
    body = {"model": "m", "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    pair.server.kill()
    spent = Decimal(0)
    for _ in range(3):
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 200
        spent += cost(r.json()["usage"])
    pair.server.start()
    deadline = time.monotonic() + 10
    while ledger(pair, "k:outage") != spent and time.monotonic() < deadline:
        # Once the breaker's cool-down is over, an admission is its probe, and carries them.
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 200
        spent += cost(r.json()["usage"])
        settled(pair, "k:outage", spent, wait_s=0.5)
    assert ledger(pair, "k:outage") == spent
    counter = pair.store.get(f"{PREFIX}b:k:outage:all")
    assert Decimal(int(counter or 0)) / Decimal(10**12) == spent

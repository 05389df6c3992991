"""Routing trees in-process, with scripted providers: nested groups, fallback statuses, weights,
timeouts and circuit breakers as the requests see them; and the config's errors for trees."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

import httpx
import orjson
import pytest

from core.completions import CompletionRequest
from core.errors import ConfigError, GatewayError, UpstreamError, UpstreamTimeout
from core.provider import Adapter, Prepared, Target
from gateway.api.app import GatewayApp, create_app
from gateway.config import parse
from gateway.routing.trees import leaves

PROVIDERS = ("a", "b", "c")
KEY = "sk-trees"


def upstream(status: int) -> UpstreamError:
    err = UpstreamError(f"upstream said {status}", status=status if status < 500 else 502)
    err.upstream_status = status
    return err


class Scripted(Adapter[None, None, None]):
    """Answers ok, or with the next scripted failure; `always` fails every call."""

    type_tags: ClassVar[tuple[str, ...]] = ("scripted",)

    def __init__(self, name: str) -> None:
        self.name = name
        self.script: list[GatewayError] = []
        self.always: GatewayError | None = None
        self.calls = 0

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def ready(self) -> bool:
        return True

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        return None

    def prepare(self, request: CompletionRequest, target: Target) -> Prepared[None]:
        return Prepared(target, (), None)

    async def complete(self, prepared: Prepared[None]) -> Any:
        self.calls += 1
        fail = self.script.pop(0) if self.script else self.always
        if fail is not None:
            raise fail
        choice = {"text": self.name, "index": 0, "logprobs": None, "finish_reason": "length"}
        return {"choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}

    def stream(self, prepared: Prepared[None]) -> AsyncIterator[Any]:
        raise NotImplementedError


def yaml(models: str, extra: str = "") -> str:
    providers = "".join(
        f"  {p}: {{type: openai, base_url: 'http://{p}.invalid/v1'}}\n" for p in PROVIDERS
    )
    return (
        f"auth:\n  keys: [{{id: t, key: {KEY}}}]\nproviders:\n{providers}models:\n{models}{extra}"
    )


class Gateway:
    def __init__(self, app: GatewayApp, client: httpx.AsyncClient, fakes: dict[str, Scripted]):
        self.app = app
        self.client = client
        self.fakes = fakes

    async def ask(self, model: str) -> httpx.Response:
        body = orjson.dumps({"model": model, "prompt": "x"})
        return await self.client.post("/v1/completions", content=body, headers=AUTH)

    def calls(self) -> dict[str, int]:
        return {name: f.calls for name, f in self.fakes.items()}


AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}


@pytest.fixture
def gateway() -> Any:
    @dataclasses.dataclass
    class Factory:
        apps: list[httpx.AsyncClient] = dataclasses.field(default_factory=list)

        async def __call__(self, models: str, extra: str = "") -> Gateway:
            fakes = {p: Scripted(p) for p in PROVIDERS}
            app = create_app(parse(yaml(models, extra)), build=lambda block: fakes[block.name])
            await app.state.runtime.start()
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
            self.apps.append(client)
            return Gateway(app, client, fakes)

    return Factory()


@pytest.fixture
async def make(gateway: Any) -> AsyncIterator[Any]:
    yield gateway
    for client in gateway.apps:
        await client.aclose()


NESTED = """\
  m:
    strategy: fallback
    targets:
      - {provider: a}
      - strategy: loadbalance
        targets: [{provider: b, weight: 1}, {provider: c, weight: 0}]
"""


@pytest.mark.asyncio
async def test_a_nested_group_answers_after_the_first_target_fails(make: Any) -> None:
    gw = await make(NESTED)
    gw.fakes["a"].always = upstream(503)
    for _ in range(3):
        r = await gw.ask("m")
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "b"
    assert gw.calls() == {"a": 3, "b": 3, "c": 0}  # weight 0: drained


@pytest.mark.asyncio
async def test_fallback_moves_on_only_after_its_statuses_and_no_answers(make: Any) -> None:
    gw = await make("  m:\n    strategy: {mode: fallback, on_status: [503]}\n"
                    "    targets: [{provider: a}, {provider: b}]\n")  # fmt: skip
    gw.fakes["a"].script = [upstream(500), upstream(503), UpstreamTimeout("slow")]
    r = await gw.ask("m")
    assert r.status_code == 502 and "500" in r.json()["error"]["message"]  # not listed: the answer
    assert (await gw.ask("m")).json()["choices"][0]["text"] == "b"  # 503: listed
    assert (await gw.ask("m")).json()["choices"][0]["text"] == "b"  # a timeout: always
    assert gw.calls() == {"a": 3, "b": 2, "c": 0}


@pytest.mark.asyncio
async def test_an_open_circuit_is_skipped_then_probed(make: Any) -> None:
    gw = await make(
        "  m:\n    strategy: fallback\n    targets: [{provider: a}, {provider: b}]\n",
        "circuit_breaker: {failures: 2, cooldown_s: 30}\n",
    )
    gw.fakes["a"].always = upstream(503)
    for _ in range(4):
        assert (await gw.ask("m")).json()["choices"][0]["text"] == "b"
    assert gw.calls()["a"] == 2  # opened after two failures: skipped since
    breaker = gw.app.state.runtime.circuits.get("a", "m")
    breaker.opened_at -= 30  # the cool-down is over
    gw.fakes["a"].always = None
    assert (await gw.ask("m")).json()["choices"][0]["text"] == "a"  # the probe closes it
    assert gw.calls()["a"] == 3 and breaker.state == 0
    text = (await gw.client.get("/metrics")).text
    assert 'gateway_circuit_state{provider="a",upstream_model="m"} 0.0' in text
    assert (
        'gateway_circuit_transitions_total{provider="a",state="open",upstream_model="m"} 1.0'
        in text
    )
    assert 'gateway_upstream_attempts_total{outcome="skipped",provider="a"} 2.0' in text


@pytest.mark.asyncio
async def test_loadbalance_picks_around_an_open_circuit(make: Any) -> None:
    gw = await make(
        "  m:\n    strategy: loadbalance\n"
        "    targets: [{provider: a, weight: 1000}, {provider: b}]\n",
        "circuit_breaker: {failures: 1, cooldown_s: 30}\n",
    )
    gw.fakes["a"].script = [upstream(500)]
    assert (await gw.ask("m")).status_code == 502  # no fallback inside a loadbalance
    for _ in range(5):
        assert (await gw.ask("m")).json()["choices"][0]["text"] == "b"
    assert gw.calls() == {"a": 1, "b": 5, "c": 0}


@pytest.mark.asyncio
async def test_when_every_circuit_is_open_the_caller_is_told_when_to_come_back(make: Any) -> None:
    gw = await make(
        "  m:\n    strategy: fallback\n    targets: [{provider: a}, {provider: b}]\n",
        "circuit_breaker: {failures: 1, cooldown_s: 30}\n",
    )
    gw.fakes["a"].always = gw.fakes["b"].always = upstream(502)
    assert (await gw.ask("m")).status_code == 502
    r = await gw.ask("m")
    assert r.status_code == 503 and r.json()["error"]["code"] == "circuit_open"
    assert 25 <= int(r.headers["retry-after"]) <= 30
    assert gw.calls() == {"a": 1, "b": 1, "c": 0}


@pytest.mark.asyncio
async def test_a_circuit_opening_during_retries_gives_the_upstreams_answer(make: Any) -> None:
    gw = await make(
        "  m:\n    retry: {attempts: 3, backoff_s: 0.001}\n    targets: [{provider: a}]\n",
        "circuit_breaker: {failures: 2, cooldown_s: 30}\n",
    )
    gw.fakes["a"].always = upstream(503)
    r = await gw.ask("m")
    assert r.status_code == 502 and "503" in r.json()["error"]["message"]
    assert gw.calls()["a"] == 2


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("models", "path"),
    [
        ("  m: {targets: [{provider: a, targets: [{provider: b}]}]}\n", "models.m.targets[0]"),
        ("  m: {targets: [{strategy: fallback}]}\n", "models.m.targets[0].targets"),
        ("  m: {targets: [{strategy: fallback, targets: []}]}\n", "models.m.targets[0].targets"),
        ("  m: {strategy: {mode: loadbalance, on_status: [503]}, targets: [{provider: a}]}\n",
         "models.m.strategy.on_status"),
        ("  m: {strategy: {mode: fallback, on_status: [200]}, targets: [{provider: a}]}\n",
         "models.m.strategy.on_status[0]"),
        ("  m: {strategy: {mode: race}, targets: [{provider: a}]}\n", "models.m.strategy.mode"),
        ("  m: {strategy: loadbalance, targets: [{provider: a, weight: 0}]}\n", "models.m.targets"),
        ("  m: {targets: [{provider: a, weight: -1}]}\n", "models.m.targets[0].weight"),
        ("  m: {weight: 2, targets: [{provider: a}]}\n", "models.m.weight"),
        ("  m: {timeout_s: 5, timeout: {total_s: 5}, targets: [{provider: a}]}\n",
         "models.m.timeout_s"),
        ("  m: {timeout: {first_byte: 5}, targets: [{provider: a}]}\n",
         "models.m.timeout.first_byte"),
        ("  m: {targets: [{provider: a, timeout: {connect_s: 0}}]}\n",
         "models.m.targets[0].timeout.connect_s"),
        ("  m: {targets: [{provider: a, retry: {attempts: 9}}]}\n",
         "models.m.targets[0].retry.attempts"),
        ("  m: {targets: [{provider: a, defaults: {}}]}\n", "models.m.targets[0].defaults"),
    ],
)  # fmt: skip
def test_tree_errors_name_the_field(models: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(yaml(models))
    assert info.value.path == path


def test_groups_pass_retries_and_timeouts_down_and_targets_keep_their_own() -> None:
    cfg = parse(
        yaml(
            "  m:\n"
            "    retry: {attempts: 2}\n"
            "    timeout: {connect_s: 1, first_byte_s: 5, total_s: 30}\n"
            "    strategy: fallback\n"
            "    targets:\n"
            "      - {provider: a, retry: {attempts: 0}, timeout_s: 9}\n"
            "      - {strategy: single, timeout: {first_byte_s: 2}, targets: [{provider: b}]}\n"
        )
    )
    a, b = leaves(cfg.models["m"].tree)
    assert (a.retry.attempts, b.retry.attempts) == (0, 2)
    assert a.target is not None and b.target is not None
    assert (a.target.connect_s, a.target.first_byte_s, a.target.timeout_s) == (1, 5, 9)
    assert (b.target.connect_s, b.target.first_byte_s, b.target.timeout_s) == (1, 2, 30)
    assert b.path == "models.m.targets[1].targets[0]"

"""`POST /v1/embeddings` with the openai SDK, through the scripted OpenAI and Fireworks upstreams
(tests/upstreams/embeddings.py): every input form, both encodings, dimensions, bad input, the
model's endpoint, fallback and retries, limits on input tokens, and the metrics' operation."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e.metrics_text import scrape
from tests.e2e.support import scripted_gateway, scripted_providers
from tests.gateway_proc import GatewayProcess
from tests.upstreams.embeddings import tokens, vector
from tests.upstreams.procs import (
    ScriptedUpstream,
)

KEY = "sk-embed-e2e"
OAI_MODEL, FW_MODEL = "text-embedding-3-small", "nomic-ai/nomic-embed-text-v1.5"
UPSTREAM_MODEL = {"emb-oai": OAI_MODEL, "emb-fw": FW_MODEL, "emb-generic": OAI_MODEL}
ALIASES = tuple(UPSTREAM_MODEL)
TIGHT_TPM = 40


def config(openai_url: str, fireworks_url: str, dead_port: int) -> str:
    oai = {"provider": "oai", "model": OAI_MODEL}
    emb = {"endpoint": "embeddings"}
    doc: dict[str, Any] = {
        "server": {"host": "127.0.0.1"},
        "auth": {"keys": [{"id": "k", "key": KEY, "models": ["*"]}]},
        "providers": {
            **scripted_providers(openai_url, fireworks_url, generic=True),
            "dead": {"type": "openai", "base_url": f"http://127.0.0.1:{dead_port}/v1"},
        },
        "models": {
            "emb-oai": {**emb, "targets": [oai]},
            "emb-fw": {**emb, "targets": [{"provider": "fw", "model": FW_MODEL}]},
            "emb-generic": {**emb, "targets": [{"provider": "generic", "model": OAI_MODEL}]},
            "emb-ada": {**emb, "targets": [{"provider": "oai", "model": "text-embedding-ada-002"}]},
            "emb-fallback": {
                **emb,
                "strategy": "fallback",
                "targets": [{"provider": "dead", "model": "x"}, oai],
            },
            "emb-retry": {**emb, "retry": {"attempts": 2, "backoff_s": 0.01}, "targets": [oai]},
            "emb-tight": {**emb, "limits": {"tpm": TIGHT_TPM}, "targets": [oai]},
            "text": {"targets": [{"provider": "oai", "model": "gpt-3.5-turbo-instruct"}]},
        },
        "circuit_breaker": {"failures": 0},
    }
    return yaml.safe_dump(doc, sort_keys=False)


gateway = scripted_gateway(config, "gateway")


@pytest.fixture
def upstreams(
    scripted_openai_server: ScriptedUpstream, scripted_fireworks_server: ScriptedUpstream
) -> dict[str, ScriptedUpstream]:
    scripted_openai_server.reset()
    scripted_fireworks_server.reset()
    return {"oai": scripted_openai_server, "fw": scripted_fireworks_server}


@pytest.fixture
def sdk(gateway: GatewayProcess, upstreams: Any) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def float32(values: list[float]) -> list[float]:
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


def upstream_of(alias: str, upstreams: dict[str, ScriptedUpstream]) -> ScriptedUpstream:
    return upstreams["fw"] if alias == "emb-fw" else upstreams["oai"]


INPUTS: list[Any] = ["The quick brown fox", ["alpha beta", "gamma"], [5, 6, 7], [[1, 2], [3]]]


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("given", INPUTS, ids=["string", "strings", "token-ids", "token-arrays"])
def test_floats(sdk: openai.OpenAI, upstreams: Any, alias: str, given: Any) -> None:
    resp = sdk.embeddings.create(model=alias, input=given, encoding_format="float")
    items = [given] if isinstance(given, str) or type(given[0]) is int else given
    model = UPSTREAM_MODEL[alias]
    assert resp.object == "list" and resp.model == alias
    assert [d.index for d in resp.data] == list(range(len(items)))
    assert all(d.object == "embedding" for d in resp.data)
    for item, data in zip(items, resp.data, strict=True):
        assert data.embedding == pytest.approx(vector(item, model, None), abs=1e-12)
    used = sum(tokens(item) for item in items)
    assert (resp.usage.prompt_tokens, resp.usage.total_tokens) == (used, used)
    sent = upstream_of(alias, upstreams).last_request()
    assert sent["path"].endswith("/embeddings") and sent["body"]["model"] == model


@pytest.mark.parametrize("alias", ALIASES)
def test_base64_as_the_sdk_asks_by_default(sdk: openai.OpenAI, upstreams: Any, alias: str) -> None:
    """The SDK asks for base64 when no format is given, and decodes it: float32 values."""
    resp = sdk.embeddings.create(model=alias, input=["one two", "three"])
    model = UPSTREAM_MODEL[alias]
    assert [d.embedding for d in resp.data] == [
        float32(vector("one two", model, None)),
        float32(vector("three", model, None)),
    ]
    sent = upstream_of(alias, upstreams).last_request()["body"]
    # OpenAI sends base64 itself; elsewhere the gateway asks for floats and encodes them.
    assert sent.get("encoding_format") == ("base64" if alias == "emb-oai" else None)


def test_raw_base64_is_little_endian_float32(gateway: GatewayProcess, upstreams: Any) -> None:
    body = {"model": "emb-fw", "input": "hello", "encoding_format": "base64"}
    resp = httpx.post(
        gateway.url + "/v1/embeddings", json=body, headers={"authorization": f"Bearer {KEY}"}
    )
    assert resp.status_code == 200, resp.text
    raw = base64.b64decode(resp.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == float32(
        vector("hello", FW_MODEL, None)
    )


def test_dimensions(sdk: openai.OpenAI, upstreams: Any) -> None:
    resp = sdk.embeddings.create(
        model="emb-oai", input="x y", dimensions=4, encoding_format="float"
    )
    assert resp.data[0].embedding == pytest.approx(vector("x y", OAI_MODEL, 4), abs=1e-12)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.embeddings.create(model="emb-ada", input="x y", dimensions=4)
    assert caught.value.body["param"] == "dimensions"  # type: ignore[index]
    # Fireworks: passed on as well (the scripted Fireworks shortens too).
    resp = sdk.embeddings.create(model="emb-fw", input="x y", dimensions=3, encoding_format="float")
    assert len(resp.data[0].embedding) == 3


BAD: list[tuple[Any, str]] = [
    ("", "input"),
    ([], "input"),
    (["ok", ""], "input[1]"),
    (["ok", 3], "input[1]"),
    ([1, -1], "input[1]"),
    ([[1], []], "input[1]"),
    ({"text": "x"}, "input"),
    (["x"] * 2049, "input"),
]


@pytest.mark.parametrize(("given", "param"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_are_400s_naming_the_parameter(
    sdk: openai.OpenAI, upstreams: dict[str, ScriptedUpstream], given: Any, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.embeddings.create(model="emb-oai", input=given)
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert upstreams["oai"].requests() == []  # refused before any upstream call


def test_other_bad_fields(sdk: openai.OpenAI) -> None:
    for kw, param in (
        ({"encoding_format": "bytes"}, "encoding_format"),
        ({"dimensions": 0}, "dimensions"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),  # unknown to OpenAI: refused
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.embeddings.create(model="emb-oai", input="x", **kw)
        assert caught.value.body["param"] == param  # type: ignore[index]


def test_the_wrong_endpoint_is_a_400(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model="emb-oai", prompt="x")
    assert caught.value.body["param"] == "model"  # type: ignore[index]
    assert "/v1/embeddings" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.embeddings.create(model="text", input="x")
    assert caught.value.body["param"] == "model"  # type: ignore[index]
    assert "/v1/completions" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="no-such-model", input="x")


def test_fallback_and_retries(sdk: openai.OpenAI, upstreams: dict[str, ScriptedUpstream]) -> None:
    resp = sdk.embeddings.create(model="emb-fallback", input="a b", encoding_format="float")
    assert resp.data[0].embedding == pytest.approx(vector("a b", OAI_MODEL, None), abs=1e-12)
    upstreams["oai"].reset()
    upstreams["oai"].script({"status": 503, "times": 1})
    resp = sdk.embeddings.create(model="emb-retry", input="a b", encoding_format="float")
    assert len(resp.data) == 1
    assert [r["outcome"] for r in upstreams["oai"].requests()] == ["error", "ok"]


def test_limits_count_input_tokens(gateway: GatewayProcess, upstreams: Any) -> None:
    """The tokens limit is charged the inputs' tokens: what the upstream reports."""
    headers = {"authorization": f"Bearer {KEY}"}
    text = "one two three four five six seven eight"  # 8 tokens of the fake tokenizer
    url = gateway.url + "/v1/embeddings"
    seen = []
    for _ in range(6):
        resp = httpx.post(url, json={"model": "emb-tight", "input": text}, headers=headers)
        seen.append(resp.status_code)
        if resp.status_code == 200:
            assert resp.headers["x-ratelimit-limit-tokens"] == str(TIGHT_TPM)
    assert seen[:4] == [200] * 4 and 429 in seen  # 5 x 8 tokens is the whole minute's 40


def test_metrics_carry_the_operation(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    sdk.embeddings.create(model="emb-oai", input="a", encoding_format="float")
    metrics = scrape(gateway.url)
    assert metrics.value("gateway_requests_total", model="emb-oai", operation="embeddings") >= 1
    assert (
        metrics.value(
            "gen_ai_client_token_usage_count",
            gen_ai_operation_name="embeddings",
            gen_ai_token_type="input",
        )
        >= 1
    )
    output = metrics.value(
        "gen_ai_client_token_usage_count",
        gen_ai_operation_name="embeddings",
        gen_ai_token_type="output",
    )
    assert output == 0  # embeddings have no output tokens

"""Traces and the request log of a real gateway (`gateway serve` in a subprocess) in front of
the scripted OpenAI upstream, with the openai SDK as its client: each endpoint's spans as an
OTLP/HTTP receiver decodes them (opentelemetry-proto), a fallback past a dead target as two
tries, the client's traceparent continued, the traceparent the upstream saw, and the request
log's lines complete, each with its trace id, and holding neither the key nor the prompt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai import OpenAI

from tests.e2e.support import OPENAI_MODEL, scripted_providers
from tests.gateway_proc import GatewayProcess
from tests.otlp_receiver import Receiver, Span, receiving
from tests.upstreams.procs import ScriptedUpstream, free_port

KEY = "sk-traces-e2e"
EMBED_MODEL = "text-embedding-3-small"
PROMPT = "A prompt the log must not hold"
DEADLINE_S = 10.0
SERVER, CLIENT = 2, 3  # the proto's span kinds


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


@pytest.fixture(scope="module")
def gateway(
    receiver: Receiver,
    scripted_openai_server: ScriptedUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("traces")
    providers = {
        **scripted_providers(scripted_openai_server.url, "http://127.0.0.1:9"),
        "dead": {"type": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1"},
    }
    oai = {"provider": "oai", "model": OPENAI_MODEL}
    config = f"""
auth:
  keys: [{{id: tracer, key: {KEY}, models: ["*"]}}]
providers: {orjson.dumps(providers).decode()}
models:
  oa: {{targets: [{orjson.dumps(oai).decode()}]}}
  cached: {{targets: [{orjson.dumps(oai).decode()}], cache: {{ttl_s: 600}}}}
  fb: {{strategy: fallback, targets: [{{provider: dead, model: x}}, {orjson.dumps(oai).decode()}]}}
  emb: {{endpoint: embeddings, targets: [{{provider: oai, model: {EMBED_MODEL}}}]}}
circuit_breaker: {{failures: 0}}
request_log: {{path: "{workdir / "requests.log"}"}}
telemetry:
  otlp_endpoint: {receiver.url}
  headers: {{authorization: "Bearer collector-token"}}
"""
    with GatewayProcess(config, workdir) as gw:
        yield gw


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def logged(gateway: GatewayProcess, request_id: str) -> Any:
    """The request log's line of one request (a probe: it is written a moment after it ends)."""
    path = gateway.config.parent / "requests.log"
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = path.read_bytes() if path.exists() else b""
        found = [x for x in map(orjson.loads, text.splitlines()) if x["request_id"] == request_id]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, f"no line for {request_id}"
            return found[0]
        time.sleep(0.05)


def tree(receiver: Receiver, trace_id: str, count: int) -> dict[str, Span]:
    spans = receiver.trace(trace_id, count)
    assert len(spans) == count
    return {s.name: s for s in spans}


def test_a_chat_through_a_dead_target_is_a_trace_of_two_tries(
    gateway: GatewayProcess, sdk: OpenAI, receiver: Receiver, scripted_openai: ScriptedUpstream
) -> None:
    caller_trace, caller_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    raw = sdk.chat.completions.with_raw_response.create(
        model="fb",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=5,
        temperature=0.5,
        extra_headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
    )
    answer = raw.parse()
    spans = tree(receiver, caller_trace, 4)
    server, genai = spans["POST /v1/chat/completions"], spans["chat fb"]
    dead, live = spans["attempt dead/x"], spans[f"attempt oai/{OPENAI_MODEL}"]
    assert server.parent_id == caller_span and server.kind == SERVER
    assert genai.parent_id == server.span_id
    assert dead.parent_id == live.parent_id == genai.span_id
    assert dead.attributes["gateway.attempt.outcome"] == "unreachable"
    assert live.attributes["gateway.attempt.outcome"] == "ok"
    attrs = genai.attributes
    assert (attrs["gen_ai.operation.name"], attrs["gen_ai.request.model"]) == ("chat", "fb")
    assert (attrs["gen_ai.provider.name"], attrs["gen_ai.response.model"]) == ("oai", OPENAI_MODEL)
    assert attrs["gen_ai.request.max_tokens"] == 5 and attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.response.id"] == answer.id
    assert attrs["gen_ai.response.finish_reasons"] == [answer.choices[0].finish_reason]
    assert answer.usage is not None
    assert attrs["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    # the upstream got the live try's span as its parent; the collector, its headers
    [seen] = [r for r in scripted_openai.requests() if r["path"].endswith("/chat/completions")]
    assert seen["headers"]["traceparent"] == f"00-{caller_trace}-{live.span_id}-01"
    assert receiver.headers[-1]["authorization"] == "Bearer collector-token"
    line = logged(gateway, raw.headers["x-request-id"])
    assert line["trace_id"] == caller_trace
    assert [a["outcome"] for a in line["attempts"]] == ["unreachable", "ok"]
    assert KEY not in orjson.dumps(line).decode() and PROMPT not in orjson.dumps(line).decode()


def test_a_completion_stream_is_traced_with_its_first_token(
    gateway: GatewayProcess, sdk: OpenAI, receiver: Receiver
) -> None:
    with sdk.completions.with_streaming_response.create(
        model="oa", prompt=PROMPT, max_tokens=4, stream=True,
        stream_options={"include_usage": True},
    ) as response:  # fmt: skip
        request_id = response.headers["x-request-id"]
        chunks = list(response.parse())
    trace_id = logged(gateway, request_id)["trace_id"]
    genai = tree(receiver, trace_id, 3)["text_completion oa"]
    # no limits apply to its key: no rate limit event
    assert [name for name, _ in genai.events] == ["gen_ai.first_token"]
    usage = chunks[-1].usage
    assert usage is not None
    assert genai.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert genai.attributes["gen_ai.response.finish_reasons"]


def test_embeddings_are_traced(gateway: GatewayProcess, sdk: OpenAI, receiver: Receiver) -> None:
    raw = sdk.embeddings.with_raw_response.create(model="emb", input=[PROMPT, "two"])
    answer = raw.parse()
    trace_id = logged(gateway, raw.headers["x-request-id"])["trace_id"]
    spans = tree(receiver, trace_id, 3)
    genai = spans["embeddings emb"]
    assert genai.attributes["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert "gen_ai.response.id" not in genai.attributes  # an embedding has no id
    text = orjson.dumps([(s.attributes, s.events) for s in spans.values()]).decode()
    assert PROMPT not in text and KEY not in text


def test_a_cache_hit_is_a_trace_without_tries(
    gateway: GatewayProcess, sdk: OpenAI, receiver: Receiver
) -> None:
    ask = {"model": "cached", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    miss = sdk.chat.completions.with_raw_response.create(**ask)  # type: ignore[call-overload]
    hit = sdk.chat.completions.with_raw_response.create(**ask)  # type: ignore[call-overload]
    assert (miss.headers["x-portkey-cache-status"], hit.headers["x-portkey-cache-status"]) == (
        "MISS", "HIT",
    )  # fmt: skip
    missed = tree(receiver, logged(gateway, miss.headers["x-request-id"])["trace_id"], 3)
    assert [e for e, _ in missed["chat cached"].events] == ["gateway.cache"]
    spans = tree(receiver, logged(gateway, hit.headers["x-request-id"])["trace_id"], 2)
    genai = spans["chat cached"]  # and the server's span: no attempt was made
    [(name, attributes)] = genai.events
    assert name == "gateway.cache" and attributes["gateway.cache.result"] == "hit"
    assert attributes["gateway.cache.age_s"] >= 0
    assert genai.attributes["gen_ai.response.id"] == hit.parse().id
    assert genai.attributes["gen_ai.provider.name"] == "oai"

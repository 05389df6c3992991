"""Traces through the pipeline, exported by the SDK's OTLP exporter (in the gateway's export
child) to a receiver that decodes them with opentelemetry-proto: the server span, the GenAI span
and one span per try, their parents, the GenAI attributes, the traceparent each try was sent
with, a caller's traceparent continued, and content only when asked for."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest

from core.chat import ChatRequest
from core.errors import ConfigError
from core.provider import Prepared
from gateway import config
from gateway.api.app import create_app
from gateway.runtime import Runtime
from tests.otlp_receiver import Receiver, Span, receiving
from tests.unit.gateway.pipeline.test_charges import CONFIG, Priced, chat, post

SERVER, CLIENT = 2, 3  # the proto's span kinds
ERROR = 2  # the proto's status code
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Seen(Priced):
    """Priced, keeping the traceparent each try was sent with."""

    def __init__(self, name: str, fail: Any = None) -> None:
        super().__init__(name, fail)
        self.traces: list[str] = []

    def prepare_chat(self, request: ChatRequest, target: Any) -> Prepared[ChatRequest]:
        self.traces.append(target.trace)
        return super().prepare_chat(request, target)


Traced = tuple[httpx.AsyncClient, Runtime, Receiver, dict[str, Seen]]


def traced_config(url: str, extra: str = "") -> str:
    return CONFIG + f"telemetry:\n  otlp_endpoint: {url}\n{extra}"


@contextlib.asynccontextmanager
async def tracing(extra: str = "", mode: str = "ok") -> AsyncIterator[Traced]:
    from core.errors import UpstreamError

    providers = {
        "premium": Seen("premium", UpstreamError("Upstream premium/big returned 503", status=502)),
        "cheap": Seen("cheap"),
        "free": Seen("free"),
        "flaky": Seen("flaky"),
    }
    with receiving(mode) as receiver:
        text = traced_config(receiver.url, extra)
        app = create_app(config.parse(text), build=lambda block: providers[block.name])
        rt = app.runtime
        await rt.start()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                yield client, rt, receiver, providers
        finally:
            await rt.aclose()


async def exported(rt: Runtime, receiver: Receiver, count: int) -> list[Span]:
    """The spans, once the runtime's tracing closed (its child exports all it holds)."""
    assert rt.tracing is not None
    await rt.tracing.aclose()
    return receiver.wait_for(count)


def by_name(spans: list[Span]) -> dict[str, Span]:
    return {s.name: s for s in spans}


async def test_a_request_that_fell_back_is_a_server_span_a_genai_span_and_two_tries() -> None:
    async with tracing() as (client, rt, receiver, providers):
        r = await post(client, "sk-a", chat(), "/v1/chat/completions")
        assert r.status_code == 200
        spans = await exported(rt, receiver, 4)
    named = by_name(spans)
    server, genai = named["POST /v1/chat/completions"], named["chat fb"]
    first, second = named["attempt premium/big"], named["attempt cheap/small"]
    assert len({s.trace_id for s in spans}) == 1 and len(spans) == 4
    assert server.parent_id == "" and server.kind == SERVER
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gateway.request_id"] == r.headers["x-request-id"]
    assert genai.parent_id == server.span_id and genai.kind == CLIENT
    body = r.json()
    assert genai.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "fb",
        "gen_ai.request.max_tokens": 100,
        "gen_ai.provider.name": "cheap",
        "gen_ai.response.model": "small",
        "gen_ai.response.id": body["id"],
        "gen_ai.response.finish_reasons": [body["choices"][0]["finish_reason"]],
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 300,
    }
    assert [e for e, _ in genai.events] == ["gateway.rate_limit"]
    assert first.parent_id == second.parent_id == genai.span_id
    assert first.attributes["gateway.attempt.outcome"] == "502" and first.status == ERROR
    assert second.attributes["gateway.attempt.outcome"] == "ok" and second.status == 0
    assert first.end <= second.start and genai.start <= first.start
    assert server.start <= genai.start and second.end <= genai.end <= server.end
    # each try went out with its own span as the parent of what the target records
    sent = providers["premium"].traces + providers["cheap"].traces
    assert sent == [f"00-{s.trace_id}-{s.span_id}-01" for s in (first, second)]
    assert spans[0].resource["service.name"] == "completions-gateway"


async def test_a_callers_traceparent_is_continued_and_a_portkey_trace_id_recorded() -> None:
    async with tracing() as (client, rt, receiver, _):
        headers = {
            "authorization": "Bearer sk-a",
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
            "x-portkey-trace-id": "run-42",
        }
        r = await client.post("/v1/chat/completions", content=chat("gratis"), headers=headers)
        assert r.status_code == 200
        spans = await exported(rt, receiver, 3)
    server = by_name(spans)["POST /v1/chat/completions"]
    assert {s.trace_id for s in spans} == {CALLER_TRACE}
    assert server.parent_id == CALLER_SPAN
    assert server.attributes["portkey.trace_id"] == "run-42"


async def test_a_caller_that_does_not_sample_is_not_traced_and_a_bad_traceparent_is_ignored() -> (
    None
):
    async with tracing() as (client, rt, receiver, providers):
        for parent in (f"00-{CALLER_TRACE}-{CALLER_SPAN}-00", "00-not-a-trace-01"):
            headers = {"authorization": "Bearer sk-a", "traceparent": parent}
            r = await client.post("/v1/chat/completions", content=chat("gratis"), headers=headers)
            assert r.status_code == 200
        spans = await exported(rt, receiver, 3)
    assert providers["free"].traces[0] == ""  # not sampled: no traceparent of ours
    assert len(spans) == 3 and CALLER_TRACE not in {s.trace_id for s in spans}


async def test_a_stream_has_its_finish_reasons_and_first_token() -> None:
    async with tracing() as (client, rt, receiver, _):
        r = await post(client, "sk-a", chat("gratis", stream=True), "/v1/chat/completions")
        assert r.status_code == 200 and "[DONE]" in r.text
        spans = await exported(rt, receiver, 3)
    genai = by_name(spans)["chat gratis"]
    assert genai.attributes["gen_ai.response.finish_reasons"]
    assert [e for e, _ in genai.events] == ["gateway.rate_limit", "gen_ai.first_token"]


async def test_a_refused_request_is_an_error_without_tries() -> None:
    async with tracing() as (client, rt, receiver, _):
        r = await post(client, "sk-a", chat("down"), "/v1/chat/completions")
        assert r.status_code == 502
        spans = await exported(rt, receiver, 4)
    genai = by_name(spans)["chat down"]
    assert genai.status == ERROR and genai.attributes["error.type"]
    server = by_name(spans)["POST /v1/chat/completions"]
    assert server.status == ERROR and server.attributes["error.type"] == "502"


async def test_no_text_is_on_the_spans_unless_content_is_captured() -> None:
    async with tracing() as (client, rt, receiver, _):
        await post(client, "sk-a", chat("gratis"), "/v1/chat/completions")
        spans = await exported(rt, receiver, 3)
    text = orjson.dumps([(s.attributes, s.events) for s in spans]).decode()
    assert "x" * 40 not in text and "sk-a" not in text


async def test_captured_content_is_the_conventions_event_after_redaction() -> None:
    captured = "  capture_content: true\n  redact: ['x{10}']\n"
    async with tracing(captured) as (client, rt, receiver, _):
        await post(client, "sk-a", chat("gratis"), "/v1/chat/completions")
        spans = await exported(rt, receiver, 3)
    [details] = [a for e, a in by_name(spans)["chat gratis"].events if e.endswith("details")]
    sent = orjson.loads(details["gen_ai.input.messages"])
    assert sent["messages"][0]["content"] == "[REDACTED]" * 4
    assert orjson.loads(details["gen_ai.output.messages"])[0]["content"]


@pytest.mark.parametrize(
    ("block", "where"),
    [
        ("{otlp_endpoint: 'ftp://x:1'}", "telemetry.otlp_endpoint"),
        ("{otlp_endpoint: 'http://x:99999'}", "telemetry.otlp_endpoint"),
        ("{sample_ratio: 1.5}", "telemetry.sample_ratio"),
        ("{headers: {'bad name': x}}", "telemetry.headers.bad name"),
        ("{exporter: x}", "telemetry"),
    ],
)
def test_a_bad_telemetry_block_is_refused_naming_its_path(block: str, where: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.parse(CONFIG + f"telemetry: {block}\n")
    assert err.value.path.startswith(where)


@pytest.mark.parametrize(
    ("given", "endpoint", "protocol"),
    [
        ("http://otel:4318", "http://otel:4318/v1/traces", "http"),
        ("https://otel:4318/custom/traces", "https://otel:4318/custom/traces", "http"),
        ("grpc://otel:4317", "http://otel:4317", "grpc"),
        ("grpcs://otel:4317", "https://otel:4317", "grpc"),
    ],
)
def test_an_endpoint_names_its_protocol(given: str, endpoint: str, protocol: str) -> None:
    t = config.parse(CONFIG + f"telemetry: {{otlp_endpoint: '{given}'}}\n").telemetry
    assert (t.endpoint, t.protocol) == (endpoint, protocol)


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_tracing_is_on_when_an_endpoint_is_known(
    no_otel_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not config.parse(CONFIG).telemetry.on
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318")
    assert config.parse(CONFIG).telemetry.on


def dropped(rt: Runtime) -> float:
    rt.metrics.flush()
    value = rt.metrics.registry.get_sample_value("gateway_telemetry_dropped_spans_total")
    return value or 0.0


@pytest.mark.parametrize("mode", ["refuse", "hang"])
async def test_a_collector_that_refuses_or_hangs_costs_only_dropped_spans(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests are answered while the collector says no or says nothing (a request that
    waited on the export would hang here); every span it did not take is counted."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # the export child's SDK reads it
    async with tracing(mode=mode) as (client, rt, receiver, _):
        for _ in range(20):
            r = await post(client, "sk-a", chat("gratis"), "/v1/chat/completions")
            assert r.status_code == 200
        assert rt.tracing is not None
        await rt.tracing.aclose()
        assert dropped(rt) == 60 and receiver.spans == []


def test_sampling_is_the_sdks_rule_on_the_ids_drawn() -> None:
    """ParentBased(TraceIdRatioBased(r)) decides as the SDK's own sampler would."""
    from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

    from gateway.observability.tracing import Tracing

    for ratio in (0.0, 0.25, 1.0):
        tracing = Tracing({}, ratio, False, lambda n: None)
        sdk = TraceIdRatioBased(ratio)
        for _ in range(2000):
            trace = tracing.begin({})
            if trace is not None:
                ok = sdk.should_sample(None, int(trace.trace_id, 16), "x").decision
                assert ok == Decision.RECORD_AND_SAMPLE
        began = sum(tracing.begin({}) is not None for _ in range(4000))
        assert abs(began / 4000 - ratio) < 0.05


def test_a_traced_target_is_the_target_with_its_trace() -> None:
    from dataclasses import replace

    from core.provider import Target

    target = Target("a", "p", "m", timeout_s=3.0, defaults={"x": 1}, background=True)
    traced = target.traced("00-1-2-01")
    assert traced == replace(target, trace="00-1-2-01") and traced.label == "p/m"
    assert target.trace == ""


async def test_a_seed_past_int64_is_traced_without_it() -> None:
    """A seed no attribute can hold (nor orjson write), which these targets take: the answer
    stands, and the trace holds no seed."""
    async with tracing() as (client, rt, receiver, _):
        body = orjson.loads(chat("gratis")) | {"seed": 2**70}
        r = await client.post(
            "/v1/chat/completions",
            content=json.dumps(body),
            headers={"authorization": "Bearer sk-a", "content-type": "application/json"},
        )
        assert r.status_code == 200, r.text
        spans = await exported(rt, receiver, 3)
    genai = by_name(spans)["chat gratis"]
    assert genai.attributes["gen_ai.request.max_tokens"] == 100
    assert "gen_ai.request.seed" not in genai.attributes


async def test_an_export_child_that_dies_is_started_again() -> None:
    async with tracing() as (client, rt, receiver, _):
        assert rt.tracing is not None and rt.tracing.child_pid is not None
        first = rt.tracing.child_pid
        os.kill(first, signal.SIGKILL)
        async with asyncio.timeout(30):
            while rt.tracing.child_pid in (None, first):  # noqa: ASYNC110 - a timer restarts it
                await asyncio.sleep(0.05)
        r = await post(client, "sk-a", chat("gratis"), "/v1/chat/completions")
        assert r.status_code == 200
        spans = await exported(rt, receiver, 3)
    assert by_name(spans)["chat gratis"].attributes["gen_ai.response.model"]

"""Exemplars and OpenMetrics (gateway.metrics): a traced request's trace id is the exemplar of
the bucket its request duration, and its time to first token, fall in, read back from the
OpenMetrics exposition by prometheus_client's OpenMetrics parser; the latest traced request of a
bucket wins, and untraced requests add none. The text format still parses and has none.

A scrape gets OpenMetrics when its Accept header asks for it, on the API port and on the metrics
listener, and each format's shared renders stay apart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families as text_families
from prometheus_client.samples import Sample

from gateway.api.app import create_app
from gateway.api.exporter import Exporter
from gateway.config import MetricsConfig, parse
from gateway.metrics import (
    DURATION_BUCKETS,
    MULTIPROC_ENV,
    OPENMETRICS,
    TEXT,
    TTFT_BUCKETS,
    Metrics,
    RequestRecord,
    negotiated,
)
from tests.upstreams.procs import free_port

DURATION = "gateway_request_duration_seconds"
TTFT = "gen_ai_server_time_to_first_token_seconds"
TRACE = "0af7651916cd43dd8448eb211c80319c"
OTHER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
# What Prometheus sends (2.x, then 3.x's default scrape_protocols).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;"
    "q=0.5,application/openmetrics-text;version=1.0.0;q=0.4,text/plain;version=0.0.4;q=0.2",
)
APP_CONFIG = """
auth: {keys: [{id: a, key: k-unit}]}
providers: {up: {type: openai, base_url: "http://127.0.0.1:9/v1", api_key: x}}
models: {m: {targets: [{provider: up, model: u}]}}
metrics: {min_interval_s: 0}
"""


def streamed(took: float, ttft: float, trace_id: str = TRACE) -> tuple[RequestRecord, float]:
    """A stream answered by provider p for alias m, and when it ended (from 0: a value on a
    bound stays on it)."""
    rec = RequestRecord(0.0, operation="chat", model="m", stream=True, provider="p")
    rec.status, rec.upstream_s, rec.completion_tokens = 200, took / 2, 5
    rec.first_token, rec.trace_id = rec.start + ttft, trace_id
    return rec, rec.start + took


def bucket_of(value: float, bounds: tuple[float, ...]) -> str:
    """The le label of the bucket a value falls in, found by walking the bounds."""
    for bound in bounds:
        if value <= bound:
            return str(float(bound))
    return "+Inf"


def openmetrics_families(text: str) -> list[Metric]:
    """The families in an OpenMetrics exposition, by prometheus_client's parser (untyped)."""
    return list(openmetrics_parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def exemplars(text: bytes, family: str) -> dict[str, Sample]:
    """The buckets of `family` that carry an exemplar, by le, read by the OpenMetrics parser."""
    out: dict[str, Sample] = {}
    for f in openmetrics_families(text.decode()):
        if f.name == family:
            for s in f.samples:
                if s.exemplar is not None:
                    assert s.name == f"{family}_bucket", s
                    assert s.labels["le"] not in out, "one series of the family only here"
                    out[s.labels["le"]] = s
    return out


def traces(text: bytes, family: str) -> dict[str, str]:
    """le → the exemplar's trace id."""
    return {le: s.exemplar.labels["trace_id"] for le, s in exemplars(text, family).items()}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("took", "ttft"),
    [
        (0.3, 0.07),  # between bounds
        (0.32, 0.1),  # on a bound: that bucket (le is "at or below")
        (0.005, 0.001),  # under the first bound
        (1000.0, 100.0),  # past the last bound: +Inf
    ],
)
def test_a_traced_request_is_the_exemplar_of_its_buckets(took: float, ttft: float) -> None:
    metrics = Metrics()
    rec, end = streamed(took, ttft)
    metrics.observe(rec, end)
    text, ctype = metrics.render(OPENMETRICS)
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")
    (duration,) = exemplars(text, DURATION).items()
    (first,) = exemplars(text, TTFT).items()
    for (le, sample), value, bounds in ((duration, took, DURATION_BUCKETS),
                                        (first, ttft, TTFT_BUCKETS)):  # fmt: skip
        assert le == bucket_of(value, bounds)
        assert sample.exemplar is not None
        assert sample.exemplar.labels == {"trace_id": TRACE}
        assert sample.exemplar.value == pytest.approx(value)
        assert sample.exemplar.timestamp is not None and float(sample.exemplar.timestamp) > 0


def test_an_untraced_request_adds_no_exemplar_nor_replaces_one() -> None:
    metrics = Metrics()
    metrics.observe(*streamed(0.3, 0.07, trace_id=""))
    text, _ = metrics.render(OPENMETRICS)
    assert exemplars(text, DURATION) == exemplars(text, TTFT) == {}
    assert any(f.name == DURATION for f in openmetrics_families(text.decode()))
    metrics.observe(*streamed(0.3, 0.07))
    metrics.observe(*streamed(0.3, 0.07, trace_id=""))  # the same buckets, untraced
    text, _ = metrics.render(OPENMETRICS)
    assert traces(text, DURATION) == {"0.32": TRACE}
    assert traces(text, TTFT) == {"0.1": TRACE}


async def test_the_latest_traced_request_of_a_bucket_wins_tallied_or_not() -> None:
    """Under load, observations wait in a tally: its exemplars are what one at a time gives."""
    for load in (0, 1):
        metrics = Metrics()
        metrics.inflight_add(load)
        metrics.observe(*streamed(0.3, 0.07, trace_id=TRACE))
        metrics.observe(*streamed(0.2, 0.06, trace_id=OTHER_TRACE))  # the same buckets
        metrics.observe(*streamed(3.0, 0.02, trace_id=TRACE))  # other buckets
        assert len(metrics._pending) == load  # tallied, not yet in the registry
        text, _ = metrics.render(OPENMETRICS)
        assert traces(text, DURATION) == {"0.32": OTHER_TRACE, "5.12": TRACE}
        assert traces(text, TTFT) == {"0.1": OTHER_TRACE, "0.025": TRACE}
        later = exemplars(text, DURATION)["0.32"].exemplar
        assert later is not None and later.value == pytest.approx(0.2)


def test_a_request_without_a_first_token_is_an_exemplar_of_its_duration_only() -> None:
    metrics = Metrics()
    rec, end = streamed(0.3, 0.07)
    rec.first_token = 0.0  # a whole answer, or a stream that failed before any text
    metrics.observe(rec, end)
    text, _ = metrics.render(OPENMETRICS)
    assert traces(text, DURATION) == {"0.32": TRACE}
    assert traces(text, TTFT) == {}


def test_the_text_format_parses_and_carries_no_exemplar() -> None:
    metrics = Metrics()
    metrics.observe(*streamed(0.3, 0.07))
    text, ctype = metrics.render()
    assert ctype.startswith("text/plain")
    assert TRACE.encode() not in text
    samples = [s for f in text_families(text.decode()) for s in f.samples]
    bucket = [s for s in samples if s.name == f"{DURATION}_bucket" and s.labels["le"] == "0.32"]
    assert [s.value for s in bucket] == [1.0]
    assert all(s.exemplar is None for s in samples)


async def test_multiprocess_mode_keeps_no_exemplars(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """prometheus_client drops them there: the tally does not keep them either."""
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    metrics = Metrics()
    metrics.inflight_add(1)  # the observation waits in its tally
    metrics.observe(*streamed(0.3, 0.07))
    (alike,) = metrics._pending.values()
    assert alike.duration == [pytest.approx(0.3)]
    assert alike.duration_traced is None and alike.ttft_traced is None


# ---------------------------------------------------------------- negotiation


@pytest.mark.parametrize(
    "accept",
    [*PROMETHEUS_ACCEPT, "application/openmetrics-text", "Application/OpenMetrics-Text; q=0.1"],
)
def test_a_scraper_that_asks_for_openmetrics_gets_it(accept: str) -> None:
    assert negotiated(accept) is OPENMETRICS


@pytest.mark.parametrize(
    "accept",
    ["", "*/*", "text/plain;version=0.0.4", "text/plain, */*;q=0.1",
     "application/openmetrics-text;q=0", "application/openmetrics-textual"],
)  # fmt: skip
def test_any_other_scraper_gets_the_text_format(accept: str) -> None:
    assert negotiated(accept) is TEXT


async def test_each_format_has_its_own_shared_renders() -> None:
    """Scrapes of both formats at once, then within min_interval_s: each gets its own."""
    metrics = Metrics(min_interval_s=60)
    metrics.observe(*streamed(0.3, 0.07))
    om, text = PROMETHEUS_ACCEPT[0], "text/plain"
    first = await asyncio.gather(*(metrics.scrape(a) for a in (om, text, om, text, "")))
    later = await asyncio.gather(*(metrics.scrape(a) for a in (text, om)))
    for body, ctype in [*first, *later]:
        if ctype.startswith("application/openmetrics-text"):
            assert body.endswith(b"# EOF\n") and TRACE.encode() in body
            assert traces(body, DURATION) == {"0.32": TRACE}
        else:
            assert ctype.startswith("text/plain") and b"# EOF" not in body
            assert list(text_families(body.decode()))
    assert [c.split(";")[0] for _, c in first] == [
        "application/openmetrics-text", "text/plain", "application/openmetrics-text",
        "text/plain", "text/plain",
    ]  # fmt: skip
    assert len({body for body, _ in first + later}) == 2  # one render per format, shared


# ---------------------------------------------------------------- over HTTP


async def test_the_api_port_serves_openmetrics_when_asked() -> None:
    app = create_app(parse(APP_CONFIG))
    app.runtime.metrics.observe(*streamed(0.3, 0.07))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        om = await client.get("/metrics", headers={"accept": PROMETHEUS_ACCEPT[0]})
        plain = await client.get("/metrics")
    assert om.status_code == plain.status_code == 200
    assert om.headers["content-type"] == OPENMETRICS.content_type
    assert traces(om.content, DURATION) == {"0.32": TRACE}
    assert plain.headers["content-type"] == TEXT.content_type
    assert list(text_families(plain.text)) and TRACE not in plain.text


async def test_the_metrics_listener_serves_openmetrics_when_asked() -> None:
    metrics, port = Metrics(), free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    exporter = Exporter(MetricsConfig(listen=("127.0.0.1", port)), metrics.scrape, None)
    await exporter.start()
    metrics.observe(*streamed(0.3, 0.07))
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            om = await client.get(url, headers={"accept": PROMETHEUS_ACCEPT[1]})
            plain = await client.get(url, headers={"accept": "text/plain"})
    finally:
        await exporter.stop()
    assert om.headers["content-type"] == OPENMETRICS.content_type
    assert traces(om.content, TTFT) == {"0.1": TRACE}
    assert plain.headers["content-type"] == TEXT.content_type
    assert list(text_families(plain.text)) and TRACE not in plain.text

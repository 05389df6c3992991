"""The metrics' handles (gateway.metrics): a counter or histogram updated through its handle
exposes exactly what prometheus_client's own `inc` and `observe` would, values on a bucket's
bound, between bounds and past the last included. Requests' observations tallied while others
are in flight expose, once flushed, what each observed alone does; a scrape flushes them, and
under load a timer does.

Scrapes share renders (Metrics.scrape): those during a render get its text, those within
metrics.min_interval_s of its start too; the render runs in a thread while the loop answers.
The metrics section's settings, and their errors by YAML path."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from core.errors import ConfigError
from gateway.api.app import create_app
from gateway.config import MetricsConfig, parse
from gateway.metrics import (
    FLUSH_S,
    TEXT,
    CounterHandle,
    Format,
    HistogramHandle,
    Metrics,
    RequestRecord,
)

BOUNDS = (0.01, 0.1, 1.0)
VALUES = (0.0, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 1e9)


def exposed(through_handles: bool) -> bytes:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ("l",), registry=registry).labels("x")
    histogram = Histogram("h", "h", ("l",), buckets=BOUNDS, registry=registry).labels("x")
    inc: Callable[..., None]
    observe: Callable[[float], None]
    if through_handles:
        inc, observe = CounterHandle(counter).inc, HistogramHandle(histogram).observe
    else:
        inc, observe = counter.inc, histogram.observe
    for value in VALUES:
        inc()
        inc(3)
        observe(value)
    return b"\n".join(
        line for line in generate_latest(registry).splitlines() if b"_created" not in line
    )


def test_handles_expose_what_prometheus_clients_own_calls_do() -> None:
    assert exposed(through_handles=True) == exposed(through_handles=False)


def test_a_request_is_observed_through_the_handles() -> None:
    metrics = Metrics()
    record = RequestRecord(0.0, operation="text_completion")
    record.model, record.provider, record.status = "m", "p", 200
    record.prompt_tokens, record.completion_tokens = 5, 7
    metrics.observe(record, end=0.5)
    metrics.observe(record, end=0.5)
    text = metrics.render()[0].decode()
    assert 'gateway_tokens_total{model="m",provider="p",type="output"} 14.0' in text
    assert 'gateway_request_duration_seconds_bucket{le="0.64",model="m",' in text
    assert 'gateway_request_duration_seconds_count{model="m",operation="text_completion",' in text
    handles = {type(child) for child in metrics._children.values()}
    assert handles == {CounterHandle, HistogramHandle}


def records() -> list[RequestRecord]:
    """Requests of several kinds: answered, streamed with a first token, failed before any
    provider, and the same labels again."""
    out = []
    for i in range(12):
        rec = RequestRecord(float(i), operation="chat" if i % 3 else "text_completion")
        rec.model, rec.status, rec.stream = "m", 200 if i % 4 else 502, bool(i % 2)
        if i % 5:
            rec.provider, rec.upstream_s = "p", 0.01 * i
            rec.prompt_tokens, rec.completion_tokens = i, 3 * i
            rec.first_token = float(i) + 0.001 * i if rec.stream else 0.0
        out.append(rec)
    return out


def samples(metrics: Metrics) -> list[bytes]:
    text = generate_latest(metrics.registry)
    lines = text.splitlines()
    return [s for s in lines if s.startswith((b"gateway_", b"gen_ai_")) and b"_created" not in s]


def test_observations_tallied_under_load_expose_what_each_one_alone_does() -> None:
    alone, tallied = Metrics(), Metrics()
    tallied.inflight_add(1)  # another request in flight: observations wait
    for rec in records():
        alone.observe(rec, end=rec.start + 0.5)
        tallied.observe(rec, end=rec.start + 0.5)
    assert samples(tallied) != samples(alone)  # not yet in the registry
    tallied.inflight_add(-1)
    tallied.flush()
    assert samples(tallied) == samples(alone)


def test_a_scrape_has_every_observation_made_before_it() -> None:
    metrics = Metrics()
    metrics.inflight_add(1)
    metrics.observe(records()[1], end=2.0)
    text = metrics.render()[0].decode()
    assert 'gateway_requests_total{model="m",operation="chat",provider="p",status="200"' in text


async def test_under_load_observations_reach_the_registry_by_themselves() -> None:
    metrics = Metrics()
    metrics.inflight_add(1)
    metrics.observe(records()[1], end=2.0)

    def flushed() -> bool:
        return any(line.startswith(b"gateway_requests_total") for line in samples(metrics))

    assert not flushed()
    async with asyncio.timeout(FLUSH_S * 20):
        while not flushed():  # noqa: ASYNC110 - the flush is a timer's, with no event
            await asyncio.sleep(FLUSH_S / 5)


# ---------------------------------------------------------------- scrapes share renders


class Held(Metrics):
    """Renders counted; each render waits in its thread until `release` is set."""

    def __init__(self, min_interval_s: float = 0.0) -> None:
        super().__init__(min_interval_s=min_interval_s)
        self.started = threading.Event()
        self.release = threading.Event()
        self.renders = 0

    def exposition(self, fmt: Format = TEXT) -> bytes:
        self.renders += 1
        self.started.set()
        assert self.release.wait(10)
        return super().exposition(fmt)


async def test_scrapes_during_a_render_share_it() -> None:
    metrics = Held()
    scrapes = [asyncio.ensure_future(metrics.scrape()) for _ in range(20)]
    assert await asyncio.to_thread(metrics.started.wait, 10)
    scrapes += [asyncio.ensure_future(metrics.scrape()) for _ in range(5)]  # during the render
    await asyncio.sleep(0)
    metrics.release.set()
    texts = {text for text, _ in await asyncio.gather(*scrapes)}
    assert metrics.renders == 1 and len(texts) == 1
    assert b"gateway_metrics_renders_total 1.0" in texts.pop()


async def test_a_scrape_that_leaves_does_not_cancel_the_others_render() -> None:
    metrics = Held()
    leaving, staying = (asyncio.ensure_future(metrics.scrape()) for _ in range(2))
    assert await asyncio.to_thread(metrics.started.wait, 10)
    leaving.cancel()
    metrics.release.set()
    text, ctype = await staying
    assert b"gateway_metrics_renders_total 1.0" in text and ctype.startswith("text/plain")


async def test_scrapes_within_the_interval_get_the_last_render() -> None:
    metrics = Metrics(min_interval_s=60)
    first, _ = await metrics.scrape()
    metrics.observe(records()[1], end=2.0)
    texts = {text for text, _ in await asyncio.gather(*(metrics.scrape() for _ in range(10)))}
    assert texts == {first}
    assert b"gateway_metrics_renders_total 1.0" in first
    metrics.min_interval_s = 0  # the interval over: the next scrape renders what came since
    text, _ = await metrics.scrape()
    assert b"gateway_metrics_renders_total 2.0" in text
    assert b'gateway_requests_total{model="m",operation="chat"' in text


async def test_without_an_interval_each_scrape_after_a_render_renders_anew() -> None:
    metrics = Metrics(min_interval_s=0)
    for n in (1, 2, 3):
        text, _ = await metrics.scrape()
        assert f"gateway_metrics_renders_total {n}.0".encode() in text


async def test_the_loop_answers_while_a_scrape_renders() -> None:
    """/metrics renders in a thread: /livez answers meanwhile, and the event-loop gauge (read
    on the loop, not in the render's thread) counts the loop's tasks."""
    app = create_app(parse(APP_CONFIG))
    metrics = app.runtime.metrics
    exposition, started, release = metrics.exposition, threading.Event(), threading.Event()

    def held(fmt: Format = TEXT) -> bytes:
        started.set()
        assert release.wait(10)
        return exposition(fmt)

    metrics.exposition = held  # type: ignore[method-assign]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        scrape = asyncio.ensure_future(client.get("/metrics"))
        assert await asyncio.to_thread(started.wait, 10)
        live = await client.get("/livez")
        assert live.status_code == 200 and not scrape.done()
        release.set()
        answer = await scrape
    assert answer.status_code == 200
    tasks = [line for line in answer.text.splitlines() if line.startswith("gateway_event_loop")]
    assert tasks and float(tasks[0].split()[-1]) >= 1


APP_CONFIG = """
auth: {keys: [{id: a, key: k-unit}]}
providers: {up: {type: openai, base_url: "http://127.0.0.1:9/v1", api_key: x}}
models: {m: {targets: [{provider: up, model: u}]}}
metrics: {min_interval_s: 0}
"""


# ---------------------------------------------------------------- config


def test_the_metrics_section_defaults() -> None:
    m = parse(APP_CONFIG.replace("metrics: {min_interval_s: 0}", "")).metrics
    assert (m.enabled, m.listen, m.require_key, m.min_interval_s) == (True, None, False, 0.0)


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:9464", ("::1", 9464)),
        ("[::]:9464", ("::", 9464)),
    ],
)
def test_listen_is_host_and_port(listen: str, address: tuple[str, int]) -> None:
    assert metrics_config(f"listen: '{listen}'").listen == address


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ("listen: '::1:9464'", "metrics.listen", "expected host:port"),
        ("listen: '9464'", "metrics.listen", "expected host:port"),
        ("listen: ':9464'", "metrics.listen", "expected host:port"),
        ("listen: 'host'", "metrics.listen", "expected host:port"),
        ("listen: 'a b:1'", "metrics.listen", "expected host:port"),
        ("listen: '127.0.0.1:0'", "metrics.listen", "expected a port from 1 to 65535"),
        ("listen: '127.0.0.1:65536'", "metrics.listen", "expected a port from 1 to 65535"),
        ("listen: '127.0.0.1:x'", "metrics.listen", "expected a port"),
        ("listen: '[1.2.3.4]:9'", "metrics.listen", "is not an IPv6 address"),
        ("listen: 9464", "metrics.listen", "expected a string"),
        ("{enabled: false, listen: '127.0.0.1:9'}", "metrics.listen", "metrics are disabled"),
        ("require_key: 'yes'", "metrics.require_key", "expected true or false"),
        ("min_interval_s: -1", "metrics.min_interval_s", "expected a number >= 0"),
        ("max_connections: 0", "metrics.max_connections", "expected an integer >= 1"),
        ("timeout_s: 0", "metrics.timeout_s", "expected a positive number"),
        ("listn: '127.0.0.1:9'", "metrics.listn", "unknown key"),
    ],
)
def test_bad_metrics_settings_name_their_path(section: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        metrics_config(section)
    assert caught.value.path == path and message in caught.value.message


def metrics_config(section: str) -> MetricsConfig:
    body = section if section.startswith("{") else "{" + section + "}"
    return parse(APP_CONFIG.replace("{min_interval_s: 0}", body)).metrics

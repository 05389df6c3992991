"""The metrics' handles (gateway.metrics): a counter or histogram updated through its handle
exposes exactly what prometheus_client's own `inc` and `observe` would, values on a bucket's
bound, between bounds and past the last included. Requests' observations tallied while others
are in flight expose, once flushed, what each observed alone does; a scrape flushes them, and
under load a timer does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import FLUSH_S, CounterHandle, HistogramHandle, Metrics, RequestRecord

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

"""The metrics' handles (gateway.metrics): a counter or histogram updated through its handle
exposes exactly what prometheus_client's own `inc` and `observe` would, values on a bucket's
bound, between bounds and past the last included."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import CounterHandle, HistogramHandle, Metrics, RequestRecord

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

"""The trace exporter: a child process of each serving process (gateway.observability.tracing),
run as `python -m gateway.observability.export`.

Its stdin: a line of settings (endpoint, protocol, headers, the clocks' offset), then one JSON
line per traced request, its record. Each becomes the request's spans (`Spans`), the SDK's
(ReadableSpan), which go to the SDK's OTLP exporter (OTLP/HTTP, or gRPC) in batches:
MAX_BATCH spans, or what came within DELAY_S of the first. Its stdout: the count of spans
dropped, a line each time (an export that failed, a line that was not a record). While an
export is under way the child reads nothing: the serving process holds the lines (bounded) and
drops what does not fit. It runs at a lower priority than the serving process
(NICE). The end of its stdin ends it, after a last export.

What the config does not set, the SDK's exporter reads from the standard OTEL_EXPORTER_OTLP_*
variables; the resource, from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import time
from collections.abc import Callable, Sequence
from random import getrandbits
from typing import Any

import orjson
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

SERVICE = "completions-gateway"
SCOPE = InstrumentationScope("gateway")
MAX_BATCH = 512
DELAY_S = 0.5
NICE = 10
PROTOCOL_ENV = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
UNSET = Status(StatusCode.UNSET)

log = logging.getLogger("gateway.observability.export")


def exporter(settings: dict[str, Any]) -> SpanExporter:
    endpoint, headers = settings.get("endpoint"), settings.get("headers") or None
    protocol = settings.get("protocol") or next(
        (os.environ[v] for v in PROTOCOL_ENV if os.environ.get(v)), "http/protobuf"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        insecure = None if endpoint is None else endpoint.startswith("http://")
        return GrpcExporter(endpoint=endpoint, insecure=insecure, headers=headers)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, headers=headers)


# The request's fields the GenAI conventions name, in the order a record holds them
# (gateway.pipeline.spans.REQUESTED).
REQUESTED = (
    "gen_ai.request.max_tokens", "gen_ai.request.max_tokens", "gen_ai.request.temperature",
    "gen_ai.request.top_p", "gen_ai.request.seed", "gen_ai.request.choice.count",
)  # fmt: skip
DETAILS = "gen_ai.client.inference.operation.details"


class Spans:
    """A request's record (gateway.observability.tracing.Record) made into its spans:

    POST /v1/chat/completions      server span (a batch's line: `batch_line`, internal)
    └─ chat llama-8b               the GenAI span, its events
       ├─ attempt vllm/llama       one span per try, whose id the try's traceparent sent
       └─ attempt fireworks/…
    """

    def __init__(self, resource: Resource, epoch: int) -> None:
        self.resource = resource
        self.epoch = epoch  # perf_counter() seconds → Unix ns: epoch + seconds * 1e9

    def ns(self, t: float) -> int:
        return self.epoch + int(t * 1e9)

    def of(self, line: bytes) -> list[ReadableSpan]:
        (
            trace, parent, remote, start, began, end, method, path, status, request_id, agent,
            portkey, batch, operation, model, provider, upstream, answer_id, reasons, tokens_in,
            tokens_out, requested, error, code, events, first_token, attempts, content,
        ) = orjson.loads(line)  # fmt: skip
        trace_id = int(trace, 16)
        root, genai = _span_id(), _span_id()
        root_attrs: dict[str, Any] = {"http.response.status_code": status,
                                      "gateway.request_id": request_id}  # fmt: skip
        if batch is not None:
            name, kind = "batch_line", SpanKind.INTERNAL
            root_attrs["gateway.batch.id"], root_attrs["gateway.batch.custom_id"] = batch
        else:
            name, kind = f"{method} {path}", SpanKind.SERVER
            root_attrs.update({"http.request.method": method, "url.path": path,
                               "http.route": path})  # fmt: skip
            _put(root_attrs, "user_agent.original", agent)
            _put(root_attrs, "portkey.trace_id", portkey)
        failed = str(status) if status >= 500 else None  # HTTP: only a server error fails it
        _put(root_attrs, "error.type", failed)
        out = [self._span(name, trace_id, root, parent and int(parent, 16), remote, kind,
                          start, end, root_attrs, [], failed)]  # fmt: skip
        attrs: dict[str, Any] = {"gen_ai.operation.name": operation}
        _put(attrs, "gen_ai.request.model", model)
        for attribute, value in zip(REQUESTED, requested or (), strict=False):
            if type(value) in (int, float):
                attrs[attribute] = value
        for attribute, value in (
            ("gen_ai.provider.name", provider), ("gen_ai.response.model", upstream),
            ("gen_ai.response.id", answer_id), ("gen_ai.response.finish_reasons", reasons),
            ("gen_ai.usage.input_tokens", tokens_in), ("gen_ai.usage.output_tokens", tokens_out),
            ("error.type", code or error),
        ):  # fmt: skip
            _put(attrs, attribute, value)
        marks = [Event(n, a, self.ns(t)) for n, t, a in events]
        if first_token:
            marks.append(Event("gen_ai.first_token", {}, self.ns(first_token)))
        if content is not None:
            sent, answered = (orjson.dumps(c).decode() for c in content)
            said = {"gen_ai.input.messages": sent, "gen_ai.output.messages": answered}
            marks.append(Event(DETAILS, said, self.ns(end)))
        out.append(self._span(f"{operation} {model or ''}".strip(), trace_id, genai, root, False,
                              SpanKind.CLIENT, began, end, attrs, marks, error))  # fmt: skip
        for label, outcome, at, took, wait, sent_with in attempts or ():
            out.append(self._attempt(trace_id, genai, label, outcome, at, took, wait, sent_with))
        return out

    def _attempt(
        self, trace_id: int, genai: int, label: str, outcome: str, at: float, took: float,
        wait: float, sent_with: str,
    ) -> ReadableSpan:  # fmt: skip
        provider, _, model = label.partition("/")
        attrs = {"gen_ai.provider.name": provider, "gen_ai.request.model": model,
                 "gateway.attempt.outcome": outcome, "gateway.retry.wait_s": wait}  # fmt: skip
        failed = None if outcome == "ok" else outcome
        _put(attrs, "error.type", failed)
        span = int(sent_with[36:52], 16) if sent_with else _span_id()
        return self._span(f"attempt {label}", trace_id, span, genai, False, SpanKind.CLIENT,
                          at, at + took, attrs, [], failed)  # fmt: skip

    def _span(
        self, name: str, trace_id: int, span: int, parent: int, remote: bool, kind: SpanKind,
        start: float, end: float, attrs: dict[str, Any], events: list[Event], error: str | None,
    ) -> ReadableSpan:  # fmt: skip
        return ReadableSpan(
            name,
            context=SpanContext(trace_id, span, False, SAMPLED),
            parent=SpanContext(trace_id, parent, remote, SAMPLED) if parent else None,
            resource=self.resource,
            attributes=attrs,
            events=events,
            kind=kind,
            status=UNSET if error is None else Status(StatusCode.ERROR, error),
            start_time=self.ns(start),
            end_time=self.ns(end),
            instrumentation_scope=SCOPE,
        )


def _put(attrs: dict[str, Any], name: str, value: Any) -> None:
    if value is not None:
        attrs[name] = value


def _span_id() -> int:
    return getrandbits(64) or 1


class Batches:
    """The spans read, exported in batches; what is dropped, told on `told`."""

    def __init__(self, export: SpanExporter, told: Callable[[int], None]) -> None:
        self.export = export
        self.told = told
        self.held: list[ReadableSpan] = []
        self.since = 0.0  # monotonic() when the first held span came
        self.failing = False

    def add(self, more: Sequence[ReadableSpan]) -> None:
        if not self.held:
            self.since = time.monotonic()
        self.held.extend(more)
        while len(self.held) >= MAX_BATCH:
            batch, self.held = self.held[:MAX_BATCH], self.held[MAX_BATCH:]
            self.send(batch)

    def due_in(self) -> float | None:
        """Seconds until the held spans are due (None: nothing held)."""
        if not self.held:
            return None
        return max(0.0, self.since + DELAY_S - time.monotonic())

    def flush(self) -> None:
        batch, self.held = self.held, []
        if batch:
            self.send(batch)

    def send(self, batch: list[ReadableSpan]) -> None:
        try:
            ok = self.export.export(batch) is SpanExportResult.SUCCESS
        except Exception:
            ok = False
        if not ok:
            self.told(len(batch))
            if not self.failing:
                log.warning("traces cannot be exported: %d spans dropped", len(batch))
        self.failing = not ok


def run(stdin: int, stdout: int) -> None:
    settings = b""
    while not settings.endswith(b"\n"):
        chunk = os.read(stdin, 65536)
        if not chunk:
            return
        settings += chunk
    first, _, rest = settings.partition(b"\n")
    given = orjson.loads(first)
    spans = Spans(Resource.create({SERVICE_NAME: SERVICE}), given["epoch"])

    def told(n: int) -> None:
        os.write(stdout, b"%d\n" % n)

    batches = Batches(exporter(given), told)
    pending = rest
    while True:
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                batches.add(spans.of(line))
            except (ValueError, TypeError):
                told(1)  # not spans (never from the gateway): counted, not exported
        if not select.select([stdin], [], [], batches.due_in())[0]:
            batches.flush()
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        pending += chunk
    batches.flush()
    batches.export.shutdown()


def main() -> None:
    # Serving comes first: on a busy machine the export yields the CPU to the serving
    # processes, falls behind, and what does not fit is dropped and counted.
    os.nice(NICE)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    # The SDK's exporter logs each failed export; the child says it once per failing spell.
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    run(sys.stdin.fileno(), sys.stdout.fileno())


if __name__ == "__main__":
    main()

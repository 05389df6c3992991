"""The trace exporter: a child process of each serving process (gateway.observability.tracing),
run as `python -m gateway.observability.export`.

Its stdin: a line of settings (endpoint, protocol, headers), then one JSON line per request,
the request's spans. They become the SDK's spans (ReadableSpan) and go to the SDK's OTLP
exporter (OTLP/HTTP, or gRPC) in batches: MAX_BATCH spans, or what came within DELAY_S of the
first. Its stdout: the count of spans dropped, a line each time (an export that failed, a line
that was not spans). While an export is under way the child reads nothing: the serving process
holds the lines (bounded) and drops what does not fit. It runs at a lower priority than the
serving process (NICE). The end of its stdin ends it, after a last export.

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


def spans(line: bytes, resource: Resource) -> list[ReadableSpan]:
    """One request's line of spans (gateway.observability.tracing.SpanLine)."""
    out = []
    for trace, span, parent, remote, name, kind, start, end, attrs, events, error in orjson.loads(
        line
    ):
        trace_id = int(trace, 16)
        out.append(
            ReadableSpan(
                name,
                context=SpanContext(trace_id, int(span, 16), False, SAMPLED),
                parent=SpanContext(trace_id, int(parent, 16), remote, SAMPLED) if parent else None,
                resource=resource,
                attributes=attrs,
                events=[Event(n, a, t) for n, t, a in events],
                kind=SpanKind(kind),
                status=UNSET if error is None else Status(StatusCode.ERROR, error),
                start_time=start,
                end_time=end,
                instrumentation_scope=SCOPE,
            )
        )
    return out


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
    resource = Resource.create({SERVICE_NAME: SERVICE})

    def told(n: int) -> None:
        os.write(stdout, b"%d\n" % n)

    batches = Batches(exporter(orjson.loads(first)), told)
    pending = rest
    while True:
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                batches.add(spans(line, resource))
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

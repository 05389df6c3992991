"""An OTLP/HTTP trace receiver for the tests: what a collector is to the gateway's exporter.

It takes `POST /v1/traces` (protobuf), decodes each body with the official
`opentelemetry-proto` messages and keeps the spans. `mode` makes it a collector that answers at
once (`ok`), refuses (`refuse`: a 400, which the SDK's exporter does not retry), is unavailable
(`unavailable`: a 503, retried until the exporter's timeout) or hangs (`hang`: no answer until
it is stopped)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

WAIT_S = 30.0  # the longest a test waits for spans to arrive
REFUSALS = {"refuse": 400, "unavailable": 503}


@dataclass
class Span:
    """A received span, its ids as hex (as traceparent writes them)."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: int  # the proto's: 1 internal, 2 server, 3 client
    start: int
    end: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any] = field(default_factory=dict)


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        assert isinstance(kv, KeyValue)
        out[kv.key] = value(kv.value)
    return out


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self.headers: list[Mapping[str, str]] = []
        self.mode = "ok"
        self.changed = threading.Condition()
        self.released = threading.Event()
        self.url = ""

    def take(self, body: bytes, headers: Mapping[str, str]) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.changed:
            self.requests += 1
            self.headers.append(dict(headers))
            for rs in req.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    self.spans.extend(_span(s, resource) for s in ss.spans)
            self.changed.notify_all()

    def wait_for(self, count: int, timeout: float = WAIT_S) -> list[Span]:
        """Once at least `count` spans came (AssertionError if they do not within `timeout`)."""
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.spans) >= count, timeout):
                raise AssertionError(f"{len(self.spans)} spans came, not {count}")
            return list(self.spans)

    def trace(self, trace_id: str, count: int) -> list[Span]:
        """The spans of one trace, once `count` of them came."""
        with self.changed:
            if not self.changed.wait_for(
                lambda: sum(s.trace_id == trace_id for s in self.spans) >= count, WAIT_S
            ):
                came = [s.name for s in self.spans if s.trace_id == trace_id]
                others = sorted({s.name for s in self.spans})
                raise AssertionError(f"trace {trace_id}: {came} came (of all: {others})")
            return [s for s in self.spans if s.trace_id == trace_id]


def _span(s: Any, resource: dict[str, Any]) -> Span:
    return Span(
        s.trace_id.hex(),
        s.span_id.hex(),
        s.parent_span_id.hex(),
        s.name,
        s.kind,
        s.start_time_unix_nano,
        s.end_time_unix_nano,
        attributes(s.attributes),
        [(e.name, attributes(e.attributes)) for e in s.events],
        s.status.code,
        resource,
    )


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if receiver.mode == "hang":
                receiver.released.wait()
            if receiver.mode in REFUSALS:
                self.send_response(REFUSALS[receiver.mode])
                self.send_header("content-length", "0")
                self.end_headers()
                return
            receiver.take(body, {k.lower(): v for k, v in self.headers.items()})
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def receiving(mode: str = "ok") -> Iterator[Receiver]:
    """A receiver on a free port of 127.0.0.1 (`url`: its base, as `otlp_endpoint` takes it)."""
    receiver = Receiver()
    receiver.mode = mode
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.released.set()
        server.shutdown()
        server.server_close()

"""OpenTelemetry traces of the requests (`telemetry`), on the request path's side.

A request's trace costs the serving process as little as can be: a trace id drawn, a span id
and traceparent per try, times read as it goes, and at its end its raw values (a `Record`) as
one JSON line queued for a writer thread (LogFile: bounded, what it drops is counted). The export
child (gateway.observability.export) makes the spans from them, as the SDK's spans, batched and
exported by the SDK's OTLP exporter: those objects and their protobuf encoding cost more CPU
than the rest of a request, and in the serving process they would hold its interpreter lock.
A collector that is down, refuses or hangs holds up only the child; the spans it cannot take
are dropped there, and the child tells the count (gateway_telemetry_dropped_spans_total).
A child that dies is started again RESTART_S later; what comes meanwhile is dropped and counted.

Sampling is the SDK's ParentBased(TraceIdRatioBased(sample_ratio)), its rule applied to the ids
drawn here: a caller's W3C traceparent (read by the SDK's propagator) decides for its trace,
else the trace id against the ratio's bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from random import getrandbits
from typing import Any

import orjson
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.observability import jsonline
from gateway.observability.logfile import LogFile

log = logging.getLogger("gateway.observability")
TRACE_ID_LIMIT = (1 << 64) - 1  # the low 64 bits of a trace id decide its sampling (the SDK's)
EXPORTER = (sys.executable, "-m", "gateway.observability.export")
CLOSE_S = 5.0  # at close, how long the child may take to export what it holds
RESTART_S = 1.0  # a child that died is started again after this long (never in a tight loop)

# A traced request, as the export child takes it (gateway.pipeline.spans writes it, in order;
# gateway.observability.export reads it): its trace, times (perf_counter() seconds), HTTP
# exchange, GenAI values, events, tries and content.
Record = list[Any]
# Where a record's tries are (their count is what a dropped record weighs, with its two spans).
ATTEMPTS = 26


def span_id() -> str:
    return f"{getrandbits(64) or 1:016x}"


class Trace:
    """One traced request: its ids, and what the stages noted on the way."""

    __slots__ = ("began", "events", "parent", "reasons", "remote", "trace_id")

    def __init__(self, trace_id: str, parent: str, remote: bool) -> None:
        self.trace_id = trace_id
        self.parent = parent  # the caller's span ("": none)
        self.remote = remote
        self.began = 0.0  # perf_counter() when the GenAI operation began (the plan stage)
        self.events: list[tuple[str, float, dict[str, Any]]] = []  # on the GenAI span
        self.reasons: dict[int, str] = {}  # a stream's finish reasons, by choice

    def traceparent(self, span: str) -> str:
        return f"00-{self.trace_id}-{span}-01"

    def event(self, name: str, attributes: dict[str, Any]) -> None:
        self.events.append((name, time.perf_counter(), attributes))

    def seen(self, batch: list[Any]) -> None:
        """A stream's batch of chunks, as written: their finish reasons kept."""
        for chunk in batch:
            response = chunk.get("response")  # a Responses event: how the response ended
            if response is not None and response.get("status") != "in_progress":
                self.reasons[0] = response["status"]
            for choice in chunk.get("choices") or ():
                reason = choice.get("finish_reason")
                if reason:
                    self.reasons[choice.get("index", 0)] = reason


class Tracing:
    """A runtime's traces: sampling, and the export child (started by `start`, on the loop)."""

    def __init__(
        self,
        exporter: Mapping[str, object],
        sample_ratio: float,
        capture_content: bool,
        dropped: Callable[[int], None],
    ) -> None:
        """`exporter`: the export child's settings (endpoint, protocol, headers: None for the
        SDK's defaults and environment)."""
        self.exporter = exporter
        self.capture_content = capture_content
        self._dropped = dropped
        self._bound = TraceIdRatioBased.get_bound_for_rate(sample_ratio)
        self._propagator = TraceContextTextMapPropagator()
        # perf_counter() seconds → Unix ns (the clocks' offset, read once: the child's)
        self._epoch = time.time_ns() - int(time.perf_counter() * 1e9)
        self._child: subprocess.Popen[bytes] | None = None
        self._lines: LogFile | None = None
        self._reports = b""
        self._closed = False
        self._restart: asyncio.TimerHandle | None = None
        self._ended: set[asyncio.Task[None]] = set()  # a dead child's writer, closing

    def begin(self, headers: Mapping[str, str]) -> Trace | None:
        """A request's trace, or None when it is not sampled."""
        if "traceparent" in headers:
            return self._continued(headers)
        trace_id = getrandbits(128) or 1
        if trace_id & TRACE_ID_LIMIT >= self._bound:
            return None
        return Trace(f"{trace_id:032x}", "", False)

    def _continued(self, headers: Mapping[str, str]) -> Trace | None:
        context = get_current_span(self._propagator.extract(headers)).get_span_context()
        if not context.is_valid:  # a malformed traceparent: a trace of our own, as without one
            return self.begin({})
        if not context.trace_flags.sampled:
            return None
        return Trace(f"{context.trace_id:032x}", f"{context.span_id:016x}", True)

    def emit(self, record: Record) -> None:
        """A request's record, queued for the exporter; never waits (a full queue drops it)."""
        weight = 2 + len(record[ATTEMPTS] or ())
        if self._lines is None:
            self._dropped(weight)
            return
        self._lines.write(jsonline.dumps(record, orjson.OPT_APPEND_NEWLINE), weight)

    def start(self) -> None:
        """The export child, given its settings first (the headers may hold a token: never in
        its arguments, which any local user can read)."""
        self._restart = None
        if self._child is not None or self._closed:
            return
        child = self._child = subprocess.Popen(
            EXPORTER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
        )
        assert child.stdin is not None and child.stdout is not None
        first = {**self.exporter, "epoch": self._epoch}
        stdin = os.dup(child.stdin.fileno())
        child.stdin.close()
        self._lines = LogFile("trace exporter", self._dropped, fd=stdin)
        self._lines.write(orjson.dumps(first, option=orjson.OPT_APPEND_NEWLINE), 0)
        os.set_blocking(child.stdout.fileno(), False)
        asyncio.get_running_loop().add_reader(child.stdout.fileno(), self._report)

    def _report(self) -> None:
        """The child's lines: the count of spans it dropped, one line each time."""
        child = self._child
        assert child is not None and child.stdout is not None
        try:
            data = os.read(child.stdout.fileno(), 4096)
        except BlockingIOError:
            return
        if data:
            self._take(data)
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(child.stdout.fileno())
        if self._closed:
            return
        log.error("the trace exporter ended (%s): started again in %s s", child.poll(), RESTART_S)
        child.stdout.close()
        lines, self._child, self._lines = self._lines, None, None
        if lines is not None:  # what it held: dropped and counted (a broken pipe)
            ending = loop.create_task(lines.aclose())
            self._ended.add(ending)
            ending.add_done_callback(self._ended.discard)
        self._restart = loop.call_later(RESTART_S, self.start)

    @property
    def child_pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def _take(self, data: bytes) -> None:
        *lines, self._reports = (self._reports + data).split(b"\n")
        for line in lines:
            if line.isdigit():
                self._dropped(int(line))

    async def aclose(self) -> None:
        """What is queued handed to the child, which exports it and ends (killed after
        CLOSE_S: a collector that hangs does not hold up a shutdown)."""
        self._closed = True
        if self._restart is not None:
            self._restart.cancel()
        for ending in list(self._ended):
            await ending
        child, lines = self._child, self._lines
        if child is None or lines is None or lines.closed:
            return
        assert child.stdout is not None
        try:
            async with asyncio.timeout(CLOSE_S):
                await lines.aclose()  # the pipe closed: the child exports the rest and ends
                await asyncio.to_thread(child.wait)
        except TimeoutError:
            log.warning("the trace exporter did not end within %s s: stopped", CLOSE_S)
            child.kill()
            await asyncio.to_thread(child.wait)
        asyncio.get_running_loop().remove_reader(child.stdout.fileno())
        with contextlib.suppress(OSError):
            while data := os.read(child.stdout.fileno(), 4096):
                self._take(data)
        child.stdout.close()

"""A traced request's record, taken from its flow when it ends: the raw values its spans are
made of, as one flat list (gateway.observability.tracing.Record). The export child makes the
spans (gateway.observability.export), so that the serving process only reads what it holds.

No key and no text, unless `telemetry.capture_content` is on: then what the caller sent and the
answer's choices, after its `redact` patterns (the GenAI span's content event).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.observability.content import answered, redacted
from gateway.observability.tracing import Record, Trace, Tracing
from gateway.pipeline.flow import Flow
from gateway.pipeline.logline import CONTENT_FIELDS

# The request's fields the GenAI conventions name (gateway.observability.export names them).
REQUESTED = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # an attribute's integer


def record(flow: Flow[Any, Any, Any], trace: Trace, tracing: Tracing, end: float) -> Record:
    """`end`: perf_counter() when the request ended."""
    rec, req, call, inbound = flow.record, flow.request, flow.call, flow.inbound
    headers = inbound.headers
    fields: Mapping[str, Any] = req.fields if req is not None else {}
    return [
        trace.trace_id,
        trace.parent,
        trace.remote,
        rec.start,
        trace.began or rec.start,
        end,
        inbound.method,
        inbound.path,
        rec.status,
        inbound.request_id,
        headers.get("user-agent"),
        headers.get("x-portkey-trace-id"),
        inbound.batch,
        rec.operation,
        req.model if req is not None else None,
        call.target.provider if call is not None else None,
        call.target.model if call is not None else None,
        flow.id or None,
        _reasons(flow, trace),
        rec.prompt_tokens,
        rec.completion_tokens,
        [_number(fields.get(name)) for name in REQUESTED] if fields else None,
        rec.error_type or None,
        rec.error_code,
        trace.events,
        rec.first_token or None,
        rec.attempts,
        _content(flow, fields) if tracing.capture_content and req is not None else None,
    ]


def _number(value: Any) -> int | float | None:
    """A requested value as an attribute may hold it: a number (an integer within int64), or
    none (a refused request's fields are as the caller sent them)."""
    if type(value) is int:
        return value if INT64_MIN <= value <= INT64_MAX else None
    return value if type(value) is float else None


def _reasons(flow: Flow[Any, Any, Any], trace: Trace) -> list[str] | None:
    if trace.reasons:
        return [trace.reasons[i] for i in sorted(trace.reasons)]
    answer = flow.answer
    if isinstance(answer, Mapping) and isinstance(answer.get("status"), str):
        return [answer["status"]]  # a response: how it ended
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not isinstance(choices, list):
        return None
    return [c["finish_reason"] for c in choices if isinstance(c.get("finish_reason"), str)]


def _content(flow: Flow[Any, Any, Any], fields: Mapping[str, Any]) -> list[Any]:
    """What was sent, and the answer's choices."""
    patterns = flow.inbound.runtime.config.telemetry.redact
    sent = redacted({k: fields[k] for k in CONTENT_FIELDS if k in fields}, patterns)
    if flow.gathered is not None:
        choices: list[dict[str, Any]] | None = flow.gathered.choices()
    else:
        choices = answered(flow.answer) if flow.answer is not None else None
    return [sent, redacted(choices or [], patterns)]

"""A traced request's spans, made from its flow when it ends (gateway.observability.tracing
exports them):

    POST /v1/chat/completions          server span (HTTP conventions); a batch's line: a
    │                                  `batch_line` span instead
    └─ chat llama-8b                   the GenAI span: gen_ai.* request and answer attributes;
       │                               events: the rate limits' decision, the first token (a
       │                               stream), the content (telemetry.capture_content)
       ├─ attempt fireworks/llama-v3   one span per try: its target, outcome, retry wait; the
       └─ attempt vllm/llama           traceparent it was sent with names it as the parent

Attributes hold no key and no text, unless `telemetry.capture_content` is on: then what the
caller sent and the answer's choices are the GenAI span's `gen_ai.client.inference.operation.
details` event (`gen_ai.input.messages`, `gen_ai.output.messages`, as JSON), after its
`redact` patterns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.metrics import RequestRecord
from gateway.observability.content import answered, redacted
from gateway.observability.tracing import (
    CLIENT,
    INTERNAL,
    SERVER,
    SpanLine,
    Trace,
    Tracing,
    span_id,
)
from gateway.pipeline.flow import Flow
from gateway.pipeline.logline import CONTENT_FIELDS

# The request's fields the GenAI conventions name, as they name them.
REQUEST_ATTRIBUTES = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("max_completion_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("seed", "gen_ai.request.seed"),
    ("n", "gen_ai.request.choice.count"),
)
DETAILS = "gen_ai.client.inference.operation.details"


def spans(flow: Flow[Any, Any, Any], trace: Trace, tracing: Tracing, end: float) -> list[SpanLine]:
    """`end`: perf_counter() when the request ended."""
    rec = flow.record
    genai = span_id()
    began = trace.began or rec.start
    out = [_root(flow, trace, tracing, end), _genai(flow, trace, tracing, genai, began, end)]
    for label, outcome, start, took, wait, sent in rec.attempts or ():
        attempt = sent[36:52] if sent else span_id()
        provider, _, model = label.partition("/")
        attrs: dict[str, Any] = {
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gateway.attempt.outcome": outcome,
            "gateway.retry.wait_s": wait,
        }
        error = None if outcome == "ok" else outcome
        if error is not None:
            attrs["error.type"] = error
        out.append(
            (trace.trace_id, attempt, genai, False, f"attempt {label}", CLIENT,
             tracing.ns(start), tracing.ns(start + took), attrs, [], error)
        )  # fmt: skip
    return out


def _root(flow: Flow[Any, Any, Any], trace: Trace, tracing: Tracing, end: float) -> SpanLine:
    """The server span; a batch's line has an internal span instead."""
    inbound, rec = flow.inbound, flow.record
    error = None
    if inbound.batch is not None:
        batch_id, custom_id = inbound.batch
        name, kind = "batch_line", INTERNAL
        attrs: dict[str, Any] = {"gateway.batch.id": batch_id, "gateway.batch.custom_id": custom_id}
    else:
        name, kind = f"{inbound.method} {inbound.path}", SERVER
        attrs = {
            "http.request.method": inbound.method,
            "url.path": inbound.path,
            "http.route": inbound.path,
        }
        agent = inbound.headers.get("user-agent")
        if agent:
            attrs["user_agent.original"] = agent
        portkey = inbound.headers.get("x-portkey-trace-id")
        if portkey:
            attrs["portkey.trace_id"] = portkey
    attrs["http.response.status_code"] = rec.status
    attrs["gateway.request_id"] = inbound.request_id
    if rec.status >= 500:  # the HTTP conventions: only a server error fails a server span
        error = attrs["error.type"] = str(rec.status)
    return (
        trace.trace_id, trace.root, trace.parent, trace.remote, name, kind,
        tracing.ns(rec.start), tracing.ns(end), attrs, [], error,
    )  # fmt: skip


def _genai(
    flow: Flow[Any, Any, Any], trace: Trace, tracing: Tracing, genai: str, began: float, end: float
) -> SpanLine:
    rec, req, call = flow.record, flow.request, flow.call
    model = req.model if req is not None else ""
    attrs: dict[str, Any] = {"gen_ai.operation.name": rec.operation}
    if req is not None:
        attrs["gen_ai.request.model"] = model
        _requested(attrs, req.fields)
    if call is not None:
        attrs["gen_ai.provider.name"] = call.target.provider
        attrs["gen_ai.response.model"] = call.target.model
    if flow.id:
        attrs["gen_ai.response.id"] = flow.id
    reasons = _reasons(flow, trace)
    if reasons:
        attrs["gen_ai.response.finish_reasons"] = reasons
    _usage(attrs, rec)
    error = rec.error_type or None
    if error is not None:
        attrs["error.type"] = rec.error_code or error
    events = [(name, tracing.ns(t), a) for name, t, a in trace.events]
    if rec.first_token:
        events.append(("gen_ai.first_token", tracing.ns(rec.first_token), {}))
    if tracing.capture_content and req is not None:
        events.append((DETAILS, tracing.ns(end), _content(flow, req.fields)))
    name = f"{rec.operation} {model}".strip()
    return (
        trace.trace_id, genai, trace.root, False, name, CLIENT,
        tracing.ns(began), tracing.ns(end), attrs, events, error,
    )  # fmt: skip


def _requested(attrs: dict[str, Any], fields: Mapping[str, Any]) -> None:
    for field, attribute in REQUEST_ATTRIBUTES:
        value = fields.get(field)
        if type(value) in (int, float):
            attrs[attribute] = value


def _usage(attrs: dict[str, Any], rec: RequestRecord) -> None:
    if rec.prompt_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = rec.prompt_tokens
    if rec.completion_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = rec.completion_tokens


def _reasons(flow: Flow[Any, Any, Any], trace: Trace) -> list[str]:
    if trace.reasons:
        return [trace.reasons[i] for i in sorted(trace.reasons)]
    answer = flow.answer
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not isinstance(choices, list):
        return []
    return [c["finish_reason"] for c in choices if isinstance(c.get("finish_reason"), str)]


def _content(flow: Flow[Any, Any, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """The conventions' event: what was sent and answered, as JSON strings."""
    patterns = flow.inbound.runtime.config.telemetry.redact
    sent = redacted({k: fields[k] for k in CONTENT_FIELDS if k in fields}, patterns)
    if flow.gathered is not None:
        choices: list[dict[str, Any]] | None = flow.gathered.choices()
    else:
        choices = answered(flow.answer) if flow.answer is not None else None
    return {
        "gen_ai.input.messages": orjson.dumps(sent).decode(),
        "gen_ai.output.messages": orjson.dumps(redacted(choices or [], patterns)).decode(),
    }

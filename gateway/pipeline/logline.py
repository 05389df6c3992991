"""A request's line in the request log (`request_log`), made from its flow when it ends: who
asked (the key's id and team, never the key), for which alias, which target answered after
which tries, what it used and cost, and how long it took. No prompt or completion text unless
`request_log.capture_content` is on: then what the caller sent (its messages, prompt or input)
and the answer's choices, after the `redact` patterns."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.governance.money import usd
from gateway.metrics import RequestRecord
from gateway.observability import jsonline
from gateway.observability.content import answered, redacted
from gateway.pipeline.flow import Flow

# A request's fields that hold what the caller said (captured with capture_content).
CONTENT_FIELDS = ("messages", "prompt", "suffix", "instructions", "input")
LINE = orjson.OPT_APPEND_NEWLINE | orjson.OPT_UTC_Z


def line(flow: Flow[Any, Any, Any], end: float) -> bytes:
    """`end`: perf_counter() when the request ended."""
    rec, principal, req, call = flow.record, flow.principal, flow.request, flow.call
    fields = req.fields if req is not None else {}
    entry: dict[str, Any] = {
        "time": datetime.now(UTC),  # written by orjson (OPT_UTC_Z: ...Z)
        "request_id": flow.inbound.request_id,
        "trace_id": rec.trace_id or None,
        "key_id": principal.key_id if principal is not None else None,
        "team": principal.team if principal is not None else None,
        "endpoint": flow.endpoint.name,
        "model": req.model if req is not None else None,
        "provider": call.target.provider if call is not None else None,
        "upstream_model": call.target.model if call is not None else None,
        "stream": flow.streams,
        "cache": flow.cache.status if flow.cache is not None else None,
        "status": rec.status,
        "error": {"type": rec.error_type, "code": rec.error_code} if rec.error_type else None,
        "attempts": _attempts(rec),
        "usage": _tokens(rec.usage),
        "cost_usd": usd(rec.cost) if rec.cost is not None else None,
        "latency_ms": int((end - rec.start) * 1e6) / 1e3,  # ms, to the µs
        "ttft_ms": int((rec.first_token - rec.start) * 1e6) / 1e3 if rec.first_token else None,
        "user": fields.get("user") if isinstance(fields.get("user"), str) else None,
    }
    if flow.inbound.batch is not None:
        entry["batch_id"], entry["custom_id"] = flow.inbound.batch
    settings = flow.inbound.runtime.config.request_log
    if settings.capture_content:
        entry["request"] = redacted(
            {k: fields[k] for k in CONTENT_FIELDS if k in fields}, settings.redact
        )
        entry["response"] = redacted(_answered(flow), settings.redact)
    return jsonline.dumps(entry, LINE)


def _answered(flow: Flow[Any, Any, Any]) -> dict[str, Any] | None:
    if flow.gathered is not None:
        return {"choices": flow.gathered.choices(), "cut": flow.gathered.cut}
    choices = answered(flow.answer) if flow.answer is not None else None
    return None if choices is None else {"choices": choices, "cut": False}


def _attempts(rec: RequestRecord) -> list[dict[str, Any]]:
    return [
        {
            "target": target,
            "outcome": outcome,
            "duration_ms": int(took * 1e6) / 1e3,
            "wait_ms": int(wait * 1e6) / 1e3,
        }
        for target, outcome, _, took, wait, _ in rec.attempts or ()
    ]


def _tokens(usage: Mapping[str, Any] | None) -> dict[str, int | None] | None:
    """The answer's token counts, as its target reported them."""
    if usage is None:
        return None
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    return {
        "prompt": _count(usage.get("prompt_tokens")),
        "completion": _count(usage.get("completion_tokens")),
        "cached": _count(prompt_details.get("cached_tokens"))
        if isinstance(prompt_details, dict)
        else None,
        "reasoning": _count(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, dict)
        else None,
    }


def _count(v: Any) -> int | None:
    return v if type(v) is int else None

"""A response object, or a Responses stream's event, as an upstream that serves the Responses
API wrote it (OpenAI, vLLM's server or its serving classes on the engine), read into the
canonical answer (core.answers.ResponseAnswer).

The answer keeps what the upstream wrote of the response object (its output items, its fields),
but for the gateway's stamps (id, time, the caller's model) and what the gateway did itself: the
response's `store`, `previous_response_id` and `metadata` are the caller's. Its usage is read
into the canonical words, its details kept as the upstream wrote them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.answers import ResponseAnswer, ResponseEvent, Upstream, Usage
from core.errors import UpstreamError
from core.responses import ResponsesRequest
from core.wire import Json

# The response object's fields that are not the request's repeated (the gateway's, or read).
OWN = frozenset(
    ("id", "object", "created_at", "model", "status", "output", "usage", "incomplete_details",
     "error")
)  # fmt: skip


def bad_answer(label: str, what: str) -> UpstreamError:
    return UpstreamError(
        f"Upstream {label} sent {what}.", target=label, code="upstream_bad_response"
    )


def answer(
    doc: Json, req: ResponsesRequest, label: str, provider: str, whole: bool
) -> ResponseAnswer:
    """The upstream's response object as the canonical response."""
    output = doc.get("output")
    status = doc.get("status")
    if not isinstance(output, list) or not isinstance(status, str):
        raise bad_answer(label, "a response without its output or status")
    echo = {k: v for k, v in doc.items() if k not in OWN}
    echo["store"], echo["previous_response_id"] = req.store, req.previous_response_id
    if "metadata" in req.fields:
        echo["metadata"] = req.fields["metadata"]
    out: ResponseAnswer = {
        "status": status,
        "output": output,
        "usage": usage(doc.get("usage")),
        "incomplete_details": doc.get("incomplete_details"),
        "error": doc.get("error"),
        "echo": echo,
    }
    rid = doc.get("id")
    if isinstance(rid, str):
        out["upstream"] = Upstream(provider=provider, id=rid, whole=whole)
    return out


def usage(raw: Any) -> Usage | None:
    """The Responses API's usage in the canonical words, its details as the upstream wrote
    them (written back as they came)."""
    if not isinstance(raw, Mapping):
        return None
    made: Usage = {
        "prompt_tokens": raw.get("input_tokens") or 0,
        "completion_tokens": raw.get("output_tokens") or 0,
        "total_tokens": raw.get("total_tokens") or 0,
    }
    if isinstance(raw.get("input_tokens_details"), dict):
        made["prompt_tokens_details"] = raw["input_tokens_details"]
    if isinstance(raw.get("output_tokens_details"), dict):
        made["completion_tokens_details"] = raw["output_tokens_details"]
    return made


def event(
    raw: Json, req: ResponsesRequest, label: str, provider: str, whole: bool
) -> ResponseEvent:
    """An event without its number (the gateway numbers what it writes), a response in it read
    as the canonical one."""
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise bad_answer(label, "a stream event without its type")
    raw.pop("sequence_number", None)  # parsed for this call alone: changed in place
    response = raw.get("response")
    if isinstance(response, dict):
        raw["response"] = answer(response, req, label, provider, whole)
    made: ResponseEvent = raw  # type: ignore[assignment]  # the upstream's, as OpenAI's
    return made

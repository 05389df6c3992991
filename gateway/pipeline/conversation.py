"""Stored responses on a Responses request's path: its earlier turns recalled from the store
(`previous_response_id`), and its answer kept there (`store`, true unless the caller says
not), under its caller's team, or its key when it has none (gateway.jobs.responsestore)."""

from __future__ import annotations

from collections.abc import Mapping

from core.answers import ResponseAnswer, ResponseEvent
from core.responses import ResponsesRequest
from gateway.auth import Principal
from gateway.jobs.responsestore import owner
from gateway.runtime import Runtime

# The events that end a response, each with the response as it ended.
ENDINGS = frozenset(("response.completed", "response.incomplete", "response.failed"))


async def recall(rt: Runtime, principal: Principal, req: ResponsesRequest) -> ResponsesRequest:
    """The request with the conversation it continues (a 404 naming `previous_response_id`
    when that is not one of its caller's)."""
    if req.previous_response_id is not None:
        recalled = await rt.responses.recall(owner(principal), req.previous_response_id)
        req.history, req.previous_upstream = recalled.items, recalled.upstream
    return req


def stored(req: ResponsesRequest) -> bool:
    return req.store


async def keep(
    rt: Runtime,
    principal: Principal,
    req: ResponsesRequest,
    answer: ResponseAnswer,
    document: Mapping[str, object],
) -> None:
    """The answer kept as its caller got it (`document`), with the upstream's own id of it."""
    upstream = answer.get("upstream")
    await rt.responses.keep(owner(principal), document, req.input, req.history, upstream)


def final(batch: list[ResponseEvent]) -> ResponseAnswer | None:
    """The response a stream ended with, if this batch ends it."""
    for event in reversed(batch):
        if event["type"] in ENDINGS and "response" in event:
            answer: ResponseAnswer = event["response"]
            return answer
    return None

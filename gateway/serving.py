"""Runs a plan against its providers and renders the answer: JSON, or SSE for streams.

Fallback happens only before the first byte reaches the caller; after that the stream either
completes or ends with an error event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import GatewayError
from gateway.http import JSON_HEADERS, SSE_HEADERS, RawHeaders, until_disconnect
from gateway.routing import Plan
from gateway.schemas import CompletionRequest, apply_defaults
from gateway.sse import Envelope, StreamResult, pump
from providers.base import Prepared

if TYPE_CHECKING:
    from gateway.routes import Ctx

DROPPED_HEADER = b"x-gateway-dropped-params"


def _prepare(ctx: Ctx, req: CompletionRequest, plan: Plan, attempt: int) -> Prepared:
    target = plan.targets[attempt]
    provider = ctx.runtime.providers[target.provider]
    return provider.prepare(apply_defaults(req, target.defaults), target)


def _headers(base: RawHeaders, prepared: Prepared) -> RawHeaders:
    if not prepared.dropped:
        return base
    return [*base, (DROPPED_HEADER, ",".join(prepared.dropped).encode())]


async def serve_json(ctx: Ctx, req: CompletionRequest, plan: Plan, cid: str) -> None:
    for attempt, target in enumerate(plan.targets):
        prepared = _prepare(ctx, req, plan, attempt)
        provider = ctx.runtime.providers[target.provider]
        try:
            out = await until_disconnect(provider.complete(prepared), ctx.receive)
        except GatewayError as err:
            if plan.should_fall_back(err, attempt):
                continue
            raise
        await ctx.respond(
            200, orjson.dumps(_document(out, req, cid)), _headers(JSON_HEADERS, prepared)
        )
        return


def _document(out: dict[str, Any], req: CompletionRequest, cid: str) -> dict[str, Any]:
    doc = {
        "id": cid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": out["choices"],
        "usage": out.get("usage"),
    }
    if out.get("system_fingerprint") is not None:
        doc["system_fingerprint"] = out["system_fingerprint"]
    return doc


async def serve_stream(ctx: Ctx, req: CompletionRequest, plan: Plan, cid: str) -> None:
    for attempt, target in enumerate(plan.targets):
        prepared = _prepare(ctx, req, plan, attempt)
        batches = ctx.runtime.providers[target.provider].stream(prepared).__aiter__()
        try:
            first = await until_disconnect(_first(batches), ctx.receive)
        except GatewayError as err:
            if plan.should_fall_back(err, attempt):
                continue
            raise
        await ctx.start_stream(_headers(SSE_HEADERS, prepared))
        env = Envelope(cid, int(time.time()), req.model, req.include_usage)
        result = StreamResult()
        await until_disconnect(
            pump(ctx.send, first, batches, env, req.include_usage, result), ctx.receive
        )
        return


async def _first(batches: AsyncIterator[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The first batch: an upstream error before it is still a plain JSON error response."""
    try:
        return await batches.__anext__()
    except StopAsyncIteration:
        return []
    except BaseException:
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            await aclose()
        raise

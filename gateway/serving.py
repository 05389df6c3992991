"""Runs a plan against its providers and renders the answer: JSON, or SSE for streams.

Fallback happens only before the first byte reaches the caller; after that the stream either
completes or ends with an error event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import GatewayError, UpstreamTimeout, UpstreamUnreachable
from gateway.http import JSON_HEADERS, SSE_HEADERS, RawHeaders, until_disconnect
from gateway.metrics import RequestRecord
from gateway.routing import Plan
from gateway.schemas import CompletionRequest, apply_defaults
from gateway.sse import Envelope, StreamResult, pump
from providers.base import Prepared

if TYPE_CHECKING:
    from gateway.routes import Ctx
    from gateway.runtime import Runtime

DROPPED_HEADER = b"x-gateway-dropped-params"


def _prepare(ctx: Ctx, req: CompletionRequest, plan: Plan, attempt: int) -> Prepared:
    target = plan.targets[attempt]
    provider = ctx.runtime.providers[target.provider]
    return provider.prepare(apply_defaults(req, target.defaults), target)


def _headers(base: RawHeaders, prepared: Prepared) -> RawHeaders:
    if not prepared.dropped:
        return base
    return [*base, (DROPPED_HEADER, ",".join(prepared.dropped).encode())]


def reservation(rt: Runtime, req: CompletionRequest, plan: Plan) -> int:
    """The tokens a request may use: its prompts (the serving provider's tokenizer where the
    gateway has one, else 4 bytes a token) plus max_tokens for every generated choice."""
    target = plan.targets[0]
    max_tokens = req.max_tokens
    if "max_tokens" not in req.fields:
        max_tokens = target.defaults.get("max_tokens", max_tokens)
    if req.prompt_is_tokens:
        prompt = sum(map(len, req.prompts))
    else:
        texts: list[str] = req.prompts  # type: ignore[assignment]
        counted = rt.providers[target.provider].count_tokens(texts)
        prompt = sum(counted if counted is not None else [-(-len(t.encode()) // 4) for t in texts])
    return prompt + max_tokens * req.n_prompts * max(req.n, req.best_of or 1)


def _error_kind(err: GatewayError) -> str:
    if isinstance(err, UpstreamTimeout):
        return "timeout"
    if isinstance(err, UpstreamUnreachable):
        return "unreachable"
    return str(err.upstream_status or err.status)


async def serve_json(ctx: Ctx, req: CompletionRequest, plan: Plan, cid: str) -> None:
    rec: RequestRecord = ctx.record  # type: ignore[assignment]
    metrics = ctx.runtime.metrics
    for attempt, target in enumerate(plan.targets):
        prepared = _prepare(ctx, req, plan, attempt)
        provider = ctx.runtime.providers[target.provider]
        rec.provider = target.provider
        began = time.perf_counter()
        try:
            out = await until_disconnect(provider.complete(prepared), ctx.receive)
        except GatewayError as err:
            metrics.attempt(target.provider, _error_kind(err))
            if plan.should_fall_back(err, attempt):
                continue
            raise
        finally:
            rec.upstream_s += time.perf_counter() - began
        metrics.attempt(target.provider, None)
        rec.use(out.get("usage"))
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
    rec: RequestRecord = ctx.record  # type: ignore[assignment]
    metrics = ctx.runtime.metrics
    for attempt, target in enumerate(plan.targets):
        prepared = _prepare(ctx, req, plan, attempt)
        batches = ctx.runtime.providers[target.provider].stream(prepared).__aiter__()
        rec.provider = target.provider
        began = time.perf_counter()
        try:
            first = await until_disconnect(_first(batches), ctx.receive)
        except GatewayError as err:
            metrics.attempt(target.provider, _error_kind(err))
            if plan.should_fall_back(err, attempt):
                continue
            raise
        finally:
            rec.upstream_s += time.perf_counter() - began
        await ctx.start_stream(_headers(SSE_HEADERS, prepared))
        await _pump(ctx, req, cid, first, batches, rec)
        metrics.attempt(target.provider, None)
        return


async def _pump(
    ctx: Ctx,
    req: CompletionRequest,
    cid: str,
    first: list[dict[str, Any]],
    batches: AsyncIterator[list[dict[str, Any]]],
    rec: RequestRecord,
) -> None:
    """Streams the rest; the time not spent writing is time spent waiting on the provider."""
    env = Envelope(cid, int(time.time()), req.model, req.include_usage)
    result = StreamResult()
    began = time.perf_counter()
    try:
        await until_disconnect(
            pump(ctx.send, first, batches, env, req.include_usage, result), ctx.receive
        )
    finally:
        rec.upstream_s += time.perf_counter() - began - result.write_s
        rec.first_token = result.first_at
        rec.use(result.usage)
    if result.error is not None:
        rec.error_type = type(result.error).__name__


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

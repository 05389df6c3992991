"""Runs a plan against its providers and renders the answer: JSON, or SSE for streams.

Retries and fallback happen only before the first byte reaches the caller; after that the
stream either completes or ends with an error event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from gateway.attempts import Attempts, Call
from gateway.http import JSON_HEADERS, SSE_HEADERS, RawHeaders, until_disconnect
from gateway.metrics import RequestRecord
from gateway.routing import Plan
from gateway.schemas import CompletionRequest, apply_overrides
from gateway.sse import Envelope, StreamResult, pump
from providers.base import Prepared, Target

if TYPE_CHECKING:
    from gateway.routes import Ctx
    from gateway.runtime import Runtime

DROPPED_HEADER = b"x-gateway-dropped-params"
T = TypeVar("T")


def _headers(base: RawHeaders, prepared: Prepared) -> RawHeaders:
    if not prepared.dropped:
        return base
    return [*base, (DROPPED_HEADER, ",".join(prepared.dropped).encode())]


def reservation(rt: Runtime, req: CompletionRequest, plan: Plan) -> int:
    """The tokens a request may use: its prompts (the serving provider's tokenizer where the
    gateway has one, else 4 bytes a token) plus max_tokens for every generated choice."""
    leaf, target = plan.first()
    if leaf.overrides:
        req = apply_overrides(req, leaf.overrides, rt.config.server.limits)
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


async def _run(ctx: Ctx, req: CompletionRequest, plan: Plan, call: Call[T]) -> tuple[T, Prepared]:
    """The plan's attempts; a Portkey config's requests learn what answered, and after how
    many retries (also when nothing did)."""
    attempts = Attempts(ctx, req, plan, call)
    try:
        result = await attempts.run()
    finally:
        if plan.portkey and attempts.used is not None:
            ctx.out_headers = [*ctx.out_headers, *portkey_headers(attempts)]
    assert attempts.prepared is not None
    return result, attempts.prepared


def portkey_headers(attempts: Attempts[Any]) -> RawHeaders:
    assert attempts.used is not None
    return [
        (b"x-portkey-last-used-option-index", attempts.used.path.encode()),
        (b"x-portkey-retry-attempt-count", str(attempts.retries).encode()),
        (b"x-portkey-provider", attempts.used.provider.encode()),
    ]


async def serve_json(ctx: Ctx, req: CompletionRequest, plan: Plan, cid: str) -> None:
    providers = ctx.runtime.providers
    out, prepared = await _run(
        ctx, req, plan, lambda target, prepared: providers[target.provider].complete(prepared)
    )
    ctx.record.use(out.get("usage"))  # type: ignore[union-attr]
    await ctx.respond(200, orjson.dumps(_document(out, req, cid)), _headers(JSON_HEADERS, prepared))


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
    providers = ctx.runtime.providers
    streams: list[AsyncIterator[list[dict[str, Any]]]] = []

    async def start(target: Target, prepared: Prepared) -> list[dict[str, Any]]:
        """The first batch: until it comes, a failure can still be retried or fall back."""
        batches = providers[target.provider].stream(prepared).__aiter__()
        streams[:] = [batches]
        return await _first(batches)

    first, prepared = await _run(ctx, req, plan, start)
    await ctx.start_stream(_headers(SSE_HEADERS, prepared))
    await _pump(ctx, req, cid, first, streams[0], ctx.record)  # type: ignore[arg-type]


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

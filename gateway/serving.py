"""Runs a plan against its providers and renders the answer: JSON, or SSE for streams.

Retries and fallback happen only before the first byte reaches the caller; after that the
stream either completes or ends with an error event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from gateway.attempts import Attempts, Call, Prepare
from gateway.embeddings import (
    EmbeddingRequest,
    document,
    embedding_defaults,
    validate_embedding,
)
from gateway.http import JSON_HEADERS, SSE_HEADERS, RawHeaders, until_disconnect
from gateway.metrics import RequestRecord
from gateway.routing import Plan
from gateway.schemas import CompletionRequest, apply_defaults, apply_overrides
from gateway.sse import Envelope, StreamResult, pump
from gateway.strategy import Leaf
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
    prompt = input_tokens(rt, target, req.prompts, req.prompt_is_tokens)
    return prompt + max_tokens * req.n_prompts * max(req.n, req.best_of or 1)


def input_tokens(rt: Runtime, target: Target, inputs: Sequence[Any], is_tokens: bool) -> int:
    """Prompt or input tokens: token ids as they are, texts by the serving provider's
    tokenizer where the gateway has one, else 4 bytes a token."""
    if is_tokens:
        return sum(map(len, inputs))
    counted = rt.providers[target.provider].count_tokens(inputs)
    return sum(counted if counted is not None else [-(-len(t.encode()) // 4) for t in inputs])


def completion_preparer(rt: Runtime, req: CompletionRequest) -> Prepare:
    def prepare(leaf: Leaf, target: Target) -> Prepared:
        mine = req
        if leaf.overrides:
            mine = apply_overrides(mine, leaf.overrides, rt.config.server.limits)
        provider = rt.providers[target.provider]
        return provider.prepare(apply_defaults(mine, target.defaults), target)

    return prepare


def embedding_preparer(rt: Runtime, req: EmbeddingRequest) -> Prepare:
    def prepare(leaf: Leaf, target: Target) -> Prepared:
        mine = req
        if leaf.overrides:
            mine = validate_embedding({**req.fields, **leaf.overrides})
        provider = rt.providers[target.provider]
        return provider.prepare_embedding(embedding_defaults(mine, target.defaults), target)

    return prepare


def embedding_reservation(rt: Runtime, req: EmbeddingRequest, plan: Plan) -> int:
    """The tokens an embeddings request uses: its inputs, counted as prompts are."""
    _, target = plan.first()
    return input_tokens(rt, target, req.inputs, req.input_is_tokens)


async def serve_embeddings(ctx: Ctx, req: EmbeddingRequest, plan: Plan) -> None:
    providers = ctx.runtime.providers
    out, headers = await _answer(
        ctx, plan, lambda t, p: providers[t.provider].embed(p), embedding_preparer(ctx.runtime, req)
    )
    await ctx.respond(200, orjson.dumps(document(out["data"], out["usage"], req.model)), headers)


async def _answer(
    ctx: Ctx, plan: Plan, call: Call[dict[str, Any]], prepare: Prepare
) -> tuple[dict[str, Any], RawHeaders]:
    """A whole JSON answer, its usage recorded, and the headers it goes out with."""
    out, prepared = await _run(ctx, plan, call, prepare)
    ctx.record.use(out.get("usage"))  # type: ignore[union-attr]
    return out, _headers(JSON_HEADERS, prepared)


async def _run(ctx: Ctx, plan: Plan, call: Call[T], prepare: Prepare) -> tuple[T, Prepared]:
    """The plan's attempts; a Portkey config's requests learn what answered, and after how
    many retries (also when nothing did)."""
    attempts = Attempts(ctx, plan, call, prepare)
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
    out, headers = await _answer(
        ctx,
        plan,
        lambda t, p: providers[t.provider].complete(p),
        completion_preparer(ctx.runtime, req),
    )
    await ctx.respond(200, orjson.dumps(_document(out, req, cid)), headers)


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

    first, prepared = await _run(ctx, plan, start, completion_preparer(ctx.runtime, req))
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

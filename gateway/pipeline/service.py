"""Serves one inference request, top to bottom: parse the body, plan its routing, admit it
against the rate limits, run the plan's attempts (gateway.routing.attempts) and write the answer,
JSON or SSE for streams, then settle the rate limiter's reservation with what was used.

Retries and fallback happen only before the first byte reaches the caller; after that the
stream either completes or ends with an error event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import orjson

from core.answers import ChatChunk, ChatCompletion, Chunk, Completion, Embeddings
from core.chat import ChatRequest, apply_chat_defaults, apply_chat_overrides, parse_chat
from core.completions import CompletionRequest, apply_defaults, apply_overrides, parse_completion
from core.embeddings import (
    EmbeddingRequest,
    document,
    embedding_defaults,
    parse_embedding,
    validate_embedding,
)
from core.errors import GatewayError
from core.provider import ChatCall, CompletionCall, EmbeddingCall, Target
from gateway.asgi import JSON_HEADERS, SSE_HEADERS, RawHeaders, until_disconnect
from gateway.auth import Principal
from gateway.config import portkey
from gateway.config.portkey import PortkeyConfig
from gateway.metrics import RequestRecord
from gateway.pipeline.exchange import Inbound, Reply
from gateway.pipeline.shapes import chat_document, completion_document, envelope
from gateway.pipeline.sse import CHAT_CHUNK, Envelope, StreamResult, pump
from gateway.ratelimit import Grant
from gateway.routing.attempts import C, Prepare, SendCall
from gateway.routing.plans import CHAT, COMPLETIONS, EMBEDDINGS, Plan
from gateway.routing.trees import Leaf
from gateway.runtime import Runtime

DROPPED_HEADER = b"x-gateway-dropped-params"
T = TypeVar("T")
K = TypeVar("K", Chunk, ChatChunk)  # what a stream's batches hold
TEXT_CHUNK = "text_completion"  # a completions stream's chunks' `object`
# A chat without max_tokens may use what the context window leaves: the reservation assumes a
# typical answer, and is settled to what was used.
UNBOUNDED_RESERVE = 256
# What a chat message costs beyond its text when the gateway estimates (role, separators).
MESSAGE_OVERHEAD = 4


# ---------------------------------------------------------------- completions


async def complete(
    inbound: Inbound, reply: Reply, record: RequestRecord, principal: Principal, body: bytes
) -> None:
    rt = inbound.runtime
    config = _portkey_config(inbound)
    req = parse_completion(body, rt.config.server.limits)
    record.model, record.stream = rt.model_label(req.model), req.stream
    plan, grant = await _admitted(
        inbound, reply, record, principal, req.model, config, COMPLETIONS,
        lambda plan: reservation(rt, req, plan),
    )  # fmt: skip
    cid = "cmpl-" + inbound.ids.next()
    serve = _stream if req.stream else _json
    await _settled(grant, record, reply, serve(inbound, reply, record, req, plan, cid))


async def _json(
    inbound: Inbound,
    reply: Reply,
    record: RequestRecord,
    req: CompletionRequest,
    plan: Plan,
    cid: str,
) -> None:
    prepare = completion_preparer(inbound.runtime, req)
    call, answer = await _attempts(inbound, reply, record, plan, prepare, _complete)
    record.use(answer["usage"])
    doc = completion_document(answer, req.model, cid, int(time.time()), call.answer_shape)
    await reply.respond(200, orjson.dumps(doc), _headers(JSON_HEADERS, call.dropped))


def _complete(call: CompletionCall) -> Awaitable[Completion]:
    return call.complete()


async def _stream(
    inbound: Inbound,
    reply: Reply,
    record: RequestRecord,
    req: CompletionRequest,
    plan: Plan,
    cid: str,
) -> None:
    prepare = completion_preparer(inbound.runtime, req)
    call, (first, rest) = await _attempts(inbound, reply, record, plan, prepare, _first_batch)
    env = envelope(
        cid, int(time.time()), req.model, req.include_usage, TEXT_CHUNK, call.answer_shape
    )
    await _pumped(inbound, reply, record, call.dropped, env, first, rest)


async def _pumped(
    inbound: Inbound,
    reply: Reply,
    record: RequestRecord,
    dropped: tuple[str, ...],
    env: Envelope,
    first: list[K],
    rest: AsyncIterator[list[K]],
) -> None:
    """The stream written as SSE until it ends or the caller leaves; its time and usage
    recorded."""
    await reply.start_stream(_headers(SSE_HEADERS, dropped))
    result = StreamResult()
    began = time.perf_counter()
    try:
        await until_disconnect(
            pump(reply.send, first, rest, env, env.include_usage, result), inbound.receive
        )
    finally:  # the time not spent writing is time spent waiting on the provider
        record.upstream_s += time.perf_counter() - began - result.write_s
        record.first_token = result.first_at
        record.use(result.usage)
    if result.error is not None:
        record.error_type = type(result.error).__name__


class Streams(Protocol[K]):
    """A call that streams (completions, chat)."""

    @property
    def stream(self) -> Callable[[], AsyncIterator[list[K]]]: ...


async def _first_batch(call: Streams[K]) -> tuple[list[K], AsyncIterator[list[K]]]:
    """The stream and its first batch: until it comes, a failure is still a plain JSON error
    response, and the attempt can be retried or fall back."""
    batches = call.stream().__aiter__()
    try:
        return await batches.__anext__(), batches
    except StopAsyncIteration:
        return [], batches
    except BaseException:
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            await aclose()
        raise


def completion_preparer(rt: Runtime, req: CompletionRequest) -> Prepare[CompletionCall]:
    def prepare(leaf: Leaf, target: Target) -> CompletionCall:
        mine = req
        if leaf.overrides:
            mine = apply_overrides(mine, leaf.overrides, rt.config.server.limits)
        provider = rt.providers[target.provider]
        return provider.completion(apply_defaults(mine, target.defaults), target)

    return prepare


def reservation(rt: Runtime, req: CompletionRequest, plan: Plan) -> int:
    """The tokens a request may use: its prompts (the serving provider's tokenizer where the
    gateway has one, else 4 bytes a token) plus max_tokens for every generated choice."""
    leaf, target = plan.first()
    if leaf.overrides:
        req = apply_overrides(req, leaf.overrides, rt.config.server.limits)
    max_tokens = req.max_tokens
    default = target.defaults.get("max_tokens")  # validated with the config: an int
    if "max_tokens" not in req.fields and isinstance(default, int):
        max_tokens = default
    prompt = input_tokens(rt, target, req.prompts, req.prompt_is_tokens)
    return prompt + max_tokens * req.n_prompts * max(req.n, req.best_of or 1)


# ---------------------------------------------------------------- chat


async def chat(
    inbound: Inbound, reply: Reply, record: RequestRecord, principal: Principal, body: bytes
) -> None:
    rt = inbound.runtime
    config = _portkey_config(inbound)
    req = parse_chat(body, rt.config.server.limits)
    record.model, record.stream = rt.model_label(req.model), req.stream
    plan, grant = await _admitted(
        inbound, reply, record, principal, req.model, config, CHAT,
        lambda plan: chat_reservation(rt, req, plan),
    )  # fmt: skip
    cid = "chatcmpl-" + inbound.ids.next()
    serve = _chat_stream if req.stream else _chat_json
    await _settled(grant, record, reply, serve(inbound, reply, record, req, plan, cid))


async def _chat_json(
    inbound: Inbound, reply: Reply, record: RequestRecord, req: ChatRequest, plan: Plan, cid: str
) -> None:
    prepare = chat_preparer(inbound.runtime, req)
    call, answer = await _attempts(inbound, reply, record, plan, prepare, _complete_chat)
    record.use(answer["usage"])
    doc = chat_document(answer, req.model, cid, int(time.time()), call.answer_shape)
    await reply.respond(200, orjson.dumps(doc), _headers(JSON_HEADERS, call.dropped))


def _complete_chat(call: ChatCall) -> Awaitable[ChatCompletion]:
    return call.complete()


async def _chat_stream(
    inbound: Inbound, reply: Reply, record: RequestRecord, req: ChatRequest, plan: Plan, cid: str
) -> None:
    prepare = chat_preparer(inbound.runtime, req)
    call, (first, rest) = await _attempts(inbound, reply, record, plan, prepare, _first_batch)
    env = envelope(
        cid, int(time.time()), req.model, req.include_usage, CHAT_CHUNK, call.answer_shape
    )
    await _pumped(inbound, reply, record, call.dropped, env, first, rest)


def chat_preparer(rt: Runtime, req: ChatRequest) -> Prepare[ChatCall]:
    def prepare(leaf: Leaf, target: Target) -> ChatCall:
        mine = req
        if leaf.overrides:
            mine = apply_chat_overrides(mine, leaf.overrides, rt.config.server.limits)
        provider = rt.providers[target.provider]
        return provider.chat(apply_chat_defaults(mine, target.defaults), target)

    return prepare


def chat_reservation(rt: Runtime, req: ChatRequest, plan: Plan) -> int:
    """As `reservation`, for the chat's rendered prompt (the serving provider's count where the
    gateway has its tokenizer and template, else estimated from the messages' text)."""
    leaf, target = plan.first()
    if leaf.overrides:
        req = apply_chat_overrides(req, leaf.overrides, rt.config.server.limits)
    req = apply_chat_defaults(req, target.defaults)
    counted = rt.providers[target.provider].count_chat_tokens(req)
    prompt = counted if counted is not None else estimate_chat_tokens(req)
    return prompt + (req.max_tokens or UNBOUNDED_RESERVE) * req.n


def estimate_chat_tokens(req: ChatRequest) -> int:
    """4 bytes a token of each message's text, plus the role and separators."""
    size = sum(len(orjson.dumps(m.get("content"))) for m in req.messages)
    return -(-size // 4) + MESSAGE_OVERHEAD * len(req.messages)


# ---------------------------------------------------------------- embeddings


async def embed(
    inbound: Inbound, reply: Reply, record: RequestRecord, principal: Principal, body: bytes
) -> None:
    rt = inbound.runtime
    config = _portkey_config(inbound)
    req = parse_embedding(body)
    record.model = rt.model_label(req.model)
    plan, grant = await _admitted(
        inbound, reply, record, principal, req.model, config, EMBEDDINGS,
        lambda plan: embedding_reservation(rt, req, plan),
    )  # fmt: skip
    await _settled(grant, record, reply, _embeddings(inbound, reply, record, req, plan))


async def _embeddings(
    inbound: Inbound, reply: Reply, record: RequestRecord, req: EmbeddingRequest, plan: Plan
) -> None:
    prepare = embedding_preparer(inbound.runtime, req)
    call, answer = await _attempts(inbound, reply, record, plan, prepare, _embed)
    record.use(answer["usage"])
    doc = document(answer["data"], answer["usage"], req.model)
    await reply.respond(200, orjson.dumps(doc), _headers(JSON_HEADERS, call.dropped))


def _embed(call: EmbeddingCall) -> Awaitable[Embeddings]:
    return call.embed()


def embedding_preparer(rt: Runtime, req: EmbeddingRequest) -> Prepare[EmbeddingCall]:
    def prepare(leaf: Leaf, target: Target) -> EmbeddingCall:
        mine = req
        if leaf.overrides:
            mine = validate_embedding({**req.fields, **leaf.overrides})
        provider = rt.providers[target.provider]
        return provider.embedding(embedding_defaults(mine, target.defaults), target)

    return prepare


def embedding_reservation(rt: Runtime, req: EmbeddingRequest, plan: Plan) -> int:
    """The tokens an embeddings request uses: its inputs, counted as prompts are."""
    _, target = plan.first()
    return input_tokens(rt, target, req.inputs, req.input_is_tokens)


# ---------------------------------------------------------------- shared


def _portkey_config(inbound: Inbound) -> PortkeyConfig | None:
    """The request's `x-portkey-config` (checked before its body, as it always was)."""
    rt = inbound.runtime
    return portkey.from_headers(inbound.headers, rt.config.configs, rt.config.providers)


async def _admitted(
    inbound: Inbound,
    reply: Reply,
    record: RequestRecord,
    principal: Principal,
    model: str,
    config: PortkeyConfig | None,
    endpoint: str,
    reserve: Callable[[Plan], int],
) -> tuple[Plan, Grant]:
    """The request's routing plan (its Portkey config and virtual key honoured) and its
    admission against the rate limits, whose headers every answer of it carries."""
    rt = inbound.runtime
    virtual_key = inbound.headers.get("x-portkey-virtual-key")
    plan = rt.router.plan(principal, model, virtual_key, config, endpoint=endpoint)
    grant = await rt.limiter.admit(principal.key_id, model, record.model, lambda: reserve(plan))
    reply.add_headers(grant.headers)
    return plan, grant


def input_tokens(rt: Runtime, target: Target, inputs: Sequence[Any], is_tokens: bool) -> int:
    """Prompt or input tokens: token ids as they are, texts by the serving provider's
    tokenizer where the gateway has one, else 4 bytes a token."""
    if is_tokens:
        return sum(map(len, inputs))
    counted = rt.providers[target.provider].count_tokens(inputs)
    return sum(counted if counted is not None else [-(-len(t.encode()) // 4) for t in inputs])


async def _attempts(
    inbound: Inbound,
    reply: Reply,
    record: RequestRecord,
    plan: Plan,
    prepare: Prepare[C],
    send: SendCall[C, T],
) -> tuple[C, T]:
    """The plan's attempts: the call that answered and its answer (else the error). A Portkey
    config's requests learn what answered, and after how many retries (also when nothing did)."""
    if inbound.background:
        prepare = _in_background(prepare)
    outcome = await inbound.runtime.attempts.run(plan, prepare, send, inbound.receive, record)
    if plan.portkey and outcome.used is not None:
        reply.add_headers(
            [
                (b"x-portkey-last-used-option-index", outcome.used.path.encode()),
                (b"x-portkey-retry-attempt-count", str(outcome.retries).encode()),
                (b"x-portkey-provider", outcome.used.provider.encode()),
            ]
        )
    return outcome.result()


def _in_background(prepare: Prepare[C]) -> Prepare[C]:
    def background(leaf: Leaf, target: Target) -> C:
        return prepare(leaf, replace(target, background=True))

    return background


def _headers(base: RawHeaders, dropped: tuple[str, ...]) -> RawHeaders:
    if not dropped:
        return base
    return [*base, (DROPPED_HEADER, ",".join(dropped).encode())]


async def _settled(
    grant: Grant, record: RequestRecord, reply: Reply, serving: Awaitable[None]
) -> None:
    """Serve, then settle the rate limiter's reservation with what was used."""
    try:
        await serving
    except GatewayError:
        if not reply.started:
            grant.settle(0)  # refused or failed before any output: nothing was generated
        raise
    finally:
        grant.settle(record.total_tokens)  # None (unknown) keeps the reservation

"""The inference endpoints, one row each: what the pipeline (gateway.pipeline.stages) needs to
know of an endpoint, and nothing else does.

A row says how a body becomes its request (`parse`), how the request is prepared for one target
and bound to its provider (`prepare`), how much of the rate limits it may use (`reserve`), how
its answer is written as a JSON document, whether and how it streams (the chunks' `object`), its
ids' prefix, its batch URL, its metrics operation, its routing name and its OpenAPI entry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Never, Protocol, TypeVar

from core.answers import (
    ChatChunk,
    ChatCompletion,
    Chunk,
    Completion,
    Embeddings,
    ResponseAnswer,
    ResponseEvent,
)
from core.chat import ChatRequest, apply_chat_defaults, apply_chat_overrides, parse_chat
from core.completions import (
    CompletionRequest,
    RequestLimits,
    apply_defaults,
    apply_overrides,
    parse_completion,
)
from core.embeddings import (
    EmbeddingRequest,
    document,
    embedding_defaults,
    parse_embedding,
    validate_embedding,
)
from core.openapi import CHAT_DOC, COMPLETIONS_DOC, EMBEDDINGS_DOC, RESPONSES_DOC, InferenceDoc
from core.provider import AnswerShape, Call, Provider, Target
from core.replay import (
    chat_chunks,
    chat_of,
    completion_chunks,
    completion_of,
    response_events,
    response_of,
)
from core.responses import (
    ResponsesRequest,
    apply_responses_defaults,
    apply_responses_overrides,
    parse_responses,
    spoken,
)
from core.wire import Json
from gateway.asgi import Send
from gateway.auth import Principal
from gateway.metrics import OP_CHAT, OP_EMBEDDINGS, OP_RESPONSES, OP_TEXT_COMPLETION
from gateway.pipeline import conversation, estimates
from gateway.pipeline.events import pump_events
from gateway.pipeline.shapes import (
    chat_document,
    completion_document,
    pump_chunks,
    response_document,
)
from gateway.pipeline.sse import CHAT_CHUNK, Head, StreamResult
from gateway.routing import plans
from gateway.routing.plans import Plan
from gateway.routing.trees import Leaf
from gateway.runtime import Runtime

TEXT_CHUNK = "text_completion"  # a completions stream's chunks' `object`


class Parsed(Protocol):
    """What the stages read of any endpoint's request."""

    @property
    def model(self) -> str: ...

    @property
    def fields(self) -> Mapping[str, object]: ...


R = TypeVar("R", bound=Parsed)  # an endpoint's request
A = TypeVar("A", bound=Mapping[str, object])  # its answer
K = TypeVar("K", bound=Mapping[str, object])  # what its streams' batches hold
X = TypeVar("X", covariant=True)


class Make(Protocol[X]):
    """What is made of a row the same way for every endpoint, whatever its types (its handler,
    its batch lines' server)."""

    def __call__(self, endpoint: Endpoint[R, A, K], /) -> X: ...


# How a stream is written: its first batch, the rest, what every event repeats, and what it
# delivered (the usage, the first token's time), filled in as it goes.
Pump = Callable[[Send, list[K], AsyncIterator[list[K]], Head, StreamResult], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Streaming(Generic[R, K]):
    """How an endpoint streams: whether a request asked to, whether its stream ends with the
    usage chunk, its chunks' `object`, and how it is written."""

    wanted: Callable[[R], bool]
    include_usage: Callable[[R], bool]
    chunk_object: str
    pump: Pump[K] = pump_chunks


@dataclass(frozen=True, slots=True)
class Conversation(Generic[R, A, K]):
    """An endpoint whose answers the gateway stores and continues from (the Responses API):
    the request's earlier turns recalled, and its answer kept, when it asked to be."""

    # The request with its earlier turns, from the store (a 404 naming the id it continues).
    recall: Callable[[Runtime, Principal, R], Awaitable[R]]
    stored: Callable[[R], bool]  # whether its answer is kept
    # Its answer kept: the answer, and the document the caller got.
    keep: Callable[[Runtime, Principal, R, A, Mapping[str, object]], Awaitable[None]]
    final: Callable[[list[K]], A | None]  # a stream's answer, from the batch that ends it


@dataclass(frozen=True, slots=True)
class Caching(Generic[A, K]):
    """How the response cache holds an endpoint's answers (gateway.pipeline.caching)."""

    # Fields that do not change the answer: left out of the cache key (`stream` always is).
    neutral: frozenset[str] = frozenset(("user", "metadata", "stream_options"))
    sampled: bool = True  # its answers are sampled (temperature, seed, n) and may not repeat
    whole: Callable[[Sequence[K]], A | None] | None = None  # a stream's answer, if it ended
    chunks: Callable[[A], list[K]] | None = None  # an answer as a stream
    kept: Callable[[A], bool] = lambda answer: True  # whether a whole answer may be cached
    # A hit's answer, or each chunk of its stream, made current (in place: it is the hit's own
    # copy) with the time the hit is served.
    fresh: Callable[[Mapping[str, Any], int], None] | None = None


@dataclass(frozen=True, slots=True)
class Endpoint(Generic[R, A, K]):
    name: str  # what routing calls it (an alias's `endpoint:` serves some: gateway.routing.plans)
    paths: tuple[str, ...]  # where it is served
    batch_url: str  # a batch's `endpoint` for it
    operation: str  # the metrics' operation
    doc: InferenceDoc  # its OpenAPI entry
    parse: Callable[[bytes, RequestLimits], R]
    # The request as one leaf's target gets it (its overrides and defaults applied), bound to
    # the target's provider, ready to send. A retry prepares anew.
    prepare: Callable[[Runtime, R, Leaf, Target], Call[A, K]]
    # The tokens it may use (the rate limits, the budgets): its prompt's, and its answer's most.
    reserve: Callable[[Runtime, R, Plan], estimates.Reserve]
    # The JSON document of an answer: answer, the caller's model, id, created, its shape.
    document: Callable[[A, str, str, int, AnswerShape], Mapping[str, object]]
    id_prefix: str = ""  # its answers' ids ("" : they have none)
    streaming: Streaming[R, K] | None = None  # None: it does not stream
    conversation: Conversation[R, A, K] | None = None  # None: nothing is stored
    caching: Caching[A, K] = Caching()

    def made(self, make: Make[X]) -> X:
        return make(self)


# ---------------------------------------------------------------- how a request is prepared

Overrides = Mapping[str, object]


def _preparer(
    overridden: Callable[[R, Overrides, RequestLimits], R],
    defaulted: Callable[[R, Overrides], R],
    bind: Callable[[Provider, R, Target], Call[A, K]],
) -> Callable[[Runtime, R, Leaf, Target], Call[A, K]]:
    """An endpoint's `prepare`: the leaf's overrides, then the target's defaults, then the
    request bound to the target's provider."""

    def prepare(rt: Runtime, req: R, leaf: Leaf, target: Target) -> Call[A, K]:
        if leaf.overrides:
            req = overridden(req, leaf.overrides, rt.config.server.limits)
        return bind(rt.providers[target.provider], defaulted(req, target.defaults), target)

    return prepare


# ---------------------------------------------------------------- completions


COMPLETIONS: Endpoint[CompletionRequest, Completion, Chunk] = Endpoint(
    name=plans.COMPLETIONS,
    paths=("/v1/completions", "/completions"),
    batch_url="/v1/completions",
    operation=OP_TEXT_COMPLETION,
    doc=COMPLETIONS_DOC,
    parse=parse_completion,
    prepare=_preparer(apply_overrides, apply_defaults, lambda p, r, t: p.completion(r, t)),
    reserve=estimates.reservation,
    document=completion_document,
    id_prefix="cmpl-",
    streaming=Streaming(lambda r: r.stream, lambda r: r.include_usage, TEXT_CHUNK),
    caching=Caching(whole=completion_of, chunks=completion_chunks),
)


# ---------------------------------------------------------------- chat


CHAT: Endpoint[ChatRequest, ChatCompletion, ChatChunk] = Endpoint(
    name=plans.CHAT,
    paths=("/v1/chat/completions", "/chat/completions"),
    batch_url="/v1/chat/completions",
    operation=OP_CHAT,
    doc=CHAT_DOC,
    parse=parse_chat,
    prepare=_preparer(apply_chat_overrides, apply_chat_defaults, lambda p, r, t: p.chat(r, t)),
    reserve=estimates.chat_reservation,
    document=chat_document,
    id_prefix="chatcmpl-",
    streaming=Streaming(lambda r: r.stream, lambda r: r.include_usage, CHAT_CHUNK),
    caching=Caching(whole=chat_of, chunks=chat_chunks),
)


# ---------------------------------------------------------------- embeddings


def _parse_embedding(body: bytes, limits: RequestLimits) -> EmbeddingRequest:
    return parse_embedding(body)


def _embedding_overridden(
    req: EmbeddingRequest, overrides: Overrides, limits: RequestLimits
) -> EmbeddingRequest:
    return validate_embedding({**req.fields, **overrides})


def _embeddings_document(
    answer: Embeddings, model: str, cid: str, created: int, shape: AnswerShape
) -> Json:
    return document(answer["data"], answer["usage"], model)


EMBEDDINGS: Endpoint[EmbeddingRequest, Embeddings, Never] = Endpoint(
    name=plans.EMBEDDINGS,
    paths=("/v1/embeddings", "/embeddings"),
    batch_url="/v1/embeddings",
    operation=OP_EMBEDDINGS,
    doc=EMBEDDINGS_DOC,
    parse=_parse_embedding,
    prepare=_preparer(_embedding_overridden, embedding_defaults, lambda p, r, t: p.embedding(r, t)),
    reserve=estimates.embedding_reservation,
    document=_embeddings_document,
    caching=Caching(sampled=False),
)


# ---------------------------------------------------------------- responses


def _completed_now(answer_or_event: Mapping[str, Any], now: int) -> None:
    """A hit's response completes when it is served (an event carries it as `response`)."""
    response = answer_or_event.get("response", answer_or_event)
    echo = response.get("echo") if isinstance(response, Mapping) else None
    if isinstance(echo, dict) and echo.get("completed_at") is not None:
        echo["completed_at"] = now


RESPONSES: Endpoint[ResponsesRequest, ResponseAnswer, ResponseEvent] = Endpoint(
    name=plans.RESPONSES,
    paths=("/v1/responses", "/responses"),
    batch_url="/v1/responses",
    operation=OP_RESPONSES,
    doc=RESPONSES_DOC,
    parse=parse_responses,
    prepare=_preparer(
        apply_responses_overrides,
        apply_responses_defaults,
        lambda p, r, t: p.responses(spoken(r), t),
    ),
    reserve=estimates.responses_reservation,
    document=response_document,
    id_prefix="resp_",
    # A response's usage is in its last event, always.
    streaming=Streaming(lambda r: r.stream, lambda r: True, "response", pump_events),
    conversation=Conversation(
        conversation.recall, conversation.stored, conversation.keep, conversation.final
    ),
    # A response echoes its metadata and user: they are part of its answer here. A failed one
    # is never cached.
    caching=Caching(
        neutral=frozenset(("stream_options",)),
        whole=response_of,
        chunks=response_events,
        kept=lambda answer: answer["status"] in ("completed", "incomplete"),
        fresh=_completed_now,
    ),
)


# The table: every inference endpoint, in the API document's order.
AnyEndpoint = (
    Endpoint[CompletionRequest, Completion, Chunk]
    | Endpoint[ChatRequest, ChatCompletion, ChatChunk]
    | Endpoint[EmbeddingRequest, Embeddings, Never]
    | Endpoint[ResponsesRequest, ResponseAnswer, ResponseEvent]
)
ENDPOINTS: tuple[AnyEndpoint, ...] = (COMPLETIONS, CHAT, EMBEDDINGS, RESPONSES)

"""The provider contract: what the gateway asks of every adapter, and what it gets back.

An adapter serves requests for its targets in two steps. `prepare` (`prepare_chat`,
`prepare_embedding`) maps a validated request for one target by the adapter's rules, without any
I/O, into a `Prepared` whose `state` is the adapter's own (the upstream body, the engine's
settings); a field it cannot serve is an InvalidRequest there, before anything is sent.
`complete`/`stream`, `complete_chat`/`stream_chat` and `embed` then send it and return the
canonical answers of `core.answers`. An adapter implements the endpoints it serves: `Adapter`
refuses the others.

The gateway holds providers of many kinds side by side, so it sees each through `Provider`:
`completion`, `chat` and `embedding` return the prepared request bound to its adapter (a `Call`),
ready to send, whatever the adapter's state is. `Adapter` does that binding for every adapter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import ClassVar, Generic, Literal, Never, Protocol, TypeVar

from core.answers import (
    ChatChunk,
    ChatCompletion,
    Chunk,
    Completion,
    Embeddings,
    ResponseAnswer,
    ResponseEvent,
)
from core.chat import ChatRequest
from core.chat_bridge import chat_request, renamed, response_of
from core.chat_events import events
from core.completions import CompletionRequest
from core.embeddings import EmbeddingRequest
from core.errors import ConfigError, GatewayError, InvalidRequest
from core.responses import ResponsesRequest

# What a model does with a field its target cannot serve: a 400, or drop it (and say so).
Policy = Literal["reject", "drop"]
# How a provider's answers are written to the caller: in OpenAI's shape, or in the shape of
# vLLM's own server (each of its fields on every answer, null when not set, and its placing of
# `system_fingerprint`), for callers written against `vllm serve`.
AnswerShape = Literal["openai", "vllm"]
ANSWER_SHAPES: tuple[AnswerShape, ...] = ("openai", "vllm")


def parse_answer_shape(value: object, path: str, default: AnswerShape) -> AnswerShape:
    """A provider block's `answer_shape` (None: `default`)."""
    if value is None:
        return default
    for shape in ANSWER_SHAPES:
        if value == shape:
            return shape
    raise ConfigError(path, f"expected one of {', '.join(ANSWER_SHAPES)}, got {value!r}")


S = TypeVar("S")  # an adapter's state for a prepared completion
E = TypeVar("E")  # an adapter's state for a prepared embeddings request
H = TypeVar("H")  # an adapter's state for a prepared chat completion


@dataclass(frozen=True, slots=True)
class Target:
    """One place a model alias can be served from (built at startup, from config)."""

    alias: str  # what the caller asked for
    provider: str  # provider name in config (also its virtual key)
    model: str  # model id at the provider
    # A whole JSON answer; for a stream, each wait for its next output (its length is the
    # caller's max_tokens, so it has no total deadline).
    timeout_s: float = 60.0
    unsupported_params: Policy = "reject"
    defaults: Mapping[str, object] = field(default_factory=dict)  # request fields, validated
    connect_s: float | None = None  # opening a connection; None: the provider's own setting
    first_byte_s: float | None = None  # until the answer begins; None: timeout_s
    # Served for a batch, not a waiting caller: a provider that can tell its work apart (the
    # engine's priority) serves it after live requests.
    background: bool = False
    # This try's W3C traceparent when its request is traced ("": it is not): an upstream gets it
    # as a header, the in-process engine as vLLM's trace headers.
    trace: str = ""
    # How errors name this target: provider and upstream model (made once: read per request).
    label: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", f"{self.provider}/{self.model}")

    def traced(self, trace: str) -> Target:
        """This target for one try sent with `trace` (made per try: a copy of the checked
        fields, without `replace`'s new init, in half its time)."""
        copy = object.__new__(Target)
        for name in _COPIED:
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "trace", trace)
        return copy


_COPIED = tuple(f.name for f in fields(Target) if f.name != "trace")


@dataclass(slots=True)  # built per request: a frozen one takes 4x as long to build
class Prepared(Generic[S]):
    """A request as an adapter mapped it for one target; `dropped` names the fields not
    forwarded (the response's x-gateway-dropped-params header)."""

    target: Target
    dropped: tuple[str, ...]
    state: S


A = TypeVar("A")  # an endpoint's answer
K = TypeVar("K")  # what its streams' batches hold


@dataclass(slots=True)  # built per request: a frozen one takes 4x as long to build
class Call(Generic[A, K]):
    """A request prepared for one target, ready to send (a retry prepares anew: an adapter's
    state is one attempt's). `stream` is None for an endpoint that does not stream."""

    target: Target
    dropped: tuple[str, ...]
    complete: Callable[[], Awaitable[A]]
    stream: Callable[[], AsyncIterator[list[K]]] | None = None
    answer_shape: AnswerShape = "openai"


# Names for the types, not constructors: an instance made through a subscripted generic costs
# four times as much (typing tries to set `__orig_class__` on it, which slots refuse).
CompletionCall = Call[Completion, Chunk]
ChatCall = Call[ChatCompletion, ChatChunk]
EmbeddingCall = Call[Embeddings, Never]
ResponsesCall = Call[ResponseAnswer, ResponseEvent]


class Provider(Protocol):
    """A configured provider, as the gateway holds it."""

    name: str
    # A config reload may build a second instance beside the running one (which serves the
    # requests in flight, then closes). False: it holds what cannot be had twice (a model in
    # memory), so its block changes only with a restart.
    reloadable: ClassVar[bool]

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def ready(self) -> bool: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Each text's prompt tokens as this provider counts them, if it can tell without I/O
        (the rate limiter's reservation); None: the gateway estimates."""
        ...

    def count_chat_tokens(self, request: ChatRequest) -> int | None:
        """The tokens of the chat's rendered prompt, if this provider can tell without I/O;
        None: the gateway estimates."""
        ...

    def completion(self, request: CompletionRequest, target: Target) -> CompletionCall:
        """The request prepared for `target`; InvalidRequest before any I/O."""
        ...

    def chat(self, request: ChatRequest, target: Target) -> ChatCall:
        """As `completion`, for chat."""
        ...

    def embedding(self, request: EmbeddingRequest, target: Target) -> EmbeddingCall:
        """As `completion`; an InvalidRequest naming `model` if the target does not serve
        embeddings."""
        ...

    def responses(self, request: ResponsesRequest, target: Target) -> ResponsesCall:
        """As `completion`, for the Responses API (served as a chat where the target speaks
        chat only)."""
        ...


class Adapter(Generic[S, E, H]):
    """The base of every adapter: its two steps per endpoint, typed by its own states, bound
    into the calls the gateway sends."""

    name: str
    type_tags: ClassVar[tuple[str, ...]]  # the config `type:` tags it serves
    reloadable: ClassVar[bool] = True
    answer_shape: AnswerShape = "openai"

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def ready(self) -> bool:
        return True

    @classmethod
    def shared_core(
        cls, name: str, type_tag: str, settings: Mapping[str, object], path: str, workers: int
    ) -> SharedCore | None:
        return None

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        return None

    def count_chat_tokens(self, request: ChatRequest) -> int | None:
        return None

    # An adapter implements the endpoints it serves; for the others, these refuse (a 400 naming
    # `model`) before anything is sent. `complete_…`/`stream_…` are reached only through a
    # prepared request, so only the `prepare_…` steps need a refusal of their own.

    def prepare(self, request: CompletionRequest, target: Target) -> Prepared[S]:
        """Apply the adapter's rules; raise InvalidRequest/UnsupportedParameter before any I/O."""
        raise unserved(target, "completions")

    async def complete(self, prepared: Prepared[S]) -> Completion:
        raise NotImplementedError

    def stream(self, prepared: Prepared[S]) -> AsyncIterator[list[Chunk]]:
        raise NotImplementedError

    def prepare_chat(self, request: ChatRequest, target: Target) -> Prepared[H]:
        """As `prepare`, for chat."""
        raise unserved(target, "chat completions")

    async def complete_chat(self, prepared: Prepared[H]) -> ChatCompletion:
        raise NotImplementedError

    def stream_chat(self, prepared: Prepared[H]) -> AsyncIterator[list[ChatChunk]]:
        raise NotImplementedError

    def prepare_embedding(self, request: EmbeddingRequest, target: Target) -> Prepared[E]:
        """As `prepare`, for embeddings."""
        raise unserved(target, "embeddings")

    async def embed(self, prepared: Prepared[E]) -> Embeddings:
        raise NotImplementedError

    def completion(self, request: CompletionRequest, target: Target) -> CompletionCall:
        prepared = self.prepare(request, target)
        return Call(
            target,
            prepared.dropped,
            partial(self.complete, prepared),
            partial(self.stream, prepared),
            self.answer_shape,
        )

    def chat(self, request: ChatRequest, target: Target) -> ChatCall:
        prepared = self.prepare_chat(request, target)
        return Call(
            target,
            prepared.dropped,
            partial(self.complete_chat, prepared),
            partial(self.stream_chat, prepared),
            self.answer_shape,
        )

    def embedding(self, request: EmbeddingRequest, target: Target) -> EmbeddingCall:
        prepared = self.prepare_embedding(request, target)
        return Call(target, prepared.dropped, partial(self.embed, prepared))

    def responses(self, request: ResponsesRequest, target: Target) -> ResponsesCall:
        """A Responses request, served as the chat it means (core.chat_bridge): an adapter
        whose targets speak the Responses API themselves overrides this."""
        made = chat_request(request, target.label, target.unsupported_params == "drop")
        try:
            call = self.chat(made.chat, target)
        except GatewayError as exc:
            raise renamed(exc) from None
        return bridged(call, request, made.dropped)


def bridged(chat: ChatCall, req: ResponsesRequest, dropped: tuple[str, ...]) -> ResponsesCall:
    """A chat call, answering as the Responses call `req` made: its answer a response, its
    stream the Responses events (core.chat_events); `dropped`: what the bridge left out,
    beside what the chat's target did. An error naming a chat field names the Responses one."""
    stream = chat.stream
    assert stream is not None, "a chat streams"

    async def complete() -> ResponseAnswer:
        try:
            return response_of(await chat.complete(), req)
        except GatewayError as exc:
            raise renamed(exc) from None

    async def streamed() -> AsyncIterator[list[ResponseEvent]]:
        try:
            async for batch in events(stream(), req):
                yield batch
        except GatewayError as exc:
            raise renamed(exc) from None

    return Call(chat.target, chat.dropped + dropped, complete, streamed, chat.answer_shape)


def unserved(target: Target, endpoint: str) -> InvalidRequest:
    """What a caller hears when the target's adapter does not serve the endpoint (worded as the
    engine words an endpoint its model cannot do)."""
    return InvalidRequest(f"Target '{target.label}' does not serve {endpoint}.", param="model")


# With `--workers N`, what a provider runs once for all of a pod's workers (an engine's core)
# reaches each worker as its slot: this variable holds, as JSON, every such provider's slot for
# the worker's process (provider name → the slot's fields, with `status_fd`, the pipe on which the
# serving process reports the core's `CoreStatus` as (status, detail) pairs).
SLOTS_ENV = "GATEWAY_SHARED_SLOTS"
CoreStatus = Literal["ready", "failed", "dead"]


class SharedCore(Protocol):
    """A provider's part that the workers of one pod share (the engine's core): the serving
    process launches it once, watches it, and stops it after the workers."""

    name: str

    def slot(self, index: int) -> Mapping[str, object]:
        """What worker `index` needs to reach the core (JSON values)."""
        ...

    def launch(self) -> None:
        """Start the core and block until it serves; raise when it cannot."""
        ...

    def sentinels(self) -> list[int]:
        """Handles that become ready when the core's processes end."""
        ...

    def shutdown(self, timeout: float) -> None: ...


class ProviderClass(Protocol):
    """An adapter class, as the registry holds it: the `type:` tags it serves, and how a
    provider of it is checked and built from its config block."""

    # Attributes of the class object (a protocol cannot ask a class for its ClassVars).
    type_tags: tuple[str, ...]
    reloadable: bool

    @classmethod
    def check_config(cls, type_tag: str, settings: Mapping[str, object], path: str) -> None:
        """Validate the block without building anything; raise ConfigError naming the YAML
        path."""
        ...

    @classmethod
    def from_config(
        cls, name: str, type_tag: str, settings: Mapping[str, object], path: str
    ) -> Provider:
        """Build from the block (no I/O until `start`); raise ConfigError naming the path."""
        ...

    @classmethod
    def shared_core(
        cls, name: str, type_tag: str, settings: Mapping[str, object], path: str, workers: int
    ) -> SharedCore | None:
        """What `workers` > 1 worker processes share of this provider, run by the serving
        process; None: each worker builds the whole provider."""
        ...

"""`OpenAICompatProvider`: serves completions, chat and embeddings from an OpenAI-compatible HTTP
upstream.

One instance per configured provider: its dialect, URLs, headers and connection pool are fixed
at construction, so a request only maps its fields (`prepare`), makes one call and normalizes
the answer (`complete` / `stream`). Each prepared request holds its URL: the provider's, or on
Azure OpenAI with an api-version, its model's deployment's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import orjson

from core.answers import ChatChunk, ChatCompletion, Chunk, Completion, Embeddings
from core.chat import ChatRequest
from core.completions import CONTEXT, CompletionRequest
from core.embeddings import EmbeddingRequest
from core.errors import ConfigError, ContextLengthExceeded, GatewayError, InvalidRequest
from core.messages import first_media_part
from core.provider import Adapter, Prepared, ResponsesCall, Target
from core.responses import ResponsesRequest
from core.wire import Json
from providers.openai_compat import responses as native
from providers.openai_compat.chat_normalize import (
    ChatNormalization,
    ChatStreamNormalizer,
    chat_answer,
    chat_extras,
)
from providers.openai_compat.context_guard import ContextGuard
from providers.openai_compat.dialects import DIALECTS, DialectSpec
from providers.openai_compat.embeddings import RULES as EMBEDDING_RULES
from providers.openai_compat.embeddings import Arrays, answer
from providers.openai_compat.emulate import completion_room, select_best
from providers.openai_compat.normalize import (
    PLAIN_EXTRAS,
    Normalization,
    StreamNormalizer,
    choices,
    extras_for,
    finish,
)
from providers.openai_compat.settings import Settings, Urls, parse_settings
from providers.rules.chat import RULES as CHAT_RULES
from providers.rules.params import Applied, Dialect, apply_rules
from providers.rules.responses import RULES as RESPONSES_RULES
from providers.transport.client import UpstreamClient

T = TypeVar("T")
Post = Callable[[bytes, Target, str], Awaitable[T]]  # the client's post_json or open_stream

# Fields the adapter writes itself from the validated request, whatever the dialect says.
SELF_SET = ("model", "max_tokens", "stream")
CHAT_SELF_SET = ("model", "stream")
Event = TypeVar("Event")


@dataclass(slots=True)  # built per request: a frozen one takes 4x as long to build
class UpstreamCompletion:
    """A completion mapped for one target: `Prepared.state`."""

    body: Mapping[str, Any]  # the upstream body, kept for a truncate retry
    payload: bytes  # the same, serialized once
    shape: Normalization
    best_of: int  # candidates per prompt when best_of is emulated, else 0
    truncate: bool  # emulate context_length_exceeded_behavior="truncate"
    check_context: bool  # "error" on an upstream that clamps: count the prompt first
    request: CompletionRequest  # as validated: best_of's ranking and the context check read it
    url: str  # where it goes


@dataclass(slots=True)  # built per request: a frozen one takes 4x as long to build
class UpstreamChat:
    """A chat completion mapped for one target: `Prepared.state`."""

    body: Mapping[str, Any]  # the upstream body, kept for a truncate retry
    payload: bytes
    shape: ChatNormalization
    truncate: bool  # emulate context_length_exceeded_behavior="truncate"
    check_context: bool  # "error" on an upstream that clamps: count the rendered prompt first
    request: ChatRequest
    url: str  # where it goes


@dataclass(slots=True)  # built per request: a frozen one takes 4x as long to build
class UpstreamEmbedding:
    """An embeddings request mapped for one target: `Prepared.state`."""

    payload: bytes
    count: int  # embeddings expected: one per input
    encoding: str  # what the caller gets: "float" or "base64"
    url: str  # where it goes


class OpenAICompatProvider(Adapter[UpstreamCompletion, UpstreamEmbedding, UpstreamChat]):
    type_tags: ClassVar[tuple[str, ...]] = (
        "openai",
        "fireworks",
        "vllm-server",
        "openai-compatible",
        "azure-openai",
    )
    reloadable: ClassVar[bool] = True

    def __init__(self, name: str, spec: DialectSpec, settings: Settings) -> None:
        self.name = name
        self.spec = spec
        self.answer_shape = settings.answer_shape
        self._embedding_rules = EMBEDDING_RULES[spec.name]
        self._chat_rules = CHAT_RULES[spec.name]
        self._responses_rules = RESPONSES_RULES.get(spec.name, {})
        # Every model's URLs; None on Azure with an api-version: each model's deployment's.
        self._urls = settings.urls
        self._deployments = settings.deployments
        # The per-choice keys kept from every answer: vLLM's stop_reason, the dialect's own.
        self._choice_extras = (*PLAIN_EXTRAS, *spec.choice_extras)
        self._chat_choice_extras = ("stop_reason", *spec.choice_extras)
        self._client = UpstreamClient(
            settings.url,
            settings.headers,
            max_connections=settings.max_connections,
            connect_timeout_s=settings.connect_timeout_s,
            max_response_bytes=settings.max_response_bytes,
            secret=settings.api_key,
            idle_timeout_s=settings.idle_timeout_s,
            tls=settings.tls,
            proxy=settings.proxy,
            name=name,
        )
        self._guard = None
        if spec.clamps_max_tokens:
            self._guard = ContextGuard(self._client, settings.base_url, settings.query)

    @classmethod
    def check_config(cls, type_tag: str, settings: Mapping[str, Any], path: str) -> None:
        cls._parsed(type_tag, settings, path)

    @classmethod
    def from_config(
        cls, name: str, type_tag: str, settings: Mapping[str, Any], path: str
    ) -> OpenAICompatProvider:
        return cls(name, *cls._parsed(type_tag, settings, path))

    @classmethod
    def _parsed(
        cls, type_tag: str, settings: Mapping[str, Any], path: str
    ) -> tuple[DialectSpec, Settings]:
        spec = DIALECTS.get(type_tag)
        if spec is None:
            known = ", ".join(cls.type_tags)
            raise ConfigError(f"{path}.type", f"{type_tag!r} is not one of {known}")
        return spec, parse_settings(settings, path, spec.answer_shapes, spec.azure_addressing)

    async def start(self) -> None:
        await self._client.start()

    async def aclose(self) -> None:
        await self._client.aclose()

    def ready(self) -> bool:
        return self._client.ready()

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        return None  # the tokenizer is the upstream's

    # ------------------------------------------------------------ mapping

    def _deployment(self, target: Target) -> Urls:
        """The URLs of the target's model's deployment (Azure with an api-version); a model
        without one is the caller's 400, before anything is sent."""
        urls = self._deployments.get(target.model)
        if urls is None:
            raise InvalidRequest(
                f"Target '{target.label}': the model '{target.model}' has no deployment on "
                f"Azure OpenAI provider '{self.name}' (providers.{self.name}.deployments).",
                param="model",
            )
        return urls

    def prepare(self, request: CompletionRequest, target: Target) -> Prepared[UpstreamCompletion]:
        spec = self.spec
        urls = self._urls or self._deployment(target)
        applied = self._mapped(spec.rules, spec.request_checks, request, target, SELF_SET)
        body = applied.body
        body["max_tokens"] = request.max_tokens  # explicit: Fireworks' default is not OpenAI's 16
        best_of = _emulate_best_of(request, applied.emulated, body)
        behavior = request.fields.get(CONTEXT)
        truncate = CONTEXT in applied.emulated and behavior == "truncate"
        check_context = self._guard is not None and behavior == "error"  # asked: vLLM's own else
        stops = request.stop if spec.stop_may_be_included else ()
        want_logprobs = request.logprobs is not None
        continuous = bool(body.get("stream_options", {}).get("continuous_usage_stats"))
        shape = Normalization(
            target.label,
            want_logprobs,
            stops,
            _echoed(request),
            request.n,
            continuous,
            extras_for(request.fields, self._choice_extras),
            keep_empty=self.answer_shape == "vllm",
            await_fingerprint=self.answer_shape == "vllm" and not request.include_usage,
            upstream_extras=spec.answer_extras,
        )
        payload = orjson.dumps(body)
        plan = UpstreamCompletion(
            body, payload, shape, best_of, truncate, check_context, request, urls.completions
        )
        return Prepared(target, applied.dropped, plan)

    def prepare_chat(self, request: ChatRequest, target: Target) -> Prepared[UpstreamChat]:
        spec = self.spec
        urls = self._urls or self._deployment(target)
        applied = self._mapped(self._chat_rules, spec.chat_checks, request, target, CHAT_SELF_SET)
        body = applied.body
        behavior = request.fields.get(CONTEXT)
        bounded = request.max_tokens is not None  # without a bound the upstream fits the window
        truncate = CONTEXT in applied.emulated and behavior == "truncate" and bounded
        check_context = self._guard is not None and behavior == "error" and bounded
        if "max_completion_tokens" in body:
            body.pop("max_tokens", None)  # the bound that wins, alone: Fireworks refuses both
        choice_extras, answer_extras = chat_extras(request.fields, self._chat_choice_extras)
        continuous = bool(body.get("stream_options", {}).get("continuous_usage_stats"))
        stop = request.fields.get("stop", ())
        stops = ((stop,) if type(stop) is str else tuple(stop)) if spec.stop_may_be_included else ()
        shape = ChatNormalization(
            target.label,
            request.logprobs,
            continuous,
            choice_extras,
            answer_extras,
            stops,
            await_fingerprint=self.answer_shape == "vllm" and not request.include_usage,
            upstream_extras=spec.answer_extras,
        )
        payload = orjson.dumps(body)
        plan = UpstreamChat(body, payload, shape, truncate, check_context, request, urls.chat)
        return Prepared(target, applied.dropped, plan)

    def _mapped(
        self,
        rules: Dialect,
        checks: Callable[[Mapping[str, Any]], None] | None,
        request: CompletionRequest | ChatRequest,
        target: Target,
        skip: tuple[str, ...],
    ) -> Applied:
        """The request's fields mapped by the dialect's rules (after its own checks), with what
        every generation request sends whatever it asked: the target's model, whether it
        streams, usage in streams (accounting needs it), and the context behaviour where the
        upstream's default is not OpenAI's "error"."""
        if checks is not None:
            checks(request.fields)
        applied = apply_rules(
            rules,
            request.fields,
            target=target.label,
            policy=target.unsupported_params,
            skip=skip,
        )
        body = applied.body
        body["model"] = target.model
        body["stream"] = request.stream
        if request.stream and not self.spec.usage_on_last_chunk:
            body.setdefault("stream_options", {"include_usage": True})
        if self.spec.needs_explicit_context_behavior:
            body.setdefault(CONTEXT, "error")
        return applied

    def responses(self, request: ResponsesRequest, target: Target) -> ResponsesCall:
        """Passed through where the upstream serves the Responses API itself; else served as
        the chat it means (the contract's way)."""
        how = self.spec.responses
        if how is None:
            return super().responses(request, target)
        urls = self._urls or self._deployment(target)
        sent = native.body(self._responses_rules, how, self.name, request, target)
        exchange = native.Exchange(self._client, urls.responses, sent, request, target, self.name)
        return native.call(exchange, self.answer_shape)

    def prepare_embedding(
        self, request: EmbeddingRequest, target: Target
    ) -> Prepared[UpstreamEmbedding]:
        urls = self._urls or self._deployment(target)
        applied = apply_rules(
            self._embedding_rules,
            request.fields,
            target=target.label,
            policy=target.unsupported_params,
            skip=("model",),
        )
        body = applied.body
        body["model"] = target.model
        count, encoding = len(request.inputs), request.encoding_format
        plan = UpstreamEmbedding(orjson.dumps(body), count, encoding, urls.embeddings)
        return Prepared(target, applied.dropped, plan)

    # ------------------------------------------------------------ serving

    async def embed(self, prepared: Prepared[UpstreamEmbedding]) -> Embeddings:
        plan = prepared.state
        target = prepared.target
        url = plan.url
        if plan.encoding != "float":
            body = await self._client.call_json("POST", url, plan.payload, target)
            return answer(body, plan.count, plan.encoding, target.label)
        raw = await self._client.call_raw("POST", url, plan.payload, target)
        arrays = Arrays(raw)
        try:
            skeleton = self._client.document(arrays.skeleton, target.label)
        except GatewayError:  # an error answer: in its own words, arrays and all
            self._client.document(raw, target.label)
            raise
        return answer(skeleton, plan.count, plan.encoding, target.label, arrays)

    async def complete(self, prepared: Prepared[UpstreamCompletion]) -> Completion:
        plan = prepared.state
        body = await self._send(prepared, self._client.post_json)
        picked = choices(body, plan.shape)
        if plan.best_of:
            req = plan.request
            picked = select_best(picked, plan.best_of, req.n, req.prompts, req.echo)
        return finish(body, picked, plan.shape)

    async def stream(
        self, prepared: Prepared[UpstreamCompletion]
    ) -> AsyncGenerator[list[Chunk], None]:
        plan = prepared.state
        opened = await self._send(prepared, self._client.open_stream)
        normalizer = StreamNormalizer(plan.shape)
        try:
            yield []  # the upstream accepted: the caller's headers can go out now
            async with aclosing(self._client.batches(opened, prepared.target)) as batches:
                async for events in batches:
                    out, failure = _normalized(normalizer.feed, events)
                    if out:  # what came before a bad event still reaches the caller
                        yield out
                    if failure is not None:
                        raise failure
            last = normalizer.end()
            if last:
                yield last
        finally:
            await opened.aclose()  # a no-op after a complete stream; cuts the upstream off

    async def complete_chat(self, prepared: Prepared[UpstreamChat]) -> ChatCompletion:
        body = await self._send_chat(prepared, self._client.post_json)
        return chat_answer(body, prepared.state.shape)

    async def stream_chat(
        self, prepared: Prepared[UpstreamChat]
    ) -> AsyncGenerator[list[ChatChunk], None]:
        opened = await self._send_chat(prepared, self._client.open_stream)
        normalizer = ChatStreamNormalizer(prepared.state.shape)
        try:
            yield []  # the upstream accepted: the caller's headers can go out now
            async with aclosing(self._client.batches(opened, prepared.target)) as batches:
                async for events in batches:
                    out, failure = _normalized(normalizer.feed, events)
                    if out:
                        yield out
                    if failure is not None:
                        raise failure
            last = normalizer.end()
            if last:
                yield last
        finally:
            await opened.aclose()

    async def _send_chat(self, prepared: Prepared[UpstreamChat], post: Post[T]) -> T:
        """As `_send`, for chat: the rendered prompt checked where the upstream clamps, and one
        retry with the room left for an emulated "truncate". A chat's prompt is its messages:
        an upstream's context error names them."""
        try:
            return await self._post_chat(prepared, post)
        except ContextLengthExceeded as err:
            err.param = "messages"
            raise
        except InvalidRequest as err:
            _name_the_media(err, prepared.state.request)
            raise

    async def _post_chat(self, prepared: Prepared[UpstreamChat], post: Post[T]) -> T:
        plan = prepared.state
        target = prepared.target
        max_tokens = plan.request.max_tokens
        if plan.check_context and self._guard is not None and max_tokens is not None:
            await self._guard.check_chat(plan.request.fields, max_tokens, target)
        try:
            return await post(plan.payload, target, plan.url)
        except ContextLengthExceeded as err:
            payload = _truncated_chat(plan, err) if plan.truncate else None
            if payload is None:
                raise
        return await post(payload, target, plan.url)

    async def _send(self, prepared: Prepared[UpstreamCompletion], post: Post[T]) -> T:
        """One upstream call (after the context check, if needed); with emulated "truncate", one
        retry with the room that is left."""
        plan = prepared.state
        target = prepared.target
        if plan.check_context and self._guard is not None:
            req = plan.request
            await self._guard.check(req.prompts, req.max_tokens, target)
        try:
            return await post(plan.payload, target, plan.url)
        except ContextLengthExceeded as err:
            payload = _truncated(plan, err) if plan.truncate else None
            if payload is None:
                raise
        return await post(payload, target, plan.url)


def _normalized(
    feed: Callable[[Json], list[Event]], events: list[Json]
) -> tuple[list[Event], GatewayError | None]:
    out: list[Event] = []
    try:
        for event in events:
            out.extend(feed(event))
    except GatewayError as err:
        return out, err
    return out, None


def _echoed(request: CompletionRequest) -> tuple[int, ...]:
    """The length of each echoed text prompt (token prompts: unknown until detokenized)."""
    if not request.echo or request.prompt_is_tokens:
        return ()
    return tuple(len(p) for p in request.prompts)


def _emulate_best_of(request: CompletionRequest, emulated: frozenset[str], body: Json) -> int:
    """Ask for all candidates (with logprobs to rank them); 0 when there is nothing to do."""
    best_of = request.best_of
    if "best_of" not in emulated or best_of is None or best_of <= request.n:
        return 0
    if request.fields.get("temperature") == 0:
        # Greedy candidates are all the same text: the best is the one greedy answer (and vLLM
        # refuses n > 1 with greedy sampling).
        return 0
    if request.stream:  # schemas refuses this already; never stream unranked candidates
        raise InvalidRequest("'best_of' cannot be used with 'stream'.", param="best_of")
    body["n"] = best_of
    body["logprobs"] = request.logprobs or 0
    return best_of


def _truncated(plan: UpstreamCompletion, err: ContextLengthExceeded) -> bytes | None:
    """The body again with `max_tokens` lowered to what the context window leaves, or None
    when the error does not say how much that is (or leaves no room)."""
    room = completion_room(err.message)
    if room is None or room < 1 or room >= plan.body["max_tokens"]:
        return None
    return orjson.dumps({**plan.body, "max_tokens": room})


def _truncated_chat(plan: UpstreamChat, err: ContextLengthExceeded) -> bytes | None:
    """As `_truncated`, lowering whichever bound the caller set."""
    room = completion_room(err.message)
    bound = plan.request.max_tokens
    if room is None or bound is None or room < 1 or room >= bound:
        return None
    lowered = {k: room for k in ("max_tokens", "max_completion_tokens") if k in plan.body}
    return orjson.dumps({**plan.body, **lowered})


# vLLM's server, refusing an image (or audio) part for a model that reads text only.
NOT_MULTIMODAL = "is not a multimodal model"


def _name_the_media(err: InvalidRequest, request: ChatRequest) -> None:
    """An upstream's refusal of a media part names the part, when the upstream did not."""
    if err.param is None and NOT_MULTIMODAL in err.message:
        media = first_media_part(request.messages)
        if media is not None:
            err.param = media[0]

"""`VllmEngineProvider`: serves completions and chat from an in-process vLLM engine
(`type: vllm`), and embeddings when the engine runs a pooling model (`pooling`).

A request goes as it would through vLLM's own OpenAI server, minus the hop: prompts rendered by
the engine's renderer (its tokenizer, BOS as the server adds it), one engine request per prompt,
outputs rendered in vLLM's legacy shape (`output`). On top, what OpenAI's API promises and vLLM
lacks: best_of and greedy n > 1 (`fanout`), an exact context check (`context`), Mirostat
(`mirostat`, through `sampling`). Leaving early, by disconnect or timeout, aborts the engine's
requests: every engine generator is closed on the way out.

Chat (`chat`, `chat_output`) goes through vLLM's own chat front end, built with the engine: its
renderer and chat template, its tool parsers, its tool-choice constraints, and then the same
sampling, fan-out and context fitting as completions.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncGenerator, Awaitable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from core.answers import (
    ChatChunk,
    ChatCompletion,
    Choice,
    Chunk,
    Completion,
    Embeddings,
    ResponseAnswer,
    ResponseEvent,
)
from core.chat import ChatRequest
from core.completions import CompletionRequest
from core.embeddings import EmbeddingRequest
from core.errors import GatewayError, InvalidRequest, ServiceUnavailable, UpstreamTimeout
from core.messages import first_media_part, text_only
from core.provider import Adapter, Call, Prepared, ResponsesCall, Target
from core.response_reading import answer, event
from core.responses import ResponsesRequest
from providers.rules import vllm_checks
from providers.rules.params import apply_rules
from providers.vllm_engine import chat, chat_output, output, pooling, submit
from providers.vllm_engine import responses as vllm_responses
from providers.vllm_engine.chat import ChatFront, EngineChat
from providers.vllm_engine.engine import GENERATE, Engine, engine_args
from providers.vllm_engine.errors import engine_error
from providers.vllm_engine.fanout import beam_fanout, fanout, select, temperature_of
from providers.vllm_engine.pooling import EngineEmbedding
from providers.vllm_engine.rules import CHAT_RULES, RULES
from providers.vllm_engine.sampling import Generation, sampling_kwargs
from providers.vllm_engine.settings import parse_settings
from providers.vllm_engine.shared import EngineCore, slot_of
from providers.vllm_engine.submit import EngineCompletion
from providers.vllm_engine.window import overflow

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

T = TypeVar("T")
A = TypeVar("A", Completion, ChatCompletion)  # a whole answer

# Fields the adapter reads from the validated request itself, whatever the rules say.
SELF_SET = ("model", "prompt", "stream", "max_tokens", "n")
CHAT_SELF_SET = ("model", "messages", "stream")
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
BACKGROUND_PRIORITY = 1 << 32  # added to a batch line's priority
CHAT = "chat"  # the gateway's name for a generating model's chat
# What a caller hears when the engine's model cannot do the endpoint's task.
WRONG_TASK: Mapping[str, str] = {
    GENERATE: "Target '{label}' runs a pooling (embedding) model: it serves POST /v1/embeddings, "
    "not completions.",
    CHAT: "Target '{label}' runs a pooling (embedding) model: it serves POST /v1/embeddings, "
    "not chat completions.",
    pooling.TASK: "Target '{label}' runs a text-generation model: it does not serve embeddings. "
    "An embedding model runs with engine_args {{runner: pooling}} (and {{convert: embed}} for a "
    "generative checkpoint).",
}


class VllmEngineProvider(Adapter[EngineCompletion, EngineEmbedding, EngineChat]):
    type_tags: ClassVar[tuple[str, ...]] = ("vllm",)
    reloadable: ClassVar[bool] = False  # a second engine beside this one: twice the memory

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine
        self.answer_shape = engine.settings.answer_shape
        self._prefix = f"{name}-{secrets.token_hex(4)}-"
        self._count = itertools.count(1)
        # vLLM's cap on logprobs and prompt_logprobs (-1: none), from the engine's arguments.
        args = engine.settings.engine_args
        self.max_logprobs: int = args.get("max_logprobs", MAX_LOGPROBS)
        # vLLM's Responses serving, with the chat front it was built on (built at first use,
        # again if the engine started anew).
        self._serving: tuple[ChatFront, Any] | None = None

    @classmethod
    def check_config(cls, type_tag: str, settings: Mapping[str, Any], path: str) -> None:
        parse_settings(settings, path)

    @classmethod
    def from_config(
        cls, name: str, type_tag: str, settings: Mapping[str, Any], path: str
    ) -> VllmEngineProvider:
        return cls(name, Engine(name, parse_settings(settings, path), slot_of(name, path)))

    @classmethod
    def shared_core(
        cls, name: str, type_tag: str, settings: Mapping[str, Any], path: str, workers: int
    ) -> EngineCore:
        """Several workers share one engine: the serving process runs its core."""
        return EngineCore(name, engine_args(parse_settings(settings, path)), workers)

    async def start(self) -> None:
        await self.engine.start()

    async def aclose(self) -> None:
        await self.engine.aclose()

    def ready(self) -> bool:
        return self.engine.ready()

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        if not self.engine.ready():
            return None
        tokenizer: Any = self.engine.llm.renderer.tokenizer
        return [len(i) for i in tokenizer(list(texts), add_special_tokens=True)["input_ids"]]

    def count_chat_tokens(self, request: ChatRequest) -> int | None:
        """The chat's prompt as the engine renders it (chat template, tools, generation prompt);
        None until the engine is up, or when the request would not render."""
        front = self.engine.chat if self.engine.ready() else None
        if front is None:
            return None
        try:
            applied = apply_rules(
                CHAT_RULES, request.fields, target="", policy="drop", skip=CHAT_SELF_SET
            )
            return front.count(front.request(chat.vllm_fields(applied.body, request)))
        except Exception:  # an estimate only: the request itself will say what is wrong
            return None

    # ------------------------------------------------------------ mapping

    def prepare(self, request: CompletionRequest, target: Target) -> Prepared[EngineCompletion]:
        vllm_checks.check(request.fields)
        self._check_serves(GENERATE, target)
        submit.check_request(request, self.max_logprobs)
        applied = apply_rules(
            RULES,
            request.fields,
            target=target.label,
            policy=target.unsupported_params,
            skip=SELF_SET,
        )
        body = _queued(applied.body, target)
        beam = bool(body.get("use_beam_search"))
        # Beam search: n beams, the n best returned (vLLM's beam_width), neither ranked nor
        # repeated.
        fan = (
            beam_fanout(request.n)
            if beam
            else fanout(request.n, request.best_of, temperature_of(body))
        )
        if fan.rank and body.get("logprobs") is None:
            body["logprobs"] = 0  # ranking needs each candidate's logprobs; not shown
        # Every 400 that does not need the engine comes out here, before any work.
        sampling_kwargs(body, Generation(fan.generate, request.max_tokens, request.stream))
        # As the caller asked (best_of's ranking logprobs are not shown).
        shape = output.Rendering.of(
            {**body, "logprobs": request.logprobs, "max_tokens": request.max_tokens},
            continuous_usage=request.continuous_usage,
        )
        plan = EngineCompletion(body, fan, shape, overflow(request.fields), beam, request)
        return Prepared(target, applied.dropped, plan)

    def prepare_chat(self, request: ChatRequest, target: Target) -> Prepared[EngineChat]:
        self._check_serves(GENERATE, target, CHAT)
        applied = apply_rules(
            CHAT_RULES,
            request.fields,
            target=target.label,
            policy=target.unsupported_params,
            skip=CHAT_SELF_SET,
        )
        plan = chat.plan(_queued(applied.body, target), request, self.max_logprobs)
        self._check_media(request, target)
        front = self.engine.chat if self.engine.ready() else None
        if front is not None:  # vLLM's own checks, before any work (else when it is sent)
            plan = replace(plan, vllm_request=front.request(plan.vllm_fields))
        return Prepared(target, applied.dropped, plan)

    def prepare_embedding(
        self, request: EmbeddingRequest, target: Target
    ) -> Prepared[EngineEmbedding]:
        self._check_serves(pooling.TASK, target)
        applied = apply_rules(
            pooling.RULES,
            request.fields,
            target=target.label,
            policy=target.unsupported_params,
            skip=("model", "input"),
        )
        if self.engine.ready():  # a refused `dimensions` comes out before any work
            pooling.verified(applied.body, self.engine.llm.model_config)
        plan = EngineEmbedding(_queued(applied.body, target), request.encoding_format, request)
        return Prepared(target, applied.dropped, plan)

    def _check_media(self, request: ChatRequest, target: Target) -> None:
        """An image, audio or file part on a model that reads text only: a 400 naming the part
        (known once the engine is up; until then vLLM's renderer refuses it when it is sent)."""
        if not self.engine.ready() or self.engine.llm.model_config.is_multimodal_model:
            return
        media = first_media_part(request.messages)
        if media is not None:
            path, kind = media
            raise InvalidRequest(text_only(target.label, kind), param=path)

    def _request_id(self) -> str:
        return f"{self._prefix}{next(self._count)}"

    def _check_serves(self, task: str, target: Target, endpoint: str | None = None) -> None:
        """A 400 naming `model` when the engine runs a model that cannot do `task` (known once
        it is up; until then the call waits for the engine, as every call does)."""
        tasks = self.engine.tasks
        if tasks and task not in tasks:
            wording = WRONG_TASK[endpoint or task]
            raise InvalidRequest(wording.format(label=target.label), param="model")

    def _fingerprinted(self, answer: A) -> A:
        """The answer with the engine's system_fingerprint."""
        if self.engine.fingerprint is not None:
            answer["system_fingerprint"] = self.engine.fingerprint
        return answer

    def _responses_serving(self) -> Any:
        front = self._front()
        if self._serving is None or self._serving[0] is not front:
            built = vllm_responses.build(self.engine.llm, front, self.engine.settings, self.name)
            self._serving = (front, built)
        return self._serving[1]

    def _front(self) -> ChatFront:
        front = self.engine.chat
        if front is None:  # a generating engine is up only with its front end
            raise ServiceUnavailable(f"The vLLM engine of provider {self.name!r} has no chat.")
        return front

    def responses(self, request: ResponsesRequest, target: Target) -> ResponsesCall:
        """The Responses API as vLLM's server serves it: its own classes on this engine
        (providers.vllm_engine.responses)."""
        self._check_serves(GENERATE, target, CHAT)
        fields, dropped = vllm_responses.body(request, target, self.name, self._request_id())
        fields = _queued(fields, target)

        async def complete() -> ResponseAnswer:
            created = await self._responses_started(fields, target, _deadline_s(target))
            doc = vllm_responses.dumped(created, target.label)
            return answer(doc, request, target.label, self.name, False)

        async def stream() -> AsyncGenerator[list[ResponseEvent], None]:
            created = await self._responses_started(fields, target, target.timeout_s)
            if not hasattr(created, "__anext__"):  # an error, or (never asked) a whole answer
                vllm_responses.dumped(created, target.label)
                return
            wait = target.first_byte_s or target.timeout_s  # the first output may wait longer
            async with aclosing(created) as events:
                while True:
                    try:
                        raw = await _guarded(anext(events), target, wait)
                    except StopAsyncIteration:
                        break
                    wait = target.timeout_s
                    doc = raw.model_dump(mode="json", by_alias=True)
                    yield [event(doc, request, target.label, self.name, False)]

        return Call(target, dropped, complete, stream, self.answer_shape)

    async def _responses_started(
        self, fields: Mapping[str, Any], target: Target, seconds: float | None
    ) -> Any:
        """vLLM's answer to the request: a whole response, its events' generator, or an error."""
        serving = self._responses_serving()
        vreq = vllm_responses.request(dict(fields))
        return await _guarded(
            serving.create_responses(vreq, vllm_responses.raw(target)), target, seconds
        )

    # ------------------------------------------------------------ serving

    async def embed(self, prepared: Prepared[EngineEmbedding]) -> Embeddings:
        llm = self.engine.llm
        target = prepared.target
        self._check_serves(pooling.TASK, target)
        work = pooling.embed(llm, prepared.state, self._request_id(), target.label, target.trace)
        return await _guarded(work, target, _deadline_s(target))

    async def complete(self, prepared: Prepared[EngineCompletion]) -> Completion:
        llm = self.engine.llm
        self._check_serves(GENERATE, prepared.target)
        label = prepared.target.label
        try:
            async with asyncio.timeout(_deadline_s(prepared.target)):
                started = submit.start(
                    llm,
                    prepared.state,
                    self._request_id(),
                    stream=False,
                    trace=prepared.target.trace,
                )
                inputs, generators = await started
                results = await submit.finals(generators)
        except TimeoutError:
            raise _timeout(prepared.target) from None
        except GatewayError:
            raise
        except Exception as exc:
            raise engine_error(exc, label) from None
        return self._fingerprinted(
            _document(results, inputs, prepared.state, llm.renderer.tokenizer)
        )

    async def stream(
        self, prepared: Prepared[EngineCompletion]
    ) -> AsyncGenerator[list[Chunk], None]:
        llm = self.engine.llm
        plan = prepared.state
        target = prepared.target
        self._check_serves(GENERATE, target)
        started = submit.start(llm, plan, self._request_id(), stream=True, trace=target.trace)
        inputs, generators = await _guarded(started, target, target.timeout_s)
        state = output.RequestStream(
            plan.shape,
            plan.fan.keep,
            len(inputs),
            llm.renderer.tokenizer,
            [_text(i) for i in inputs],
            copies=plan.fan.copies,
        )
        merged = submit.merge(generators)
        wait = target.first_byte_s or target.timeout_s  # the first output may wait longer
        fingerprint = self.engine.fingerprint  # on the first chunk: it holds for all later ones
        async with aclosing(merged):
            while True:
                try:
                    idx, result = await _guarded(anext(merged), target, wait)
                except StopAsyncIteration:
                    break
                wait = target.timeout_s
                chunks = state.chunks(idx, result)
                if chunks:
                    if fingerprint is not None:
                        chunks[0]["system_fingerprint"], fingerprint = fingerprint, None
                    yield chunks
        yield [state.usage_chunk()]

    async def complete_chat(self, prepared: Prepared[EngineChat]) -> ChatCompletion:
        llm = self.engine.llm
        target = prepared.target
        self._check_serves(GENERATE, target, CHAT)
        plan = prepared.state
        front = self._front()
        try:
            async with asyncio.timeout(_deadline_s(target)):
                started = await chat.start(
                    llm, front, plan, self._request_id(), stream=False, trace=target.trace
                )
                results = await submit.finals([started.outputs])
        except TimeoutError:
            raise _timeout(target) from None
        except GatewayError:
            raise
        except Exception as exc:
            raise engine_error(exc, target.label) from None
        if not results:  # vLLM's server: "No output received from the engine." (a 500)
            raise output.EngineStopped("no output")
        vreq = started.vllm_request
        shape = _chat_shape(front, plan, started)
        return self._fingerprinted(
            chat_output.document(
                results[0],
                plan.fan,
                shape,
                vreq,
                lambda: front.parser(vreq),
                llm.renderer.tokenizer,
            )
        )

    async def stream_chat(
        self, prepared: Prepared[EngineChat]
    ) -> AsyncGenerator[list[ChatChunk], None]:
        llm = self.engine.llm
        plan = prepared.state
        target = prepared.target
        self._check_serves(GENERATE, target, CHAT)
        front = self._front()
        started = await _guarded(
            chat.start(llm, front, plan, self._request_id(), stream=True, trace=target.trace),
            target,
            target.timeout_s,
        )
        vreq = started.vllm_request
        state = chat_output.ChatStream(
            _chat_shape(front, plan, started),
            vreq,
            lambda: front.parser(vreq),
            llm.renderer.tokenizer,
        )
        wait = target.first_byte_s or target.timeout_s  # the first output may wait longer
        fingerprint = self.engine.fingerprint  # on the first chunk: it holds for all later ones
        async with aclosing(started.outputs) as outputs:
            accepted = False
            while True:
                try:
                    result = await _guarded(anext(outputs), target, wait)
                except StopAsyncIteration:
                    break
                wait = target.timeout_s
                chunks = state.chunks(result)
                if not accepted:  # the engine took the request: the caller's headers can go
                    accepted = True
                    yield []
                if chunks:
                    if fingerprint is not None:
                        chunks[0]["system_fingerprint"], fingerprint = fingerprint, None
                    yield chunks
        yield [state.usage_chunk()]


def _chat_shape(
    front: ChatFront, plan: EngineChat, started: chat.Started
) -> chat_output.ChatRendering:
    vreq = started.vllm_request
    auto = front.enable_auto_tools and front.tool_parser_cls is not None
    echo = chat.echoed(vreq, started.conversation)
    return chat_output.ChatRendering.of(plan.request, vreq, plan.fan, auto, echo)


def _deadline_s(target: Target) -> float | None:
    """How long a whole answer may take. A batch's line has no deadline here: the engine serves
    it after every live request, so it waits as long as live traffic lasts, which is no fault of
    the engine's. The batch's window bounds it (the runner stops its lines when it ends)."""
    return None if target.background else target.timeout_s


async def _guarded(step: Awaitable[T], target: Target, seconds: float | None) -> T:
    """One await on the engine, bounded by `seconds` (None: unbounded; for streams: per
    output), with the engine's exceptions as gateway errors. StopAsyncIteration passes
    through."""
    try:
        async with asyncio.timeout(seconds):
            return await step
    except TimeoutError:
        raise _timeout(target, seconds) from None
    except (GatewayError, StopAsyncIteration):
        raise
    except Exception as exc:
        raise engine_error(exc, target.label) from None


def _timeout(target: Target, seconds: float | None = None) -> UpstreamTimeout:
    return UpstreamTimeout(
        f"The vLLM engine of {target.label} did not answer within "
        f"{seconds or target.timeout_s:g} s; "
        "the request was aborted.",
        target=target.label,
    )


def _text(engine_input: Mapping[str, Any]) -> str | None:
    text = engine_input.get("prompt")
    return text if isinstance(text, str) else None


def _document(
    results: Sequence[RequestOutput], inputs: Sequence[Any], plan: EngineCompletion, tokenizer: Any
) -> Completion:
    """The canonical answer: each prompt's selected sequences, choices numbered in order."""
    choices: list[Choice] = []
    for result, engine_input in zip(results, inputs, strict=True):
        prompt = output.prompt_of(result, _text(engine_input))
        for seq in select(result.outputs, plan.fan):
            choices.append(output.choice(seq, len(choices), plan.shape, tokenizer, prompt))
    usage = output.request_usage(results)
    if plan.fan.copies > 1:  # each copy of a greedy sequence counts, as OpenAI's n choices do
        completion = usage["completion_tokens"] * plan.fan.copies
        usage = output.usage(usage["prompt_tokens"], completion)
    return {"choices": choices, "usage": usage}


def _queued(body: dict[str, Any], target: Target) -> dict[str, Any]:
    """A batch's line waits behind every live request: its priority (lower is sooner, the
    request's own, 0 by default) moved past any a live request can have in practice. The engine
    schedules by priority (`scheduling_policy: priority`, its default here)."""
    if target.background:
        body["priority"] = body.get("priority", 0) + BACKGROUND_PRIORITY
    return body

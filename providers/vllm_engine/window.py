"""Fitting each prompt and its completion into the engine's window, exactly: the prompt's token
count comes from the engine's own tokenizer (for chat: the rendered messages), the window is the
engine's `max_model_len`.

`context_length_exceeded_behavior`:
    "error"     OpenAI's: a 400 `context_length_exceeded` naming both numbers;
    "truncate"  max_tokens lowered to the room left;
    unset       vLLM's own: max_tokens lowered to the room left, unless it is larger than the
                whole window (a 400 in vLLM's words, naming the bound the caller set).
A prompt that leaves no room for even one token is a 400 whatever was asked (the engine always
generates at least one token, even for echo with max_tokens 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from core.completions import CONTEXT
from core.errors import ContextLengthExceeded, InvalidRequest, too_long, too_long_chat

Overflow = Literal["error", "truncate", "vllm"]


def overflow(fields: Mapping[str, Any]) -> Overflow:
    """What a request asked for when its completion does not fit: vLLM's own when unset."""
    asked: Overflow = fields.get(CONTEXT) or "vllm"
    return asked


def fit(prompt_lengths: Sequence[int], max_tokens: int, window: int, how: Overflow) -> list[int]:
    """max_tokens for each prompt, or ContextLengthExceeded (param "prompt", as the vllm-server
    path names it)."""
    if how == "vllm":
        _within_window(max_tokens, window, "max_tokens")
    budgets: list[int] = []
    many = len(prompt_lengths) > 1
    for i, length in enumerate(prompt_lengths):
        room = window - length
        wanted = max(max_tokens, 1)  # the engine's minimum: one (possibly discarded) token
        if wanted <= room:
            budgets.append(max_tokens)
            continue
        message = too_long(window, length, max_tokens, f" {i}" if many else "")
        if room < 1 or how == "error":
            raise ContextLengthExceeded(message, param="prompt")
        budgets.append(room)
    return budgets


def fit_chat(
    prompt_length: int, max_tokens: int | None, window: int, how: Overflow, bound: str
) -> int:
    """max_tokens for a chat's rendered prompt: as asked, or with none asked what the window
    leaves (vLLM's `get_max_tokens`); ContextLengthExceeded with OpenAI's chat wording (param
    "messages") when it does not fit and "error" was asked. `bound`: the field that set
    max_tokens (`max_completion_tokens` or `max_tokens`)."""
    if how == "vllm" and max_tokens is not None:
        _within_window(max_tokens, window, bound)
    room = window - prompt_length
    wanted = 1 if max_tokens is None else max_tokens  # the engine makes at least one token
    if wanted <= room:
        return room if max_tokens is None else max_tokens
    if room < 1 or how == "error":
        raise ContextLengthExceeded(too_long_chat(window, prompt_length, wanted), param="messages")
    return room


def _within_window(max_tokens: int, window: int, bound: str) -> None:
    """vLLM's own check, in its words: a bound larger than the whole window is refused, not
    lowered."""
    if max_tokens > window:
        raise InvalidRequest(
            f"{bound}={max_tokens} cannot be greater than max_model_len={window}. Please "
            "request fewer output tokens.",
            param=bound,
        )

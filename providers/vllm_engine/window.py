"""Fitting each prompt and its completion into the engine's window, exactly: the prompt's token
count comes from the engine's own tokenizer (for chat: the rendered messages), the window is the
engine's `max_model_len`.

`context_length_exceeded_behavior`: "error" (OpenAI's behaviour, the default) is a 400
`context_length_exceeded` naming both numbers; "truncate" lowers max_tokens to the room left. A
prompt that leaves no room for even one token is a 400 either way (the engine always generates
at least one token, even for echo with max_tokens 0).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import ContextLengthExceeded, too_long, too_long_chat


def fit(prompt_lengths: Sequence[int], max_tokens: int, window: int, truncate: bool) -> list[int]:
    """max_tokens for each prompt, or ContextLengthExceeded (param "prompt", as the vllm-server
    path names it)."""
    budgets: list[int] = []
    many = len(prompt_lengths) > 1
    for i, length in enumerate(prompt_lengths):
        room = window - length
        wanted = max(max_tokens, 1)  # the engine's minimum: one (possibly discarded) token
        if wanted <= room:
            budgets.append(max_tokens)
            continue
        message = too_long(window, length, max_tokens, f" {i}" if many else "")
        if room < 1 or not truncate:
            raise ContextLengthExceeded(message, param="prompt")
        budgets.append(room)
    return budgets


def fit_chat(prompt_length: int, max_tokens: int | None, window: int, truncate: bool) -> int:
    """max_tokens for a chat's rendered prompt: as asked, or with none asked what the window
    leaves (vLLM's `get_max_tokens`); ContextLengthExceeded with OpenAI's chat wording (param
    "messages") when it does not fit, unless "truncate" can lower it."""
    room = window - prompt_length
    wanted = 1 if max_tokens is None else max_tokens  # the engine makes at least one token
    if wanted <= room:
        return room if max_tokens is None else max_tokens
    if room < 1 or not truncate:
        raise ContextLengthExceeded(too_long_chat(window, prompt_length, wanted), param="messages")
    return room

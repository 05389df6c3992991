"""What the adapter does itself when the upstream cannot: `best_of`, and the "truncate"
behaviour of `context_length_exceeded_behavior`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from core.answers import Choice

# ---------------------------------------------------------------- best_of


def select_best(
    candidates: Sequence[Choice], best_of: int, n: int, prompts: Sequence[Any], echo: bool
) -> list[Choice]:
    """OpenAI's `best_of`: the upstream generated `best_of` candidates per prompt (indices
    `prompt_idx * best_of + j`); keep each prompt's `n` best by mean token logprob, best first,
    re-indexed `prompt_idx * n + i`.

    Usage is left as the upstream reported it, so `completion_tokens` counts every candidate:
    that is what was generated and what the upstream bills (OpenAI bills best_of the same way).
    """
    groups: dict[int, list[Choice]] = {}
    for c in candidates:
        groups.setdefault(c["index"] // best_of, []).append(c)
    out: list[Choice] = []
    for prompt_idx in sorted(groups):
        prompt = prompts[prompt_idx] if echo and prompt_idx < len(prompts) else None
        ranked = sorted(groups[prompt_idx], key=lambda c: mean_logprob(c, prompt), reverse=True)
        for i, c in enumerate(ranked[:n]):
            c["index"] = prompt_idx * n + i
            out.append(c)
    return out


def mean_logprob(choice: Choice, echoed_prompt: Any = None) -> float:
    """Mean logprob of the generated tokens (null entries skipped); -inf without any, so a
    candidate without logprobs never wins over one with them. With `echo` the leading prompt
    tokens are not part of the generation and are left out."""
    logprobs = choice.get("logprobs")
    if not logprobs:
        return -math.inf
    values = logprobs["token_logprobs"]
    if echoed_prompt is not None:
        values = values[prompt_entries(logprobs["tokens"], echoed_prompt) :]
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else -math.inf


def prompt_entries(tokens: Sequence[str], prompt: Any) -> int:
    """How many leading logprob entries cover an echoed prompt."""
    if not isinstance(prompt, str):
        return len(prompt)  # token ids: one entry each
    covered = count = 0
    for token in tokens:
        if covered >= len(prompt):
            break
        covered += len(token)
        count += 1
    return count


# ---------------------------------------------------------------- truncate

_WINDOW = re.compile(r"maximum context length is (\d+)")
_PROMPT = re.compile(
    r"\((\d+) in your prompt"  # OpenAI
    r"|prompt contains at least (\d+)"  # vLLM
    r"|\((\d+) in the messages"  # older vLLM
    r"|request has (\d+) input tokens"  # newer vLLM wording
)


def completion_room(message: str) -> int | None:
    """Tokens left for the completion, from a context-length error message; None when the
    message does not say both the window and the prompt size.

    OpenAI: "maximum context length is 4097 tokens, however you requested 4116 tokens (3860 in
    your prompt; 256 for the completion)". vLLM: "maximum context length is 131072 tokens.
    However, you requested 105924 output tokens and your prompt contains at least 25149 input
    tokens"."""
    window = _WINDOW.search(message)
    prompt = _PROMPT.search(message)
    if window is None or prompt is None:
        return None
    used = next(int(g) for g in prompt.groups() if g is not None)
    return int(window[1]) - used

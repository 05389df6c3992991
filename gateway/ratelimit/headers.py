"""How limits are reported: OpenAI's `x-ratelimit-*` headers, `retry-after`, and the messages
of 429s, in OpenAI's words."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.ratelimit.rules import State

KIND_WORDS = {
    "requests": "requests per minute (RPM)",
    "tokens": "tokens per minute (TPM)",
    "parallel": "parallel requests",
}


def duration(seconds: float) -> str:
    """Go's time.Duration format, as OpenAI's reset headers use it: 250ms, 1.5s, 6m0s, 1h2m3s."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    whole_ms = math.ceil(seconds * 1000)
    hours, rest = divmod(whole_ms, 3_600_000)
    minutes, ms = divmod(rest, 60_000)
    secs = f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


def binding(states: Sequence[State], kind: str) -> State | None:
    """The rule of this kind closest to refusing: the one a caller should pace itself by."""
    best: State | None = None
    for s in states:
        if s.rule.kind != kind:
            continue
        if best is None or (s.remaining, s.rule.limit) < (best.remaining, best.rule.limit):
            best = s
    return best


def ratelimit_headers(states: Sequence[State]) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for kind in ("requests", "tokens"):
        s = binding(states, kind)
        if s is not None:
            out += [
                (b"x-ratelimit-limit-" + kind.encode(), str(s.rule.limit).encode()),
                (b"x-ratelimit-remaining-" + kind.encode(), str(max(0, s.remaining)).encode()),
                (b"x-ratelimit-reset-" + kind.encode(), duration(s.reset_s).encode()),
            ]
    return out


def retry_headers(seconds: float) -> dict[str, str]:
    """`retry-after` in whole seconds (at least 1), `retry-after-ms` exact: the openai SDK
    prefers the latter."""
    return {
        "retry-after": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
    }


def refusal_message(state: State, tokens: int) -> str:
    rule = state.rule
    words = KIND_WORDS[rule.kind]
    if rule.kind == "parallel":
        return (
            f"Rate limit reached for {rule.subject} on {words}: Limit {rule.limit}. "
            "Please try again when one of them has finished."
        )
    requested = tokens if rule.kind == "tokens" else 1
    used = rule.limit - max(0, state.remaining)
    return (
        f"Rate limit reached for {rule.subject} on {words}: Limit {rule.limit}, Used {used}, "
        f"Requested {requested}. Please try again in {duration(state.retry_s)}."
    )

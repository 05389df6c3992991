"""How limits are reported: OpenAI's `x-ratelimit-*` headers, `retry-after`, and the messages
of 429s, in OpenAI's words."""

from __future__ import annotations

import math

from gateway.ratelimit.rules import Rule, State, Values, Verdict

KIND_WORDS = {
    "requests": "requests per minute (RPM)",
    "tokens": "tokens per minute (TPM)",
    "parallel": "parallel requests",
}


def duration(seconds: float) -> str:
    """Go's time.Duration format, as OpenAI's reset headers use it: 250ms, 1.5s, 6m0s, 1h2m3s.
    Whole milliseconds, rounded up. Cheap: it runs for every response."""
    exact = seconds * 1000
    ms = int(exact)
    if ms < exact:
        ms += 1
    if ms < 1000:
        return f"{ms}ms" if ms > 0 else "0s"
    minutes, ms = divmod(ms, 60_000)
    secs = f"{ms // 1000}s" if not ms % 1000 else f"{ms // 1000}.{ms % 1000:03d}".rstrip("0") + "s"
    if not minutes:
        return secs
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{secs}" if hours else f"{minutes}m{secs}"


_REQUESTS, _TOKENS = (
    tuple(f"x-ratelimit-{what}-{kind}".encode() for what in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens")
)


def ratelimit_headers(verdict: Verdict) -> list[tuple[bytes, bytes]]:
    """OpenAI's six headers (three per kind that has a limit), for the binding rule of each
    kind: the one with the fewest left. Per request: one pass, no States."""
    requests: tuple[Rule, Values] | None = None
    tokens: tuple[Rule, Values] | None = None
    for rule, values in zip(verdict.rules, verdict.values):  # noqa: B905 (same length)
        kind = rule.kind
        if kind == "requests":
            if requests is None or _closer(rule, values, requests):
                requests = (rule, values)
        elif kind == "tokens" and (tokens is None or _closer(rule, values, tokens)):
            tokens = (rule, values)
    out: list[tuple[bytes, bytes]] = []
    for names, found in ((_REQUESTS, requests), (_TOKENS, tokens)):
        if found is not None:
            rule, (remaining, reset_s, _) = found
            out.append((names[0], rule.limit_header))
            out.append((names[1], b"%d" % remaining if remaining > 0 else b"0"))
            out.append((names[2], _reset_value(reset_s)))
    return out


def _closer(rule: Rule, values: Values, best: tuple[Rule, Values]) -> bool:
    """Fewer left, or as few of a smaller limit."""
    left, best_left = values[0], best[1][0]
    return left < best_left or (left == best_left and rule.limit < best[0].limit)


def _reset_value(seconds: float) -> bytes:
    """duration(), encoded; under a second (the usual case) without the general path."""
    ms = math.ceil(seconds * 1000)
    if ms < 1000:
        return b"%dms" % ms
    return duration(seconds).encode()


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

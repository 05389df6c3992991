"""How limits are reported: OpenAI's `x-ratelimit-*` headers, `retry-after`, and the messages
of 429s, in OpenAI's words."""

from __future__ import annotations

import math

from gateway.asgi import RawHeaders
from gateway.governance.budgets import iso
from gateway.governance.money import PICO, dollars
from gateway.ratelimit.rules import Reported, Rule, State, Values, Verdict

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


NAMES = {
    kind: tuple(f"x-ratelimit-{what}-{kind}".encode() for what in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens")
}


def ratelimit_headers(verdict: Verdict, reported: Reported) -> RawHeaders:
    """OpenAI's six headers (three per kind that has a limit), for the binding rule of each
    kind: the one with the fewest left. The rules of each kind are known in advance. With a
    budget, what the least of them has left."""
    out: RawHeaders = []
    rules, values = verdict.rules, verdict.values
    for kind, ix in reported:
        i = ix[0] if len(ix) == 1 else _binding(rules, values, ix)
        remaining, reset_s, _ = values[i]
        out += kind_headers(kind, rules[i].limit_header, remaining, reset_s)
    if rules and rules[-1].kind == "budget":  # budgets come last
        i = len(rules) - 1
        left = values[i][0]
        while i > 0 and rules[i - 1].kind == "budget":
            i -= 1
            left = min(left, values[i][0])
        out.append(budget_header(left))
    return out


BUDGET_HEADER = b"x-gateway-budget-remaining-usd"


def budget_header(left: int) -> tuple[bytes, bytes]:
    """What the binding budget has left, in dollars (exact, as money.usd writes it), once the
    request's most is reserved. Bytes formatted directly: this runs for every response."""
    whole, frac = divmod(left, PICO) if left > 0 else (0, 0)
    if not frac:
        return (BUDGET_HEADER, b"%d" % whole)
    return (BUDGET_HEADER, (b"%d.%012d" % (whole, frac)).rstrip(b"0"))


def kind_headers(kind: str, limit: bytes, remaining: int, reset_s: float) -> RawHeaders:
    """One kind's three headers. Runs twice a response: the usual reset, under a second, takes
    no general path."""
    limit_name, remaining_name, reset_name = NAMES[kind]
    ms = math.ceil(reset_s * 1000)
    return [
        (limit_name, limit),
        (remaining_name, b"%d" % remaining if remaining > 0 else b"0"),
        (reset_name, b"%dms" % ms if 0 < ms < 1000 else duration(reset_s).encode()),
    ]


def _binding(rules: tuple[Rule, ...], values: list[Values], ix: tuple[int, ...]) -> int:
    """Of several rules of a kind, the one with the fewest left (of those, the smallest)."""
    return min(ix, key=lambda i: (values[i][0], rules[i].limit))


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


PER_PERIOD = {"day": "a day", "week": "a week", "month": "a month", "total": "in total"}


def budget_message(state: State, cost: int) -> str:
    """A budget's refusal: which budget, what it allows, what was spent, when it resets."""
    rule = state.rule
    assert rule.budget is not None and rule.window is not None, "a budget rule has both"
    used = rule.limit - state.remaining
    ends = rule.window.ends
    resets = (
        f"It resets at {iso(ends)}." if ends is not None else "It does not reset (period: total)."
    )
    return (
        f"Budget exceeded for {rule.subject}: {dollars(rule.limit)} "
        f"{PER_PERIOD[rule.budget.period]}, {dollars(used)} spent or reserved by requests in "
        f"flight, and this request may cost up to {dollars(cost)}. {resets}"
    )

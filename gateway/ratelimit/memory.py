"""GCRA (the virtual-scheduling token bucket) and the in-process backend.

A bucket keeps one number, its theoretical arrival time (TAT). A limit of L per minute emits one
unit every 60/L seconds and holds at most a minute's worth: a request of cost c is admitted when
max(TAT, now) + c·60/L ≤ now + 60. The Redis script (redis_backend.py) is the same arithmetic in
Lua; tests hold the two to the same answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.ratelimit.rules import WINDOW_S, Ask, Values, Verdict

PARALLEL_RETRY_S = 1.0  # a parallel slot frees when some request ends: no arithmetic says when
_EPS = 1e-9
SWEEP_EVERY = 4096  # decisions between sweeps of buckets that are full again


def settle_tat(tat: float, now: float, limit: int, delta: int) -> float:
    """The TAT after correcting a reservation by `delta` units (negative: a refund)."""
    base = max(tat, now) if delta > 0 else tat
    return max(now, base + delta * (WINDOW_S / limit))


class MemoryBackend:
    """Limits kept in this process. With `divisor` > 1 it is the `local` fallback: every limit
    divided among the configured replicas."""

    def __init__(
        self, name: str = "memory", divisor: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self._divisor = divisor
        self._clock = clock
        self._tat: dict[str, float] = {}
        self._slots: dict[str, int] = {}
        self._decisions = 0

    async def admit(self, ask: Ask) -> Verdict:
        return self.decide(ask)

    def decide(self, ask: Ask) -> Verdict:
        """GCRA for every rate rule, a count for every parallel one; writes only if all admit.
        Written out flat, without helpers: it runs for every request."""
        now = self._clock()
        limit_at = now + WINDOW_S  # a bucket may be filled up to here
        tats, slots = self._tat, self._slots
        rules = ask.rules
        if self._divisor != 1:
            rules = tuple(r.scaled(self._divisor) for r in rules)
        values: list[Values] = []
        writes: list[tuple[str, float]] = []
        admitted = True
        for rule in rules:
            kind = rule.kind
            if kind == "parallel":
                used = slots.get(rule.bucket, 0)
                if used < rule.limit:
                    values.append((rule.limit - used - 1, 0.0, 0.0))
                else:
                    admitted = False
                    values.append((0, 0.0, PARALLEL_RETRY_S))
                continue
            interval = rule.interval
            base = tats.get(rule.bucket, now)
            if base < now:
                base = now
            tat = base + (ask.tokens if kind == "tokens" else 1) * interval
            if tat > limit_at + _EPS:  # refused: report the bucket as it stands
                admitted = False
                values.append(
                    (int((limit_at - base) / interval + _EPS), base - now, tat - limit_at)
                )
            else:
                values.append((int((limit_at - tat) / interval + _EPS), tat - now, 0.0))
                writes.append((rule.bucket, tat))
        if admitted:
            tats.update(writes)
            if len(writes) < len(rules):
                for rule in rules:
                    if rule.kind == "parallel":
                        slots[rule.bucket] = slots.get(rule.bucket, 0) + 1
        self._decisions += 1
        if not self._decisions % SWEEP_EVERY:
            self._sweep(now)
        return Verdict(admitted, rules, values)

    def settle(self, ask: Ask, delta_tokens: int) -> None:
        now = self._clock()
        for rule in ask.rules:
            if rule.kind == "requests":
                continue
            if self._divisor != 1:
                rule = rule.scaled(self._divisor)
            if rule.kind == "parallel":
                left = self._slots.get(rule.bucket, 0) - 1
                if left > 0:
                    self._slots[rule.bucket] = left
                else:
                    self._slots.pop(rule.bucket, None)
            elif rule.kind == "tokens" and delta_tokens:
                tat = self._tat.get(rule.bucket, now)
                self._tat[rule.bucket] = settle_tat(tat, now, rule.limit, delta_tokens)

    def _sweep(self, now: float) -> None:
        """Forget buckets that are full again: they read the same as absent ones."""
        self._tat = {k: v for k, v in self._tat.items() if v > now}

    async def aclose(self) -> None:
        return None

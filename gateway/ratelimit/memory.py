"""GCRA (the virtual-scheduling token bucket) and the in-process backend.

A bucket keeps one number, its theoretical arrival time (TAT). A limit of L per minute emits one
unit every 60/L seconds and holds at most a minute's worth: a request of cost c is admitted when
max(TAT, now) + c·60/L ≤ now + 60. The Redis script (redis_backend.py) is the same arithmetic in
Lua; tests hold the two to the same answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from gateway.ratelimit.rules import WINDOW_S, Ask, Rule, State, Verdict

PARALLEL_RETRY_S = 1.0  # a parallel slot frees when some request ends: no arithmetic says when
_EPS = 1e-9
SWEEP_EVERY = 4096  # decisions between sweeps of buckets that are full again


class Step(NamedTuple):
    """One GCRA decision."""

    admitted: bool
    tat: float  # the bucket's TAT after the decision
    remaining: int
    reset_s: float
    retry_s: float


def gcra(tat: float, now: float, limit: int, cost: int) -> Step:
    interval = WINDOW_S / limit
    base = max(tat, now)
    new = base + cost * interval
    allow_at = new - WINDOW_S
    if allow_at > now + _EPS:
        remaining = int((now + WINDOW_S - base) / interval + _EPS)
        return Step(False, tat, remaining, base - now, allow_at - now)
    remaining = int((now + WINDOW_S - new) / interval + _EPS)
    return Step(True, new, remaining, new - now, 0.0)


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
        now = self._clock()
        tats = self._tat
        states: list[State] = []
        writes: list[tuple[str, float]] = []
        admitted = True
        for rule in ask.rules:
            if self._divisor != 1:
                rule = rule.scaled(self._divisor)
            if rule.kind == "parallel":
                state = self._parallel(rule)
            else:
                cost = ask.tokens if rule.kind == "tokens" else 1
                step = gcra(tats.get(rule.bucket, now), now, rule.limit, cost)
                state = State(rule, step.remaining, step.reset_s, step.retry_s)
                writes.append((rule.bucket, step.tat))
            admitted = admitted and state.retry_s == 0.0
            states.append(state)
        if admitted:
            tats.update(writes)
            for s in states:
                if s.rule.kind == "parallel":
                    self._slots[s.rule.bucket] = self._slots.get(s.rule.bucket, 0) + 1
        self._sweep(now)
        return Verdict(admitted, tuple(states))

    def _parallel(self, rule: Rule) -> State:
        used = self._slots.get(rule.bucket, 0)
        if used >= rule.limit:
            return State(rule, 0, 0.0, PARALLEL_RETRY_S)
        return State(rule, rule.limit - used - 1, 0.0, 0.0)

    def settle(self, ask: Ask, delta_tokens: int) -> None:
        now = self._clock()
        for rule in ask.rules:
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
        self._decisions += 1
        if self._decisions % SWEEP_EVERY:
            return
        self._tat = {k: v for k, v in self._tat.items() if v > now}

    async def aclose(self) -> None:
        return None

"""GCRA (the virtual-scheduling token bucket) and the in-process backend.

A budget is a counter of pico-dollars spent or reserved in its period: a request is admitted
when the counter plus the request's reservation stays within the budget.

A bucket keeps one number, its theoretical arrival time (TAT). A limit of L per minute emits one
unit every 60/L seconds and holds at most a minute's worth: a request of cost c is admitted when
max(TAT, now) + c·60/L ≤ now + 60. The Redis script (redis_backend.py) is the same arithmetic in
Lua; tests hold the two to the same answers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from gateway.asgi import RawHeaders
from gateway.ratelimit.headers import budget_header, kind_headers
from gateway.ratelimit.rules import WINDOW_S, Ask, RuleSet, Spend, Values, Verdict

PARALLEL_RETRY_S = 1.0  # a parallel slot frees when some request ends: no arithmetic says when
_EPS_S = 1e-9  # seconds: a cost that fills a bucket exactly to the window is admitted
_EPS_UNITS = 1e-6  # units: a count that rounding left a hair under a whole number is that number
SWEEP_EVERY = 4096  # decisions between sweeps of buckets that are full again


def settle_tat(tat: float, now: float, limit: int, delta: int) -> float:
    """The TAT after correcting a reservation by `delta` units (negative: a refund)."""
    base = max(tat, now) if delta > 0 else tat
    return max(now, base + delta * (WINDOW_S / limit))


class MemoryBackend:
    """Limits kept in this process. With `divisor` > 1 it is the `local` fallback: every limit
    divided among the configured replicas."""

    def __init__(
        self,
        name: str = "memory",
        divisor: int = 1,
        clock: Callable[[], float] = time.monotonic,
        charged: Callable[[Ask, int], None] | None = None,
    ) -> None:
        self.name = name
        self._divisor = divisor
        self._clock = clock
        # Told what each settled request was charged (the `local` fallback tells the Redis
        # backend, so that its budgets count what was spent while it was away).
        self._charged = charged
        self._tat: dict[str, float] = {}
        self._slots: dict[str, int] = {}
        self.spent: dict[str, int] = {}  # budget buckets: pico-dollars spent or reserved
        self.expiry: dict[str, float] = {}  # budget buckets: epoch seconds they are kept to
        self.ledger: dict[tuple[str, str], int] = {}  # (day's hash, field) → pico-dollars
        self._decisions = 0

    async def admit(self, ask: Ask) -> Verdict:
        return self.decide(ask)

    def decide(self, ask: Ask) -> Verdict:
        """GCRA for every rate rule, a count for every parallel one; writes only if all admit.
        The general path, with every rule's values: it explains refusals, and `local` mode
        runs it (its limits divided). The usual admission takes `take`."""
        now = self._clock()
        tats, slots = self._tat, self._slots
        rules = ask.rules
        if self._divisor != 1:
            rules = tuple(r.scaled(self._divisor) for r in rules)
        values: list[Values] = []
        writes: list[tuple[str, float]] = []
        admitted = True
        for rule in rules:
            kind = rule.kind
            if kind == "budget":
                used = self.spent.get(rule.bucket, 0)
                if used + ask.cost > rule.limit:
                    admitted = False
                    values.append((rule.limit - used, 0.0, 1.0))  # < 0: overspent
                else:
                    values.append((rule.limit - used - ask.cost, 0.0, 0.0))
                continue
            if kind == "parallel":
                used = slots.get(rule.bucket, 0)
                if used < rule.limit:
                    values.append((rule.limit - used - 1, 0.0, 0.0))
                else:
                    admitted = False
                    values.append((0, 0.0, PARALLEL_RETRY_S))
                continue
            interval = rule.interval
            ahead = tats.get(rule.bucket, now) - now  # how far the bucket is drawn: seconds
            if ahead < 0:
                ahead = 0.0
            after = ahead + (ask.tokens if kind == "tokens" else 1) * interval
            if after > WINDOW_S + _EPS_S:  # refused: report the bucket as it stands
                admitted = False
                values.append((_left(ahead, interval), ahead, after - WINDOW_S))
            else:
                values.append((_left(after, interval), after, 0.0))
                writes.append((rule.bucket, now + after))
        if admitted:
            tats.update(writes)
            if len(writes) < len(rules):
                for rule in rules:
                    if rule.kind == "parallel":
                        slots[rule.bucket] = slots.get(rule.bucket, 0) + 1
                for bucket, _, ttl in ask.limits.budgets:
                    self._spend(bucket, ask.cost, ttl)
        self._counted(now)
        return Verdict(admitted, rules, values)

    def take(self, found: RuleSet, tokens: int, cost: int = 0) -> RawHeaders | None:
        """decide() for the usual case, fused with the headers: admits and returns the
        response's rate-limit headers, or returns None having written nothing (decide() then
        explains). No Verdict and no values: it runs for every request. Limits as configured:
        the `local` fallback, which divides them, decides."""
        now = self._clock()
        tats, slots = self._tat, self._slots
        aheads: list[float] = []  # how far each bucket is drawn once admitted: seconds
        for bucket, interval, per_token in found.rates:
            ahead = tats.get(bucket, now) - now
            after = (ahead if ahead > 0 else 0.0) + (tokens if per_token else 1) * interval
            if after > WINDOW_S + _EPS_S:
                return None
            aheads.append(after)
        for bucket, limit in found.slots:
            if slots.get(bucket, 0) >= limit:
                return None
        left = None  # the least any budget has left once this request's cost is reserved
        for bucket, limit, _ in found.budgets:
            after = limit - self.spent.get(bucket, 0) - cost
            if after < 0:
                return None
            left = after if left is None or after < left else left
        for (bucket, _, _), after in zip(found.rates, aheads):  # noqa: B905 (same length)
            tats[bucket] = now + after
        for bucket, _ in found.slots:
            slots[bucket] = slots.get(bucket, 0) + 1
        for bucket, _, ttl in found.budgets:
            self._spend(bucket, cost, ttl)
        self._counted(now)
        out: RawHeaders = []
        for kind, ix in found.reported:
            i = ix[0] if len(ix) == 1 else _binding(found, aheads, ix)
            remaining = _left(aheads[i], found.rates[i][1])
            out += kind_headers(kind, found.rules[i].limit_header, remaining, aheads[i])
        if left is not None:
            out.append(budget_header(left))
        return out

    def settle(self, ask: Ask, delta_tokens: int, delta_cost: int = 0) -> None:
        found = ask.limits
        if delta_cost:
            for bucket, _, ttl in found.budgets:
                self._spend(bucket, delta_cost, ttl)
        if self._charged is not None and found.budgets:
            self._charged(ask, ask.cost + delta_cost)
        slots = self._slots
        for bucket, _ in found.slots:
            left = slots.get(bucket, 0) - 1
            if left > 0:
                slots[bucket] = left
            else:
                slots.pop(bucket, None)
        if not (delta_tokens and found.tokens):
            return
        now, tats = self._clock(), self._tat
        for rule in found.rules[: len(found.rates)]:
            if rule.kind == "tokens":
                limit = rule.limit if self._divisor == 1 else rule.scaled(self._divisor).limit
                tats[rule.bucket] = settle_tat(tats.get(rule.bucket, now), now, limit, delta_tokens)

    def _spend(self, bucket: str, amount: int, ttl: int) -> None:
        self.spent[bucket] = self.spent.get(bucket, 0) + amount
        if bucket not in self.expiry:
            self.expiry[bucket] = time.time() + ttl if ttl else math.inf

    def spend(self, entry: Spend) -> None:
        """Adds to the spend ledger: the amount to each of the entry's fields of its day."""
        ledger = self.ledger
        day, names, amount = entry
        for name in names:
            ledger[(day, name)] = ledger.get((day, name), 0) + amount

    def _counted(self, now: float) -> None:
        self._decisions += 1
        if not self._decisions % SWEEP_EVERY:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Forget buckets that are full again: they read the same as absent ones."""
        self._tat = {k: v for k, v in self._tat.items() if v > now}
        wall = time.time()
        for bucket in [b for b, until in self.expiry.items() if until <= wall]:
            del self.expiry[bucket]
            self.spent.pop(bucket, None)

    async def aclose(self) -> None:
        return None


def _left(ahead: float, interval: float) -> int:
    """Whole units left in a bucket drawn `ahead` seconds. The arithmetic is on how far the
    bucket is drawn, never on absolute times: a clock that has run for weeks (or the Redis
    server's, in epoch seconds) would cost the difference of two large numbers its low digits,
    and a full bucket would then report one unit fewer than it holds."""
    return int((WINDOW_S - ahead) / interval + _EPS_UNITS)


def _binding(found: RuleSet, aheads: list[float], ix: tuple[int, ...]) -> int:
    """Of several rules of a kind, the one with the fewest left (of those, the smallest)."""

    def left(i: int) -> tuple[int, int]:
        return _left(aheads[i], found.rates[i][1]), found.rules[i].limit

    return min(ix, key=left)

"""The limiter the request path talks to: resolves the rules of a request, asks the backend,
and turns the verdict into headers, a 429, or a 400 for a request no limit could ever admit.

When the Redis backend fails, `on_backend_error` decides: `local` (this process enforces every
limit divided by `replicas`), `open` (admit, unlimited) or `closed` (503). A breaker keeps a
dead Redis from costing every request a timeout; Redis is not part of readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from core.errors import InsufficientQuota, InvalidRequest, RateLimited, ServiceUnavailable
from gateway.asgi import RawHeaders
from gateway.ratelimit import gauges
from gateway.ratelimit.headers import (
    BUDGET_HEADER,
    budget_message,
    ratelimit_headers,
    refusal_message,
    retry_headers,
)
from gateway.ratelimit.memory import MemoryBackend
from gateway.ratelimit.redis_backend import BackendDown, RedisBackend
from gateway.ratelimit.rules import Ask, RateLimitConfig, Rule, RuleBook, Spend, Verdict
from gateway.routing.circuits import CLOSED, OPEN, Breaker, CircuitPolicy

log = logging.getLogger("gateway.ratelimit")
T = TypeVar("T")


class Observer(Protocol):
    """Where decisions are counted (gateway.metrics)."""

    def ratelimit_decision(self, model: str, result: str, limit: str, backend: str) -> None: ...

    def ratelimit_counter(
        self, model: str, result: str, limit: str, backend: str
    ) -> Callable[[], None]:
        """ratelimit_decision, as a callable to keep: for the decision of every request."""
        ...

    def ratelimit_backend_error(self, mode: str) -> None: ...

    def ratelimit_backend_started(self, mode: str) -> None:
        """The backend is in use; its error count shows from 0 (a rate sees the first one)."""
        ...

    def ratelimit_backend_up(self, up: bool) -> None: ...

    def budget_used(self, scope: str, team: str, ratio: float) -> None: ...


class Kept(Protocol):
    """What keeps the memory backend's money across restarts (gateway.governance.keeper)."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class Backend(Protocol):
    name: str

    async def admit(self, ask: Ask) -> Verdict: ...

    def settle(self, ask: Ask, delta_tokens: int, delta_cost: int = 0) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class Grant:
    """An admitted request's hold on its limits, given back by `settle` when it ends."""

    backend: Backend | None
    ask: Ask | None
    headers: RawHeaders

    def settle(self, total_tokens: int | None, cost: int | None = 0) -> int | None:
        """`total_tokens`, `cost` (pico-dollars): what the request used (None: unknown, the
        reservation stands). Returns what the request is charged: its cost, or when that is
        unknown what its budgets keep reserved (None: nothing was reserved)."""
        ask = self.ask
        if self.backend is None or ask is None:
            return cost
        delta = 0 if total_tokens is None else total_tokens - ask.tokens
        charged = cost if cost is not None else (ask.cost if ask.limits.budgets else None)
        delta_cost = (charged or 0) - ask.cost if ask.limits.budgets else 0
        backend, self.backend = self.backend, None
        backend.settle(ask, delta, delta_cost)
        return charged


def no_grant() -> Grant:
    return Grant(None, None, [])


class Unchecked:
    """on_backend_error: open admits without limits; what such a request costs still reaches
    the budgets' counters in Redis (`charged`), with the next call that Redis answers."""

    name = "open"

    def __init__(self, charged: Callable[[Ask, int], None]) -> None:
        self._charged = charged

    async def admit(self, ask: Ask) -> Verdict:
        raise AssertionError("an unchecked grant is made admitted")

    def settle(self, ask: Ask, delta_tokens: int, delta_cost: int = 0) -> None:
        self._charged(ask, ask.cost + delta_cost)

    async def aclose(self) -> None:
        return None


class Limiter:
    def __init__(self, cfg: RateLimitConfig, book: RuleBook, observer: Observer) -> None:
        self._cfg = cfg
        self._book = book
        self._observer = observer
        self._memory = MemoryBackend() if cfg.backend == "memory" else None
        self._redis = RedisBackend(cfg) if cfg.backend == "redis" else None
        charged = self._redis.charged if self._redis is not None else None
        self._local = MemoryBackend("local", divisor=cfg.replicas, charged=charged)
        self._breaker = Breaker(CircuitPolicy(cfg.breaker.failures, cfg.breaker.cooldown_s))
        self._lease_prefix = secrets.token_hex(6) + "-"  # unique per process: leases are shared
        self._lease_count: Iterator[int] = itertools.count(1)
        self._allowed_counters: dict[tuple[str, str], Callable[[], None]] = {}
        self._keeper: Kept | None = None
        self._gauges: asyncio.Task[None] | None = None

    def keep(self, keeper: Kept) -> None:
        """`keeper` loads the memory backend's money at start, and keeps it until close."""
        self._keeper = keeper

    async def start(self) -> None:
        if self._keeper is not None:
            await self._keeper.start()
        if self._redis is not None:
            await self._redis.start()
            self._observer.ratelimit_backend_started(self._cfg.on_backend_error)
        self._gauges = asyncio.create_task(self._gauge_budgets())

    async def aclose(self) -> None:
        if self._gauges is not None:
            self._gauges.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gauges
        if self._redis is not None:
            await self._redis.aclose()
        if self._keeper is not None:
            await self._keeper.aclose()

    async def _gauge_budgets(self) -> None:
        """The budgets' gauges, every gauges.EVERY_S (a backend away: they keep their last)."""
        while True:
            with contextlib.suppress(ServiceUnavailable):
                await gauges.refresh(self._book, self.read_counters, self._observer)
            await asyncio.sleep(gauges.EVERY_S)

    def use_rules(self, book: RuleBook) -> None:
        """A reloaded config's limits, same backend settings: the buckets keep their counts."""
        self._book = book

    async def admit(
        self, key_id: str, model: str, label: str, cost: Callable[[], tuple[int, int]]
    ) -> Grant:
        """`cost`: what the request may use at most, asked only when a limit needs it: its
        tokens, and its cost in pico-dollars."""
        found = self._book.rules(key_id, model)
        if not found.rules:
            return no_grant()
        tokens = money = 0
        if found.tokens or found.budgets:
            tokens, money = cost()
            if found.max_tokens is not None and tokens > found.max_tokens:
                raise self._unfit(found.rules, tokens, label)
        if self._memory is not None:  # no await: nothing to wait for
            ask = Ask(found, tokens, "", money)
            headers = self._memory.take(found, tokens, money)
            if headers is None:
                return self._granted(self._memory, ask, self._memory.decide(ask), label)
            self._allowed(label, self._memory.name)()
            return Grant(self._memory, ask, headers)
        lease = ""  # names the request's parallel slots in Redis
        if found.parallel:
            lease = f"{self._lease_prefix}{next(self._lease_count):x}"
        ask = Ask(found, tokens, lease, money)
        backend, verdict = await self._decide(ask, label)
        if backend is None or verdict is None:
            self._observer.ratelimit_decision(label, "open", "none", "none")
            if self._redis is None or not found.budgets:
                return no_grant()
            return Grant(Unchecked(self._redis.charged), ask, [])
        return self._granted(backend, ask, verdict, label)

    def _granted(self, backend: Backend, ask: Ask, verdict: Verdict, label: str) -> Grant:
        if not verdict.admitted:
            raise self._refusal(verdict, ask, label, backend.name)
        self._allowed(label, backend.name)()
        return Grant(backend, ask, ratelimit_headers(verdict, ask.limits.reported))

    def _allowed(self, label: str, backend: str) -> Callable[[], None]:
        """The counter of admissions: found once per (model, backend), then one call."""
        inc = self._allowed_counters.get((label, backend))
        if inc is None:
            inc = self._observer.ratelimit_counter(label, "allowed", "none", backend)
            self._allowed_counters[(label, backend)] = inc
        return inc

    async def _decide(self, ask: Ask, label: str) -> tuple[Backend | None, Verdict | None]:
        assert self._redis is not None
        if self._breaker.admit(time.monotonic()):
            try:
                verdict = await self._redis.admit(ask)
            except BackendDown as exc:
                self._failed(exc)
            else:
                self._recovered()
                return self._redis, verdict
        return self._degraded(ask, label)

    def _failed(self, exc: BackendDown) -> None:
        was = self._breaker.state
        self._breaker.failed(time.monotonic())
        self._observer.ratelimit_backend_error(self._cfg.on_backend_error)
        if self._breaker.state != was and self._breaker.state == OPEN:
            self._observer.ratelimit_backend_up(False)
            log.warning(
                "rate-limit backend unavailable (%s): on_backend_error=%s for the next %.0f s",
                exc,
                self._cfg.on_backend_error,
                self._cfg.breaker.cooldown_s,
            )

    def _recovered(self) -> None:
        if self._breaker.state != CLOSED:
            log.warning("rate-limit backend is back: limits are shared again")
            self._observer.ratelimit_backend_up(True)
        self._breaker.succeeded()

    def _degraded(self, ask: Ask, label: str) -> tuple[Backend | None, Verdict | None]:
        mode = self._cfg.on_backend_error
        if mode == "local":
            return self._local, self._local.decide(ask)
        if mode == "open":
            return None, None
        self._observer.ratelimit_decision(label, "unavailable", "none", "none")
        raise ServiceUnavailable(
            "The rate limiter's backend is unavailable, and this gateway admits no requests "
            "without it. Please try again shortly.",
            headers=retry_headers(max(1.0, self._breaker.retry_in(time.monotonic()))),
        )

    def spend(self, entry: Spend) -> None:
        """Adds to the spend ledger, where the limits are kept (a Redis that is away gets it
        with its next call)."""
        if self._memory is not None:
            self._memory.spend(entry)
        elif self._redis is not None:
            self._redis.spend(entry, now=self._breaker.state == CLOSED)

    async def read_ledger(self, days: Sequence[str]) -> dict[str, dict[str, int]]:
        """The spend ledger's days (gateway.governance.ledger's hashes): field → pico-dollars.
        A Redis that cannot answer is a 503."""
        if self._redis is None:
            ledger = self._memory.ledger if self._memory is not None else {}
            out: dict[str, dict[str, int]] = {day: {} for day in days}
            for (day, name), amount in ledger.items():
                if day in out:
                    out[day][name] = amount
            return out
        return await self._read(self._redis.read_ledger(days))

    async def read_counters(self, buckets: Sequence[str]) -> dict[str, int]:
        """Budget counters by bucket: pico-dollars spent or reserved in their period."""
        if self._redis is None:
            spent = self._memory.spent if self._memory is not None else {}
            return {b: spent.get(b, 0) for b in buckets}
        return await self._read(self._redis.read_counters(buckets))

    async def _read(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except Exception as exc:  # any failure of Redis: the caller may try again
            raise ServiceUnavailable(
                f"The limits' backend could not answer ({type(exc).__name__}); try again shortly."
            ) from None

    def budget_rules(self, key_id: str, model: str = "") -> tuple[Rule, ...]:
        """The budgets that apply to a key (on `model`, its model budgets too), in their
        current periods."""
        return tuple(r for r in self._book.rules(key_id, model).rules if r.kind == "budget")

    @property
    def memory(self) -> MemoryBackend | None:
        """The memory backend, whose budgets and ledger the files store keeps."""
        return self._memory

    def _refusal(
        self, verdict: Verdict, ask: Ask, label: str, backend: str
    ) -> RateLimited | InsufficientQuota:
        states = [s for s in verdict.states if s.retry_s > 0]
        spent = [s for s in states if s.rule.kind == "budget"]
        if spent:  # a budget outlasts any rate limit: it is what the caller must hear
            state = spent[0]
            self._observer.ratelimit_decision(
                label, "rejected", f"{state.rule.scope}_budget", backend
            )
            return InsufficientQuota(
                budget_message(state, ask.cost),
                headers={"x-should-retry": "false", BUDGET_HEADER.decode(): "0"},
            )
        state = max(states, key=lambda s: s.retry_s)
        rule = state.rule
        self._observer.ratelimit_decision(label, "rejected", f"{rule.scope}_{rule.kind}", backend)
        headers = retry_headers(state.retry_s)
        reported = ratelimit_headers(verdict, ask.limits.reported)
        headers.update((k.decode(), v.decode()) for k, v in reported)
        return RateLimited(
            refusal_message(state, ask.tokens),
            type="tokens" if rule.kind == "tokens" else "requests",
            headers=headers,
        )

    def _unfit(self, rules: tuple[Rule, ...], tokens: int, label: str) -> InvalidRequest:
        """A reservation above a token limit would be refused forever: say so once, as a 400
        the openai SDK does not retry."""
        rule = min((r for r in rules if r.kind == "tokens"), key=lambda r: r.limit)
        self._observer.ratelimit_decision(label, "unfit", f"{rule.scope}_tokens", "none")
        return InvalidRequest(
            f"This request reserves {tokens} tokens (its prompt, plus max_tokens for "
            f"each choice), more than the limit of {rule.limit} tokens per minute (TPM) "
            f"for {rule.subject}: it can never be admitted. Lower max_tokens, n or "
            "best_of, or shorten the prompt.",
            param="max_tokens",
            code="rate_limit_unfit",
            headers={"x-should-retry": "false"},
        )

"""One request's way through its plan's tree, before the first byte reaches the caller: each
target tried with its retries (gateway.routing.retry) while its circuit breaker lets it
(gateway.routing.circuits), fallback groups moving on, loadbalance groups picking by weight among
targets not cut off.

`Attempts` holds what the tries need of the runtime (the breakers, the metrics of calls, the
router's randomness); `run` is one request's tries. It takes how to prepare the request for a
target (`Prepare`) and how to send what was prepared (`SendCall`), and returns an `Outcome`: the
answer and the call that gave it, or the error the caller gets, with the target tried last and
its retries (Portkey's response headers name them, also when nothing answered).

A wait between tries ends at once if the caller leaves (ClientGone).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from core.errors import (
    CircuitOpen,
    GatewayError,
    RequestTimeout,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from core.provider import Target
from gateway.asgi import Receive, until_disconnect
from gateway.metrics import Metrics, RequestRecord
from gateway.routing.circuits import Board, Breaker, is_failure
from gateway.routing.plans import Plan
from gateway.routing.trees import Group, Leaf, Node


class Call(Protocol):
    """A request prepared for one target (a provider's CompletionCall or EmbeddingCall)."""

    @property
    def dropped(self) -> tuple[str, ...]: ...

    @property
    def target(self) -> Target: ...  # as the try sends it (with its traceparent when traced)


C = TypeVar("C", bound=Call)
T = TypeVar("T")
# The request as a leaf's target gets it (its overrides and defaults applied, mapped by the
# provider): what one try sends. A retry prepares anew: a provider's state is one try's.
Prepare = Callable[[Leaf, Target], C]
SendCall = Callable[[C], Awaitable[T]]


@dataclass(slots=True)
class Outcome(Generic[C, T]):
    """What a request's tries came to."""

    used: Leaf | None = None  # the target tried last; None: none was tried
    retries: int = 0  # retries of that target
    call: C | None = None  # what was sent to the target that answered
    answer: T | None = None
    error: GatewayError | None = None  # what the caller gets when nothing answered

    def result(self) -> tuple[C, T]:
        """The call that answered and its answer; the error when nothing did."""
        if self.error is not None:
            raise self.error
        assert self.call is not None and self.answer is not None
        return self.call, self.answer


def error_kind(err: GatewayError) -> str:
    if isinstance(err, UpstreamTimeout):
        return "timeout"
    if isinstance(err, UpstreamUnreachable):
        return "unreachable"
    if isinstance(err, RequestTimeout):
        return "request_timeout"
    return str(err.upstream_status or err.status)


class Attempts:
    """What a request's tries need of the runtime; one per runtime."""

    __slots__ = ("circuits", "jitter", "metrics", "pick")

    def __init__(
        self,
        circuits: Board,
        metrics: Metrics,
        pick: Callable[[list[float]], int],
        jitter: Callable[[], float],
    ) -> None:
        self.circuits = circuits
        self.metrics = metrics
        self.pick = pick  # an index by weight (loadbalance)
        self.jitter = jitter  # a random number in [0, 1) (backoff)

    async def run(
        self,
        plan: Plan,
        prepare: Prepare[C],
        send: SendCall[C, T],
        receive: Receive,
        record: RequestRecord,
    ) -> Outcome[C, T]:
        """One request's tries. `record` learns the provider tried last and the time spent
        waiting on providers."""
        tries = _Tries(self, plan, prepare, send, receive, record)
        root = plan.root
        try:
            await (tries.leaf(root) if isinstance(root, Leaf) else tries.node(root))
        except GatewayError as err:
            tries.outcome.error = err
        return tries.outcome


class _Tries(Generic[C, T]):
    """One request's tries through its plan."""

    __slots__ = (
        "_prepare", "_send", "attempts", "outcome", "plan", "receive", "record", "wait", "waited",
    )  # fmt: skip

    def __init__(
        self,
        attempts: Attempts,
        plan: Plan,
        prepare: Prepare[C],
        send: SendCall[C, T],
        receive: Receive,
        record: RequestRecord,
    ) -> None:
        self.attempts = attempts
        self.plan = plan
        self._prepare = prepare
        self._send = send
        self.receive = receive
        self.record = record
        self.waited = 0.0  # all waits between tries so far (the retry policy's cap)
        self.wait = 0.0  # the wait before the next try (its record tells it)
        self.outcome: Outcome[C, T] = Outcome()

    async def node(self, node: Node) -> None:
        if isinstance(node, Leaf):
            await self.leaf(node)
        elif node.mode == "fallback":
            await self._fallback(node)
        elif node.mode == "loadbalance":
            await self.node(self._pick(node))
        else:
            await self.node(node.children[0])

    async def _fallback(self, group: Group) -> None:
        last = len(group.children) - 1
        for i, child in enumerate(group.children):
            try:
                await self.node(child)
                return
            except GatewayError as err:
                if i == last or not group.falls_back(err):
                    raise

    def _pick(self, group: Group) -> Node:
        """By weight among the children not cut off by an open circuit (all, if none is)."""
        now = time.monotonic()
        weights = [0.0 if self._cut_off(c, now) else c.weight for c in group.children]
        if not any(weights):
            weights = list(group.weights)
        return group.children[self.attempts.pick(weights)]

    def _cut_off(self, node: Node, now: float) -> bool:
        if isinstance(node, Group):
            return False
        target = self.plan.resolve(node)
        return self.attempts.circuits.get(target.provider, target.model).blocked(now)

    async def leaf(self, leaf: Leaf) -> None:
        target = self.plan.resolve(leaf)
        breaker = self.attempts.circuits.get(target.provider, target.model)
        outcome = self.outcome
        outcome.used, outcome.retries = leaf, 0
        call = self._prepare(leaf, target)
        self.record.provider = target.provider
        last: GatewayError | None = None
        while True:
            if breaker.state and not breaker.admit(time.monotonic()):  # CLOSED is 0
                raise last or self._skipped(target, breaker)
            try:
                outcome.answer = await self._try(leaf, target, call, breaker)
            except GatewayError as err:
                delay = leaf.retry.delay(outcome.retries, err, self.waited, self.attempts.jitter())
                if delay is None:
                    raise
                last = err
            else:
                outcome.call = call
                return
            outcome.retries, self.waited = outcome.retries + 1, self.waited + delay
            await self._wait(delay)
            call = self._prepare(leaf, target)

    async def _wait(self, delay: float) -> None:
        self.wait = delay
        began = time.perf_counter()
        try:
            await until_disconnect(asyncio.sleep(delay), self.receive)
        finally:  # waiting out an upstream's failure is not the gateway's own time
            self.record.upstream_s += time.perf_counter() - began

    async def _try(self, leaf: Leaf, target: Target, call: C, breaker: Breaker) -> T:
        metrics, wait = self.attempts.metrics, self.wait
        self.wait = 0.0
        began = time.perf_counter()
        try:
            answer = await until_disconnect(self._bounded(leaf, call), self.receive)
        except GatewayError as err:
            kind = error_kind(err)
            self._tried(call.target, kind, began, wait)
            metrics.attempt(target.provider, kind)
            if is_failure(err):
                breaker.failed(time.monotonic())
            else:
                breaker.succeeded()  # an answer, if not the one hoped for: the target is alive
            raise
        except BaseException:
            self._tried(call.target, "cancelled", began, wait)
            breaker.released()
            raise
        self._tried(call.target, "ok", began, wait)
        metrics.attempt(target.provider, None)
        breaker.succeeded()
        return answer

    def _tried(self, target: Target, outcome: str, began: float, wait: float) -> None:
        took = time.perf_counter() - began
        self.record.upstream_s += took
        self.record.tried((target.label, outcome, began, took, wait, target.trace))

    def _bounded(self, leaf: Leaf, call: C) -> Awaitable[T]:
        sent = self._send(call)
        return sent if leaf.request_s is None else _within(sent, leaf.request_s)

    def _skipped(self, target: Target, breaker: Breaker) -> CircuitOpen:
        self.attempts.metrics.skipped(target.provider)
        wait = breaker.retry_in(time.monotonic())
        return CircuitOpen(
            f"{target.label} is failing and is not being called for now (circuit open); "
            f"try again in {math.ceil(wait)} s.",
            target=target.label,
            headers={"retry-after": str(max(1, math.ceil(wait)))},
        )


async def _within(call: Awaitable[T], seconds: float) -> T:
    """Portkey's request_timeout: the attempt, or the 408 Portkey answers when it runs out."""
    try:
        async with asyncio.timeout(seconds):
            return await call
    except TimeoutError:
        raise RequestTimeout(
            f"Request exceeded the timeout sent in the request: {round(seconds * 1000)}ms"
        ) from None

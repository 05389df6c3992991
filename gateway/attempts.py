"""One request's way through its plan's tree, before the first byte reaches the caller: each
target tried with its retries (gateway.retry) while its circuit breaker lets it (gateway.circuits),
fallback groups moving on, loadbalance groups picking by weight among targets not cut off.

A wait between tries ends at once if the caller leaves (ClientGone). What answered, and after
how many retries, is kept for Portkey's response headers.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gateway.circuits import Breaker, is_failure
from gateway.errors import (
    CircuitOpen,
    GatewayError,
    RequestTimeout,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.http import until_disconnect
from gateway.routing import Plan
from gateway.strategy import Group, Leaf, Node
from providers.base import Prepared, Target

if TYPE_CHECKING:
    from gateway.metrics import RequestRecord
    from gateway.routes import Ctx

T = TypeVar("T")
Call = Callable[[Target, Prepared], Coroutine[Any, Any, T]]
# The request as a leaf's target gets it (its overrides and defaults applied, mapped by the
# provider): what an attempt sends.
Prepare = Callable[[Leaf, Target], Prepared]


def error_kind(err: GatewayError) -> str:
    if isinstance(err, UpstreamTimeout):
        return "timeout"
    if isinstance(err, UpstreamUnreachable):
        return "unreachable"
    if isinstance(err, RequestTimeout):
        return "request_timeout"
    return str(err.upstream_status or err.status)


class Attempts(Generic[T]):
    __slots__ = ("_call", "_prepare", "ctx", "plan", "prepared", "retries", "used", "waited")

    def __init__(self, ctx: Ctx, plan: Plan, call: Call[T], prepare: Prepare) -> None:
        self.ctx = ctx
        self.plan = plan
        self._call = call
        self._prepare = prepare
        self.waited = 0.0  # all waits between tries so far (the retry policy's cap)
        self.used: Leaf | None = None  # the target tried last
        self.retries = 0  # retries of that target
        self.prepared: Prepared | None = None  # the request as the answering target got it

    async def run(self) -> T:
        return await self._node(self.plan.root)

    async def _node(self, node: Node) -> T:
        if isinstance(node, Leaf):
            return await self._leaf(node)
        if node.mode == "fallback":
            return await self._fallback(node)
        if node.mode == "loadbalance":
            return await self._node(self._pick(node))
        return await self._node(node.children[0])

    async def _fallback(self, group: Group) -> T:
        last = len(group.children) - 1
        for i, child in enumerate(group.children):
            try:
                return await self._node(child)
            except GatewayError as err:
                if i == last or not group.falls_back(err):
                    raise
        raise AssertionError("a group has at least one target")  # pragma: no cover

    def _pick(self, group: Group) -> Node:
        """By weight among the children not cut off by an open circuit (all, if none is)."""
        now = time.monotonic()
        weights = [0.0 if self._cut_off(c, now) else c.weight for c in group.children]
        if not any(weights):
            weights = list(group.weights)
        return group.children[self.ctx.runtime.router.pick(weights)]

    def _cut_off(self, node: Node, now: float) -> bool:
        if isinstance(node, Group):
            return False
        target = self.plan.resolve(node)
        return self.ctx.runtime.circuits.get(target.provider, target.model).blocked(now)

    async def _leaf(self, leaf: Leaf) -> T:
        target = self.plan.resolve(leaf)
        breaker = self.ctx.runtime.circuits.get(target.provider, target.model)
        self.used, self.retries = leaf, 0
        prepared = self._prepare(leaf, target)
        rec: RequestRecord = self.ctx.record  # type: ignore[assignment]
        rec.provider = target.provider
        last: GatewayError | None = None
        while True:
            if breaker.state and not breaker.admit(time.monotonic()):  # CLOSED is 0
                raise last or self._skipped(target, breaker)
            try:
                result = await self._try(leaf, target, prepared, breaker, rec)
            except GatewayError as err:
                delay = leaf.retry.delay(self.retries, err, self.waited, self._jitter())
                if delay is None:
                    raise
                last = err
            else:
                self.prepared = prepared
                return result
            self.retries, self.waited = self.retries + 1, self.waited + delay
            await self._wait(delay, rec)
            prepared = self._prepare(leaf, target)  # a provider's state is one attempt's

    async def _wait(self, delay: float, rec: RequestRecord) -> None:
        began = time.perf_counter()
        try:
            await until_disconnect(asyncio.sleep(delay), self.ctx.receive)
        finally:  # waiting out an upstream's failure is not the gateway's own time
            rec.upstream_s += time.perf_counter() - began

    async def _try(
        self, leaf: Leaf, target: Target, prepared: Prepared, breaker: Breaker, rec: RequestRecord
    ) -> T:
        metrics = self.ctx.runtime.metrics
        began = time.perf_counter()
        try:
            result = await until_disconnect(self._bounded(leaf, target, prepared), self.ctx.receive)
        except GatewayError as err:
            metrics.attempt(target.provider, error_kind(err))
            if is_failure(err):
                breaker.failed(time.monotonic())
            else:
                breaker.succeeded()  # an answer, if not the one hoped for: the target is alive
            raise
        except BaseException:
            breaker.released()
            raise
        finally:
            rec.upstream_s += time.perf_counter() - began
        metrics.attempt(target.provider, None)
        breaker.succeeded()
        return result

    def _bounded(self, leaf: Leaf, target: Target, prepared: Prepared) -> Coroutine[Any, Any, T]:
        call = self._call(target, prepared)
        return call if leaf.request_s is None else _within(call, leaf.request_s)

    def _skipped(self, target: Target, breaker: Breaker) -> CircuitOpen:
        self.ctx.runtime.metrics.skipped(target.provider)
        wait = breaker.retry_in(time.monotonic())
        return CircuitOpen(
            f"{target.label} is failing and is not being called for now (circuit open); "
            f"try again in {math.ceil(wait)} s.",
            target=target.label,
            headers={"retry-after": str(max(1, math.ceil(wait)))},
        )

    def _jitter(self) -> float:
        return self.ctx.runtime.router.jitter()


async def _within(call: Coroutine[Any, Any, T], seconds: float) -> T:
    """Portkey's request_timeout: the attempt, or the 408 Portkey answers when it runs out."""
    try:
        async with asyncio.timeout(seconds):
            return await call
    except TimeoutError:
        raise RequestTimeout(
            f"Request exceeded the timeout sent in the request: {round(seconds * 1000)}ms"
        ) from None

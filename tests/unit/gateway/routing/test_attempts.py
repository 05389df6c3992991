"""A request's tries through its plan, without HTTP: retries, fallback, loadbalance and circuit
breakers, each on scripted sends (gateway.routing.attempts)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.errors import CircuitOpen, GatewayError, RequestTimeout, UpstreamError, UpstreamTimeout
from core.provider import Target
from gateway.asgi import ClientGone, Message
from gateway.metrics import Metrics, RequestRecord
from gateway.routing.attempts import Attempts, Outcome
from gateway.routing.circuits import OPEN, Board, CircuitPolicy
from gateway.routing.plans import Plan
from gateway.routing.retry import RetryPolicy
from gateway.routing.trees import FALLBACK_STATUSES, Group, Leaf, Node

pytestmark = pytest.mark.asyncio
FAST = RetryPolicy(attempts=2, backoff_s=0.001, max_backoff_s=0.001)


def upstream(status: int) -> UpstreamError:
    err = UpstreamError(f"upstream said {status}", status=status if status < 500 else 502)
    err.upstream_status = status
    return err


def leaf(provider: str, weight: float = 1.0, retry: RetryPolicy = FAST, **kw: Any) -> Leaf:
    target = Target("m", provider, f"{provider}-model")
    return Leaf(provider, target.model, f"t.{provider}", weight, retry, target, **kw)


@dataclass
class Call:
    """What prepare made for one try."""

    target: Target
    dropped: tuple[str, ...] = ()


@dataclass
class Upstreams:
    """Scripted answers per provider: an exception to raise, else the provider's name."""

    script: dict[str, list[GatewayError]] = field(default_factory=dict)
    prepared: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    hang: bool = False

    def prepare(self, leaf: Leaf, target: Target) -> Call:
        self.prepared.append(target.provider)
        return Call(target)

    async def send(self, call: Call) -> str:
        name = call.target.provider
        self.sent.append(name)
        if self.hang:
            await asyncio.Event().wait()
        failures = self.script.get(name)
        if failures:
            raise failures.pop(0)
        return name


@dataclass
class Setup:
    attempts: Attempts
    metrics: Metrics
    board: Board
    picks: list[list[float]]
    up: Upstreams = field(default_factory=Upstreams)
    record: RequestRecord = field(default_factory=lambda: RequestRecord(0.0))

    async def run(
        self, root: Node, receive: Callable[[], Awaitable[Message]] | None = None
    ) -> Outcome[Call, str]:
        plan = Plan(root, _target)
        return await self.attempts.run(
            plan, self.up.prepare, self.up.send, receive or _stays, self.record
        )

    def count(self, provider: str, outcome: str) -> float:
        labels = {"provider": provider, "outcome": outcome}
        self.metrics.flush()  # as a scrape does
        value = self.metrics.registry.get_sample_value("gateway_upstream_attempts_total", labels)
        return value or 0.0


def _target(leaf: Leaf) -> Target:
    assert leaf.target is not None
    return leaf.target


async def _stays() -> Message:
    """A caller that never leaves."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _leaves() -> Message:
    return {"type": "http.disconnect"}


@pytest.fixture
def setup() -> Setup:
    metrics = Metrics(enabled=True)
    board = Board(CircuitPolicy(failures=3, cooldown_s=30.0), metrics.circuit)
    picks: list[list[float]] = []

    def pick(weights: list[float]) -> int:
        picks.append(weights)
        return max(range(len(weights)), key=weights.__getitem__)

    return Setup(Attempts(board, metrics, pick, lambda: 0.0), metrics, board, picks)


async def test_a_retry_prepares_anew_and_the_outcome_counts_it(setup: Setup) -> None:
    setup.up.script["a"] = [upstream(503), upstream(503)]
    outcome = await setup.run(leaf("a"))
    assert outcome.result()[1] == "a" and outcome.retries == 2
    assert outcome.used is not None and outcome.used.provider == "a"
    assert setup.up.prepared == ["a", "a", "a"]  # a provider's state is one try's
    assert (setup.count("a", "error"), setup.count("a", "ok")) == (2, 1)
    assert setup.record.provider == "a" and setup.record.upstream_s > 0


async def test_a_status_the_policy_does_not_list_is_not_retried(setup: Setup) -> None:
    setup.up.script["a"] = [upstream(400)]
    outcome = await setup.run(leaf("a"))
    assert outcome.error is not None and outcome.error.upstream_status == 400
    assert outcome.retries == 0 and outcome.call is None and setup.up.sent == ["a"]
    with pytest.raises(UpstreamError):
        outcome.result()


async def test_retries_stop_at_the_policy_s_count(setup: Setup) -> None:
    setup.up.script["a"] = [upstream(503)] * 3
    outcome = await setup.run(leaf("a"))
    assert outcome.error is not None and outcome.retries == 2 and len(setup.up.sent) == 3


async def test_fallback_moves_on_after_a_listed_status_and_names_what_answered(
    setup: Setup,
) -> None:
    setup.up.script["a"] = [upstream(503)] * 3
    outcome = await setup.run(Group("fallback", (leaf("a"), leaf("b")), "t"))
    assert outcome.result() == (Call(_target(leaf("b"))), "b")
    assert outcome.used is not None and outcome.used.provider == "b" and outcome.retries == 0
    assert setup.record.provider == "b"


async def test_the_record_tells_each_try_its_outcome_and_the_wait_before_it(
    setup: Setup,
) -> None:
    timeout = UpstreamTimeout("a/a-model timed out")
    setup.up.script["a"] = [upstream(503), timeout, upstream(503)]
    await setup.run(Group("fallback", (leaf("a"), leaf("b")), "t"))
    tried = setup.record.attempts
    assert tried is not None
    assert [(label, outcome) for label, outcome, *_ in tried] == [
        ("a/a-model", "503"),
        ("a/a-model", "timeout"),
        ("a/a-model", "503"),
        ("b/b-model", "ok"),
    ]
    waits = [wait for _, _, _, _, wait, _ in tried]
    assert waits[0] == 0 and waits[1] > 0 and waits[2] > 0 and waits[3] == 0  # b: no retry
    assert all(took >= 0 for _, _, _, took, _, _ in tried)
    assert setup.record.upstream_s >= sum(took for _, _, _, took, _, _ in tried)


async def test_fallback_stops_at_an_answer_it_does_not_fall_back_on(setup: Setup) -> None:
    setup.up.script["a"] = [upstream(400)]
    outcome = await setup.run(Group("fallback", (leaf("a"), leaf("b")), "t"))
    assert outcome.error is not None and outcome.error.upstream_status == 400
    assert "b" not in setup.up.sent


async def test_portkey_s_fallback_moves_on_after_any_failure(setup: Setup) -> None:
    setup.up.script["a"] = [upstream(400)]
    group = Group("fallback", (leaf("a"), leaf("b")), "t", fall_on=None)
    assert (await setup.run(group)).result()[1] == "b"


async def test_the_last_target_s_failure_is_the_callers(setup: Setup) -> None:
    setup.up.script = {"a": [upstream(503)] * 3, "b": [upstream(429)] * 3}
    outcome = await setup.run(
        Group("fallback", (leaf("a"), leaf("b")), "t", 1.0, FALLBACK_STATUSES)
    )
    assert outcome.error is not None and outcome.error.upstream_status == 429
    assert outcome.used is not None and outcome.used.provider == "b" and outcome.retries == 2


async def test_loadbalance_picks_by_weight_among_closed_circuits(setup: Setup) -> None:
    group = Group("loadbalance", (leaf("a", 3.0), leaf("b", 1.0)), "t")
    assert (await setup.run(group)).result()[1] == "a"
    for _ in range(3):  # three failures in a row: open
        setup.board.get("a", "a-model").failed(time.monotonic())
    assert setup.board.get("a", "a-model").state == OPEN
    assert (await setup.run(group)).result()[1] == "b"
    assert setup.picks == [[3.0, 1.0], [0.0, 1.0]]


async def test_loadbalance_with_every_circuit_open_picks_by_the_weights(setup: Setup) -> None:
    for name in ("a", "b"):
        for _ in range(3):
            setup.board.get(name, f"{name}-model").failed(time.monotonic())
    outcome = await setup.run(Group("loadbalance", (leaf("a", 1.0), leaf("b", 2.0)), "t"))
    assert setup.picks == [[1.0, 2.0]]
    assert isinstance(outcome.error, CircuitOpen) and setup.up.sent == []


async def test_an_open_circuit_is_skipped_and_says_when_to_come_back(setup: Setup) -> None:
    setup.up.script["a"] = [upstream(503)] * 3
    for _ in range(3):  # the third failure in a row opens it
        await setup.run(leaf("a", retry=RetryPolicy()))
    outcome = await setup.run(leaf("a"))
    err = outcome.error
    assert isinstance(err, CircuitOpen) and err.status == 503
    assert 1 <= int(err.headers["retry-after"]) <= 30
    assert setup.up.sent == ["a"] * 3 and setup.count("a", "skipped") == 1


async def test_a_circuit_opening_during_retries_gives_the_upstream_s_answer(setup: Setup) -> None:
    setup.up.script["a"] = [upstream(503), upstream(503), UpstreamTimeout("slow")]
    outcome = await setup.run(leaf("a", retry=RetryPolicy(attempts=4, backoff_s=0.001)))
    assert isinstance(outcome.error, UpstreamTimeout)  # not CircuitOpen: what the upstream did
    assert len(setup.up.sent) == 3


async def test_a_half_open_circuit_lets_one_probe_through_and_closes_on_success(
    setup: Setup,
) -> None:
    breaker = setup.board.get("a", "a-model")
    for _ in range(3):
        breaker.failed(time.monotonic())
    breaker.opened_at -= 60  # its cool-down is over
    assert (await setup.run(leaf("a"))).result()[1] == "a"
    assert breaker.state == 0 and not breaker.probing


async def test_portkey_s_request_timeout_is_a_408(setup: Setup) -> None:
    setup.up.hang = True
    outcome = await setup.run(leaf("a", retry=RetryPolicy(), request_s=0.01))
    assert isinstance(outcome.error, RequestTimeout) and outcome.error.status == 408


async def test_a_caller_who_leaves_ends_the_tries(setup: Setup) -> None:
    setup.up.hang = True
    with pytest.raises(ClientGone):
        await setup.run(leaf("a"), _leaves)
    assert not setup.board.get("a", "a-model").probing  # a probe it held is let go
    assert setup.record.attempts is not None
    assert [outcome for _, outcome, *_ in setup.record.attempts] == ["cancelled"]

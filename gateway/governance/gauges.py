"""`gateway_budget_used_ratio`: the share of each team's budget spent or reserved in its current
period (scope `team`), and the highest share among its keys' own budgets (scope `key`; keys
without a team under `none`), read from where the limits are kept every few seconds: a scrape
never waits on Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Protocol

from gateway.ratelimit import Limiter
from gateway.ratelimit.rules import Rule

EVERY_S = 10.0


class Gauges(Protocol):
    def budget_used(self, scope: str, team: str, ratio: float) -> None: ...


async def refresh(limiter: Limiter, keys: Iterable[tuple[str, str | None]], gauges: Gauges) -> None:
    """`keys`: every key's id and team."""
    found: list[tuple[str, Rule]] = []  # (team or "", rule)
    for key_id, team in keys:
        found += [
            (team or "", r) for r in limiter.budget_rules(key_id) if r.scope in ("key", "team")
        ]
    counters = await limiter.read_counters(sorted({r.bucket for _, r in found}))
    highest: dict[tuple[str, str], float] = {}
    for team, r in found:
        ratio = counters.get(r.bucket, 0) / r.limit if r.limit else 1.0
        slot = (r.scope, team or "none")
        highest[slot] = max(highest.get(slot, 0.0), ratio)
    for (scope, team), ratio in highest.items():
        gauges.budget_used(scope, team, ratio)


async def every(
    limiter: Limiter, keys: Callable[[], Iterable[tuple[str, str | None]]], gauges: Gauges
) -> None:
    """refresh() every EVERY_S seconds, for the keys of the moment, until cancelled."""
    while True:
        with contextlib.suppress(Exception):  # Redis away: the gauges keep their last values
            await refresh(limiter, keys(), gauges)
        await asyncio.sleep(EVERY_S)

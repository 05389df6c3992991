"""`gateway_budget_used_ratio`: the share of each team's budget spent or reserved in its current
period (scope `team`), and the highest share among its keys' own budgets (scope `key`; keys
without a team under `none`), read from where the budgets are kept every EVERY_S seconds: a
scrape never waits on Redis."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gateway.ratelimit.rules import RuleBook

EVERY_S = 10.0

ReadCounters = Callable[[Sequence[str]], Awaitable[dict[str, int]]]


class Gauges(Protocol):
    def budget_used(self, scope: str, team: str, ratio: float) -> None: ...


async def refresh(book: RuleBook, read: ReadCounters, gauges: Gauges) -> None:
    """Every key's and team's own budget (not the per-model ones), read in one call."""
    found = [
        (team or "none", r)
        for key_id, team in book.key_teams()
        for r in book.rules(key_id, "").rules
        if r.kind == "budget" and r.scope in ("key", "team")
    ]
    if not found:
        return
    counters = await read(sorted({r.bucket for _, r in found}))
    highest: dict[tuple[str, str], float] = {}
    for team, r in found:
        ratio = counters.get(r.bucket, 0) / r.limit if r.limit else 1.0
        slot = (r.scope, team)
        highest[slot] = max(highest.get(slot, 0.0), ratio)
    for (scope, team), ratio in highest.items():
        gauges.budget_used(scope, team, ratio)

"""The budgets' gauges: each team's own budget, and the highest of its keys' budgets."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.governance.budgets import Budget
from gateway.ratelimit import KeyLimits, Limits, RuleBook, TeamLimits
from gateway.ratelimit.gauges import refresh
from tests.unit.gateway.ratelimit.test_limiter import Seen


def book() -> RuleBook:
    keys = {
        "a": KeyLimits(Limits(), (), team="t", budget=Budget(1000, "day")),
        "b": KeyLimits(Limits(), (), team="t", budget=Budget(4000, "month")),
        "c": KeyLimits(Limits(), (), budget=Budget(100, "total")),
        "d": KeyLimits(Limits(), ()),  # no budget: no gauge
    }
    return RuleBook(keys, {}, {"t": TeamLimits(budget=Budget(10_000, "week"))})


async def test_teams_and_keys_report_the_share_spent() -> None:
    b = book()
    spent = {"b:k:a": 250, "b:k:b": 3000, "b:t:t": 9500, "b:k:c": 100}

    async def read(buckets: Sequence[str]) -> dict[str, int]:
        return {x: spent[x.rsplit(":", 1)[0]] for x in buckets}

    seen = Seen()
    await refresh(b, read, seen)
    # team t: its own budget 95%; its keys' highest: b's 75% (a's 25%); c has no team
    assert seen.budgets == {("team", "t"): 0.95, ("key", "t"): 0.75, ("key", "none"): 1.0}


async def test_no_budget_reads_nothing() -> None:
    async def read(buckets: Sequence[str]) -> dict[str, int]:
        raise AssertionError("nothing to read")

    seen = Seen()
    await refresh(RuleBook({"d": KeyLimits(Limits(), ())}, {}), read, seen)
    assert seen.budgets == {}

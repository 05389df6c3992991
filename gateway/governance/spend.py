"""What the admin API shows of money: the spend ledger's days grouped by key, team or model
(gateway.governance.ledger), and a key's budgets in their current periods. Amounts are exact
decimal strings of dollars (gateway.governance.money)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.errors import InvalidRequest
from core.wire import Json
from gateway.governance.budgets import iso
from gateway.governance.ledger import GROUPS, KEEP_DAYS, day_hash
from gateway.governance.money import usd
from gateway.ratelimit.rules import Rule

MAX_DAYS = KEEP_DAYS  # a query's range, inclusive: as long as the ledger keeps days
DEFAULT_DAYS = 30  # without `start`: the 30 days up to `end`
QUERY = ("group_by", "start", "end")


@dataclass(frozen=True, slots=True)
class SpendQuery:
    group_by: str
    start: dt.date
    end: dt.date

    def days(self) -> list[dt.date]:
        return [self.start + dt.timedelta(days=i) for i in range((self.end - self.start).days + 1)]


def spend_query(params: Mapping[str, str], today: dt.date) -> SpendQuery:
    """`group_by` (key, team, model; key by default), `start` and `end` (YYYY-MM-DD, UTC)."""
    for name in params:
        if name not in QUERY:
            raise InvalidRequest(
                f"Unknown query parameter '{name}': use {', '.join(QUERY)}.", param=name
            )
    group_by = params.get("group_by", "key")
    if group_by not in GROUPS:
        raise InvalidRequest(
            f"group_by must be one of {', '.join(GROUPS)}, got '{group_by[:40]}'.",
            param="group_by",
        )
    end = _date(params, "end", today)
    start = _date(params, "start", end - dt.timedelta(days=DEFAULT_DAYS - 1))
    if start > end:
        raise InvalidRequest("start must not be after end.", param="start")
    if (end - start).days + 1 > MAX_DAYS:
        raise InvalidRequest(f"A query spans at most {MAX_DAYS} days.", param="start")
    return SpendQuery(group_by, start, end)


def _date(params: Mapping[str, str], name: str, default: dt.date) -> dt.date:
    given = params.get(name)
    if given is None:
        return default
    try:
        if len(given) != 10:
            raise ValueError(given)
        return dt.date.fromisoformat(given)
    except ValueError:
        raise InvalidRequest(
            f"{name} must be a date as YYYY-MM-DD (UTC), got '{given[:40]}'.", param=name
        ) from None


def spend_document(query: SpendQuery, ledger: Mapping[str, Mapping[str, int]]) -> Json:
    """One row per day and group member that spent something, by date then name."""
    prefix = GROUPS[query.group_by]
    data = []
    for day in query.days():
        found = ledger.get(day_hash(day), {})
        for name in sorted(n for n in found if n.startswith(prefix)):
            data.append(
                {
                    "date": day.isoformat(),
                    query.group_by: name.removeprefix(prefix),
                    "spend_usd": usd(found[name]),
                }
            )
    return {
        "object": "list",
        "group_by": query.group_by,
        "start": query.start.isoformat(),
        "end": query.end.isoformat(),
        "data": data,
    }


def budget_rows(rules: Sequence[Rule], spent: Mapping[str, int]) -> list[Json]:
    """Each budget's state in its current period: its amount, spent (or held by requests under
    way), what is left, and when it starts again from zero (null: a total budget never does)."""
    rows = []
    for r in rules:
        if r.budget is None or r.window is None:
            continue
        used = spent.get(r.bucket, 0)
        rows.append(
            {
                "scope": r.scope,
                "usd": usd(r.limit),
                "period": r.budget.period,
                "spent_usd": usd(used),
                "remaining_usd": usd(max(0, r.limit - used)),
                "resets_at": None if r.window.ends is None else iso(r.window.ends),
            }
        )
    return rows

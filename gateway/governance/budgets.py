"""Budgets: an amount of dollars per UTC calendar period (day, ISO week from Monday, month) or
in total. A period's spend is counted in a bucket named after the period ("d20261128",
"w20261123", "m202611", "all"), so a new period starts from zero with nothing to reset."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

Period = Literal["day", "week", "month", "total"]
PERIODS: tuple[Period, ...] = ("day", "week", "month", "total")
UTC = dt.UTC
# A period's counter is kept this long after the period ends: requests admitted in it settle
# into it when they end, however late.
GRACE_S = 2 * 86400


@dataclass(frozen=True, slots=True)
class Budget:
    pico: int  # the amount, in pico-dollars (gateway.governance.money)
    period: Period


@dataclass(frozen=True, slots=True)
class Window:
    """One period of a budget: its bucket's name, and when it ends (None: never)."""

    stamp: str
    ends: dt.datetime | None

    def ttl_s(self, now: dt.datetime) -> int:
        """How long the period's counter must be kept (0: forever)."""
        if self.ends is None:
            return 0
        return int((self.ends - now).total_seconds()) + GRACE_S


def window(period: Period, now: dt.datetime) -> Window:
    """The period that `now` (UTC) falls in."""
    day = now.date()
    if period == "day":
        start = day
        end = day + dt.timedelta(days=1)
        return Window("d" + start.strftime("%Y%m%d"), _midnight(end))
    if period == "week":
        start = day - dt.timedelta(days=day.weekday())
        return Window("w" + start.strftime("%Y%m%d"), _midnight(start + dt.timedelta(days=7)))
    if period == "month":
        nxt = dt.date(day.year + day.month // 12, day.month % 12 + 1, 1)
        return Window("m" + day.strftime("%Y%m"), _midnight(nxt))
    return Window("all", None)


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=UTC)


def iso(moment: dt.datetime) -> str:
    """2026-12-01T00:00:00Z"""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

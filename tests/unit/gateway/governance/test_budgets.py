"""Budget periods on the UTC calendar: each moment's bucket and when it ends (days, ISO weeks
from Monday, months, across year ends and leap days; `total` never ends), and how long a
period's counter is kept."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.governance.budgets import GRACE_S, PERIODS, UTC, Period, Window, iso, window


def at(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0, us: int = 0
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, sec, us, tzinfo=UTC)


LAST_US = 999_999  # the last microsecond of a second


@pytest.mark.parametrize(
    ("period", "now", "stamp", "ends"),
    [
        ("day", at(2026, 11, 28, 13, 5), "d20261128", at(2026, 11, 29)),
        ("day", at(2026, 11, 28), "d20261128", at(2026, 11, 29)),  # midnight opens a day
        ("day", at(2026, 11, 28, 23, 59, 59, LAST_US), "d20261128", at(2026, 11, 29)),
        ("day", at(2026, 12, 31, 23, 59, 59, LAST_US), "d20261231", at(2027, 1, 1)),
        ("day", at(2027, 1, 1), "d20270101", at(2027, 1, 2)),
        ("day", at(2028, 2, 28, 12), "d20280228", at(2028, 2, 29)),  # a leap year
        ("day", at(2028, 2, 29, 12), "d20280229", at(2028, 3, 1)),
        ("day", at(2027, 2, 28, 12), "d20270228", at(2027, 3, 1)),  # not one
        # weeks start on Monday (ISO 8601), 00:00 UTC; the bucket is named after that Monday
        ("week", at(2026, 11, 23), "w20261123", at(2026, 11, 30)),  # Monday
        ("week", at(2026, 11, 28, 13), "w20261123", at(2026, 11, 30)),  # Saturday
        ("week", at(2026, 11, 29, 23, 59, 59, LAST_US), "w20261123", at(2026, 11, 30)),  # Sun
        ("week", at(2026, 11, 30), "w20261130", at(2026, 12, 7)),
        ("week", at(2026, 12, 31, 12), "w20261228", at(2027, 1, 4)),  # a week across years
        ("week", at(2027, 1, 3, 23), "w20261228", at(2027, 1, 4)),  # ISO week 2026-W53
        ("week", at(2027, 1, 4), "w20270104", at(2027, 1, 11)),  # 2027-W01
        ("week", at(2028, 3, 1), "w20280228", at(2028, 3, 6)),  # holds 29 February
        ("week", at(2028, 2, 29), "w20280228", at(2028, 3, 6)),
        ("month", at(2026, 11, 28, 13), "m202611", at(2026, 12, 1)),
        ("month", at(2026, 11, 30, 23, 59, 59, LAST_US), "m202611", at(2026, 12, 1)),
        ("month", at(2026, 12, 1), "m202612", at(2027, 1, 1)),
        ("month", at(2026, 12, 31, 23, 59, 59, LAST_US), "m202612", at(2027, 1, 1)),  # year end
        ("month", at(2027, 1, 1), "m202701", at(2027, 2, 1)),
        ("month", at(2028, 2, 29, 23, 59), "m202802", at(2028, 3, 1)),
        ("month", at(2027, 2, 28, 23, 59), "m202702", at(2027, 3, 1)),
        ("month", at(2026, 1, 31), "m202601", at(2026, 2, 1)),
        ("total", at(2026, 11, 28, 13), "all", None),
        ("total", at(2099, 1, 1), "all", None),
    ],
)
def test_each_moment_falls_in_one_period(
    period: Period, now: dt.datetime, stamp: str, ends: dt.datetime | None
) -> None:
    assert window(period, now) == Window(stamp, ends)


@given(st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(9998, 12, 1)))
def test_periods_tile_the_calendar(naive: dt.datetime) -> None:
    now = naive.replace(tzinfo=UTC)
    day = window("day", now)
    assert day.ends is not None and day.ends - dt.timedelta(days=1) <= now < day.ends
    assert day.stamp == now.strftime("d%Y%m%d")

    week = window("week", now)
    assert week.ends is not None
    monday = week.ends - dt.timedelta(days=7)
    assert monday <= now < week.ends
    assert monday.isoweekday() == 1 and (monday.hour, monday.minute, monday.second) == (0, 0, 0)
    year, number, _ = now.isocalendar()
    assert monday.date() == dt.date.fromisocalendar(year, number, 1)
    assert week.stamp == monday.strftime("w%Y%m%d")

    month = window("month", now)
    assert month.ends is not None and month.ends.day == 1 and month.ends.time() == dt.time(0)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    assert first <= now < month.ends
    assert (month.ends - dt.timedelta(days=1)).month == now.month  # the next month's first
    assert month.stamp == now.strftime("m%Y%m")

    for period in PERIODS:  # the next period, a microsecond after one ends, is another bucket
        w = window(period, now)
        if w.ends is not None:
            assert window(period, w.ends).stamp != w.stamp
            assert window(period, w.ends - dt.timedelta(microseconds=1)).stamp == w.stamp


@pytest.mark.parametrize(
    ("period", "now", "ttl"),
    [
        ("day", at(2026, 11, 28, 12), 12 * 3600 + GRACE_S),
        ("day", at(2026, 11, 28), 86400 + GRACE_S),
        ("day", at(2026, 11, 28, 23, 59, 59, 500_000), GRACE_S),  # 0.5 s left: whole seconds
        ("week", at(2026, 11, 23), 7 * 86400 + GRACE_S),
        ("month", at(2026, 12, 31), 86400 + GRACE_S),
        ("month", at(2028, 2, 1), 29 * 86400 + GRACE_S),
        ("total", at(2026, 11, 28), 0),  # kept for ever
    ],
)
def test_a_periods_counter_is_kept_two_days_past_its_end(
    period: Period, now: dt.datetime, ttl: int
) -> None:
    assert GRACE_S == 2 * 86400
    assert window(period, now).ttl_s(now) == ttl


def test_the_ttl_counts_from_the_moment_asked() -> None:
    w = window("day", at(2026, 11, 28, 1))
    assert w.ttl_s(at(2026, 11, 28, 23)) == 3600 + GRACE_S
    assert w.ttl_s(at(2026, 11, 29, 1)) == GRACE_S - 3600  # settled an hour after its end


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (at(2026, 12, 1), "2026-12-01T00:00:00Z"),
        (at(2028, 2, 29, 23, 59, 59, LAST_US), "2028-02-29T23:59:59Z"),
        (
            dt.datetime(2026, 12, 1, 5, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
            "2026-12-01T00:00:00Z",
        ),
        (
            dt.datetime(2026, 11, 30, 19, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            "2026-12-01T00:00:00Z",
        ),
    ],
)
def test_iso_writes_utc_with_a_z(moment: dt.datetime, text: str) -> None:
    assert iso(moment) == text

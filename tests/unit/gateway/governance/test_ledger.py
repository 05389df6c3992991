"""The spend ledger's entries: one request's cost, on the UTC day it ended, by key, model and
team; added up by the memory backend and read back by the limiter."""

from __future__ import annotations

import datetime as dt

from gateway.governance.ledger import GROUPS, KEEP_DAYS, day_hash, ledger
from gateway.ratelimit import Limiter, RateLimitConfig, RuleBook
from gateway.ratelimit.memory import MemoryBackend
from gateway.ratelimit.redis_backend import LEDGER_TTL_S
from tests.unit.gateway.ratelimit.test_limiter import Seen

UTC = dt.UTC


def test_a_days_hash_is_named_after_its_utc_date() -> None:
    assert day_hash(dt.date(2026, 11, 28)) == "s:20261128"
    assert day_hash(dt.date(2028, 2, 29)) == "s:20280229"


def test_a_request_adds_its_cost_to_its_key_model_and_team() -> None:
    now = dt.datetime(2026, 11, 28, 13, tzinfo=UTC)
    assert ledger("key-1", "research", "gpt-4o", 4_000_000_000, now) == (
        "s:20261128",
        ("k:key-1", "m:gpt-4o", "t:research"),
        4_000_000_000,
    )


def test_a_key_without_a_team_adds_no_team_entry() -> None:
    now = dt.datetime(2026, 11, 28, 13, tzinfo=UTC)
    assert ledger("k", None, "m", 5, now) == ("s:20261128", ("k:k", "m:m"), 5)
    assert ledger("k", "", "m", 5, now) == ("s:20261128", ("k:k", "m:m"), 5)


def test_the_day_is_the_utc_day_the_request_ended() -> None:
    last = dt.datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    assert ledger("k", None, "m", 1, last)[0] == "s:20261231"
    assert ledger("k", None, "m", 1, last + dt.timedelta(microseconds=1))[0] == "s:20270101"
    before = dt.datetime.now(UTC).date()
    day = ledger("k", None, "m", 1)[0]  # now, by default
    after = dt.datetime.now(UTC).date()
    assert day in {day_hash(before), day_hash(after)}


def test_the_field_prefixes_and_how_long_a_day_is_kept() -> None:
    assert GROUPS == {"key": "k:", "team": "t:", "model": "m:"}
    assert KEEP_DAYS == 400
    assert LEDGER_TTL_S == KEEP_DAYS * 86400  # what Redis is told


def test_the_memory_backend_adds_each_entry_to_its_days_field() -> None:
    mem = MemoryBackend()
    day1 = dt.datetime(2026, 11, 28, 10, tzinfo=UTC)
    day2 = dt.datetime(2026, 11, 29, 10, tzinfo=UTC)
    mem.spend(ledger("a", "t", "m1", 100, day1))
    mem.spend(ledger("b", "t", "m1", 20, day1))
    mem.spend(ledger("a", None, "m2", 3, day1))
    mem.spend(ledger("a", "t", "m1", 7, day2))
    assert mem.ledger == {
        ("s:20261128", "k:a"): 103,
        ("s:20261128", "k:b"): 20,
        ("s:20261128", "m:m1"): 120,
        ("s:20261128", "m:m2"): 3,
        ("s:20261128", "t:t"): 120,
        ("s:20261129", "k:a"): 7,
        ("s:20261129", "m:m1"): 7,
        ("s:20261129", "t:t"): 7,
    }


async def test_the_limiter_reads_the_ledger_by_day() -> None:
    lim = Limiter(RateLimitConfig(), RuleBook({}, {}), Seen())
    now = dt.datetime(2026, 11, 28, 10, tzinfo=UTC)
    lim.spend(ledger("a", "t", "m", 100, now))
    lim.spend(ledger("a", "t", "m", -30, now))  # a correction
    days = await lim.read_ledger(["s:20261128", "s:20261127"])
    assert days == {"s:20261128": {"k:a": 70, "m:m": 70, "t:t": 70}, "s:20261127": {}}
    assert await lim.read_ledger([]) == {}

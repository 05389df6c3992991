"""Budgets in the limiter: the memory backend and the Redis script (on a real redis-server) give
the same verdicts and keep the same counters for the same sequences. Admission is exact at the
boundary and all-or-nothing with the rate limits; settlement corrects the reservation; periods,
team budgets and key x model budgets count in their own buckets; the spend ledger's hashes and
their TTL; money queued while Redis is away arrives once; a burst against a small budget admits
exactly what fits; a refusal is OpenAI's insufficient_quota."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InsufficientQuota, RateLimited
from gateway.governance.budgets import GRACE_S, Budget, Period, iso, window
from gateway.governance.ledger import ledger
from gateway.governance.money import usd
from gateway.ratelimit import Limiter, Limits, RateLimitConfig, RuleBook
from gateway.ratelimit.headers import BUDGET_HEADER, budget_header, ratelimit_headers
from gateway.ratelimit.memory import MemoryBackend
from gateway.ratelimit.redis_backend import LEDGER_TTL_S, BackendDown, RedisBackend
from gateway.ratelimit.rules import (
    Ask,
    BreakerConfig,
    KeyLimits,
    LimitScope,
    Rule,
    RuleSet,
    TeamLimits,
    Verdict,
)
from tests.redis_proc import RedisServer
from tests.unit.gateway.ratelimit.test_limiter import Seen, rule
from tests.unit.gateway.ratelimit.test_redis_backend import backend, config

PICO = 10**12
UTC = dt.UTC
PREFIX = "{llmgw}:"


async def idle(red: RedisBackend) -> None:
    """Until no call is out: a probe, each turn a millisecond (a call is a round trip)."""
    for _ in range(5000):
        if not red._draining:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("a call to Redis never ended")


async def flushed(red: RedisBackend) -> None:
    """Until everything queued has been sent and answered."""
    for _ in range(5000):
        if not (
            red._draining
            or red._adjust
            or red._spent
            or red._settled
            or red._settles
            or red._admits
        ):
            return
        if not red._draining:
            red._kick()  # money alone waits for a call: make one
        await asyncio.sleep(0.001)
    raise AssertionError("the Redis backend never sent what it queued")


def reply_int(raw: bytes) -> int:
    """An integer reply of RedisServer.command (":123\\r\\n")."""
    assert raw.startswith(b":"), raw
    return int(raw[1:].strip())


def budget(
    limit: int,
    bucket: str = "b:k:a",
    period: Period = "total",
    scope: LimitScope = "key",
    subject: str = "key 'a'",
) -> Rule:
    """A budget rule as the rule book makes one: its bucket named after its current period."""
    w = window(period, dt.datetime.now(UTC))
    return Rule(scope, "budget", limit, f"{bucket}:{w.stamp}", subject, Budget(limit, period), w)


def ask(*rules: Rule, cost: int = 0, tokens: int = 0, lease: str = "-") -> Ask:
    return Ask(RuleSet.of(rules), tokens, lease, cost)


@dataclass
class Twins:
    """The memory backend and the Redis script, asked the same things: every verdict and every
    counter must agree. `fast` is the memory backend's request path (`take`), held to `decide`."""

    mem: MemoryBackend
    red: RedisBackend
    fast: MemoryBackend

    async def admit(self, a: Ask) -> Verdict:
        m = self.mem.decide(a)
        r = await self.red.admit(a)
        headers = self.fast.take(a.limits, a.tokens, a.cost)
        assert r.admitted == m.admitted == (headers is not None)
        assert [v[2] > 0 for v in r.values] == [v[2] > 0 for v in m.values]  # which refused
        for rule_, mv, rv in zip(m.rules, m.values, r.values, strict=True):
            if rule_.kind == "budget":  # money is exact: the same values to the pico
                assert mv == rv == (mv[0], 0.0, 1.0 if mv[2] else 0.0)
            elif rule_.kind == "parallel":
                assert mv[0] == rv[0]
            else:  # a rate refills on each backend's own clock, a moment apart
                assert abs(mv[0] - rv[0]) <= 1
        spent = budget_left(ratelimit_headers(m, a.limits.reported))
        assert budget_left(ratelimit_headers(r, a.limits.reported)) == spent
        if headers is not None:
            assert budget_left(headers) == spent
        return m

    def settle(self, a: Ask, delta_tokens: int, delta_cost: int) -> None:
        for b in (self.mem, self.red, self.fast):
            b.settle(a, delta_tokens, delta_cost)

    async def counters(self, *buckets: str) -> dict[str, int]:
        """The budget counters, the same in both (Redis's once everything queued is in)."""
        await flushed(self.red)
        red = await self.red.read_counters(list(buckets))
        mem = {b: self.mem.spent.get(b, 0) for b in buckets}
        assert red == mem == {b: self.fast.spent.get(b, 0) for b in buckets}
        return mem


@pytest.fixture
async def twins(redis: RedisServer) -> AsyncIterator[Twins]:
    red = await backend(redis)
    try:
        yield Twins(MemoryBackend(), red, MemoryBackend())
    finally:
        await red.aclose()


def budget_left(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    return dict(headers).get(BUDGET_HEADER)


def outcome(v: Verdict) -> tuple[bool, list[int]]:
    return v.admitted, [value[0] for value in v.values]


# ---------------------------------------------------------------- admission


@pytest.mark.parametrize(
    "limit",
    [
        1000,
        PICO,  # $1
        9 * 10**15,  # $9,000: below 2^53 pico-dollars, where Lua's doubles are exact
        10**16,  # $10,000: past it, where only the script's exact pairs of digits are
        10**18,  # MAX_USD, $1,000,000
        2**53 + 1,  # the first integer a double cannot hold
    ],
)
async def test_a_cost_of_exactly_what_is_left_is_admitted_and_one_pico_more_refused(
    twins: Twins, limit: int
) -> None:
    b = budget(limit)
    assert outcome(await twins.admit(ask(b, cost=limit + 1))) == (False, [limit])
    assert outcome(await twins.admit(ask(b, cost=limit - 1))) == (True, [1])
    assert outcome(await twins.admit(ask(b, cost=2))) == (False, [1])
    assert outcome(await twins.admit(ask(b, cost=1))) == (True, [0])
    assert outcome(await twins.admit(ask(b, cost=1))) == (False, [0])
    assert outcome(await twins.admit(ask(b, cost=0))) == (True, [0])  # nothing to pay: fits
    assert await twins.counters(b.bucket) == {b.bucket: limit}


async def test_a_refusing_budget_leaves_the_rate_limits_untouched(
    twins: Twins, redis: RedisServer
) -> None:
    r, t, b = rule("requests", 3, "k:a:r"), rule("tokens", 1000, "k:a:t"), budget(500)
    refused = await twins.admit(ask(r, t, b, tokens=100, cost=501))
    assert outcome(refused) == (False, [2, 900, 500])  # what the rates would have left
    assert [v[2] > 0 for v in refused.values] == [False, False, True]  # the budget refused
    assert redis.command("EXISTS", f"{PREFIX}k:a:r", f"{PREFIX}k:a:t") == b":0\r\n"
    assert twins.mem._tat == {} and twins.fast._tat == {}
    admitted = await twins.admit(ask(r, t, b, tokens=100, cost=500))
    assert outcome(admitted) == (True, [2, 900, 0])  # a whole bucket: nothing was taken
    assert await twins.counters(b.bucket) == {b.bucket: 500}


async def test_a_refusing_rate_limit_leaves_the_budgets_untouched(twins: Twins) -> None:
    r, key, team = rule("requests", 1, "k:a:r"), budget(1000), budget(5000, "b:t:t")
    assert outcome(await twins.admit(ask(r, key, team, cost=100))) == (True, [0, 900, 4900])
    refused = await twins.admit(ask(r, key, team, cost=100))
    assert outcome(refused) == (False, [0, 800, 4800])  # what the budgets would have left
    assert [v[2] > 0 for v in refused.values] == [True, False, False]
    assert await twins.counters(key.bucket, team.bucket) == {key.bucket: 100, team.bucket: 100}


async def test_a_full_parallel_limit_leaves_the_budgets_untouched(twins: Twins) -> None:
    p, b = rule("parallel", 1, "k:a:p"), budget(1000)
    held = ask(p, b, cost=300, lease="held")
    assert outcome(await twins.admit(held)) == (True, [0, 700])
    assert outcome(await twins.admit(ask(p, b, cost=300, lease="x"))) == (False, [0, 400])
    assert await twins.counters(b.bucket) == {b.bucket: 300}
    twins.settle(held, 0, -100)  # the slot freed, 200 charged
    assert outcome(await twins.admit(ask(p, b, cost=800, lease="y"))) == (True, [0, 0])
    assert await twins.counters(b.bucket) == {b.bucket: 1000}


async def test_the_least_of_several_budgets_binds_and_is_reported(twins: Twins) -> None:
    key, team, model = budget(1000), budget(400, "b:t:t"), budget(700, "b:km:a:m")
    first = await twins.admit(ask(key, team, model, cost=300))
    assert outcome(first) == (True, [700, 100, 400])
    headers = ratelimit_headers(first, RuleSet.of((key, team, model)).reported)
    assert headers == [(BUDGET_HEADER, b"0.0000000001")]  # 100 pico-dollars
    refused = await twins.admit(ask(key, team, model, cost=101))
    assert [v[2] > 0 for v in refused.values] == [False, True, False]  # only the team's


@given(st.integers(min_value=-(10**19), max_value=10**19))
def test_the_header_writes_what_is_left_as_usd_does(left: int) -> None:
    assert budget_header(left) == (BUDGET_HEADER, usd(max(0, left)).encode())


# ---------------------------------------------------------------- settlement


async def test_settlement_refunds_and_charges_what_was_used(twins: Twins) -> None:
    b = budget(1000)
    first = ask(b, cost=800)
    assert (await twins.admit(first)).admitted
    assert not (await twins.admit(ask(b, cost=300))).admitted
    twins.settle(first, 0, -650)  # reserved 800, cost 150
    assert await twins.counters(b.bucket) == {b.bucket: 150}
    second = ask(b, cost=850)
    assert outcome(await twins.admit(second)) == (True, [0])
    twins.settle(second, 0, 100)  # cost more than it reserved (its prompt was underestimated)
    assert await twins.counters(b.bucket) == {b.bucket: 1100}
    overspent = await twins.admit(ask(b, cost=0))
    assert outcome(overspent) == (False, [-100])  # spent past the budget: even 0 is refused
    headers = ratelimit_headers(overspent, RuleSet.of((b,)).reported)
    assert headers == [(BUDGET_HEADER, b"0")]  # never negative


async def test_settlement_and_tokens_are_corrected_together(twins: Twins) -> None:
    t, b = rule("tokens", 1000, "k:a:t"), budget(10_000)
    a = ask(t, b, tokens=900, cost=9000)
    assert (await twins.admit(a)).admitted
    twins.settle(a, -800, -8000)  # used 100 tokens, cost 1000
    after = await twins.admit(ask(t, b, tokens=100, cost=1000))
    assert after.admitted and after.values[1][0] == 8000
    assert after.values[0][0] in (799, 800)  # tokens refill meanwhile
    assert await twins.counters(b.bucket) == {b.bucket: 2000}


async def test_a_random_sequence_gets_the_same_answers_from_both(twins: Twins) -> None:
    rng = random.Random(37)
    p = rule("parallel", 4, "k:a:p")
    rules = [budget(50_000), budget(80_000, "b:t:t", "month"), budget(30_000, "b:km:a:m", "day")]
    held: list[Ask] = []
    seen = set()
    for i in range(300):
        chosen = (p, *rng.sample(rules, rng.randint(1, 3)))
        a = ask(*chosen, cost=rng.choice((0, 1, 999, 1000, rng.randint(0, 8000))), lease=f"l{i}")
        verdict = await twins.admit(a)
        seen.add(verdict.admitted)
        if verdict.admitted:
            held.append(a)
        while held and (len(held) == 4 or rng.random() < 0.5):
            done = held.pop(rng.randrange(len(held)))
            twins.settle(done, 0, rng.randint(-done.cost, 500))
    assert seen == {True, False}
    counted = await twins.counters(*(r.bucket for r in rules))
    assert all(v > 0 for v in counted.values())


# ---------------------------------------------------------------- what budgets count


def resolved(book: RuleBook, key: str, model: str) -> dict[str, tuple[str, int, str]]:
    """A (key, model)'s budget rules: bucket → (scope, limit, subject)."""
    return {
        r.bucket: (r.scope, r.limit, r.subject)
        for r in book.rules(key, model).rules
        if r.kind == "budget"
    }


def stamp(period: Period) -> str:
    return window(period, dt.datetime.now(UTC)).stamp


def test_budgets_of_every_scope_and_period_have_their_own_buckets() -> None:
    book = RuleBook(
        {
            "a": KeyLimits(
                Limits(),
                (),
                team="t",
                budget=Budget(1000, "day"),
                model_budgets=(("gpt-*", Budget(500, "week")), ("*", Budget(100, "month"))),
            )
        },
        {"gpt-4o": Limits()},
        {
            "t": TeamLimits(
                budget=Budget(5000, "total"), model_budgets=(("gpt-4o", Budget(300, "month")),)
            )
        },
    )
    d, w, m = stamp("day"), stamp("week"), stamp("month")
    assert resolved(book, "a", "gpt-4o") == {
        f"b:k:a:{d}": ("key", 1000, "key 'a'"),
        f"b:km:a:gpt-4o:{w}": ("key_model", 500, "model 'gpt-4o' on key 'a'"),
        "b:t:t:all": ("team", 5000, "team 't'"),
        f"b:tm:t:gpt-4o:{m}": ("team_model", 300, "model 'gpt-4o' on team 't'"),
    }
    # another alias of the glob has a budget of its own, not a share of gpt-4o's
    assert resolved(book, "a", "gpt-5") == {
        f"b:k:a:{d}": ("key", 1000, "key 'a'"),
        f"b:km:a:gpt-5:{w}": ("key_model", 500, "model 'gpt-5' on key 'a'"),
        "b:t:t:all": ("team", 5000, "team 't'"),
    }
    assert f"b:km:a:llama:{m}" in resolved(book, "a", "llama")  # the first glob that matches
    odd = [b for b in resolved(book, "a", "a model/with {braces}") if b.startswith("b:km:")]
    assert len(odd) == 1 and odd[0].startswith("b:km:a:h-") and "{" not in odd[0]
    found = book.rules("a", "gpt-4o")
    assert found.until == window("day", dt.datetime.now(UTC)).ends.timestamp()  # type: ignore[union-attr]
    assert [r.kind for r in found.rules] == ["budget"] * 4
    assert resolved(book, "nobody", "gpt-4o") == {}


async def test_budgets_of_different_periods_count_together_and_expire_apart(
    twins: Twins, redis: RedisServer
) -> None:
    day, week = budget(1000, period="day"), budget(5000, "b:t:t", "week", "team", "team 't'")
    month, total = budget(9000, "b:km:a:m", "month"), budget(10**6, "b:tm:t:m", "total")
    rules = (day, week, month, total)
    first = ask(*rules, cost=600)
    given = {bucket: ttl for bucket, _, ttl in first.limits.budgets}  # what EXPIRE is told
    assert outcome(await twins.admit(first)) == (True, [400, 4400, 8400, 999_400])
    refused = await twins.admit(ask(*rules, cost=401))
    assert [v[2] > 0 for v in refused.values] == [True, False, False, False]  # the day's
    buckets = [r.bucket for r in rules]
    assert await twins.counters(*buckets) == dict.fromkeys(buckets, 600)
    now = dt.datetime.now(UTC)
    for r in (day, week, month):
        assert r.window is not None
        expected = r.window.ttl_s(now)  # the period's end, plus two days
        assert expected > GRACE_S and abs(given[r.bucket] - expected) <= 1
        ttl = reply_int(redis.command("TTL", PREFIX + r.bucket))
        assert given[r.bucket] - 5 <= ttl <= given[r.bucket]
        assert abs(twins.mem.expiry[r.bucket] - (time.time() + expected)) < 5
    assert given[total.bucket] == 0
    assert redis.command("TTL", PREFIX + total.bucket) == b":-1\r\n"  # kept for ever
    assert twins.mem.expiry[total.bucket] == math.inf


async def test_a_teams_budget_is_shared_by_its_keys(twins: Twins) -> None:
    book = RuleBook(
        {k: KeyLimits(Limits(), (), team="t") for k in ("a", "b")},
        {"m": Limits()},
        {"t": TeamLimits(budget=Budget(1000, "day"))},
    )
    a, b = book.rules("a", "m"), book.rules("b", "m")
    assert [x[0] for x in a.budgets] == [x[0] for x in b.budgets]  # one bucket: the team's
    assert outcome(await twins.admit(Ask(a, 0, "-", 600))) == (True, [400])
    assert outcome(await twins.admit(Ask(b, 0, "-", 500))) == (False, [400])
    assert outcome(await twins.admit(Ask(b, 0, "-", 400))) == (True, [0])
    assert outcome(await twins.admit(Ask(a, 0, "-", 1))) == (False, [0])
    bucket = a.budgets[0][0]
    assert bucket == f"b:t:t:{stamp('day')}"
    assert await twins.counters(bucket) == {bucket: 1000}


async def test_key_model_budgets_match_by_glob_each_model_its_own(twins: Twins) -> None:
    book = RuleBook(
        {
            "a": KeyLimits(
                Limits(),
                (),
                team="t",
                model_budgets=(("gpt-*", Budget(500, "day")), ("*", Budget(100, "day"))),
            )
        },
        {"gpt-4o": Limits(), "gpt-5": Limits(), "llama": Limits()},
        {"t": TeamLimits(model_budgets=(("gpt-4o", Budget(300, "total")),))},
    )
    g4, g5, llama = (book.rules("a", m) for m in ("gpt-4o", "gpt-5", "llama"))
    assert outcome(await twins.admit(Ask(g4, 0, "-", 300))) == (True, [200, 0])
    refused = await twins.admit(Ask(g4, 0, "-", 1))  # the team's budget on gpt-4o is spent
    assert [(r.scope, v[2] > 0) for r, v in zip(refused.rules, refused.values, strict=True)] == [
        ("key_model", False),
        ("team_model", True),
    ]
    assert outcome(await twins.admit(Ask(g5, 0, "-", 500))) == (True, [0])  # its own 500
    assert outcome(await twins.admit(Ask(llama, 0, "-", 101))) == (False, [100])
    assert outcome(await twins.admit(Ask(llama, 0, "-", 100))) == (True, [0])
    d = stamp("day")
    counted = await twins.counters(
        f"b:km:a:gpt-4o:{d}", "b:tm:t:gpt-4o:all", f"b:km:a:gpt-5:{d}", f"b:km:a:llama:{d}"
    )
    assert list(counted.values()) == [300, 300, 500, 100]


# ---------------------------------------------------------------- the spend ledger


async def test_the_ledger_is_a_hash_per_day_kept_400_days(twins: Twins, redis: RedisServer) -> None:
    now = dt.datetime.now(UTC)
    entries = [ledger("a", "t", "gpt-4o", 4_000_000_000, now), ledger("b", None, "gpt-4o", 7, now)]
    for b in (twins.mem, twins.red):
        for entry in entries:
            b.spend(entry)
    await flushed(twins.red)
    day = entries[0][0]
    assert day == now.strftime("s:%Y%m%d")
    expected = {"k:a": 4_000_000_000, "m:gpt-4o": 4_000_000_007, "t:t": 4_000_000_000, "k:b": 7}
    assert await twins.red.read_ledger([day, "s:19991231"]) == {day: expected, "s:19991231": {}}
    assert {f: v for (d, f), v in twins.mem.ledger.items() if d == day} == expected
    ttl = reply_int(redis.command("TTL", PREFIX + day))
    assert LEDGER_TTL_S == 400 * 86400
    assert LEDGER_TTL_S - 5 <= ttl <= LEDGER_TTL_S
    assert redis.command("TYPE", PREFIX + day) == b"+hash\r\n"


async def test_the_limiter_adds_to_the_ledger_in_redis(redis: RedisServer) -> None:
    lim = Limiter(config(redis), RuleBook({}, {}), Seen())
    await lim.start()
    try:
        now = dt.datetime(2026, 11, 28, 12, tzinfo=UTC)
        lim.spend(ledger("a", "t", "m", 25, now))
        lim.spend(ledger("a", "t", "m", 5, now))
        assert lim._redis is not None
        await flushed(lim._redis)
        assert await lim.read_ledger(["s:20261128"]) == {
            "s:20261128": {"k:a": 30, "m:m": 30, "t:t": 30}
        }
    finally:
        await lim.aclose()


# ---------------------------------------------------------------- Redis away


async def test_money_queued_while_redis_is_down_arrives_exactly_once(redis: RedisServer) -> None:
    red = await backend(redis)
    b = budget(10_000)
    now = dt.datetime.now(UTC)
    day = now.strftime("s:%Y%m%d")
    try:
        a = ask(b, cost=1000)
        assert (await red.admit(a)).admitted
        redis.kill()
        red.settle(a, 0, -600)  # it cost 400
        red.spend(ledger("a", "t", "m", 400, now))
        with pytest.raises(BackendDown):
            await red.admit(ask(b, cost=1))
        await idle(red)
        red.spend(ledger("a", "t", "m", 50, now))  # more, while Redis is away
        await idle(red)
        redis.start()  # a new, empty Redis: what it holds next is what was queued
        assert (await red.admit(ask(b, cost=0))).admitted
        await flushed(red)
        assert await red.read_counters([b.bucket]) == {b.bucket: -600}
        assert await red.read_ledger([day]) == {day: {"k:a": 450, "m:m": 450, "t:t": 450}}
        for i in range(3):  # later calls send nothing again
            assert (await red.admit(ask(b, cost=0, lease=str(i)))).admitted
        assert await red.read_counters([b.bucket]) == {b.bucket: -600}
        assert await red.read_ledger([day]) == {day: {"k:a": 450, "m:m": 450, "t:t": 450}}
        assert red.lost_adjustments == 0
    finally:
        await red.aclose()


async def test_a_charge_made_locally_while_redis_is_away_reaches_its_counters(
    redis: RedisServer,
) -> None:
    """With on_backend_error: local, what a request admitted locally cost is queued for the
    Redis budgets and ledger, and sent once Redis answers again."""
    book = RuleBook({"a": KeyLimits(Limits(), (), team="t", budget=Budget(PICO, "day"))}, {})
    seen = Seen()
    lim = Limiter(config(redis, breaker=BreakerConfig(failures=1, cooldown_s=0.1)), book, seen)
    await lim.start()
    assert lim._redis is not None
    bucket = f"b:k:a:{stamp('day')}"
    now = dt.datetime.now(UTC)
    day = now.strftime("s:%Y%m%d")
    try:
        redis.kill()
        grant = await lim.admit("a", "m", "m", lambda: (100, 500_000))
        assert grant.backend is lim._local
        assert grant.settle(80, 123_456) == 123_456
        lim.spend(ledger("a", "t", "m", 123_456, now))  # the breaker is open: queued only
        await idle(lim._redis)
        redis.start()
        await back_on_redis(lim)
        await flushed(lim._redis)
        assert await lim.read_counters([bucket]) == {bucket: 123_456}
        assert await lim.read_ledger([day]) == {
            day: {"k:a": 123_456, "m:m": 123_456, "t:t": 123_456}
        }
        assert seen.errors == ["local"]
    finally:
        await lim.aclose()


async def back_on_redis(lim: Limiter) -> None:
    """Admissions until one is Redis's: the breaker's cooldown (0.1 s), then its probe."""
    for _ in range(200):
        grant = await lim.admit("a", "m", "m", lambda: (1, 0))
        if grant.backend is lim._redis:
            return
        await asyncio.sleep(0.02)
    pytest.fail("the limiter never went back to Redis")


async def test_what_an_unchecked_request_cost_reaches_the_budgets_when_redis_is_back(
    redis: RedisServer,
) -> None:
    """With on_backend_error: open, a request admitted while Redis is away is not checked, but
    what it cost still counts in its budgets' counters once Redis answers again."""
    book = RuleBook({"a": KeyLimits(Limits(), (), budget=Budget(PICO, "day"))}, {})
    breaker = BreakerConfig(failures=1, cooldown_s=0.1)
    lim = Limiter(config(redis, on_backend_error="open", breaker=breaker), book, Seen())
    await lim.start()
    assert lim._redis is not None
    bucket = f"b:k:a:{stamp('day')}"
    try:
        redis.kill()
        grant = await lim.admit("a", "m", "m", lambda: (100, 500_000))
        assert grant.headers == []
        assert grant.settle(80, 123_456) == 123_456
        await idle(lim._redis)
        redis.start()
        await back_on_redis(lim)
        await flushed(lim._redis)
        assert await lim.read_counters([bucket]) == {bucket: 123_456}
    finally:
        await lim.aclose()


async def test_money_of_a_call_that_timed_out_is_counted_once(redis: RedisServer) -> None:
    """Redis takes a call and answers after the client gave up (paused here; in production a
    slow Redis past timeout_ms): a refund and a ledger entry must still count once."""
    red = await backend(redis, timeout_ms=50)
    b = budget(10_000)
    now = dt.datetime.now(UTC)
    day = now.strftime("s:%Y%m%d")
    try:
        a = ask(b, cost=1000)
        assert (await red.admit(a)).admitted  # the script is loaded: a call is one EVALSHA
        red.spend(ledger("a", None, "m", 5, now))
        await flushed(red)
        redis.pause()
        try:
            red.settle(a, 0, -900)  # it cost 100
            red.spend(ledger("a", None, "m", 100, now))
            await idle(red)  # the call timed out
        finally:
            redis.resume()
        await flushed(red)
        assert await red.read_counters([b.bucket]) == {b.bucket: 100}
        assert await red.read_ledger([day]) == {day: {"k:a": 105, "m:m": 105}}
    finally:
        await red.aclose()


async def test_an_admission_that_timed_out_holds_no_money(redis: RedisServer) -> None:
    red = await backend(redis, timeout_ms=50)
    b = budget(10_000)
    try:
        assert (await red.admit(ask(b, cost=0))).admitted  # the script is loaded
        redis.pause()
        try:
            with pytest.raises(BackendDown):
                await red.admit(ask(b, cost=1000))
        finally:
            redis.resume()
        assert (await red.admit(ask(b, cost=0))).admitted
        await flushed(red)
        assert await red.read_counters([b.bucket]) == {b.bucket: 0}
    finally:
        await red.aclose()


# ---------------------------------------------------------------- the limiter


def budget_book(usd_pico: int = 1000, period: Period = "day") -> RuleBook:
    return RuleBook(
        {"a": KeyLimits(Limits(), (), budget=Budget(usd_pico, period))}, {"m": Limits()}
    )


def costing(tokens: int, money: int) -> Callable[[], tuple[int, int]]:
    return lambda: (tokens, money)


@pytest.fixture(params=["memory", "redis"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_limiter(
    name: str, redis_server: RedisServer, book: RuleBook, seen: Seen | None = None
) -> Limiter:
    cfg = RateLimitConfig() if name == "memory" else config(redis_server)
    return Limiter(cfg, book, seen or Seen())


async def test_a_burst_admits_exactly_what_the_budget_holds(
    backend_name: str, redis: RedisServer
) -> None:
    """64 concurrent requests reserving 70 pico-dollars each against 1000: exactly
    floor(1000 / 70) = 14 admitted, on the memory backend and across 4 replicas on Redis."""
    replicas = 1 if backend_name == "memory" else 4
    limiters = [make_limiter(backend_name, redis, budget_book(1000)) for _ in range(replicas)]
    for lim in limiters:
        await lim.start()
    try:
        results = await asyncio.gather(
            *(limiters[i % replicas].admit("a", "m", "m", costing(5, 70)) for i in range(64)),
            return_exceptions=True,
        )
        admitted = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(admitted) == 1000 // 70 == 14
        assert all(isinstance(e, InsufficientQuota) for e in refused) and len(refused) == 50
        bucket = f"b:k:a:{stamp('day')}"
        assert await limiters[0].read_counters([bucket]) == {bucket: 14 * 70}
        left = sorted(dict(g.headers)[BUDGET_HEADER] for g in admitted)
        assert left == sorted(usd(1000 - 70 * n).encode() for n in range(1, 15))
    finally:
        for lim in limiters:
            await lim.aclose()


async def test_a_budget_refusal_is_openais_insufficient_quota(
    backend_name: str, redis: RedisServer
) -> None:
    seen = Seen()
    lim = make_limiter(backend_name, redis, budget_book(PICO), seen)  # $1 a day
    await lim.start()
    try:
        grant = await lim.admit("a", "m", "m", costing(1000, 600_000_000_000))  # up to $0.60
        assert grant.headers == [(BUDGET_HEADER, b"0.4")]
        with pytest.raises(InsufficientQuota) as err:
            await lim.admit("a", "m", "m", costing(1000, 600_000_000_000))
        (rule_,) = lim.budget_rules("a", "m")
        assert rule_.window is not None and rule_.window.ends is not None
        resets = iso(rule_.window.ends)
        e = err.value
        assert (e.status, e.type, e.code) == (429, "insufficient_quota", "insufficient_quota")
        assert e.headers == {"x-should-retry": "false", "x-gateway-budget-remaining-usd": "0"}
        assert e.message == (
            "Budget exceeded for key 'a': $1.00 a day, $0.60 spent or reserved by requests in "
            f"flight, and this request may cost up to $0.60. It resets at {resets}."
        )
        assert e.body() == {
            "error": {
                "message": e.message,
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        }
        now = dt.datetime.now(UTC)
        assert rule_.window.ends - dt.timedelta(days=1) <= now < rule_.window.ends
        assert resets == rule_.window.ends.strftime("%Y-%m-%dT00:00:00Z")  # next UTC midnight
        assert seen.decisions[-1] == ("m", "rejected", "key_budget", backend_name)
        # settled to what it cost ($0.25): the rest is free again
        assert grant.settle(900, 250_000_000_000) == 250_000_000_000
        after = await lim.admit("a", "m", "m", costing(1000, 600_000_000_000))
        assert after.headers == [(BUDGET_HEADER, b"0.15")]
        assert after.settle(None, None) == 600_000_000_000  # unknown usage: the reservation
    finally:
        await lim.aclose()


async def test_a_total_budget_says_it_does_not_reset(backend_name: str, redis: RedisServer) -> None:
    book = RuleBook(
        {"a": KeyLimits(Limits(), (), team="t")},
        {"m": Limits()},
        {"t": TeamLimits(budget=Budget(5 * PICO, "total"))},
    )
    lim = make_limiter(backend_name, redis, book)
    await lim.start()
    try:
        await lim.admit("a", "m", "m", costing(10, 4_990_000_000_000))
        with pytest.raises(InsufficientQuota) as err:
            await lim.admit("a", "m", "m", costing(10, 15_000_000_000))
        assert err.value.message == (
            "Budget exceeded for team 't': $5.00 in total, $4.99 spent or reserved by requests "
            "in flight, and this request may cost up to $0.015. It does not reset (period: total)."
        )
    finally:
        await lim.aclose()


async def test_a_spent_budget_is_what_the_caller_hears_over_a_rate_limit(
    backend_name: str, redis: RedisServer
) -> None:
    """Refused by both at once: the budget's 429, which the SDK does not retry, not the rate
    limit's, which it would retry for nothing."""
    book = RuleBook(
        {"a": KeyLimits(Limits(rpm=1), (), budget=Budget(1000, "week"))}, {"m": Limits()}
    )
    seen = Seen()
    lim = make_limiter(backend_name, redis, book, seen)
    await lim.start()
    try:
        await lim.admit("a", "m", "m", costing(1, 1000))
        with pytest.raises(InsufficientQuota) as err:
            await lim.admit("a", "m", "m", costing(1, 1))
        assert "for key 'a': $0.000000001 a week, $0.000000001 spent" in err.value.message
        assert seen.decisions[-1] == ("m", "rejected", "key_budget", backend_name)
        with pytest.raises(RateLimited):  # free of cost, the rate limit alone refuses
            await lim.admit("a", "m", "m", costing(1, 0))
    finally:
        await lim.aclose()


async def test_a_key_without_budgets_reserves_no_money(
    backend_name: str, redis: RedisServer
) -> None:
    lim = make_limiter(backend_name, redis, RuleBook({"a": KeyLimits(Limits(rpm=5), ())}, {}))
    await lim.start()
    try:
        grant = await lim.admit("a", "m", "m", costing(1, 10**9))
        assert BUDGET_HEADER not in dict(grant.headers)
        assert grant.settle(1, 77) == 77  # what it cost, for the ledger
        assert (await lim.admit("a", "m", "m", costing(1, 10**9))).settle(1, None) is None
    finally:
        await lim.aclose()


# ---------------------------------------------------------------- periods roll over


def test_a_cached_rule_set_is_found_again_when_a_period_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rules of a configured alias are resolved once, and again once the earliest of their
    budgets' periods ends: the next request counts in the new period's buckets."""
    from gateway.ratelimit import rules as rules_module

    clock = [dt.datetime(2026, 11, 29, 23, 59, 59, tzinfo=UTC)]  # a Sunday's last second

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Frozen:
            return clock[0]  # type: ignore[return-value]

    fake_dt = type("dt", (), {"datetime": Frozen, "UTC": UTC})
    monkeypatch.setattr(rules_module, "dt", fake_dt)
    fake_time = type("time", (), {"time": staticmethod(lambda: clock[0].timestamp())})
    monkeypatch.setattr(rules_module, "time", fake_time)
    book = RuleBook(
        {
            "a": KeyLimits(
                Limits(rpm=5),
                (),
                budget=Budget(1000, "day"),
                model_budgets=(("*", Budget(5000, "week")),),
            )
        },
        {"m": Limits()},
    )
    sunday = book.rules("a", "m")
    assert [b for b, _, _ in sunday.budgets] == ["b:k:a:d20261129", "b:km:a:m:w20261123"]
    assert sunday.until == dt.datetime(2026, 11, 30, tzinfo=UTC).timestamp()
    assert [ttl for _, _, ttl in sunday.budgets] == [1 + GRACE_S, 1 + GRACE_S]
    clock[0] += dt.timedelta(microseconds=999_999)
    assert book.rules("a", "m") is sunday  # the same period: the same rules
    clock[0] += dt.timedelta(microseconds=1)  # Monday 00:00:00: a new day and a new week
    monday = book.rules("a", "m")
    assert [b for b, _, _ in monday.budgets] == ["b:k:a:d20261130", "b:km:a:m:w20261130"]
    assert [ttl for _, _, ttl in monday.budgets] == [86400 + GRACE_S, 7 * 86400 + GRACE_S]
    assert book.rules("a", "m") is monday
    # an alias the config does not name (a virtual key's model) is resolved per request
    assert book.rules("a", "org/other") is not book.rules("a", "org/other")


def test_the_memory_backend_forgets_a_periods_counter_after_its_time_to_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.ratelimit import memory as memory_module

    wall = [1_800_000_000.0]
    monkeypatch.setattr(memory_module, "time", type("t", (), {"time": lambda: wall[0]}))
    mem = MemoryBackend(clock=lambda: 0.0)
    day, total = budget(1000, period="day"), budget(1000, "b:t:t")
    a = ask(day, total, cost=10)
    assert mem.decide(a).admitted
    ttl = a.limits.budgets[0][2]
    assert ttl > GRACE_S
    assert mem.expiry == {day.bucket: wall[0] + ttl, total.bucket: math.inf}
    wall[0] += ttl - 1
    mem._sweep(0.0)
    assert mem.spent == {day.bucket: 10, total.bucket: 10}
    wall[0] += 1
    mem._sweep(0.0)
    assert mem.spent == {total.bucket: 10}  # the day's, two days past its end: gone


async def test_a_budget_costs_no_round_trip_beyond_the_limits(redis: RedisServer) -> None:
    """Admission and settlement with every kind of limit and two budgets: one script call
    each, as with the limits alone; the spend ledger rides with the settlement."""
    keys = {
        "a": KeyLimits(
            Limits(rpm=100, tpm=10_000, max_parallel=5), (), team="t",
            budget=Budget(10**12, "day"),
        )
    }  # fmt: skip
    book = RuleBook(keys, {"m": Limits()}, {"t": TeamLimits(budget=Budget(10**12, "month"))})
    lim = Limiter(config(redis), book, Seen())
    await lim.start()
    assert lim._redis is not None
    calls: list[object] = []
    script = lim._redis._script

    async def counted(**kw: object) -> object:
        calls.append(kw)
        return await script(**kw)  # type: ignore[arg-type]

    lim._redis._script = counted  # type: ignore[assignment]
    try:
        grant = await lim.admit("a", "m", "m", costing(10, 5000))
        assert len(calls) == 1
        assert grant.settle(8, 4000) == 4000
        lim.spend(ledger("a", "t", "m", 4000))
        await flushed(lim._redis)
        assert len(calls) == 2
    finally:
        await lim.aclose()

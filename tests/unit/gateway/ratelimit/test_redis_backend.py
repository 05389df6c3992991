"""The Redis backend and the limiter on a real redis-server: the Lua script against the memory
backend, exact admission under concurrency from several replicas' backends, settlement, parallel
leases, cancellation, and Redis failing and coming back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.errors import RateLimited
from gateway.ratelimit import Grant, KeyLimits, Limiter, Limits, RateLimitConfig, RuleBook
from gateway.ratelimit.memory import MemoryBackend
from gateway.ratelimit.redis_backend import BackendDown, RedisBackend
from gateway.ratelimit.rules import BreakerConfig, Rule
from tests.redis_proc import RedisCluster, RedisServer
from tests.unit.gateway.ratelimit.test_limiter import FULL_BUCKET_CASES, Seen, ask, cost, rule


def config(redis: RedisServer, **kw: object) -> RateLimitConfig:
    return RateLimitConfig(backend="redis", redis_url=redis.url, **kw)  # type: ignore[arg-type]


async def backend(redis: RedisServer, **kw: object) -> RedisBackend:
    b = RedisBackend(config(redis, **kw))
    await b.start()
    return b


async def test_script_decides_as_the_memory_backend(redis: RedisServer) -> None:
    rules = (rule("requests", 4, "r"), rule("tokens", 100, "t"))
    asks = [ask(*rules, tokens=t, lease=str(i)) for i, t in enumerate((30, 50, 30, 10, 5, 1))]
    mem = MemoryBackend()
    red = await backend(redis)
    try:
        for a in asks:
            m, r = mem.decide(a), await red.admit(a)
            assert r.admitted == m.admitted
            assert [s.remaining for s in r.states] == [s.remaining for s in m.states]
            assert [s.retry_s > 0 for s in r.states] == [s.retry_s > 0 for s in m.states]
            for rs, ms in zip(r.states, m.states, strict=True):
                assert rs.reset_s == pytest.approx(ms.reset_s, abs=0.5)
    finally:
        await red.aclose()


async def test_a_full_bucket_reports_exactly_what_is_left(redis: RedisServer) -> None:
    """On the server's clock (epoch seconds), a fresh bucket reports limit less cost to the
    unit: the script's arithmetic is on how far a bucket is drawn, not on epoch times."""
    red = await backend(redis)
    try:
        for limit, cost_ in FULL_BUCKET_CASES:
            for attempt in range(20):  # each at another instant: other low digits of the clock
                r = rule("tokens", limit, f"t{limit}:{cost_}:{attempt}")
                verdict = await red.admit(ask(r, tokens=cost_))
                assert verdict.states[0].remaining == limit - cost_, (limit, cost_, attempt)
    finally:
        await red.aclose()


async def test_four_replicas_admit_exactly_the_limit_under_a_burst(redis: RedisServer) -> None:
    limit = 25
    replicas = [await backend(redis) for _ in range(4)]
    r = rule("requests", limit, "k:burst:r")
    try:
        verdicts = await asyncio.gather(
            *(replicas[i % 4].admit(ask(r, lease=str(i))) for i in range(4 * limit))
        )
    finally:
        for b in replicas:
            await b.aclose()
    assert sum(v.admitted for v in verdicts) == limit
    keys = redis.command("KEYS", "*")
    assert b"{llmgw}:k:burst:r" in keys  # one hash tag: one slot on a Cluster


async def test_tokens_are_reserved_then_settled(redis: RedisServer) -> None:
    t = rule("tokens", 1000, "t")
    red = await backend(redis)
    try:
        first = ask(t, tokens=900, lease="1")
        assert (await red.admit(first)).admitted
        assert not (await red.admit(ask(t, tokens=200, lease="2"))).admitted
        red.settle(first, -800)  # it used 100
        after = await red.admit(ask(t, tokens=200, lease="3"))
        assert after.admitted and after.states[0].remaining in (699, 700)
    finally:
        await red.aclose()


async def test_parallel_slots_are_leases(redis: RedisServer) -> None:
    par = rule("parallel", 1, "p")
    a = await backend(redis, lease_s=30.0)
    b = await backend(redis, lease_s=30.0)
    try:
        held = ask(par, lease="held")
        assert (await a.admit(held)).admitted
        assert not (await b.admit(ask(par, lease="x"))).admitted
        a.settle(held, 0)
        assert (await b.admit(ask(par, lease="y"))).admitted
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_vanished_replicas_slot_frees_itself_and_a_live_one_keeps_it(
    redis: RedisServer,
) -> None:
    par = rule("parallel", 1, "p")
    gone = await backend(redis, lease_s=0.6)
    live = await backend(redis, lease_s=0.6)
    other = await backend(redis, lease_s=0.6)
    try:
        assert (await gone.admit(ask(par, lease="gone"))).admitted
        await gone.aclose()  # never settles, never refreshes: as if the process died
        for attempt in range(200):  # the lease lapses after 0.6 s
            if (await live.admit(ask(par, lease=f"live{attempt}"))).admitted:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the vanished replica's slot never freed")
        # `live` refreshes its lease every 0.2 s: held well past 0.6 s
        for _ in range(8):
            await asyncio.sleep(0.2)
            assert not (await other.admit(ask(par, lease="other"))).admitted
    finally:
        await live.aclose()
        await other.aclose()


async def test_an_admission_abandoned_in_flight_is_given_back(redis: RedisServer) -> None:
    par, t = rule("parallel", 1, "p"), rule("tokens", 100, "t")
    red = await backend(redis)
    try:
        task = asyncio.ensure_future(red.admit(ask(par, t, tokens=100, lease="left")))
        await asyncio.sleep(0)  # queued, and the call is on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the next call carries the give-back first: both limits are whole again
        again = await red.admit(ask(par, t, tokens=100, lease="next"))
        if not again.admitted:  # the give-back may ride on the call after
            again = await red.admit(ask(par, t, tokens=100, lease="next2"))
        assert again.admitted
    finally:
        await red.aclose()


async def test_an_admission_queued_as_the_last_call_ends_is_still_made(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admission queued in the step where the last call's drainer ends (before that task's
    done-callbacks run) gets a drainer of its own, instead of waiting for the next request."""
    monkeypatch.setattr("gateway.ratelimit.redis_backend.MAX_IN_FLIGHT", 1)
    limit = rule("requests", 10, "r")
    red = await backend(redis)
    call = red._call
    late: list[asyncio.Task[object]] = []

    async def then_one_more(*args: object) -> object:
        verdicts = await call(*args)  # type: ignore[arg-type]
        if not late:  # its first step runs after this drainer's end, before its callbacks
            late.append(asyncio.ensure_future(red.admit(ask(limit, lease="late"))))
        return verdicts

    monkeypatch.setattr(red, "_call", then_one_more)
    try:
        assert (await red.admit(ask(limit, lease="first"))).admitted
        verdict = await asyncio.wait_for(late[0], 2.0)
        assert verdict.admitted  # type: ignore[attr-defined]
    finally:
        await red.aclose()


async def test_a_hung_redis_fails_the_call_instead_of_hanging(redis: RedisServer) -> None:
    red = await backend(redis, timeout_ms=50)
    try:
        assert (await red.admit(ask(rule(), lease="1"))).admitted
        redis.pause()
        with pytest.raises(BackendDown):
            await red.admit(ask(rule(), lease="2"))
        redis.resume()
        assert (await red.admit(ask(rule(), lease="3"))).admitted
    finally:
        redis.resume()
        await red.aclose()


async def test_limiter_falls_back_locally_and_shares_again_when_redis_returns(
    redis: RedisServer,
) -> None:
    seen = Seen()
    cfg = config(redis, replicas=2, breaker=BreakerConfig(failures=1, cooldown_s=0.2))
    book = RuleBook({"a": KeyLimits(Limits(rpm=10), ())}, {})
    lim = Limiter(cfg, book, seen)
    await lim.start()
    try:
        grant = await lim.admit("a", "m", "m", cost(1))
        assert (b"x-ratelimit-remaining-requests", b"9") in grant.headers
        redis.kill()
        local = await lim.admit("a", "m", "m", cost(1))  # 10 / 2 replicas, fresh
        assert (b"x-ratelimit-limit-requests", b"5") in local.headers
        assert seen.errors == ["local"] and seen.up == [True, False]
        redis.start()  # empty: the shared count starts again
        shared = await _until_shared(lim)
        assert (b"x-ratelimit-limit-requests", b"10") in shared.headers
        assert seen.up == [True, False, True]
        assert seen.decisions[0][3] == "redis" and seen.decisions[1][3] == "local"
    finally:
        await lim.aclose()


async def _until_shared(lim: Limiter) -> Grant:
    """Admissions go local until the breaker's probe finds Redis again (no restart)."""
    while True:
        grant = await lim.admit("a", "m", "m", cost(1))
        if (b"x-ratelimit-limit-requests", b"10") in grant.headers:
            return grant
        await asyncio.sleep(0.05)


async def test_redis_429_after_the_limit(redis: RedisServer) -> None:
    book = RuleBook({"a": KeyLimits(Limits(rpm=2), ())}, {"m": Limits(tpm=50)})
    lim = Limiter(config(redis), book, Seen())
    await lim.start()
    try:
        await lim.admit("a", "m", "m", cost(10))
        with pytest.raises(RateLimited) as err:
            await lim.admit("a", "m", "m", cost(45))
        assert err.value.type == "tokens"
        assert "model 'm'" in err.value.message
        assert err.value.headers["x-ratelimit-remaining-tokens"] == "40"
    finally:
        await lim.aclose()


def test_rules_are_plain_data() -> None:
    r = Rule("key", "requests", 3, "k:a:r", "key 'a'")
    assert r.scaled(2).limit == 1 and r.scaled(1) is r


async def test_a_redis_cluster_holds_every_limit_in_one_slot(tmp_path: Path) -> None:
    """Keys of many scopes in one script: on a Cluster that works only because every key
    shares the hash tag; the script runs on the node that owns it."""
    with RedisCluster(tmp_path) as cluster:
        cfg = RateLimitConfig(backend="redis", redis_url=cluster.url, cluster=True)
        book = RuleBook(
            {k: KeyLimits(Limits(rpm=3, tpm=1000), (("*", Limits(max_parallel=5)),))
             for k in ("a", "b", "c")},
            {"m1": Limits(rpm=100), "m2": Limits(rpm=100)},
        )  # fmt: skip
        lim = Limiter(cfg, book, Seen())
        await lim.start()
        try:
            for key in ("a", "b", "c"):
                for model in ("m1", "m2", "m1"):
                    await lim.admit(key, model, model, cost(10))
                with pytest.raises(RateLimited):
                    await lim.admit(key, "m2", "m2", cost(10))
        finally:
            await lim.aclose()
        owner = cluster.node_of("{llmgw}:k:a:r")
        stored = owner.command("KEYS", "*")
        for bucket in ("k:a:r", "k:b:t", "km:c:m2:p", "m:m1:r", "m:m2:r"):
            assert f"{{llmgw}}:{bucket}".encode() in stored

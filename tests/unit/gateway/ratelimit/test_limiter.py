"""The limiter's parts without Redis: GCRA arithmetic, the memory backend, rule resolution,
headers and messages, and the limiter's answers (429, 400, headers)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from core.errors import InvalidRequest, RateLimited, ServiceUnavailable
from gateway.config import parse
from gateway.ratelimit import KeyLimits, Limiter, Limits, RateLimitConfig, RuleBook
from gateway.ratelimit.headers import duration, ratelimit_headers
from gateway.ratelimit.memory import MemoryBackend, settle_tat
from gateway.ratelimit.rules import Ask, Rule, RuleSet


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Seen:
    """An Observer that remembers what it was told."""

    def __init__(self) -> None:
        self.decisions: list[tuple[str, str, str, str]] = []
        self.errors: list[str] = []
        self.up: list[bool] = []
        self.budgets: dict[tuple[str, str], float] = {}

    def ratelimit_decision(self, model: str, result: str, limit: str, backend: str) -> None:
        self.decisions.append((model, result, limit, backend))

    def ratelimit_counter(
        self, model: str, result: str, limit: str, backend: str
    ) -> Callable[[], None]:
        return lambda: self.ratelimit_decision(model, result, limit, backend)

    def ratelimit_backend_error(self, mode: str) -> None:
        self.errors.append(mode)

    def ratelimit_backend_started(self, mode: str) -> None:
        self.up.append(True)

    def ratelimit_backend_up(self, up: bool) -> None:
        self.up.append(up)

    def budget_used(self, scope: str, team: str, ratio: float) -> None:
        self.budgets[(scope, team)] = ratio


def rule(kind: str = "requests", limit: int = 10, bucket: str = "k:a:r") -> Rule:
    return Rule("key", kind, limit, bucket, "key 'a'")  # type: ignore[arg-type]


# ---------------------------------------------------------------- GCRA


def gcra_run(limit: int, costs: list[int], at: list[float] | None = None) -> list[tuple[bool, Any]]:
    """One bucket of `limit` per minute, asked for each cost at its time: (admitted, values)."""
    clock = Clock()
    mem = MemoryBackend(clock=clock)
    r = rule("tokens", limit, "b")
    out = []
    for i, c in enumerate(costs):
        clock.now = 100.0 + (at[i] if at else 0.0)
        v = mem.decide(ask(r, tokens=c))
        out.append((v.admitted, v.values[0]))
    return out


def test_gcra_admits_a_burst_of_exactly_the_limit_then_refuses() -> None:
    steps = gcra_run(10, [1] * 12)
    assert [ok for ok, _ in steps] == [True] * 10 + [False] * 2
    assert [values[0] for _, values in steps[:10]] == list(range(9, -1, -1))
    assert steps[9][1][1] == pytest.approx(60.0)  # reset: full again after a minute
    assert steps[10][1][2] == pytest.approx(6.0)  # retry: one request's worth, 60 s / 10


def test_gcra_refills_at_the_rate() -> None:
    whole, early, due = gcra_run(10, [10, 1, 1], at=[0.0, 5.9, 6.0])
    assert whole == (True, (0, pytest.approx(60.0), 0.0))  # the whole minute at once
    assert not early[0]
    assert due[0] and due[1][0] == 0


def test_gcra_weighs_by_cost_and_refuses_without_taking() -> None:
    first, second, third = gcra_run(1000, [700, 400, 300])
    assert first[0] and first[1][0] == 300
    assert not second[0]
    assert second[1][0] == 300  # nothing taken
    assert second[1][2] == pytest.approx(6.0)  # 100 tokens at 1000/min
    assert third[0] and third[1][0] == 0


def test_settle_refunds_down_to_now_and_charges_extra() -> None:
    tat = 80.0  # 30 s of a 60/min bucket, at 50 s
    assert settle_tat(tat, 50.0, 60, -10) == pytest.approx(70.0)
    assert settle_tat(tat, 50.0, 60, -100) == 50.0  # never below now: a full bucket
    assert settle_tat(tat, 50.0, 60, 5) == pytest.approx(85.0)
    assert settle_tat(10.0, 50.0, 60, 5) == pytest.approx(55.0)  # extra from a full bucket


# ---------------------------------------------------------------- memory backend


def ask(*rules: Rule, tokens: int = 0, lease: str = "l1") -> Ask:
    return Ask(RuleSet.of(tuple(rules)), tokens, lease)


def test_memory_admits_all_or_nothing() -> None:
    clock = Clock()
    mem = MemoryBackend(clock=clock)
    requests, tokens = rule("requests", 5, "r"), rule("tokens", 100, "t")
    assert mem.decide(ask(requests, tokens, tokens=90)).admitted
    refused = mem.decide(ask(requests, tokens, tokens=20))
    assert not refused.admitted
    # the requests bucket was not charged for the refused request
    by_kind = {s.rule.kind: s for s in refused.states}
    assert by_kind["requests"].remaining == 3 and by_kind["requests"].retry_s == 0
    assert by_kind["tokens"].retry_s == pytest.approx(6.0)
    assert mem.decide(ask(requests, tokens, tokens=10)).states[0].remaining == 3


def test_memory_settle_gives_tokens_back() -> None:
    clock = Clock()
    mem = MemoryBackend(clock=clock)
    tokens = rule("tokens", 100, "t")
    a = ask(tokens, tokens=80)
    assert mem.decide(a).admitted
    assert not mem.decide(ask(tokens, tokens=50)).admitted
    mem.settle(a, -60)  # used 20 of the 80 reserved
    assert mem.decide(ask(tokens, tokens=50)).states[0].remaining == 30


def test_memory_parallel_slots_are_held_until_settled() -> None:
    mem = MemoryBackend(clock=Clock())
    par = rule("parallel", 2, "p")
    first, second = ask(par, lease="1"), ask(par, lease="2")
    assert mem.decide(first).admitted and mem.decide(second).admitted
    third = mem.decide(ask(par, lease="3"))
    assert not third.admitted and third.states[0].retry_s > 0
    mem.settle(first, 0)
    assert mem.decide(ask(par, lease="4")).admitted


def test_local_fallback_divides_limits_among_replicas() -> None:
    mem = MemoryBackend("local", divisor=4, clock=Clock())
    r = rule("requests", 10, "r")
    admitted = [mem.decide(ask(r)).admitted for _ in range(4)]
    assert admitted == [True, True, False, False]  # 10 // 4
    assert mem.decide(ask(rule("requests", 2, "tiny"))).admitted  # at least 1


# ---------------------------------------------------------------- rules


def book() -> RuleBook:
    keys = {
        "a": KeyLimits(Limits(rpm=60, tpm=1000), (("gpt-*", Limits(rpm=5)), ("*", Limits(rpm=9)))),
        "b": KeyLimits(Limits(), ()),
    }
    return RuleBook(keys, {"gpt-4": Limits(max_parallel=3)})


def test_rules_cover_key_model_and_key_model_scopes() -> None:
    rules = book().rules("a", "gpt-4").rules
    named = {(r.scope, r.kind, r.limit, r.bucket) for r in rules}
    assert named == {
        ("key", "requests", 60, "k:a:r"),
        ("key", "tokens", 1000, "k:a:t"),
        ("key_model", "requests", 5, "km:a:gpt-4:r"),  # the first matching glob
        ("model", "parallel", 3, "m:gpt-4:p"),
    }
    other = book().rules("a", "llama").rules
    assert ("key_model", 9) in {(r.scope, r.limit) for r in other}
    assert book().rules("b", "llama").rules == ()


def test_rule_buckets_hash_odd_model_ids() -> None:
    rules = book().rules("a", "x" * 200).rules
    km = next(r for r in rules if r.scope == "key_model")
    assert km.bucket.startswith("km:a:h-") and len(km.bucket) < 40
    assert "{" not in book().rules("a", "{evil}").rules[2].bucket


def test_limits_come_from_the_config() -> None:
    cfg = parse(
        """
auth:
  keys:
    - {id: a, key: k, limits: {rpm: 10, tpm: 500, max_parallel: 2},
       model_limits: {"m*": {tpm: 100}}}
providers:
  p: {type: openai-compatible, base_url: "http://127.0.0.1:1/v1"}
models:
  m1: {targets: [{provider: p}], limits: {rpm: 3}}
rate_limit: {backend: redis, redis_url: "redis://h:6379/1", on_backend_error: closed,
             replicas: 3, breaker: {failures: 2, cooldown_s: 0.5}}
"""
    )
    assert cfg.keys[0].limits.limits == Limits(10, 500, 2)
    assert cfg.keys[0].limits.per_model == (("m*", Limits(tpm=100)),)
    assert cfg.models["m1"].limits == Limits(rpm=3)
    rl = cfg.rate_limit
    assert (rl.backend, rl.on_backend_error, rl.replicas) == ("redis", "closed", 3)
    assert (rl.breaker.failures, rl.breaker.cooldown_s) == (2, 0.5)


@pytest.mark.parametrize(
    ("snippet", "path"),
    [
        ("rate_limit: {backend: dynamo}", "rate_limit.backend"),
        ("rate_limit: {on_backend_error: maybe}", "rate_limit.on_backend_error"),
        ("rate_limit: {redis_url: 'http://x'}", "rate_limit.redis_url"),
        ("rate_limit: {key_prefix: 'a}b'}", "rate_limit.key_prefix"),
        ("rate_limit: {replicas: 0}", "rate_limit.replicas"),
        ("rate_limit: {cluster: yes please}", "rate_limit.cluster"),
        ("rate_limit: {breaker: {failures: 0}}", "rate_limit.breaker.failures"),
        ("rate_limit: {burst: 1}", "rate_limit.burst"),
        ("metrics: {enabled: 1}", "metrics.enabled"),
        ("auth: {keys: [{id: a, key: k, limits: {rpm: 0}}]}", "auth.keys[0].limits.rpm"),
        ("auth: {keys: [{id: a, key: k, limits: {rps: 1}}]}", "auth.keys[0].limits.rps"),
        (
            "auth: {keys: [{id: a, key: k, model_limits: {'*': {tpm: -1}}}]}",
            "auth.keys[0].model_limits.*.tpm",
        ),
    ],
)
def test_bad_limit_config_names_its_path(snippet: str, path: str) -> None:
    from core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse(snippet)
    assert err.value.path == path


# ---------------------------------------------------------------- headers


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "1ms"),
        (0.25, "250ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (12.0101, "12.011s"),
        (59.9999, "1m0s"),
        (360, "6m0s"),
        (361.5, "6m1.5s"),
        (3723, "1h2m3s"),
    ],
)
def test_durations_read_like_openais(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_headers_report_the_binding_limit_of_each_kind() -> None:
    mem = MemoryBackend(clock=Clock())
    rules = (rule("requests", 100, "r1"), rule("requests", 3, "r2"), rule("tokens", 50, "t"))
    verdict = mem.decide(ask(*rules, tokens=20))
    found = RuleSet.of(rules)
    headers = dict((k.decode(), v.decode()) for k, v in ratelimit_headers(verdict, found.reported))
    assert headers == {
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "20s",
        "x-ratelimit-limit-tokens": "50",
        "x-ratelimit-remaining-tokens": "30",
        "x-ratelimit-reset-tokens": "24s",
    }


def test_take_admits_and_reports_exactly_as_decide() -> None:
    """The request path's fused `take` against the general `decide`: the same admissions and
    the same headers, over bursts, refusals, settlements, and several rules of a kind."""
    rng = random.Random(7)
    clock = Clock()
    fast, general = MemoryBackend(clock=clock), MemoryBackend(clock=clock)
    rules = (
        rule("parallel", 3, "p"),
        rule("requests", 40, "r1"),
        rule("tokens", 5000, "t1"),
        rule("requests", 25, "r2"),
        rule("tokens", 9000, "t2"),
    )
    found = RuleSet.of(rules)
    held: list[Ask] = []
    outcomes = set()
    for _ in range(600):
        clock.now += rng.choice((0.0, 0.01, 0.5, 3.0))
        tokens = rng.randint(1, 400)
        headers = fast.take(found, tokens)
        verdict = general.decide(ask(*rules, tokens=tokens))
        assert (headers is not None) == verdict.admitted
        outcomes.add(verdict.admitted)
        if headers is not None:
            assert headers == ratelimit_headers(verdict, found.reported)
            held.append(ask(*rules, tokens=tokens))
        if held and rng.random() < 0.6:
            done, used = held.pop(rng.randrange(len(held))), rng.randint(0, 500)
            fast.settle(done, used - done.tokens)
            general.settle(done, used - done.tokens)
    assert outcomes == {True, False}


FULL_BUCKET_CASES = [(100_000, c) for c in (1, 7, 225, 4321, 99_999)] + [
    (6_000_000, 777),
    (37, 5),
]


@pytest.mark.parametrize("now", [1000.0, 2.5e6, 1.76e9])  # a new process, weeks up, epoch s
def test_a_full_bucket_reports_exactly_what_is_left(now: float) -> None:
    """Limit less cost, to the unit, however long the clock has run: the arithmetic is on how
    far a bucket is drawn, not on two large times whose difference loses its low digits."""
    clock = Clock()
    for limit, cost_ in FULL_BUCKET_CASES:
        for offset in (0.0, 0.1, 0.123457, 0.3):
            clock.now = now + offset
            r = rule("tokens", limit, f"t{limit}:{cost_}:{offset}")
            fresh = MemoryBackend(clock=clock)
            assert fresh.decide(ask(r, tokens=cost_)).states[0].remaining == limit - cost_
            headers = dict(MemoryBackend(clock=clock).take(RuleSet.of((r,)), cost_) or [])
            assert headers[b"x-ratelimit-remaining-tokens"] == b"%d" % (limit - cost_)


def test_rule_sets_put_rate_rules_first() -> None:
    found = RuleSet.of((rule("parallel", 2, "p"), rule("tokens", 9, "t"), rule("requests", 3)))
    assert [r.kind for r in found.rules] == ["tokens", "requests", "parallel"]
    assert found.rates == (("t", 60 / 9, True), ("k:a:r", 20.0, False))
    assert found.slots == (("p", 2),)
    assert found.reported == (("requests", (1,)), ("tokens", (0,)))


# ---------------------------------------------------------------- the limiter


def limiter(
    keys: dict[str, KeyLimits], models: dict[str, Limits] | None = None, **cfg: object
) -> tuple[Limiter, Seen]:
    seen = Seen()
    return Limiter(RateLimitConfig(**cfg), RuleBook(keys, models or {}), seen), seen  # type: ignore[arg-type]


def cost(n: int, money: int = 0) -> Callable[[], tuple[int, int]]:
    return lambda: (n, money)


async def test_limiter_refuses_with_openai_429_and_retry_headers() -> None:
    lim, seen = limiter({"a": KeyLimits(Limits(rpm=2), ())})
    for _ in range(2):
        grant = await lim.admit("a", "m", "m", cost(1))
        assert (b"x-ratelimit-limit-requests", b"2") in grant.headers
    with pytest.raises(RateLimited) as err:
        await lim.admit("a", "m", "m", cost(1))
    e = err.value
    assert e.status == 429 and e.type == "requests" and e.code == "rate_limit_exceeded"
    assert "Limit 2, Used 2, Requested 1" in e.message
    assert e.headers["retry-after"] == "30"
    assert 29_000 < int(e.headers["retry-after-ms"]) <= 30_000
    assert e.headers["x-ratelimit-remaining-requests"] == "0"
    assert seen.decisions[-1] == ("m", "rejected", "key_requests", "memory")


async def test_limiter_counts_tokens_only_when_a_token_limit_applies() -> None:
    lim, _ = limiter({"a": KeyLimits(Limits(rpm=5), ())})

    def boom() -> tuple[int, int]:
        raise AssertionError("no token limit: nothing to count")

    await lim.admit("a", "m", "m", boom)


async def test_request_above_the_token_limit_is_a_400_not_a_429() -> None:
    lim, seen = limiter({"a": KeyLimits(Limits(tpm=100), ())})
    with pytest.raises(InvalidRequest) as err:
        await lim.admit("a", "m", "m", cost(101))
    assert err.value.status == 400 and err.value.param == "max_tokens"
    assert err.value.headers == {"x-should-retry": "false"}
    assert "can never be admitted" in err.value.message
    assert seen.decisions == [("m", "unfit", "key_tokens", "none")]
    await lim.admit("a", "m", "m", cost(100))  # exactly the limit fits


async def test_grant_settles_once_with_actual_usage() -> None:
    lim, _ = limiter({"a": KeyLimits(Limits(tpm=100), ())})
    grant = await lim.admit("a", "m", "m", cost(90))
    grant.settle(30)
    grant.settle(0)  # a second settle is ignored
    after = await lim.admit("a", "m", "m", cost(70))
    assert (b"x-ratelimit-remaining-tokens", b"0") in after.headers


async def test_no_limits_means_no_headers_and_no_state() -> None:
    lim, seen = limiter({})
    grant = await lim.admit("a", "m", "m", cost(1))
    assert grant.headers == [] and seen.decisions == []
    grant.settle(5)


@pytest.mark.parametrize("mode", ["local", "open", "closed"])
async def test_dead_redis_answers_per_mode(mode: str) -> None:
    from tests.upstreams.procs import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    lim, seen = limiter(
        {"a": KeyLimits(Limits(rpm=4), ())},
        backend="redis",
        redis_url=url,
        on_backend_error=mode,
        replicas=2,
    )
    await lim.start()
    try:
        outcomes = []
        for _ in range(4):
            try:
                grant = await lim.admit("a", "m", "m", cost(1))
                outcomes.append(("ok", dict(grant.headers).get(b"x-ratelimit-limit-requests")))
            except RateLimited:
                outcomes.append(("429", None))
            except ServiceUnavailable as err:
                assert int(err.headers["retry-after"]) >= 1
                outcomes.append(("503", None))
    finally:
        await lim.aclose()
    expected = {
        "local": [("ok", b"2"), ("ok", b"2"), ("429", None), ("429", None)],  # 4 / 2 replicas
        "open": [("ok", None)] * 4,
        "closed": [("503", None)] * 4,
    }
    assert outcomes == expected[mode]
    assert seen.errors == [mode] * 3  # then the breaker stops calling it
    assert seen.up == [True, False]

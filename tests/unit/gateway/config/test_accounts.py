"""Teams, keys with a team, budgets and an expiry, admin keys, and a provider's prices, as the
YAML gives them: typed data, and every error naming its path."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from typing import Any

import pytest

from core.errors import ConfigError
from gateway import config
from gateway.auth import Authenticator
from gateway.config.accounts import AdminKey, TeamConfig
from gateway.governance.budgets import Budget
from gateway.governance.pricing import Price
from gateway.ratelimit import KeyLimits, Limits, TeamLimits
from gateway.runtime import rulebook
from providers import registry

PROVIDERS = """
providers:
  oa:
    type: openai
    base_url: "https://api.openai.example/v1"
    pricing:
      gpt-4o: {input: 2.5, cached_input: 1.25, output: 10}
      "*": {input: 0.5, output: 1.5}
  local: {type: openai-compatible, base_url: "http://127.0.0.1:1/v1"}
"""

GOOD = (
    PROVIDERS
    + """
teams:
  research:
    models: ["gpt-*"]
    providers: [oa]
    limits: {rpm: 100}
    budget: {usd: 500, period: month}
    model_budgets:
      gpt-4o: {usd: 50.25, period: day}
  ops: {}
auth:
  keys:
    - id: alice
      key: sk-alice
      team: research
      budget: {usd: 10, period: week}
      model_budgets:
        "gpt-4*": {usd: 2.5, period: day}
        "*": {usd: 0.000001, period: total}
      expires_at: "2027-01-01T00:00:00Z"
    - {id: bob, key: sk-bob, team: research, expires_at: 4102444800}  # 2100
    - {id: carol, key: sk-carol}
  admin_keys:
    - {id: root, key: sk-admin}
    - {id: ops-admin, key_sha256: SHA_OF_SK_OPS}
""".replace("SHA_OF_SK_OPS", hashlib.sha256(b"sk-ops").hexdigest())
)

PICO = 10**12


def test_teams_keys_budgets_and_admin_keys_are_read() -> None:
    cfg = config.parse(GOOD)
    assert cfg.teams == {
        "research": TeamConfig(
            id="research",
            models=("gpt-*",),
            providers=("oa",),
            limits=Limits(rpm=100),
            budget=Budget(500 * PICO, "month"),
            model_budgets=(("gpt-4o", Budget(50_250_000_000_000, "day")),),
        ),
        "ops": TeamConfig(id="ops"),  # every default: any model, its keys' providers
    }
    alice, bob, carol = cfg.keys
    assert alice.team == "research"
    assert alice.budget == Budget(10 * PICO, "week")
    assert alice.model_budgets == (
        ("gpt-4*", Budget(2_500_000_000_000, "day")),
        ("*", Budget(1_000_000, "total")),  # first match wins: the order is kept
    )
    assert alice.expires_at == dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp() == 1798761600
    assert bob.expires_at == 4102444800.0 and bob.budget is None and bob.model_budgets == ()
    assert (carol.team, carol.budget, carol.expires_at) == (None, None, None)
    assert not alice.runtime and alice.rotated == ()
    assert cfg.admin_keys == (
        AdminKey("root", hashlib.sha256(b"sk-admin").digest()),
        AdminKey("ops-admin", hashlib.sha256(b"sk-ops").digest()),
    )


def test_budgets_reach_the_rule_book() -> None:
    cfg = config.parse(GOOD)
    book = rulebook(cfg)
    assert book._keys["alice"] == KeyLimits(
        Limits(),
        (),
        team="research",
        budget=Budget(10 * PICO, "week"),
        model_budgets=cfg.keys[0].model_budgets,
    )
    assert book._teams["research"] == TeamLimits(
        Limits(rpm=100), Budget(500 * PICO, "month"), cfg.teams["research"].model_budgets
    )
    scopes = {(r.scope, r.kind, r.limit) for r in book.rules("alice", "gpt-4o").rules}
    assert scopes == {
        ("key", "budget", 10 * PICO),
        ("key_model", "budget", 2_500_000_000_000),
        ("team", "requests", 100),
        ("team", "budget", 500 * PICO),
        ("team_model", "budget", 50_250_000_000_000),
    }


def test_a_key_is_bounded_by_its_teams_models_and_providers() -> None:
    cfg = config.parse(
        GOOD.replace("id: bob, key: sk-bob,", "id: bob, key: sk-bob, providers: [oa, local],")
    )
    auth = Authenticator(cfg)
    bob = auth.principal("bob")
    assert bob is not None and bob.team == "research"
    assert bob.may_use_model("gpt-4o") and not bob.may_use_model("llama")  # the team's globs
    assert bob.providers == frozenset({"oa"})  # both must list it
    carol = auth.principal("carol")
    assert carol is not None and carol.team is None and carol.may_use_model("llama")


def test_a_providers_prices_are_read_apart_from_its_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pricing` is the gateway's, not the adapter's: its own check (which refuses unknown
    keys) never sees it, and a price change is no rebuild of the provider."""
    checked: list[Mapping[str, Any]] = []
    real = registry.check

    def check(settings: Mapping[str, Any], path: str) -> None:
        checked.append(dict(settings))
        real(settings, path)

    monkeypatch.setattr(registry, "check", check)
    cfg = config.parse(GOOD)
    assert [sorted(s) for s in checked] == [["base_url", "type"], ["base_url", "type"]]
    oa = cfg.providers["oa"]
    assert "pricing" not in oa.settings
    assert oa.pricing == {
        "gpt-4o": Price(2_500_000, 1_250_000, 10_000_000),
        "*": Price(500_000, 500_000, 1_500_000),
    }
    assert cfg.providers["local"].pricing == {}


def test_the_provider_check_still_refuses_its_own_unknown_keys() -> None:
    with pytest.raises(ConfigError) as err:
        config.parse(PROVIDERS.replace("type: openai\n", "type: openai\n    prices: {}\n"))
    assert err.value.path == "providers.oa.prices"


KEY = "auth:\n  keys:\n    - {id: a, key: k, %s}\n"
TEAM = "teams:\n  t: {%s}\n"
ADMIN = "auth:\n  admin_keys: %s\n"
PRICED = "providers:\n  oa: {type: openai, base_url: 'https://x/v1', pricing: %s}\n"
ID_CHARS = "expected 1-64 characters of letters, digits and ._@+=-"
PERIODS = "one of day, week, month, total"
NOT_USD = "expected a number of US dollars"
EXPIRY = "expected epoch seconds or an ISO 8601 time with a zone, e.g. 2027-01-01T00:00:00Z"
ONE_KEY = "set exactly one of 'key' and 'key_sha256'"
SIX = "is finer than the gateway counts (6 decimals per million tokens)"
K0 = "auth.keys[0]"


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (KEY % "team: nobody", f"{K0}.team", "unknown team 'nobody'"),
        (TEAM % "" + KEY % "team: T", f"{K0}.team", "unknown team 'T'"),  # ids are exact
        (KEY % "team: 'a b'", f"{K0}.team", ID_CHARS),
        (KEY % "team: 5", f"{K0}.team", "expected a string, got int"),
        (KEY % "budget: {usd: 10}", f"{K0}.budget.period", f"required: {PERIODS}"),
        (KEY % "budget: {period: day}", f"{K0}.budget.usd", "required: the budget in US dollars"),
        (
            KEY % "budget: {usd: 10, period: year}",
            f"{K0}.budget.period",
            f"expected {PERIODS}, got 'year'",
        ),
        (KEY % "budget: {usd: 10, period: day, hard: true}", f"{K0}.budget.hard", "unknown key"),
        (
            KEY % "budget: {usd: -1, period: day}",
            f"{K0}.budget.usd",
            f"{NOT_USD} from 0 to 1000000",
        ),
        (KEY % "budget: {usd: lots, period: day}", f"{K0}.budget.usd", f"{NOT_USD}, got 'lots'"),
        (
            KEY % "budget: {usd: 0.0000000000001, period: day}",
            f"{K0}.budget.usd",
            "1e-13 is finer than the gateway counts (1e-12 dollars)",
        ),
        (KEY % "budget: 10", f"{K0}.budget", "expected a mapping, got int"),
        (
            KEY % "model_budgets: {'gpt-*': {usd: 1, period: hourly}}",
            f"{K0}.model_budgets.gpt-*.period",
            f"expected {PERIODS}, got 'hourly'",
        ),
        (
            KEY % "model_budgets: {'gpt-*': {period: day}}",
            f"{K0}.model_budgets.gpt-*.usd",
            "required: the budget in US dollars",
        ),
        (KEY % "model_budgets: [1]", f"{K0}.model_budgets", "expected a mapping, got list"),
        (KEY % "expires_at: tomorrow", f"{K0}.expires_at", EXPIRY),
        (KEY % "expires_at: '2027-01-01T00:00:00'", f"{K0}.expires_at", EXPIRY),  # no zone
        (KEY % "expires_at: -1", f"{K0}.expires_at", EXPIRY),
        (KEY % "expires_at: true", f"{K0}.expires_at", EXPIRY),
        (KEY % "id: 'a/b'", f"{K0}.id", ID_CHARS),
        (KEY % "owner: x", f"{K0}.owner", "unknown key"),
        (TEAM % "budget: {usd: 5}", "teams.t.budget.period", f"required: {PERIODS}"),
        (
            TEAM % "model_budgets: {m: {usd: 1, period: day, x: 1}}",
            "teams.t.model_budgets.m.x",
            "unknown key",
        ),
        (TEAM % "providers: [nowhere]", "teams.t.providers[0]", "unknown provider 'nowhere'"),
        (TEAM % "limits: {rpm: 0}", "teams.t.limits.rpm", "expected an integer >= 1"),
        (TEAM % "id: t", "teams.t.id", "unknown key"),  # the id is the name
        (TEAM % "colour: red", "teams.t.colour", "unknown key"),
        ("teams:\n  'a b': {}\n", "teams.a b", ID_CHARS),
        ("teams: [t]\n", "teams", "expected a mapping, got list"),
        ("teams:\n  t: 1\n", "teams.t", "expected a mapping, got int"),
        (
            PRICED % "{gpt-4o: {input: 2.5000001, output: 10}}",
            "providers.oa.pricing.gpt-4o.input",
            f"2.5000001 {SIX}",
        ),
        (
            PRICED % "{gpt-4o: {input: 2.5, output: '0.0000001'}}",
            "providers.oa.pricing.gpt-4o.output",
            f"0.0000001 {SIX}",
        ),
        (
            PRICED % "{gpt-4o: {input: 2.5}}",
            "providers.oa.pricing.gpt-4o.output",
            "required (USD per million tokens)",
        ),
        (PRICED % "3", "providers.oa.pricing", "expected a mapping, got int"),
        (ADMIN % "[{id: root}]", "auth.admin_keys[0]", ONE_KEY),
        (ADMIN % "[{id: root, key: a, key_sha256: b}]", "auth.admin_keys[0]", ONE_KEY),
        (ADMIN % "[{id: root, key: ''}]", "auth.admin_keys[0].key", "empty key"),
        (
            ADMIN % "[{id: root, key_sha256: abc}]",
            "auth.admin_keys[0].key_sha256",
            "expected 64 hex digits (gateway hash-key KEY)",
        ),
        (ADMIN % "[{id: root, key: a, models: ['*']}]", "auth.admin_keys[0].models", "unknown key"),
        (ADMIN % "[{id: r, key: a}, {id: r, key: b}]", "auth.admin_keys[1].id", "duplicate id"),
        (ADMIN % "[{id: r, key: a}, {id: s, key: a}]", "auth.admin_keys[1].key", "duplicate key"),
        (ADMIN % "[{key: a}]", "auth.admin_keys[0].id", "expected a string, got NoneType"),
        (ADMIN % "{root: a}", "auth.admin_keys", "expected a list, got dict"),
        ("auth:\n  admins: []\n", "auth.admins", "unknown key"),
    ],
)
def test_a_bad_entry_names_its_path(text: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.parse(text if text.startswith("providers") else PROVIDERS + text)
    assert (err.value.path, err.value.message) == (path, message)


@pytest.mark.parametrize(
    ("value", "epoch"),
    [
        ("'2027-01-01T00:00:00Z'", 1798761600.0),
        ("'2027-01-01T01:00:00+01:00'", 1798761600.0),
        ("'2026-12-31T19:00:00-05:00'", 1798761600.0),
        ("1798761600", 1798761600.0),
        ("1798761600.5", 1798761600.5),
        ("0", 0.0),
        ("null", None),
    ],
)
def test_an_expiry_is_epoch_seconds_or_a_zoned_iso_time(value: str, epoch: float | None) -> None:
    cfg = config.parse(PROVIDERS + KEY % f"expires_at: {value}")
    assert cfg.keys[0].expires_at == epoch


@pytest.mark.xfail(
    strict=True,
    reason="YAML reads an unquoted price as a float before money.decimal sees its text: "
    "digits past a float's precision are rounded away, and the price is accepted",
)
def test_an_unquoted_price_with_more_than_6_decimals_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        config.parse(PRICED % "{gpt-4o: {input: 2.50000000000000001, output: 10}}")
    assert err.value.path == "providers.oa.pricing.gpt-4o.input"


def test_an_unquoted_yaml_timestamp_is_an_expiry() -> None:
    cfg = config.parse(PROVIDERS + KEY % "expires_at: 2027-01-01T00:00:00Z")
    assert cfg.keys[0].expires_at == 1798761600.0


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (KEY % "budget: {usd: 1, period: day}", "auth.keys[0]"),
        (KEY % "model_budgets: {'*': {usd: 1, period: total}}", "auth.keys[0]"),
        (TEAM % "budget: {usd: 1, period: day}", "teams.t"),
        (TEAM % "model_budgets: {'*': {usd: 1, period: day}}", "teams.t"),
        (TEAM % "limits: {rpm: 3}", "teams.t"),
    ],
)
def test_a_budget_on_the_memory_backend_needs_one_worker(text: str, path: str) -> None:
    """Each worker would count the budget apart: the whole of it each."""
    cfg = config.parse(PROVIDERS + text)
    cfg.check_workers(1)
    redis = config.parse(PROVIDERS + text + "rate_limit: {backend: redis}\n")
    redis.check_workers(4)
    with pytest.raises(ConfigError) as err:
        cfg.check_workers(2)
    assert err.value.path == path
    assert "2 workers on the memory backend" in err.value.message


def test_a_team_without_keys_or_limits_is_no_reason_for_one_worker() -> None:
    config.parse(PROVIDERS + "teams:\n  t: {models: ['*']}\n").check_workers(3)

"""Money as whole pico-dollars: dollars read exactly (refused rather than rounded when finer
than the gateway counts), and written back exactly (`usd`) or for people (`dollars`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError
from gateway.governance.money import MAX_USD, PER_TOKEN, PICO, decimal, dollars, pico, usd


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, PICO),
        (0, 0),
        ("0", 0),
        (0.1, 100_000_000_000),  # the float's shortest text, not 0.1000000000000000055…
        (0.3, 300_000_000_000),
        (2.675, 2_675_000_000_000),
        ("0.000000000001", 1),  # one pico-dollar, the finest
        ("1e-12", 1),
        ("1e3", 1000 * PICO),  # YAML reads 1e3 as a string
        (" 2.5 ", 2_500_000_000_000),
        (1_000_000, 10**18),  # MAX_USD itself
        ("1000000.000000000000", 10**18),
        ("-0", 0),
    ],
)
def test_dollars_are_read_exactly(value: Any, expected: int) -> None:
    assert pico(value, "budget.usd") == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2.5, 2_500_000),  # $2.50 per million tokens: 2.5 micro-dollars a token
        (0.15, 150_000),
        ("0.000001", 1),  # the finest price: one pico-dollar a token
        (60, 60_000_000),
        (0, 0),
        (1_000_000, 10**12),
    ],
)
def test_prices_per_million_tokens_are_pico_dollars_per_token(value: Any, expected: int) -> None:
    assert pico(value, "p", PER_TOKEN) == expected


@pytest.mark.parametrize(
    ("value", "per", "finest"),
    [
        ("0.0000000000001", PICO, "1e-12 dollars"),
        (0.30000000000000004, PICO, "1e-12 dollars"),  # 0.1 + 0.2 as a float: 17 decimals
        ("0.0000001", PER_TOKEN, "6 decimals per million tokens"),
        (1.2345678, PER_TOKEN, "6 decimals per million tokens"),
        ("2.5000001", PER_TOKEN, "6 decimals per million tokens"),
    ],
)
def test_an_amount_finer_than_counted_is_refused_not_rounded(
    value: Any, per: int, finest: str
) -> None:
    with pytest.raises(ConfigError) as err:
        pico(value, "providers.p.pricing.m.input", per)
    assert err.value.path == "providers.p.pricing.m.input"
    assert err.value.message == f"{value} is finer than the gateway counts ({finest})"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "expected a number of US dollars, got bool"),
        (None, "expected a number of US dollars, got NoneType"),
        ([1], "expected a number of US dollars, got list"),
        ({"usd": 1}, "expected a number of US dollars, got dict"),
        ("ten", "expected a number of US dollars, got 'ten'"),
        ("", "expected a number of US dollars, got ''"),
        ("1,5", "expected a number of US dollars, got '1,5'"),
        ("NaN", "expected a number of US dollars from 0 to 1000000"),
        ("Infinity", "expected a number of US dollars from 0 to 1000000"),
        (float("inf"), "expected a number of US dollars from 0 to 1000000"),
        (-1, "expected a number of US dollars from 0 to 1000000"),
        ("-0.000000000001", "expected a number of US dollars from 0 to 1000000"),
        (1_000_001, "expected a number of US dollars from 0 to 1000000"),
        ("1000000.000000000001", "expected a number of US dollars from 0 to 1000000"),
    ],
)
def test_what_is_not_an_amount_is_refused_naming_its_path(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        decimal(value, "teams.t.budget.usd")
    assert (err.value.path, err.value.message) == ("teams.t.budget.usd", message)
    with pytest.raises(ConfigError):
        pico(value, "teams.t.budget.usd")


def test_the_largest_amount_fits_redis_signed_64_bit_counters() -> None:
    top = int(MAX_USD)
    assert pico(top, "x") == 10**18 < 2**63 - 1
    assert pico(top, "x", PER_TOKEN) * 10**6 <= 2**63 - 1  # a million tokens at the top price


@pytest.mark.parametrize(
    ("value", "per"),
    [
        ("1.0000000000000000000000000001", PER_TOKEN),  # 28 decimals: rounds to 1000000
        ("999999.9999999999990000000000001", PICO),  # rounds to 999999999999999999
    ],
)
def test_an_amount_with_more_digits_than_the_decimal_context_is_refused(
    value: str, per: int
) -> None:
    with pytest.raises(ConfigError):
        pico(value, "p", per)


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (0, "0"),
        (1, "0.000000000001"),
        (1_500_000_000, "0.0015"),
        (PICO, "1"),
        (PICO + 5 * 10**11, "1.5"),
        (123 * PICO + 456_000_000_000, "123.456"),
        (10**18, "1000000"),
        (10**18 - 1, "999999.999999999999"),
        (-1_500_000_000, "-0.0015"),
        (-PICO, "-1"),
    ],
)
def test_usd_writes_pico_dollars_exactly(amount: int, text: str) -> None:
    assert usd(amount) == text


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (0, "$0.00"),
        (PICO, "$1.00"),
        (5 * 10**11, "$0.50"),
        (10**10, "$0.01"),
        (1_500_000_000, "$0.0015"),
        (123_456_789, "$0.000123456789"),
        (1, "$0.000000000001"),
        (25 * PICO + 10**11, "$25.10"),
        (10**18, "$1000000.00"),
    ],
)
def test_dollars_for_messages_show_cents_and_any_finer_digit(amount: int, text: str) -> None:
    assert dollars(amount) == text


@given(st.integers(min_value=-(10**18), max_value=10**18))
def test_usd_is_exact_and_reads_back_to_the_same_amount(amount: int) -> None:
    text = usd(amount)
    assert Decimal(text) * PICO == amount
    if amount >= 0:
        assert pico(text, "x") == amount
    assert Decimal(dollars(amount)[1:]) == Decimal(text)


@given(
    st.decimals(min_value=0, max_value=MAX_USD, places=12, allow_nan=False, allow_infinity=False)
)
def test_any_amount_of_whole_pico_dollars_is_read_exactly(value: Decimal) -> None:
    assert pico(str(value), "x") == int(value * PICO)
    assert Decimal(usd(pico(str(value), "x"))) == value

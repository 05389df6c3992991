"""Prices and costs: a provider's `pricing:` block read into pico-dollars per token, the cost
of an answer from its usage as OpenAI reports it (cached prompt tokens at their own price,
reasoning tokens once, at the output price, inside completion_tokens; every best_of candidate
already counted), exactly, however many costs are added; the price book's look-ups and the
ceiling a plan reserves at."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError
from gateway.governance.money import PICO, usd
from gateway.governance.pricing import Price, PriceBook, parse

# gpt-4o's list prices: $2.50 in, $1.25 cached in, $10 out per million tokens
GPT_4O = {"input": 2.5, "cached_input": 1.25, "output": 10}


def price(**entry: Any) -> Price:
    return parse({"m": entry}, "providers.p.pricing")["m"]


def test_a_pricing_block_is_read_as_pico_dollars_per_token() -> None:
    prices = parse(
        {
            "gpt-4o": GPT_4O,
            "gpt-4o-mini": {"input": 0.15, "output": 0.6},
            "*": {"input": 1, "output": 2},
        },
        "providers.openai.pricing",
    )
    assert prices == {
        "gpt-4o": Price(2_500_000, 1_250_000, 10_000_000),
        "gpt-4o-mini": Price(150_000, 150_000, 600_000),  # cached_input defaults to input
        "*": Price(1_000_000, 1_000_000, 2_000_000),
    }


def test_cached_prompt_tokens_cost_the_cached_price() -> None:
    usage = {
        "prompt_tokens": 1000,  # of which 400 were cached
        "prompt_tokens_details": {"cached_tokens": 400},
        "completion_tokens": 200,
        "total_tokens": 1200,
    }
    cost = price(**GPT_4O).cost(usage)
    assert cost == 600 * 2_500_000 + 400 * 1_250_000 + 200 * 10_000_000 == 4_000_000_000
    assert usd(cost) == "0.004"


def test_without_a_cached_price_cached_tokens_cost_the_input_price() -> None:
    usage = {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 400}}
    assert price(input=3, output=15).cost(usage) == 1000 * 3_000_000


def test_reasoning_tokens_are_counted_once_inside_the_completion() -> None:
    """OpenAI's completion_tokens include completion_tokens_details.reasoning_tokens."""
    usage = {
        "prompt_tokens": 50,
        "completion_tokens": 500,
        "completion_tokens_details": {"reasoning_tokens": 448, "accepted_prediction_tokens": 0},
        "total_tokens": 550,
    }
    assert price(input=1.1, output=4.4).cost(usage) == 50 * 1_100_000 + 500 * 4_400_000


def test_best_of_candidates_are_already_in_the_usage() -> None:
    """A best_of=3 answer reports every candidate's tokens in completion_tokens: its cost is
    that count at the output price, not multiplied again."""
    usage = {"prompt_tokens": 10, "completion_tokens": 3 * 16, "total_tokens": 58}
    assert price(input=1, output=2).cost(usage) == 10 * 1_000_000 + 48 * 2_000_000


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({}, 0),
        ({"total_tokens": 99}, 0),  # total_tokens is not what is priced
        ({"prompt_tokens": 7}, 7 * 1_000_000),
        ({"completion_tokens": 7}, 7 * 2_000_000),
        ({"prompt_tokens": None, "completion_tokens": 3}, 3 * 2_000_000),
        ({"prompt_tokens": -5, "completion_tokens": 3}, 3 * 2_000_000),
        ({"prompt_tokens": 2.0, "completion_tokens": 3}, 3 * 2_000_000),  # not a count
        ({"prompt_tokens": True, "completion_tokens": 3}, 3 * 2_000_000),
        ({"prompt_tokens": "10", "completion_tokens": 3}, 3 * 2_000_000),
        # a cached count above the prompt's is held to it
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}}, 10 * 500_000),
        ({"prompt_tokens": 10, "prompt_tokens_details": None}, 10 * 1_000_000),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": None}}, 10 * 1_000_000),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -3}}, 10 * 1_000_000),
        ({"prompt_tokens": 10, "prompt_tokens_details": {}}, 10 * 1_000_000),
        ({"prompt_tokens": 10, "prompt_tokens_details": [4]}, 10 * 1_000_000),
    ],
)
def test_missing_or_odd_counts_cost_nothing(usage: dict[str, Any], expected: int) -> None:
    assert price(input=1, cached_input=0.5, output=2).cost(usage) == expected


def test_a_free_model_costs_nothing() -> None:
    usage = {"prompt_tokens": 10**6, "completion_tokens": 10**6}
    assert price(input=0, output=0).cost(usage) == 0


def test_a_million_costs_add_up_to_the_decimal_computation() -> None:
    """Integers: no drift. The same sum in Decimal dollars, per token, agrees to the pico; the
    sum in floats (what a naive implementation keeps) does not."""
    p = price(input=0.15, cached_input=0.075, output=0.6)
    rng = random.Random(37)
    counts = []  # (prompt, cached, completion)
    for _ in range(1000):
        prompt = rng.randint(0, 20_000)
        counts.append((prompt, rng.randint(0, prompt), rng.randint(0, 4000)))
    costs = [
        p.cost(
            {
                "prompt_tokens": prompt,
                "prompt_tokens_details": {"cached_tokens": cached},
                "completion_tokens": completion,
            }
        )
        for prompt, cached, completion in counts
    ]
    total = 0
    for _ in range(1000):  # a million additions
        for c in costs:
            total += c
    per_token = Decimal(1) / 10**6
    exact = Decimal(0)
    for prompt, cached, completion in counts:
        exact += (
            (prompt - cached) * Decimal("0.15") * per_token
            + cached * Decimal("0.075") * per_token
            + completion * Decimal("0.6") * per_token
        )
    exact *= 1000
    assert Decimal(usd(total)) == exact
    assert total == int(exact * PICO)
    floats = 0.0
    for _ in range(1000):
        for c in costs:
            floats += c / PICO
    assert Decimal(repr(floats)) != exact  # what pico-dollars are for


SIX_PLACES = st.decimals(min_value=0, max_value=1000, places=6)
COUNTS = st.integers(min_value=0, max_value=10**7)


@given(SIX_PLACES, SIX_PLACES, SIX_PLACES, COUNTS, COUNTS, COUNTS)
def test_a_cost_is_the_exact_decimal_cost(
    p_in: Decimal, p_cached: Decimal, p_out: Decimal, prompt: int, cached: int, completion: int
) -> None:
    p = price(input=str(p_in), cached_input=str(p_cached), output=str(p_out))
    usage = {
        "prompt_tokens": prompt,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens": completion,
    }
    held = min(cached, prompt)
    dollars = (
        (prompt - held) * p_in + held * p_cached + completion * p_out
    ) / 10**6  # USD per million tokens
    assert p.cost(usage) == dollars * PICO


@pytest.mark.parametrize(
    ("block", "path", "message"),
    [
        ([], "providers.p.pricing", "expected a mapping, got list"),
        ({"m": 2.5}, "providers.p.pricing.m", "expected a mapping, got float"),
        ({"m": {"input": 1}}, "providers.p.pricing.m.output", "required (USD per million tokens)"),
        ({"m": {"output": 1}}, "providers.p.pricing.m.input", "required (USD per million tokens)"),
        (
            {"m": {"input": 1, "output": 2, "reasoning": 3}},
            "providers.p.pricing.m.reasoning",
            "unknown key",
        ),
        (
            {"m": {"input": 1.0000001, "output": 2}},
            "providers.p.pricing.m.input",
            "1.0000001 is finer than the gateway counts (6 decimals per million tokens)",
        ),
        (
            {"m": {"input": 1, "output": "0.0000005"}},
            "providers.p.pricing.m.output",
            "0.0000005 is finer than the gateway counts (6 decimals per million tokens)",
        ),
        (
            {"m": {"input": 1, "output": 2, "cached_input": 0.12345678}},
            "providers.p.pricing.m.cached_input",
            "0.12345678 is finer than the gateway counts (6 decimals per million tokens)",
        ),
        (
            {"m": {"input": -1, "output": 2}},
            "providers.p.pricing.m.input",
            "expected a number of US dollars from 0 to 1000000",
        ),
        (
            {"m": {"input": "cheap", "output": 2}},
            "providers.p.pricing.m.input",
            "expected a number of US dollars, got 'cheap'",
        ),
        (
            {"m": {"input": None, "output": 2}},
            "providers.p.pricing.m.input",
            "expected a number of US dollars, got NoneType",
        ),
    ],
)  # fmt: skip
def test_a_bad_pricing_block_names_its_path(block: Any, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(block, "providers.p.pricing")
    assert (err.value.path, err.value.message) == (path, message)


def book() -> PriceBook:
    return PriceBook(
        {
            "openai": parse({"gpt-4o": GPT_4O, "*": {"input": 1, "output": 2}}, "a"),
            "fw": parse({"llama": {"input": 0.2, "cached_input": 3, "output": 0.2}}, "b"),
            "local": {},  # no prices: as if not there
        }
    )


def test_the_price_book_finds_a_models_price_else_the_providers_default() -> None:
    b = book()
    assert b.price("openai", "gpt-4o") == Price(2_500_000, 1_250_000, 10_000_000)
    assert b.price("openai", "gpt-4.1") == Price(1_000_000, 1_000_000, 2_000_000)  # "*"
    assert b.price("fw", "llama") == Price(200_000, 3_000_000, 200_000)
    assert b.price("fw", "mistral") is None  # no default there: unpriced
    assert b.price("local", "x") is None
    assert b.price("nobody", "gpt-4o") is None
    assert bool(b)
    assert not PriceBook({}) and not PriceBook({"local": {}})


def test_the_ceiling_is_the_highest_price_a_plan_may_be_charged() -> None:
    b = book()
    # input: the highest of every input and cached price (fw's cached price is its highest)
    assert b.ceiling((("openai", "gpt-4o"), ("fw", "llama"))) == (3_000_000, 10_000_000)
    assert b.ceiling((("openai", "gpt-4o"),)) == (2_500_000, 10_000_000)
    assert b.ceiling((("openai", "other"), ("local", "x"))) == (1_000_000, 2_000_000)
    assert b.ceiling((("local", "x"), ("fw", "mistral"))) == (0, 0)  # unpriced: nothing
    assert b.ceiling(()) == (0, 0)

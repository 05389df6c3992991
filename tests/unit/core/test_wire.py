"""The one parse of a body, and the exact second one for an integer beyond what orjson reads as
an integer (it reads such a literal as a float)."""

from __future__ import annotations

import orjson
import pytest

from core.chat import parse_chat
from core.checks import WIRE_HI, WIRE_LO
from core.completions import RequestLimits, parse_completion
from core.embeddings import parse_embedding
from core.errors import InvalidRequest

CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
COMPLETION = b'{"model": "m", "prompt": "hi", '


def chat(tail: str) -> object:
    return parse_chat(CHAT + tail.encode() + b"}", RequestLimits())


def refusal(call: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        call()  # type: ignore[operator]
    return caught.value


@pytest.mark.parametrize("seed", [WIRE_LO - 1, -(10**30), WIRE_HI + 1, 10**40])
def test_a_seed_beyond_the_wire_is_kept_exact(seed: int) -> None:
    """orjson reads these as floats; the request keeps the integer as sent (each target then
    checks its range: tests/unit/providers/rules/test_ranges.py)."""
    assert type(orjson.loads(str(seed))) is float
    req = chat(f'"seed": {seed}')
    assert req.fields["seed"] == seed and type(req.fields["seed"]) is int  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("tail", "param", "shown"),
    [
        ('"n": 100000000000000000000000', "n", "100000000000000000000000"),
        ('"max_tokens": -9223372036854775809', "max_tokens", "-9223372036854775809"),
        ('"top_k": 18446744073709551616', "top_k", "18446744073709551616"),
    ],
)
def test_a_bounded_integer_beyond_the_wire_is_refused_as_sent(
    tail: str, param: str, shown: str
) -> None:
    err = refusal(lambda: parse_completion(COMPLETION + tail.encode() + b"}", RequestLimits()))
    assert err.param == param and f"got {shown}." in err.message, err.message


def test_unbounded_integers_stop_at_what_the_wire_carries() -> None:
    """top_k has no upper bound of its own: anything past the wire's integers could not be
    written upstream, so it is refused when parsed."""
    err = refusal(lambda: chat('"top_k": 18446744073709551616'))
    assert err.param == "top_k" and "18446744073709551615" in err.message
    assert chat('"top_k": 18446744073709551615').fields["top_k"] == WIRE_HI  # type: ignore[attr-defined]


@pytest.mark.parametrize("literal", ["1e19", "-1e19", "1.5e30", "-9.223372036854775808e18"])
def test_a_float_literal_stays_a_float(literal: str) -> None:
    err = refusal(lambda: chat(f'"seed": {literal}'))
    assert err.param == "seed" and "expected an integer" in err.message


def test_a_literal_too_long_for_python_is_bad_json() -> None:
    err = refusal(lambda: chat('"seed": ' + "9" * 5000))
    assert err.code == "invalid_json"


def test_embeddings_too() -> None:
    body = b'{"model": "m", "input": "x", "dimensions": 100000000000000000000000}'
    err = refusal(lambda: parse_embedding(body))
    assert err.param == "dimensions" and "100000000000000000000000" in err.message

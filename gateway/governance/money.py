"""Money as whole pico-dollars (10^-12 USD), in Python ints: exact, with no drift however many
requests are added up. A price of up to 6 decimals per million tokens is a whole number of
pico-dollars per token, so a request's cost is exact too."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

from core.errors import ConfigError

PICO = 10**12  # pico-dollars in a dollar
PER_TOKEN = 10**6  # pico-dollars per token in a price of one dollar per million tokens
# The largest amount a budget or price may be: Redis counts pico-dollars in signed 64-bit
# integers (9.2e18), and a budget's counter may pass its limit by what was in flight.
MAX_USD = Decimal(1_000_000)


def decimal(v: Any, path: str) -> Decimal:
    """A config's or an admin call's number of dollars, read exactly: YAML and JSON floats are
    read by their shortest decimal text (0.1 is 0.1, not 0.1000000000000000055...)."""
    if type(v) is bool or not isinstance(v, (int, float, str)):
        raise ConfigError(path, f"expected a number of US dollars, got {type(v).__name__}")
    try:
        d = Decimal(str(v).strip())
    except InvalidOperation:
        raise ConfigError(path, f"expected a number of US dollars, got {v!r}") from None
    if not d.is_finite() or d < 0 or d > MAX_USD:
        raise ConfigError(path, f"expected a number of US dollars from 0 to {MAX_USD}")
    return d


def pico(v: Any, path: str, per: int = PICO) -> int:
    """Dollars (or dollars per million tokens, with per=PER_TOKEN) as whole pico-dollars; an
    amount finer than that is refused rather than rounded."""
    given = decimal(v, path)
    with localcontext() as ctx:  # exact: as many digits as the amount has, and the factor's
        ctx.prec = len(given.as_tuple().digits) + len(str(per)) + 2
        d = given * per
    if d != d.to_integral_value():
        finest = "1e-12 dollars" if per == PICO else "6 decimals per million tokens"
        raise ConfigError(path, f"{v} is finer than the gateway counts ({finest})")
    return int(d)


def usd(amount: int) -> str:
    """Pico-dollars as an exact decimal number of dollars: 1500000000 → "0.0015"."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), PICO)
    digits = f"{frac:012d}".rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"


def dollars(amount: int) -> str:
    """For messages: at least cents, more digits only where they are not zero ($0.0015)."""
    text = usd(amount)
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"

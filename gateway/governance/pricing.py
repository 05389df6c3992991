"""Prices, per provider and upstream model ("*": the provider's default), in USD per million
tokens as configured, held as pico-dollars per token; and what a request costs from the usage
of the target that answered."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from gateway.governance.money import PER_TOKEN, pico

PRICE_KEYS = ("input", "cached_input", "output")
DEFAULT = "*"
MAX_CEILINGS = 1024


@dataclass(frozen=True, slots=True)
class Price:
    """Pico-dollars per token. Cached prompt tokens cost `cached_input` (the input price when
    none is set); reasoning tokens are part of the completion's, at `output`."""

    input: int
    cached_input: int
    output: int

    def cost(self, usage: Mapping[str, Any]) -> int:
        """An answer's cost from its usage (OpenAI's: prompt_tokens counts the cached ones,
        completion_tokens the reasoning ones, every best_of candidate's included)."""
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if not details:  # the usual answer: no cached tokens
            return prompt * self.input + completion * self.output
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
        cached = min(cached, prompt)
        return (
            (prompt - cached) * self.input + cached * self.cached_input + completion * self.output
        )


def _count(v: Any) -> int:
    return v if type(v) is int and v > 0 else 0


Pricing = Mapping[str, Price]  # upstream model (or "*") → its price


def parse(v: Any, path: str) -> dict[str, Price]:
    """A provider's `pricing:` block: `model: {input, output, cached_input}`, USD per 1M."""
    if not isinstance(v, dict):
        raise ConfigError(path, f"expected a mapping, got {type(v).__name__}")
    out: dict[str, Price] = {}
    for model, entry in v.items():
        here = f"{path}.{model}"
        if not isinstance(entry, dict):
            raise ConfigError(here, f"expected a mapping, got {type(entry).__name__}")
        for k in entry:
            if k not in PRICE_KEYS:
                raise ConfigError(f"{here}.{k}", "unknown key")
        for k in ("input", "output"):
            if k not in entry:
                raise ConfigError(f"{here}.{k}", "required (USD per million tokens)")
        given = {k: pico(entry[k], f"{here}.{k}", PER_TOKEN) for k in entry}
        out[str(model)] = Price(
            given["input"], given.get("cached_input", given["input"]), given["output"]
        )
    return out


class PriceBook:
    """Every provider's prices: looked up per answer, and at admission for the highest a
    request's plan may be charged."""

    def __init__(self, prices: Mapping[str, Pricing]) -> None:
        self._prices = {name: p for name, p in prices.items() if p}
        # ceilings by plan: an alias's plan is the same tuple every request; a request's own
        # (Portkey) config makes new ones, so the table is emptied when full
        self._ceilings: dict[tuple[tuple[str, str], ...], tuple[int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._prices)

    def price(self, provider: str, model: str) -> Price | None:
        """None: the target is unpriced (it costs 0, and is counted as unpriced)."""
        table = self._prices.get(provider)
        if table is None:
            return None
        found = table.get(model)
        return found if found is not None else table.get(DEFAULT)

    def ceiling(self, targets: tuple[tuple[str, str], ...]) -> tuple[int, int]:
        """The highest prompt and completion prices among `targets` (provider, model): what a
        request that may be served by any of them reserves per token."""
        found = self._ceilings.get(targets)
        if found is None:
            if len(self._ceilings) >= MAX_CEILINGS:
                self._ceilings.clear()
            found = self._ceilings[targets] = self._highest(targets)
        return found

    def _highest(self, targets: Iterable[tuple[str, str]]) -> tuple[int, int]:
        top_in = top_out = 0
        for provider, model in targets:
            p = self.price(provider, model)
            if p is not None:
                top_in = max(top_in, p.input, p.cached_input)
                top_out = max(top_out, p.output)
        return top_in, top_out

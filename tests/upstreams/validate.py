"""Request validation shared by the dialects: field rules with ranges, prompt and stop
parsing, and the dialect-neutral `Params` a request becomes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .fakegen import Prompt, prompt_from_ids, prompt_from_text

ECHO_ALL = 1 << 30
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class Rule:
    kind: str  # int | number | bool | str | object | int_or_bool | any
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Violation:
    name: str
    problem: str  # type | min | max | choice
    rule: Rule
    value: Any


COMMON_RULES: dict[str, Rule] = {
    "model": Rule("str"),
    "prompt": Rule("any"),
    "echo": Rule("bool"),
    "frequency_penalty": Rule("number", -2, 2),
    "presence_penalty": Rule("number", -2, 2),
    "logit_bias": Rule("object"),
    "logprobs": Rule("int", 0, 5),
    "max_tokens": Rule("int", 0),
    "n": Rule("int", 1, 128),
    "seed": Rule("int"),
    "stop": Rule("any"),
    "stream": Rule("bool"),
    "temperature": Rule("number", 0, 2),
    "top_p": Rule("number", 0, 1),
    "user": Rule("str"),
}


@dataclass(frozen=True)
class Params:
    """A validated request, dialect-neutral."""

    model: str
    prompts: tuple[Prompt, ...]
    n: int = 1
    best_of: int = 1
    max_tokens: int = DEFAULT_MAX_TOKENS
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    echo: int | None = None  # prompt tokens echoed from the end (ECHO_ALL: whole prompt)
    logprobs: int | None = None  # legacy format: alternatives per position
    content_logprobs: int | None = None  # Fireworks `logprobs: true`: top_logprobs per position
    seed: int | None = None
    ignore_eos: bool = False
    truncate: bool = False
    raw_output: bool = False
    return_token_ids: bool = False
    perf_metrics: bool = False

    @property
    def top_n(self) -> int:
        return self.logprobs or self.content_logprobs or 0

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None or self.content_logprobs is not None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "number": lambda x: _is_int(x) or isinstance(x, float),
    "bool": lambda x: isinstance(x, bool),
    "str": lambda x: isinstance(x, str),
    "object": lambda x: isinstance(x, dict),
    "int_or_bool": lambda x: isinstance(x, int),
}


def _type_ok(kind: str, v: Any) -> bool:
    check = _TYPE_CHECKS.get(kind)
    return check is None or check(v)


def check_value(name: str, value: Any, rule: Rule) -> Violation | None:
    if value is None or rule.kind == "any":
        return None
    if not _type_ok(rule.kind, value):
        return Violation(name, "type", rule, value)
    if rule.choices and value not in rule.choices:
        return Violation(name, "choice", rule, value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if rule.lo is not None and value < rule.lo:
        return Violation(name, "min", rule, value)
    if rule.hi is not None and value > rule.hi:
        return Violation(name, "max", rule, value)
    return None


def check_all(body: Mapping[str, Any], rules: Mapping[str, Rule]) -> list[Violation]:
    found = (check_value(k, v, rules[k]) for k, v in body.items() if k in rules)
    return [v for v in found if v is not None]


def parse_prompts(raw: Any) -> tuple[Prompt, ...] | None:
    """string | string[] | int[] | int[][] → prompts; None when malformed or empty."""
    if isinstance(raw, str):
        return (prompt_from_text(raw),)
    if not isinstance(raw, list) or not raw:
        return None
    if all(_is_int(x) and x >= 0 for x in raw):
        return (prompt_from_ids(raw),)
    if all(isinstance(x, str) for x in raw):
        return tuple(prompt_from_text(x) for x in raw)
    if all(isinstance(x, list) and x and all(_is_int(t) and t >= 0 for t in x) for x in raw):
        return tuple(prompt_from_ids(x) for x in raw)
    return None


def parse_stops(raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,) if raw else ()
    if isinstance(raw, list) and len(raw) <= 4 and all(isinstance(s, str) for s in raw):
        return tuple(s for s in raw if s)
    return None


def prompt_texts(body: Any) -> list[str]:
    """The text prompts of a raw body (for magic markers), whatever else is wrong with it."""
    raw = body.get("prompt") if isinstance(body, dict) else None
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list):
        return [x for x in raw if isinstance(x, str)]
    return []


def input_texts(body: Any) -> list[str]:
    """The text inputs of a raw embeddings body (for magic markers)."""
    raw = body.get("input") if isinstance(body, dict) else None
    return prompt_texts({"prompt": raw})


def num_text(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def or_default(value: Any, default: int) -> int:
    return default if value is None else int(value)

"""Checked reads of YAML values: each error names the value's YAML path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import ConfigError


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def mapping(v: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(path or "<top>", f"expected a mapping, got {type(v).__name__}")
    return v


def seq(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise ConfigError(path, f"expected a list, got {type(v).__name__}")
    return v


def text(v: Any, path: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(path, f"expected a string, got {type(v).__name__}")
    return v


def integer(v: Any, path: str, lo: int, hi: int | None = None) -> int:
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        raise ConfigError(path, f"expected an integer >= {lo}" + (f" and <= {hi}" if hi else ""))
    return v


def number(v: Any, path: str) -> float:
    if type(v) not in (int, float) or v <= 0:
        raise ConfigError(path, "expected a positive number")
    return float(v)


def one_of(v: Any, path: str, options: tuple[str, ...]) -> str:
    if v not in options:
        raise ConfigError(path, f"expected one of {', '.join(options)}, got {v!r}")
    return str(v)


def known(m: Mapping[str, Any], path: str, keys: Any) -> None:
    for k in m:
        if k not in keys:
            raise ConfigError(join(path, str(k)), "unknown key")


def unique(values: list[str], path: str, what: str) -> None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise ConfigError(f"{path}[{i}].{what}", f"duplicate {what}")
        seen.add(v)


def boolean(v: Any, path: str) -> bool:
    if type(v) is not bool:
        raise ConfigError(path, "expected true or false")
    return v


def nonnegative(v: Any, path: str) -> float:
    if type(v) not in (int, float) or not 0 <= v < float("inf"):
        raise ConfigError(path, "expected a number >= 0")
    return float(v)


def weight(v: Any, path: str) -> float:
    return nonnegative(v, path)


def statuses(v: Any, path: str) -> frozenset[int]:
    return frozenset(integer(c, f"{path}[{i}]", 400, 599) for i, c in enumerate(seq(v, path)))

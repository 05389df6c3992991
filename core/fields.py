"""Requests declared as data: each endpoint's fields with their JSON type, range, default and
family, and the validation that runs from that declaration.

A `Field` is one request field. Its check is built from its type and range (`core.checks`), or
given for a structured field (prompt, stop, response_format, …); either way a bad value is a 400
naming the field. A `Declaration` is one endpoint's request: its fields, the required ones, and
`validate`, the one pass over a parsed body. The same declarations are what an API document is
built from, so what is validated and what is documented cannot drift.

Families say who defines a field: OpenAI's API itself, the provider extensions every target may
serve (Fireworks' sampling fields, the context-length behaviour), or vLLM's own extras. Dialect
tables derive their rows for a family from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from core import checks
from core.checks import Validator
from core.errors import InvalidRequest


class Family(Enum):
    OPENAI = "openai"  # OpenAI's API
    EXTENSION = "extension"  # provider extensions any target may serve
    VLLM = "vllm"  # vLLM's own extras


OPENAI, EXTENSION, VLLM = Family.OPENAI, Family.EXTENSION, Family.VLLM


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: tuple[str, ...]  # the JSON types it takes ("integer"; "string", "array" for prompt)
    check: Validator  # value, name → the value; a 400 naming the field when it is wrong
    lo: float | None = None  # the range of a number (inclusive unless lo_open)
    hi: float | None = None
    lo_open: bool = False
    options: tuple[str, ...] = ()  # an enum's values
    default: object = None  # the value an absent (or null) field means; None: nothing
    family: Family = OPENAI
    # The known keys of an object field, declared as fields (their own family and check).
    parts: tuple[Field, ...] = ()
    # Its check goes beyond its JSON types (prompt's forms, messages by role, …): an API
    # document states the types only, and the rest in words.
    structured: bool = False
    # Its range is checked by each target's table, in the target's words, not when parsed.
    ranged_by_target: bool = False


def integer(
    name: str,
    lo: int | None = None,
    hi: int | None = None,
    *,
    default: int | None = None,
    family: Family = OPENAI,
    by_target: bool = False,
) -> Field:
    """`by_target`: the range is declared (documented, and read by the dialect tables) but
    checked by each target's table, so that a target answers in its own words (vLLM's for a
    seed); the parse checks only that the value is an integer."""
    check = checks.integer(wire=False) if by_target else checks.integer(lo, hi)
    made = Field(name, ("integer",), check, lo, hi, default=default, family=family)
    return replace(made, ranged_by_target=True) if by_target else made


def number(
    name: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    default: float | None = None,
    family: Family = OPENAI,
) -> Field:
    check = checks.number(lo, hi, lo_open=lo_open)
    return Field(name, ("number",), check, lo, hi, lo_open, default=default, family=family)


def boolean(name: str, *, default: bool | None = None, family: Family = OPENAI) -> Field:
    return Field(name, ("boolean",), checks.boolean, default=default, family=family)


def string(name: str, *, family: Family = OPENAI) -> Field:
    return Field(name, ("string",), checks.string, family=family)


def choice(name: str, *options: str, default: str | None = None, family: Family = OPENAI) -> Field:
    check = checks.choice(*options)
    return Field(name, ("string",), check, options=options, default=default, family=family)


def structured(
    name: str, types: tuple[str, ...], check: Validator, *, family: Family = OPENAI
) -> Field:
    """A field whose value has a structure of its own, checked by `check`."""
    return Field(name, types, check, family=family, structured=True)


def object_of(name: str, *parts: Field, family: Family = OPENAI) -> Field:
    """An object field whose known keys are declared as fields (null keys are left alone;
    other keys are kept as sent)."""
    known = {p.name: p.check for p in parts}

    def check(v: Any, name: str) -> dict[str, Any]:
        value = checks.obj(v, name)
        for key, part in known.items():
            if value.get(key) is not None:
                part(value[key], f"{name}.{key}")
        return value

    return Field(name, ("object",), check, family=family, parts=parts)


@dataclass(frozen=True)
class Declaration:
    """One endpoint's request: `validate` checks a parsed body against it."""

    name: str  # OpenAI's name for the request, e.g. CreateCompletionRequest
    fields: tuple[Field, ...]
    required: tuple[str, ...]
    by_name: Mapping[str, Field] = field(init=False)
    _checks: Mapping[str, Validator] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        by_name = MappingProxyType({f.name: f for f in self.fields})
        object.__setattr__(self, "by_name", by_name)
        object.__setattr__(
            self, "_checks", MappingProxyType({f.name: f.check for f in by_name.values()})
        )

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def names(self, *families: Family) -> tuple[str, ...]:
        """The fields of these families (all without one), in declaration order."""
        return tuple(f.name for f in self.fields if not families or f.family in families)

    def sub_fields(self, *families: Family) -> tuple[str, ...]:
        """Keys of object fields, as `field.key`, of these families (all without one): a
        dialect may treat such a key apart from its field."""
        return tuple(
            f"{f.name}.{part.name}"
            for f in self.fields
            for part in f.parts
            if not families or part.family in families
        )

    def check(self, name: str, value: Any) -> Any:
        """One known field's value, checked (config defaults, Portkey's override_params)."""
        return self._checks[name](value, name)

    def validate(self, data: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """A body's fields, each known one checked (null means "the default" and is left out),
        and the names of the unknown ones, which are kept as sent."""
        fields: dict[str, Any] = {}
        unknown: list[str] = []
        known = self._checks
        for name, value in data.items():
            if value is None:
                continue
            check = known.get(name)
            if check is None:
                unknown.append(name)
                fields[name] = value
            else:
                fields[name] = check(value, name)
        for name in self.required:
            if name not in fields:
                raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
        return fields, tuple(unknown)

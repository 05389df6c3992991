"""Parameter rules: how one dialect treats each request field, as data.

A dialect is a mapping field name → FieldRule, plus the rule for unknown fields under the key `*`.
Dialects derive from the OpenAI table and state only their differences (`derive`). A key inside
an object field may have its own row, `"field.key"` (e.g. `stream_options.continuous_usage_stats`):
it is applied first, and a key that is not forwarded is taken out of the object.

    pass     forward as is; a value outside the dialect's own range is a 400 (never clamped)
    rename   forward under another name
    convert  forward the result of a function (a value the upstream spells differently)
    emulate  the gateway does it itself; the field is not forwarded
    drop     not forwarded, without changing the result; reported in the dropped-params header
    reject   the upstream cannot do it: the model's `unsupported_params` decides, 400 or drop

`apply_rules` never clamps and never drops silently: every dropped field is returned so the
response can say so.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from core.checks import shown_number
from core.completions import SUB_FIELDS
from core.errors import InvalidRequest, UnsupportedParameter
from core.provider import Policy

UNKNOWN = "*"
SUB_PARENTS = frozenset(name.split(".", 1)[0] for name in SUB_FIELDS)


class Action(Enum):
    PASS = "pass"
    RENAME = "rename"
    CONVERT = "convert"
    EMULATE = "emulate"
    DROP = "drop"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class FieldRule:
    action: Action
    to: str | None = None  # rename target
    lo: float | None = None  # inclusive range the upstream accepts (pass/rename)
    hi: float | None = None
    convert: Callable[[Any], Mapping[str, Any]] | None = None  # value → fields to send
    note: str = ""
    # A value outside [lo, hi] in the upstream's own words (name, value, lo, hi → the 400);
    # without it, the gateway's (the range that target accepts).
    outside: Callable[[str, Any, float | None, float | None], InvalidRequest] | None = None

    def with_range(self, lo: float | None, hi: float | None) -> FieldRule:
        return replace(self, lo=lo, hi=hi)


def passes(
    lo: float | None = None,
    hi: float | None = None,
    outside: Callable[[str, Any, float | None, float | None], InvalidRequest] | None = None,
) -> FieldRule:
    return FieldRule(Action.PASS, lo=lo, hi=hi, outside=outside)


def rename(to: str) -> FieldRule:
    return FieldRule(Action.RENAME, to=to)


def convert(fn: Callable[[Any], Mapping[str, Any]], note: str = "") -> FieldRule:
    return FieldRule(Action.CONVERT, convert=fn, note=note)


EMULATE = FieldRule(Action.EMULATE)
DROP = FieldRule(Action.DROP)
REJECT = FieldRule(Action.REJECT)

Dialect = Mapping[str, FieldRule]


def derive(base: Dialect, **changes: FieldRule) -> dict[str, FieldRule]:
    return {**base, **changes}


@dataclass(slots=True)
class Applied:
    body: dict[str, Any]  # what goes upstream
    emulated: frozenset[str]  # fields the gateway must carry out itself
    dropped: tuple[str, ...]  # fields not forwarded: the response says so


def apply_rules(
    dialect: Dialect,
    fields: Mapping[str, Any],
    *,
    target: str,
    policy: Policy,
    skip: Iterable[str] = (),
    sub_parents: Container[str] = SUB_PARENTS,
) -> Applied:
    """Map validated request `fields` to an upstream body; `skip` names fields set elsewhere."""
    body: dict[str, Any] = {}
    emulated: set[str] = set()
    dropped: list[str] = []
    skipped = frozenset(skip)
    default = dialect[UNKNOWN]
    for name, value in fields.items():
        if name in skipped:
            continue
        rule = dialect.get(name, default)
        if name in sub_parents and type(value) is dict:
            value = _sub_rules(dialect, name, value, target, policy, emulated, dropped)
        action = rule.action
        if action is Action.PASS or action is Action.RENAME:
            _check_range(rule, name, value, target)
            body[rule.to or name] = value
        elif action is Action.CONVERT:
            body.update(rule.convert(value))  # type: ignore[misc]
        elif action is Action.EMULATE:
            emulated.add(name)
        elif action is Action.DROP or policy == "drop":
            dropped.append(name)
        else:
            raise _unsupported(name, rule, target)
    return Applied(body, frozenset(emulated), tuple(dropped))


def _sub_rules(
    dialect: Dialect,
    parent: str,
    value: dict[str, Any],
    target: str,
    policy: Policy,
    emulated: set[str],
    dropped: list[str],
) -> dict[str, Any]:
    """`value` with the rows `parent.key` applied: what is not forwarded is taken out."""
    kept = dict(value)
    for key in value:
        name = f"{parent}.{key}"
        rule = dialect.get(name)
        if rule is None or rule.action is Action.PASS or value[key] is None:
            continue
        del kept[key]
        if rule.action is Action.EMULATE:
            emulated.add(name)
        elif rule.action is Action.DROP or policy == "drop":
            dropped.append(name)
        else:
            raise _unsupported(name, rule, target)
    return kept


def _unsupported(name: str, rule: FieldRule, target: str) -> UnsupportedParameter:
    return UnsupportedParameter(
        f"Parameter '{name}' is not supported by target '{target}'"
        + (f" ({rule.note})." if rule.note else "."),
        param=name,
    )


def _check_range(rule: FieldRule, name: str, value: Any, target: str) -> None:
    if rule.lo is None and rule.hi is None:
        return
    if type(value) not in (int, float):
        return
    if (rule.lo is not None and value < rule.lo) or (rule.hi is not None and value > rule.hi):
        if rule.outside is not None:
            raise rule.outside(name, value, rule.lo, rule.hi)
        bounds = f"[{_fmt(rule.lo, '-inf')}, {_fmt(rule.hi, 'inf')}]"
        raise InvalidRequest(
            f"'{name}'={value} is outside the range {bounds} that target '{target}' accepts.",
            param=name,
            code="unsupported_value",
        )


def _fmt(v: float | None, unbounded: str) -> str:
    return unbounded if v is None else shown_number(v)

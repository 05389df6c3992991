"""What a PromQL expression reads: its metric names and the label names it matches or groups
by. A tokenizer, not a full parser: enough for the dashboard's and the alerts' queries, and
strict where it matters (an unknown identifier counts as a metric, so it must exist).

    used("sum by (model) (rate(gateway_requests_total{status=~'5..'}[5m]))")
    == Used(metrics={"gateway_requests_total"}, labels={"model", "status"})
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TOKEN = re.compile(
    r"""(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
      |(?P<range>\[[^\]]*\])
      |(?P<duration>(?:\d+(?:ms|[smhdwy]))+\b)
      |(?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)
      |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      |(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},])
      |(?P<space>\s+)""",
    re.VERBOSE,
)
AGGREGATIONS = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ]
)
KEYWORDS = frozenset(["and", "or", "unless", "bool", "offset"])
GROUPING = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
MATCH_OPS = frozenset(("=", "!=", "=~", "!~"))


@dataclass
class Used:
    metrics: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)


def tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos : pos + 20]!r} in {expr!r}")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def used(expr: str) -> Used:
    toks = tokens(expr)
    found = Used()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "op" and text == "{":
            i = _matchers(toks, i + 1, found)
            continue
        if kind == "ident" and text in GROUPING and nxt == "(":
            i = _label_list(toks, i + 2, found)
            continue
        if kind == "ident" and not _is_operator_word(text, nxt):
            found.metrics.add(text)
        i += 1
    return found


def _is_operator_word(text: str, nxt: str) -> bool:
    """Functions and aggregations (followed by `(`, or `by`/`without` for aggregations),
    and the binary keywords: not metrics."""
    if nxt == "(" or text in KEYWORDS or text in GROUPING:
        return True
    return text in AGGREGATIONS and nxt in ("by", "without")


def _matchers(toks: list[tuple[str, str]], i: int, found: Used) -> int:
    """Inside `{...}`: `label op "value"` pairs; returns the index after `}`."""
    while toks[i][1] != "}":
        kind, text = toks[i]
        if kind == "ident" and toks[i + 1][1] in MATCH_OPS:
            found.labels.add(text)
        i += 1
    return i + 1


def _label_list(toks: list[tuple[str, str]], i: int, found: Used) -> int:
    while toks[i][1] != ")":
        if toks[i][0] == "ident":
            found.labels.add(toks[i][1])
        i += 1
    return i + 1

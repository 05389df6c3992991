"""Ranges a declaration leaves to the targets (`ranged_by_target`: a seed's int64): every table
that can serve the field checks it, so nothing outside it is ever written upstream, and vLLM's
tables refuse it in vLLM's words."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from core.chat import CHAT
from core.checks import INT64_MAX, INT64_MIN
from core.completions import COMPLETIONS
from core.errors import InvalidRequest
from core.fields import Declaration
from providers.openai_compat.dialects import DIALECTS
from providers.rules.chat import RULES as CHAT_TABLES
from providers.rules.params import Action, FieldRule, apply_rules
from providers.vllm_engine import rules as engine

TABLES: dict[str, tuple[Declaration, Mapping[str, FieldRule]]] = {
    **{f"completions-{n}": (COMPLETIONS, s.rules) for n, s in DIALECTS.items()},
    **{f"chat-{n}": (CHAT, t) for n, t in CHAT_TABLES.items()},
    "completions-engine": (COMPLETIONS, engine.RULES),
    "chat-engine": (CHAT, engine.CHAT_RULES),
}
VLLM_TABLES = ("completions-vllm-server", "chat-vllm-server", "completions-engine", "chat-engine")


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_every_table_checks_the_ranges_left_to_it(table: str) -> None:
    declaration, rules = TABLES[table]
    left = [f for f in declaration.fields if f.ranged_by_target]
    assert [f.name for f in left] == ["seed"]
    for f in left:
        rule = rules[f.name]
        assert rule.action is Action.PASS
        assert rule.lo is not None and rule.hi is not None
        assert f.lo is not None and f.hi is not None
        assert f.lo <= rule.lo and rule.hi <= f.hi, (table, rule)


@pytest.mark.parametrize("table", TABLES, ids=str)
@pytest.mark.parametrize("seed", [INT64_MIN - 1, INT64_MAX + 1, 2**64, -(10**30)])
def test_a_seed_outside_int64_is_refused_naming_it(table: str, seed: int) -> None:
    _, rules = TABLES[table]
    with pytest.raises(InvalidRequest) as caught:
        apply_rules(rules, {"seed": seed}, target="p/m", policy="reject")
    err = caught.value
    assert err.param == "seed" and str(seed) in err.message
    vllms = "less_than_equal" if seed > 0 else "greater_than_equal"
    bound = INT64_MAX if seed > 0 else INT64_MIN
    assert str(bound) in err.message
    assert (vllms in err.message) == (table in VLLM_TABLES), err.message


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_int64_seeds_pass(table: str) -> None:
    _, rules = TABLES[table]
    for seed in (INT64_MIN, 0, INT64_MAX):
        assert apply_rules(rules, {"seed": seed}, target="p/m", policy="reject").body == {
            "seed": seed
        }

"""Portkey configs → trees: inheritance (override_params merge, retry and request_timeout pass
down), Portkey's retry defaults, modifiers on the usual routing, and where errors point."""

from __future__ import annotations

import pytest

from core.errors import ConfigError, UpstreamError
from gateway.config import parse as parse_yaml
from gateway.config.portkey import PORTKEY_RETRY, from_header, parse, with_timeout
from gateway.routing.retry import RETRY_STATUSES
from gateway.routing.trees import Group, Leaf, leaves

PROVIDERS = ("a", "b")


def test_children_inherit_and_their_own_values_win() -> None:
    cfg = parse(
        {
            "strategy": {"mode": "fallback", "on_status_codes": [503]},
            "override_params": {"temperature": 0.5, "top_p": 0.9, "model": "m-root"},
            "retry": {"attempts": 2},
            "request_timeout": 1500,
            "targets": [
                {"virtual_key": "a", "override_params": {"temperature": 0.1}},
                {
                    "strategy": {"mode": "loadbalance"},
                    "retry": {"attempts": 0},
                    "targets": [{"provider": "b", "weight": 2, "request_timeout": 10}],
                },
            ],
        },
        PROVIDERS,
    )
    assert isinstance(cfg.root, Group) and cfg.root.fall_on == frozenset({503})
    a, b = leaves(cfg.root)
    assert (a.provider, a.model, a.path) == ("a", "m-root", "config.targets[0]")
    assert a.overrides == {"temperature": 0.1, "top_p": 0.9}
    assert (a.retry.attempts, a.request_s) == (2, 1.5)
    assert (b.path, b.weight, b.retry.attempts, b.request_s) == (
        "config.targets[1].targets[0]",
        2,
        0,
        0.01,
    )


def test_portkeys_retry_waits_1_2_4_s_and_honours_retry_after_only_when_asked() -> None:
    err = UpstreamError("busy", headers={"retry-after": "0.2"})
    err.upstream_status = 429
    plain = parse({"virtual_key": "a", "retry": {"attempts": 3}}, PROVIDERS)
    policy = leaves(plain.root)[0].retry  # type: ignore[arg-type]
    assert policy.on_status == RETRY_STATUSES
    assert [policy.delay(n, err, 0, jitter=0.9) for n in range(4)] == [1.0, 2.0, 4.0, None]
    asked = parse(
        {"virtual_key": "a", "retry": {"attempts": 3, "use_retry_after_header": True}}, PROVIDERS
    )
    assert leaves(asked.root)[0].retry.delay(0, err, 0, jitter=0.9) == 0.2  # type: ignore[arg-type]


def test_a_config_without_targets_modifies_the_usual_tree() -> None:
    tree = Group(
        "fallback", (Leaf("a", "x", "models.m.targets[0]"), Leaf("b", "y", "p")), "models.m"
    )
    cfg = parse({"retry": {"attempts": 1}, "override_params": {"seed": 7}}, PROVIDERS)
    first, _ = leaves(cfg.applied_to(tree))
    assert (first.retry.attempts, first.overrides, first.path) == (
        1,
        {"seed": 7},
        "models.m.targets[0]",
    )
    timed = with_timeout(parse({"override_params": {"seed": 7}}, PROVIDERS), 0.25)
    untouched = leaves(timed.applied_to(tree))[1]
    assert untouched.retry == tree.children[1].retry and untouched.request_s == 0.25  # type: ignore[union-attr]


def test_named_configs_come_from_the_yaml_and_their_errors_name_the_yaml_path() -> None:
    base = "providers:\n  a: {type: openai, base_url: 'http://a.invalid/v1'}\n"
    cfg = parse_yaml(
        base + "configs:\n  r: {strategy: {mode: single}, targets: [{virtual_key: a}]}\n"
    )
    assert leaves(from_header("r", cfg.configs, PROVIDERS).root)[0].path == "config.targets[0]"  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        parse_yaml(
            base + "configs:\n  r: {targets: [{virtual_key: zz}], strategy: {mode: single}}\n"
        )
    assert info.value.path == "configs.r.targets[0].virtual_key"


def test_too_many_targets_or_levels_are_refused() -> None:
    wide = {"strategy": {"mode": "loadbalance"}, "targets": [{"virtual_key": "a"}] * 33}
    with pytest.raises(ConfigError, match="at most 32"):
        parse(wide, PROVIDERS)
    deep: dict[str, object] = {"virtual_key": "a"}
    for _ in range(5):
        deep = {"strategy": {"mode": "single"}, "targets": [deep]}
    with pytest.raises(ConfigError, match="levels deep"):
        parse(deep, PROVIDERS)


def test_the_portkey_defaults() -> None:
    assert (PORTKEY_RETRY.backoff_s, PORTKEY_RETRY.max_wait_s, PORTKEY_RETRY.jitter) == (
        1.0,
        60.0,
        False,
    )

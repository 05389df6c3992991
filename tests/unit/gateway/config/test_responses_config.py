"""The `responses:` block (the Responses API's stored responses): its default, its value read,
and each bad value refused with its YAML path."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from gateway import config

BASE = "auth: {keys: []}\n"


def test_the_default() -> None:
    assert config.parse(BASE).responses == config.ResponsesConfig(ttl_days=30)
    assert config.parse(BASE + "responses: {}\n").responses.ttl_days == 30


def test_ttl_days_is_read() -> None:
    assert config.parse(BASE + "responses: {ttl_days: 1}\n").responses.ttl_days == 1
    assert config.parse(BASE + "responses: {ttl_days: 365}\n").responses.ttl_days == 365


@pytest.mark.parametrize(
    ("block", "path"),
    [
        ("responses: {ttl_days: 0}", "responses.ttl_days"),
        ("responses: {ttl_days: -1}", "responses.ttl_days"),
        ("responses: {ttl_days: 1.5}", "responses.ttl_days"),
        ("responses: {ttl_days: '30'}", "responses.ttl_days"),
        ("responses: {ttl_days: true}", "responses.ttl_days"),
        ("responses: {ttl_days: null}", "responses.ttl_days"),
        ("responses: {ttl: 30}", "responses.ttl"),
        ("responses: 30", "responses"),
        ("responses: [ttl_days]", "responses"),
    ],
)
def test_bad_values_name_their_path(block: str, path: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config.parse(BASE + block + "\n")
    assert exc.value.path == path, exc.value

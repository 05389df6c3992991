"""providers.vllm_engine.settings: the `type: vllm` block, errors naming the YAML path."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ConfigError
from providers.vllm_engine.settings import DEFAULT_ENGINE_ARGS, parse_settings

PATH = "providers.local"


def test_model_and_engine_args() -> None:
    s = parse_settings(
        {"type": "vllm", "model": "./models/tiny", "engine_args": {"max_model_len": 1024}}, PATH
    )
    assert s.model == "./models/tiny"
    assert s.engine_args == {**DEFAULT_ENGINE_ARGS, "max_model_len": 1024}


def test_configured_engine_args_win_over_defaults() -> None:
    s = parse_settings({"model": "m", "engine_args": {"disable_log_stats": False}}, PATH)
    assert s.engine_args["disable_log_stats"] is False


@pytest.mark.parametrize(
    ("block", "where", "says"),
    [
        ({}, "providers.local.model", "required"),
        ({"model": ""}, "providers.local.model", "required"),
        ({"model": 3}, "providers.local.model", "required"),
        ({"model": "m", "base_url": "x"}, "providers.local.base_url", "unknown key"),
        ({"model": "m", "engine_args": [1]}, "providers.local.engine_args", "mapping"),
        ({"model": "m", "engine_args": {"max-len": 1}}, "providers.local.engine_args", "name"),
        ({"model": "m", "engine_args": {"model": "x"}}, "providers.local.engine_args.model", "set"),
        (
            {"model": "m", "engine_args": {"logits_processors": []}},
            "providers.local.engine_args.logits_processors",
            "set by the gateway",
        ),
    ],
)
def test_errors_name_the_path(block: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_settings(block, PATH)
    assert str(exc.value).startswith(f"{where}: ") and says in str(exc.value)

"""Portkey configs (`x-portkey-config`, inline JSON or a name from the YAML's `configs:`) through
the openai SDK: fallback, retries, override_params, request_timeout, Portkey's response headers;
bad configs are 400s naming the field, and no config reaches a host the YAML does not name."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from tests.e2e.conftest import Env
from tests.e2e.support import (
    FIREWORKS_MODEL,
    LIMITED_KEY,
    NAMED_CONFIG,
    OA,
    OPENAI_MODEL,
    PORTKEY_OA_THEN_FW,
    error_body,
)
from tests.upstreams.fakegen import expected_text

PROMPT = "Say this is a test"
MODEL = "any-model-the-config-overrides"


def config(data: dict[str, Any]) -> dict[str, str]:
    return {"x-portkey-config": orjson.dumps(data).decode()}


def create(env: Env, headers: dict[str, str], **kw: Any) -> Any:
    """The raw response (for its headers) of a completion with these headers."""
    kw.setdefault("model", MODEL)
    kw.setdefault("prompt", PROMPT)
    return env.sdk.completions.with_raw_response.create(extra_headers=headers, **kw)


@pytest.mark.parametrize("how", ["inline", "named"])
def test_a_fallback_config_moves_on_and_says_where_it_ended(env: Env, how: str) -> None:
    env.openai.script({"status": 503, "times": -1})
    headers = config(PORTKEY_OA_THEN_FW) if how == "inline" else {"x-portkey-config": NAMED_CONFIG}
    raw = create(env, headers)
    assert raw.headers["x-portkey-last-used-option-index"] == "config.targets[1]"
    assert raw.headers["x-portkey-retry-attempt-count"] == "0"
    assert raw.headers["x-portkey-provider"] == "fw"
    completion = raw.parse()
    assert completion.model == MODEL  # the caller's name for it, as always
    assert completion.choices[0].text == expected_text(PROMPT, 0, 16)
    assert [r["body"]["model"] for r in env.fireworks.requests()] == [FIREWORKS_MODEL]
    assert len(env.openai.requests()) == 1


def test_config_retries_count_in_the_header(env: Env) -> None:
    env.openai.script({"status": 429, "times": 2, "headers": {"retry-after-ms": "10"}})
    data = {
        "retry": {"attempts": 3, "on_status_codes": [429], "use_retry_after_header": True},
        "virtual_key": "oai",
        "override_params": {"model": OPENAI_MODEL},
    }
    raw = create(env, config(data))
    assert raw.headers["x-portkey-retry-attempt-count"] == "2"
    assert raw.headers["x-portkey-last-used-option-index"] == "config"
    assert [r["outcome"] for r in env.openai.requests()] == ["error", "error", "ok"]


def test_override_params_win_over_the_body_and_pass_down(env: Env) -> None:
    data = {
        "strategy": {"mode": "single"},
        "override_params": {"temperature": 0.25, "max_tokens": 3},
        "targets": [
            {"virtual_key": "oai", "override_params": {"model": OPENAI_MODEL, "max_tokens": 5}}
        ],
    }
    completion = create(env, config(data), temperature=1.5, max_tokens=9).parse()
    (request,) = env.openai.requests()
    assert request["body"]["temperature"] == 0.25 and request["body"]["max_tokens"] == 5
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def test_a_config_without_targets_modifies_the_aliass_routing(env: Env) -> None:
    env.openai.script({"status": 500, "times": 1})
    raw = create(env, config({"retry": {"attempts": 1}}), model=OA)
    assert raw.headers["x-portkey-retry-attempt-count"] == "1"
    assert raw.parse().model == OA
    assert len(env.openai.requests()) == 2


def test_request_timeout_is_a_408_and_can_fall_back(env: Env) -> None:
    env.openai.script({"delay_ms": 3000, "times": -1})
    slow = {
        "virtual_key": "oai",
        "override_params": {"model": OPENAI_MODEL},
        "request_timeout": 200,
    }
    with pytest.raises(openai.APIStatusError) as info:
        create(env, config(slow))
    assert info.value.status_code == 408
    assert error_body(info.value)["type"] == "timeout_error"
    assert error_body(info.value)["message"] == (
        "Request exceeded the timeout sent in the request: 200ms"
    )
    assert info.value.response.headers["x-portkey-last-used-option-index"] == "config"
    fallback = {
        "strategy": {"mode": "fallback"},
        "targets": [slow, PORTKEY_OA_THEN_FW["targets"][1]],
    }
    raw = create(env, config(fallback))
    assert raw.headers["x-portkey-last-used-option-index"] == "config.targets[1]"


def test_the_request_timeout_header_beats_the_config(env: Env) -> None:
    env.openai.script({"delay_ms": 3000, "times": -1})
    headers = {**config(PORTKEY_OA_THEN_FW), "x-portkey-request-timeout": "200"}
    raw = create(env, headers)  # the 408 falls back: Portkey's fallback takes any failure
    assert raw.headers["x-portkey-last-used-option-index"] == "config.targets[1]"


def test_a_stream_falls_back_before_its_first_byte(env: Env) -> None:
    env.openai.script({"status": 502, "times": -1})
    chunks = list(
        env.sdk.completions.create(
            model=MODEL, prompt=PROMPT, stream=True, extra_headers=config(PORTKEY_OA_THEN_FW)
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected_text(PROMPT, 0, 16)


@pytest.mark.parametrize(
    ("header", "param", "words"),
    [
        ("{not json", "config", "not valid JSON"),
        ("no-such-config", "config", "no config named"),
        ('{"targets": []}', "config.strategy", "required"),
        ('{"strategy": {"mode": "fallback"}, "targets": []}', "config.targets", "at least one"),
        ('{"strategy": {"mode": "conditional"}, "targets": [{"virtual_key": "oai"}]}',
         "config.strategy.mode", "not supported"),
        ('{"strategy": {"mode": "loadbalance"}, "targets": [{"virtual_key": "oai", "weight": -1}]}',
         "config.targets[0].weight", ">= 0"),
        ('{"virtual_key": "oai", "retry": {"attempts": 6}}', "config.retry.attempts", "<= 5"),
        ('{"virtual_key": "oai", "retry": {}}', "config.retry.attempts", "required"),
        ('{"virtual_key": "oai", "request_timeout": 0}', "config.request_timeout", ">= 1"),
        ('{"virtual_key": "nope"}', "config.virtual_key", "no provider named"),
        ('{"provider": "openai", "api_key": "sk-mine"}', "config.api_key", "credentials"),
        ('{"virtual_key": "oai", "custom_host": "http://169.254.169.254/v1"}',
         "config.custom_host", "only the hosts"),
        ('{"virtual_key": "oai", "override_params": {"temperature": 9}}',
         "config.override_params.temperature", "temperature"),
        ('{"virtual_key": "oai", "override_params": {"stream": true}}',
         "config.override_params.stream", "can be overridden"),
        ('{"virtual_key": "oai", "cache": {"mode": "semantic"}}', "config.cache.mode",
         "semantic caching is not supported"),
        ('{"virtual_key": "oai", "cache": {"max_age": 0}}', "config.cache.max_age", ">= 1"),
        ('{"strategy": {"mode": "fallback"}, "targets": [{"virtual_key": "oai", "cache": {}}]}',
         "config.targets[0].cache", "top level"),
        ('{"weight": 1}', "config.weight", "needs targets"),
        ('{"name": "x"}', "config", "a config needs"),
    ],
)  # fmt: skip
def test_bad_configs_are_400s_naming_the_field(
    env: Env, header: str, param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        create(env, {"x-portkey-config": header})
    error = error_body(info.value)
    assert error["param"] == param and words in error["message"], error
    assert env.openai.requests() == [] and env.fireworks.requests() == []


def test_a_config_cannot_reach_providers_the_key_may_not_use(env: Env) -> None:
    with env.client(LIMITED_KEY) as limited, pytest.raises(openai.PermissionDeniedError) as info:
        limited.completions.create(
            model=MODEL, prompt=PROMPT, extra_headers=config(PORTKEY_OA_THEN_FW)
        )
    assert error_body(info.value)["param"] == "config.targets[0]"  # the target it names
    assert env.openai.requests() == []


@pytest.mark.parametrize("header", ["x-portkey-custom-host", "x-portkey-provider"])
def test_headers_that_would_reach_other_hosts_are_refused(env: Env, header: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        create(env, {header: "http://127.0.0.1:1/v1", **config(PORTKEY_OA_THEN_FW)})
    assert error_body(info.value)["param"] == header


def test_a_bad_request_timeout_header_is_a_400(env: Env) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        create(env, {"x-portkey-request-timeout": "soon", **config(PORTKEY_OA_THEN_FW)})
    assert error_body(info.value)["param"] == "x-portkey-request-timeout"

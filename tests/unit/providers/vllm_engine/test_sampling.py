"""providers.vllm_engine.sampling: request fields → SamplingParams, checked against vLLM's own
server mapping (CompletionRequest.to_sampling_params) for the same requests."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import InvalidRequest
from providers.vllm_engine.beams import beam_kwargs
from providers.vllm_engine.rules import ADAPTER_READS
from providers.vllm_engine.sampling import (
    DEFAULTS,
    VLLM_DIRECT,
    Generation,
    build,
    mirostat_args,
    sampling_kwargs,
    structured_outputs,
)

ONE = Generation(n=1, max_tokens=16, stream=False)
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_unset_fields_get_vllm_server_defaults() -> None:
    kw = sampling_kwargs({"prompt": "x"}, ONE)
    assert {k: kw[k] for k in DEFAULTS} == dict(DEFAULTS)
    assert kw["n"] == 1 and kw["max_tokens"] == 16 and kw["stop"] == []
    assert kw["logprobs"] is None and kw["prompt_logprobs"] is None
    assert kw["structured_outputs"] is None and kw["extra_args"] is None
    assert kw["output_kind"] == "final"


def test_given_fields_are_taken_as_sent() -> None:
    body = {
        "temperature": 0.3,
        "top_p": 0.5,
        "top_k": 7,
        "min_p": 0.1,
        "presence_penalty": 0.4,
        "frequency_penalty": -0.2,
        "repetition_penalty": 1.3,
        "seed": 42,
        "logit_bias": {"12": 5.0},
        "stop": "\n",
        "ignore_eos": True,
    }
    kw = sampling_kwargs(body, Generation(n=3, max_tokens=9, stream=True))
    for name in DEFAULTS:
        assert kw[name] == body[name]
    assert kw["seed"] == 42 and kw["logit_bias"] == {"12": 5.0}
    assert kw["stop"] == ["\n"] and kw["ignore_eos"] is True
    assert kw["n"] == 3 and kw["max_tokens"] == 9 and kw["output_kind"] == "delta"


def test_echo_asks_prompt_logprobs_and_one_token_for_max_tokens_0() -> None:
    kw = sampling_kwargs({"echo": True, "logprobs": 2}, Generation(1, 0, False))
    assert kw["prompt_logprobs"] == 2 and kw["logprobs"] == 2
    assert kw["max_tokens"] == 1
    assert sampling_kwargs({"echo": True}, ONE)["prompt_logprobs"] is None


@pytest.mark.parametrize(
    ("fmt", "want"),
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"json_object": True}),
        ({"type": "json_object", "schema": SCHEMA}, {"json": SCHEMA}),
        ({"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}, {"json": SCHEMA}),
    ],
)
def test_response_format_as_structured_outputs(fmt: Any, want: Any) -> None:
    assert structured_outputs(fmt) == want


@pytest.mark.parametrize(
    "fmt",
    [{"type": "json_schema"}, {"type": "json_schema", "json_schema": {"name": "s"}}, {"type": "x"}],
)
def test_bad_response_format_is_a_400(fmt: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        structured_outputs(fmt)
    assert exc.value.param == "response_format"


def test_mirostat_goes_to_extra_args() -> None:
    assert mirostat_args({}) == {}
    assert mirostat_args({"mirostat_target": 5}) == {"mirostat_target": 5.0, "mirostat_lr": 0.1}
    kw = sampling_kwargs({"mirostat_target": 3.0, "mirostat_lr": 0.5}, ONE)
    assert kw["extra_args"] == {"mirostat_target": 3.0, "mirostat_lr": 0.5}
    xargs = {"mirostat_target": 9.0, "other": "x"}  # the fields win over xargs of their name
    kw = sampling_kwargs({"mirostat_target": 3.0, "vllm_xargs": xargs}, ONE)
    assert kw["extra_args"] == {"mirostat_target": 3.0, "mirostat_lr": 0.1, "other": "x"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"mirostat_target": 0}, "mirostat_target"),
        ({"mirostat_target": -1.0}, "mirostat_target"),
        ({"mirostat_target": float("inf")}, "mirostat_target"),
        ({"mirostat_target": True}, "mirostat_target"),
        ({"mirostat_target": 5.0, "mirostat_lr": 0}, "mirostat_lr"),
        ({"mirostat_target": 5.0, "mirostat_lr": "fast"}, "mirostat_lr"),
        ({"mirostat_lr": 0.1}, "mirostat_lr"),
    ],
)
def test_bad_mirostat_is_a_400_naming_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        mirostat_args(body)
    assert exc.value.param == param


# ---------------------------------------------------------------- against vLLM's own mapping

# vLLM refuses n > 1 with greedy sampling (the adapter generates once and repeats the choice).
PARITY = [
    {},
    {"temperature": 0, "n": 1},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "seed": 7},
    {"presence_penalty": 1.0, "frequency_penalty": 0.5, "repetition_penalty": 1.2},
    {"stop": ["a", "bc"], "ignore_eos": True, "logprobs": 3},
    {"echo": True, "logprobs": 1},
    {"logit_bias": {"5": 100, "9": -100}},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
    # vLLM's extras the engine serves
    {"min_tokens": 3, "stop_token_ids": [4, 9], "include_stop_str_in_output": True},
    {"skip_special_tokens": False, "spaces_between_special_tokens": False},
    {"bad_words": ["foo", "bar baz"], "allowed_token_ids": [3, 4, 5]},
    {"vllm_xargs": {"a": 1, "b": ["x", 2.5]}},
    {"structured_outputs": {"choice": ["yes", "no"]}},
    {"structured_outputs": {"regex": "[a-z]+", "disable_any_whitespace": True}},
    {"structured_outputs": {"grammar": "root ::= 'a'"}, "response_format": {"type": "text"}},
    {"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
    {"prompt_logprobs": 3},
    {"prompt_logprobs": 0, "echo": True, "logprobs": 2},
    {"logprobs": 2, "logprob_token_ids": [5, 9]},
    {"logprobs": 1, "logprob_token_ids": [4], "echo": True},
]
COMPARED = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "logprobs",
    "prompt_logprobs",
    "logprob_token_ids",
    "ignore_eos",
    "max_tokens",
    "output_kind",
    "logit_bias",
    "structured_outputs",
    "extra_args",
    *VLLM_DIRECT,
)


@pytest.mark.parametrize("given", PARITY, ids=lambda b: ",".join(b) or "defaults")
@pytest.mark.parametrize("stream", [False, True])
def test_same_sampling_params_as_vllm_server(given: dict[str, Any], stream: bool) -> None:
    body = dict(given)
    if stream and body.get("prompt_logprobs"):
        pytest.skip("prompt_logprobs > 0 is refused with stream (vLLM's and the gateway's 400)")
    protocol = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
    n = body.pop("n", 2)
    request = protocol.CompletionRequest(model="m", prompt="hi", stream=stream, n=n, **body)
    theirs = request.to_sampling_params(max_tokens=11)
    ours = build(sampling_kwargs(body, Generation(n=n, max_tokens=11, stream=stream)))
    for name in COMPARED:
        assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"n": 3, "temperature": 0.5, "length_penalty": 0.5},
        {"ignore_eos": True, "include_stop_str_in_output": True, "skip_special_tokens": False},
    ],
    ids=lambda b: ",".join(b) or "defaults",
)
def test_same_beam_search_params_as_vllm_server(given: dict[str, Any]) -> None:
    protocol = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
    from vllm.sampling_params import BeamSearchParams

    n = given.get("n", 1)
    request = protocol.CompletionRequest(model="m", prompt="hi", use_beam_search=True, **given)
    theirs = request.to_beam_search_params(max_tokens=9)
    assert BeamSearchParams(**beam_kwargs(given, n, 9)) == theirs


def test_vllm_validation_error_is_a_400_naming_the_parameter() -> None:
    pytest.importorskip("vllm")
    with pytest.raises(InvalidRequest) as exc:
        build(sampling_kwargs({"top_k": -2}, ONE))
    assert exc.value.param == "top_k"
    assert "parameter=" not in exc.value.message


# ---------------------------------------------------------------- the engine's rule table

# Passed fields the adapter reads itself (Generation, the prompt) or that vLLM ignores too (user).
READ_BY_ADAPTER = {"model", "prompt", "stream", "max_tokens", "n", "user", *ADAPTER_READS}


class Recording(dict[str, Any]):
    """A body that remembers which fields were looked at."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)


def test_every_field_has_an_engine_rule() -> None:
    from core.completions import FIELDS
    from providers.vllm_engine.rules import RULES

    assert [name for name in FIELDS if name not in RULES] == []


def test_every_vllm_extra_is_served() -> None:
    from core.completions import SUB_FIELDS, VLLM_FIELDS
    from providers.rules.params import Action
    from providers.vllm_engine.rules import RULES, SERVED

    assert sorted(SERVED) == sorted(VLLM_FIELDS)
    assert {RULES[name].action for name in VLLM_FIELDS} == {Action.PASS}
    assert {RULES[name].action for name in SUB_FIELDS} == {Action.EMULATE}


def test_every_passed_field_is_used() -> None:
    from core.completions import FIELDS
    from providers.rules.params import Action
    from providers.vllm_engine.rules import RULES

    body = Recording()
    sampling_kwargs(body, ONE)
    passed = {n for n in FIELDS if RULES[n].action in (Action.PASS, Action.CONVERT)}
    assert passed - body.seen - READ_BY_ADAPTER == set()

"""The request schema: every field's type and range, the prompt forms, the cross-field rules."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from core.completions import (
    FIELDS,
    OPENAI_FIELDS,
    RequestLimits,
    apply_defaults,
    parse_completion,
    validate_completion,
)
from core.errors import InvalidRequest
from tests.unit.refusals import refused

LIMITS = RequestLimits()
BASE = {"model": "m", "prompt": "hi"}


def parse(**fields: Any) -> Any:
    return validate_completion({**BASE, **fields}, LIMITS)


# (field overrides, param named in the 400)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"model": 3}, "model"),
    ({"prompt": 3}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt[0]"),
    ({"prompt": ["a", 1]}, "prompt[1]"),
    ({"prompt": [1, "a"]}, "prompt[1]"),
    ({"prompt": [1, -2]}, "prompt[1]"),
    ({"prompt": [[1], [2, 1.5]]}, "prompt[1][1]"),
    ({"prompt": [{"a": 1}]}, "prompt[0]"),
    ({"prompt": [True]}, "prompt[0]"),
    ({"best_of": 21}, "best_of"),
    ({"best_of": -1}, "best_of"),
    ({"best_of": 1.5}, "best_of"),
    ({"echo": "yes"}, "echo"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"frequency_penalty": "1"}, "frequency_penalty"),
    ({"presence_penalty": -2.01}, "presence_penalty"),
    ({"logit_bias": {"12": 101}}, "logit_bias.12"),
    ({"logit_bias": {"abc": 1}}, "logit_bias.abc"),
    ({"logit_bias": {"1": 1, "a": 1, "b": 2}}, "logit_bias"),  # several: named together
    ({"logit_bias": {"²": 1}}, "logit_bias.²"),  # a digit to Python, not an integer
    ({"logit_bias": [1]}, "logit_bias"),
    ({"logprobs": -2}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": "16"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"seed": 1.0}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": []}, "stop"),
    ({"stop": [1]}, "stop[0]"),
    ({"stop": ""}, "stop"),
    ({"stream": "true"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"stream": True, "stream_options": []}, "stream_options"),
    ({"suffix": 1}, "suffix"),
    ({"temperature": 2.1}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 1.1}, "top_p"),
    ({"user": 5}, "user"),
    ({"best_of": 2, "stream": True}, "best_of"),
    ({"best_of": 2, "n": 3}, "best_of"),
    ({"context_length_exceeded_behavior": "clip"}, "context_length_exceeded_behavior"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"mirostat_target": 0}, "mirostat_target"),
    ({"mirostat_target": 5, "mirostat_lr": -1}, "mirostat_lr"),
    ({"mirostat_lr": 0.1}, "mirostat_lr"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object", "schema": 3}}, "response_format.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
    ),
    ({"temperature": float("nan")}, "temperature"),
    # vLLM's extras, as vLLM's CompletionRequest checks them
    ({"prompt_logprobs": -2}, "prompt_logprobs"),
    ({"prompt_logprobs": "1"}, "prompt_logprobs"),
    ({"return_token_ids": "yes"}, "return_token_ids"),
    ({"return_tokens_as_token_ids": 1}, "return_tokens_as_token_ids"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"truncation_side": "middle"}, "truncation_side"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"stop_token_ids": 2}, "stop_token_ids"),
    ({"stop_token_ids": [1, -1]}, "stop_token_ids[1]"),
    ({"include_stop_str_in_output": "no"}, "include_stop_str_in_output"),
    ({"skip_special_tokens": 0}, "skip_special_tokens"),
    ({"spaces_between_special_tokens": None, "skip_special_tokens": "x"}, "skip_special_tokens"),
    ({"bad_words": "bad"}, "bad_words"),
    ({"bad_words": ["ok", 3]}, "bad_words[1]"),
    ({"allowed_token_ids": [1, "2"]}, "allowed_token_ids[1]"),
    ({"structured_outputs": "json"}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", 1]}}, "structured_outputs.choice[1]"),
    ({"structured_outputs": {"json": 3}}, "structured_outputs.json"),
    ({"structured_outputs": {"guided_json": {}}}, "structured_outputs.guided_json"),
    ({"use_beam_search": "true"}, "use_beam_search"),
    ({"length_penalty": "1"}, "length_penalty"),
    ({"logprob_token_ids": [-3], "logprobs": 1}, "logprob_token_ids[0]"),
    ({"add_special_tokens": 1}, "add_special_tokens"),
    ({"vllm_xargs": []}, "vllm_xargs"),
    ({"vllm_xargs": {"a": {"b": 1}}}, "vllm_xargs.a"),
    ({"vllm_xargs": {"a": [1, None]}}, "vllm_xargs.a"),
    ({"priority": 1.5}, "priority"),
]


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": 20},
        {"logprobs": -1},
        {"prompt_logprobs": 0, "stream": True},
        {"min_tokens": 16},
        {"structured_outputs": {"choice": ["yes", "no"], "disable_any_whitespace": True}},
        {"structured_outputs": {"json": {"type": "object"}}},
        {"structured_outputs": {"json_object": True}},
        {"vllm_xargs": {"a": "x", "b": 2, "c": [1.5, "y"]}},
        {"truncate_prompt_tokens": -1, "truncation_side": "right"},
        # Beam search with what it applies, and the rest at neutral values.
        {"use_beam_search": True, "n": 3, "length_penalty": 0.5, "temperature": 0.3},
        {"use_beam_search": True, "top_p": 1.0, "top_k": -1, "logit_bias": {}, "seed": 3},
        {"use_beam_search": True, "response_format": {"type": "text"}, "logprobs": 2},
        {"length_penalty": 1.0},
        {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    ],
)
def test_vllm_extras_that_vllm_accepts(fields: dict[str, Any]) -> None:
    """Valid to vLLM: whether a target takes them is its dialect's business."""
    assert parse(**fields).fields.items() >= fields.items()


def test_continuous_usage_needs_include_usage() -> None:
    """As vLLM reads it: per-chunk usage only when the caller asked for usage at all."""
    on = {"include_usage": True, "continuous_usage_stats": True}
    assert parse(stream=True, stream_options=on).continuous_usage
    off = {"include_usage": False, "continuous_usage_stats": True}
    assert not parse(stream=True, stream_options=off).continuous_usage
    assert not parse(stream=True, stream_options={"include_usage": True}).continuous_usage


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[str(b[0])[:60] for b in BAD])
def test_bad_input_names_the_parameter(fields: dict[str, Any], param: str) -> None:
    refused(param, parse, **fields)


@pytest.mark.parametrize("missing", ["model", "prompt"])
def test_required_fields(missing: str) -> None:
    data = dict(BASE)
    del data[missing]
    with pytest.raises(InvalidRequest) as info:
        validate_completion(data, LIMITS)
    assert info.value.param == missing


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"{nope", "invalid_json"), (b"[1, 2]", "invalid_json"), (b"", "invalid_json")],
)
def test_body_must_be_a_json_object(body: bytes, code: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_completion(body, LIMITS)
    assert info.value.code == code


@pytest.mark.parametrize(
    ("prompt", "prompts", "tokens"),
    [
        ("a", ["a"], False),
        (["a", "b"], ["a", "b"], False),
        ([1, 2, 3], [[1, 2, 3]], True),
        ([[1, 2], [3]], [[1, 2], [3]], True),
    ],
)
def test_the_four_prompt_forms(prompt: Any, prompts: Any, tokens: bool) -> None:
    req = parse(prompt=prompt)
    assert req.prompts == prompts
    assert req.prompt_is_tokens is tokens
    assert req.fields["prompt"] == prompt  # forwarded as sent


def test_defaults_and_nulls() -> None:
    req = parse(max_tokens=None, n=None, stop=None, stream=None, temperature=None)
    assert (req.max_tokens, req.n, req.stop, req.stream) == (16, 1, (), False)
    assert "temperature" not in req.fields  # null means the default: nothing to forward


def test_valid_values_pass_through_unchanged() -> None:
    body = {
        **BASE,
        "best_of": 3,
        "n": 2,
        "echo": True,
        "logprobs": 5,
        "max_tokens": 0,
        "stop": "x",
        "stream": False,
        "temperature": 0,
        "top_p": 0,
        "logit_bias": {"50256": -100},
        "seed": 2**40,
        "user": "u",
        "suffix": "s",
        "top_k": 40,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "mirostat_target": 5.0,
        "mirostat_lr": 0.1,
        "ignore_eos": True,
        "context_length_exceeded_behavior": "truncate",
        "response_format": {"type": "json_object", "schema": {"type": "object"}},
    }
    req = validate_completion(dict(body), LIMITS)
    assert req.fields == body
    assert req.stop == ("x",)
    assert req.unknown == ()


def test_unknown_fields_are_kept_for_the_dialect_rules() -> None:
    req = parse(min_tokens=3, cache_salt="s", guided_json={"type": "object"})
    assert req.unknown == ("cache_salt", "guided_json")  # min_tokens is a known vLLM field
    assert req.fields["guided_json"] == {"type": "object"} and req.fields["min_tokens"] == 3


def test_stream_options_and_usage() -> None:
    req = parse(stream=True, stream_options={"include_usage": True, "include_obfuscation": False})
    assert req.stream and req.include_usage


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 9}, "n"),
        ({"best_of": 9}, "best_of"),
        ({"max_tokens": 101}, "max_tokens"),
        ({"prompt": ["a"] * 5}, "prompt"),
        ({"prompt": ["a"] * 4, "n": 4}, "n"),
    ],
)
def test_gateway_bounds(fields: dict[str, Any], param: str) -> None:
    limits = RequestLimits(max_n=8, max_best_of=8, max_tokens=100, max_prompts=4, max_choices=10)
    with pytest.raises(InvalidRequest) as info:
        validate_completion({**BASE, **fields}, limits)
    assert info.value.param == param


def test_model_defaults_fill_only_unset_fields() -> None:
    req = parse(temperature=0.5)
    out = apply_defaults(req, {"temperature": 1.0, "max_tokens": 64})
    assert out.fields["temperature"] == 0.5
    assert out.max_tokens == 64 and out.fields["max_tokens"] == 64
    assert req.max_tokens == 16 and "max_tokens" not in req.fields  # the original is untouched


def test_every_openai_field_is_in_the_table() -> None:
    spec = {
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
    assert set(OPENAI_FIELDS) == spec
    assert set(FIELDS) >= spec | {
        "context_length_exceeded_behavior",
        "ignore_eos",
        "mirostat_target",
        "mirostat_lr",
        "top_k",
        "repetition_penalty",
        "min_p",
        "response_format",
    }


def test_one_parse_of_the_body() -> None:
    req = parse_completion(orjson.dumps({**BASE, "n": 2}), LIMITS)
    assert req.n == 2


def test_every_bad_logit_bias_key_is_named() -> None:
    """As vLLM names them: each key that is not a token id, not only the first."""
    bias = {"1": 1, "a": 1, "-2": 1, "b c": 1, "7": 1}
    with pytest.raises(InvalidRequest) as caught:
        parse(logit_bias=bias)
    assert caught.value.param == "logit_bias"
    assert caught.value.message == (
        "Invalid value for 'logit_bias': its keys must be token ids as strings; 3 are not: "
        '"a", "-2", "b c".'
    )
    many = {f"k{i}": 1 for i in range(25)}
    with pytest.raises(InvalidRequest) as caught:
        parse(logit_bias=many)
    assert '"k19" and 5 more.' in caught.value.message and '"k20"' not in caught.value.message

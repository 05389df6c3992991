"""vLLM's own rules between a completion request's fields, which hold where vLLM serves the
request (the in-process engine and the vllm-server dialect): each a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from core.chat import validate_chat
from core.completions import RequestLimits, validate_completion
from core.errors import InvalidRequest
from providers.rules import vllm_checks
from tests.unit.refusals import refused

LIMITS = RequestLimits()
BASE = {"model": "m", "prompt": "hi"}


def parse(**fields: Any) -> Any:
    """The request as validated for every target, then vLLM's checks on it."""
    request = validate_completion({**BASE, **fields}, LIMITS)
    vllm_checks.check(request.fields)
    return request


# (field overrides, param named in the 400)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt_logprobs": -1, "stream": True}, "prompt_logprobs"),
    ({"min_tokens": 17}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"use_beam_search": True, "echo": True, "logprobs": 1}, "echo"),
    ({"length_penalty": 0.5}, "length_penalty"),  # beam search only
    ({"use_beam_search": True, "stream": True}, "use_beam_search"),
    ({"use_beam_search": True, "stop": ["x"]}, "stop"),
    ({"use_beam_search": True, "top_p": 0.5}, "top_p"),
    ({"use_beam_search": True, "min_tokens": 2}, "min_tokens"),
    ({"use_beam_search": True, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"use_beam_search": True, "response_format": {"type": "json_object"}}, "response_format"),
    ({"use_beam_search": True, "prompt_logprobs": 0}, "prompt_logprobs"),
    ({"use_beam_search": True, "best_of": 2}, "best_of"),
    ({"use_beam_search": True, "logprobs": 1, "logprob_token_ids": [3]}, "logprob_token_ids"),
    ({"logprob_token_ids": [3]}, "logprob_token_ids"),  # needs logprobs
    ({"logprob_token_ids": [3], "logprobs": 1, "echo": True, "max_tokens": 0}, "logprob_token_ids"),
    ({"logprob_token_ids": list(range(129)), "logprobs": 1}, "logprob_token_ids"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[str(b[0])[:60] for b in BAD])
def test_bad_input_names_the_parameter(fields: dict[str, Any], param: str) -> None:
    refused(param, parse, **fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": 20},
        {"prompt_logprobs": 0, "stream": True},
        {"min_tokens": 16},
        # Beam search with what it applies, and the rest at neutral values.
        {"use_beam_search": True, "n": 3, "length_penalty": 0.5, "temperature": 0.3},
        {"use_beam_search": True, "top_p": 1.0, "top_k": -1, "logit_bias": {}, "seed": 3},
        {"use_beam_search": True, "response_format": {"type": "text"}, "logprobs": 2},
        {"length_penalty": 1.0},
        {"logprob_token_ids": [3], "logprobs": 1},
    ],
)
def test_what_vllm_accepts(fields: dict[str, Any]) -> None:
    assert parse(**fields).fields.items() >= fields.items()


def test_the_checks_are_vllms_alone() -> None:
    """Other targets take these requests to their own rules (their dialect tables)."""
    for fields, _ in BAD:
        validate_completion({**BASE, **fields}, LIMITS)


# ---------------------------------------------------------------- chat

HELLO = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> Any:
    request = validate_chat({"model": "m", "messages": HELLO, **fields}, LIMITS)
    vllm_checks.check_chat(request.fields)
    return request


CHAT_BAD: list[tuple[dict[str, Any], str]] = [
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"min_tokens": 5, "max_completion_tokens": 4, "max_tokens": 9}, "min_tokens"),
    ({"length_penalty": 0.5}, "length_penalty"),
    ({"logprob_token_ids": [1]}, "logprob_token_ids"),
    ({"logprob_token_ids": list(range(129)), "logprobs": True}, "logprob_token_ids"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"use_beam_search": True, "stream": True}, "use_beam_search"),
    ({"use_beam_search": True, "top_p": 0.5}, "top_p"),
]


@pytest.mark.parametrize(("fields", "param"), CHAT_BAD)
def test_chat_requests_vllm_refuses(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        chat(**fields)
    assert exc.value.param == param


@pytest.mark.parametrize(
    "fields",
    [
        {"min_tokens": 50},  # no bound: the window's room
        {"min_tokens": 4, "max_completion_tokens": 4},
        {"logprob_token_ids": [1, 2], "logprobs": True},
        {"use_beam_search": True, "echo": True, "logprobs": True},
        {"prompt_logprobs": 0, "stream": True},
    ],
)
def test_chat_requests_vllm_serves(fields: dict[str, Any]) -> None:
    chat(**fields)

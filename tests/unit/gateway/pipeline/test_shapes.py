"""Answers in their provider's shape (gateway.pipeline.shapes): OpenAI's leaves out what is not set;
vLLM's server's has each field of its answer, null when not set, and writes the fingerprint on
the chunks that end a choice (or on the usage chunk, when usage was asked for). The e2e parity
suite (tests/e2e/test_vllm_shape.py) holds these against vLLM's own server."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from core.answers import ChatCompletion, Completion, Usage
from core.errors import ConfigError
from gateway.pipeline.shapes import chat_document, completion_document, envelope
from gateway.pipeline.sse import CHAT_CHUNK
from providers.openai_compat.chat_normalize import ChatNormalization, ChatStreamNormalizer
from providers.openai_compat.normalize import Normalization, StreamNormalizer
from providers.openai_compat.settings import parse_settings
from providers.vllm_engine.settings import parse_settings as engine_settings

USAGE: Usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
CHOICE: dict[str, Any] = {"text": "hi", "index": 0, "logprobs": None, "finish_reason": "length"}
ANSWER: Completion = {"choices": [CHOICE], "usage": USAGE, "system_fingerprint": "fp"}  # type: ignore[list-item]


def event(data: bytes) -> dict[str, Any]:
    assert data.startswith(b"data: ") and data.endswith(b"\n\n")
    out: dict[str, Any] = orjson.loads(data[6:-2])
    return out


# ---------------------------------------------------------------- whole answers


def test_openais_shape_leaves_out_what_is_not_set() -> None:
    doc = completion_document(ANSWER, "m", "cmpl-1", 7, "openai")
    assert doc == {
        "id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
        "choices": [CHOICE], "usage": USAGE, "system_fingerprint": "fp",
    }  # fmt: skip


def test_vllms_shape_has_every_field_in_its_order() -> None:
    doc = completion_document(ANSWER, "m", "cmpl-1", 7, "vllm")
    assert list(doc) == [
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
        "usage", "kv_transfer_params", "ec_transfer_params", "metrics",
    ]  # fmt: skip
    assert doc["system_fingerprint"] == "fp" and doc["metrics"] is None
    assert doc["choices"] == [
        {**CHOICE, "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
         "prompt_token_ids": None, "routed_experts": None},
    ]  # fmt: skip
    assert doc["usage"] == {
        **USAGE,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_a_value_set_wins_over_vllms_null() -> None:
    choices: Any = [{**CHOICE, "stop_reason": 13}]
    answer: Completion = {"choices": choices, "usage": USAGE}
    doc = completion_document(answer, "m", "c", 7, "vllm")
    assert doc["choices"][0]["stop_reason"] == 13  # type: ignore[index]
    assert doc["system_fingerprint"] is None


def test_a_vllm_chat_answer() -> None:
    answer: ChatCompletion = {
        "choices": [{
            "index": 0, "finish_reason": "stop", "stop_reason": None,
            "message": {"role": "assistant", "content": "x", "refusal": None, "tool_calls": []},
            "logprobs": {"content": [], "refusal": None},
        }],
        "usage": USAGE,
        "prompt_token_ids": [1, 2],
    }  # fmt: skip
    doc = chat_document(answer, "m", "chatcmpl-1", 7, "vllm")
    assert doc["prompt_token_ids"] == [1, 2] and doc["prompt_text"] is None
    choice: Any = doc["choices"][0]  # type: ignore[index]
    assert choice["message"] == {
        "role": "assistant",
        "content": "x",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }  # an empty tool_calls list is left out, as vLLM's server does
    assert choice["logprobs"] == {"content": []}  # vLLM's have no `refusal`
    assert choice["token_ids"] is None and choice["routed_experts"] is None


# ---------------------------------------------------------------- streams


def test_a_vllm_completion_stream() -> None:
    env = envelope("c", 7, "m", False, "text_completion", "vllm")
    env.fingerprint("fp")
    going = event(env.chunk([{**CHOICE, "finish_reason": None}]))
    assert "usage" not in going and "system_fingerprint" not in going
    assert going["choices"][0] == {
        **CHOICE, "finish_reason": None, "stop_reason": None, "prompt_token_ids": None,
        "token_ids": None,
    }  # fmt: skip
    assert event(env.chunk([CHOICE]))["system_fingerprint"] == "fp"  # it ends a choice


def test_with_usage_asked_the_fingerprint_is_on_the_usage_chunk_only() -> None:
    env = envelope("c", 7, "m", True, "text_completion", "vllm")
    env.fingerprint("fp")
    ending = event(env.chunk([CHOICE]))
    assert "system_fingerprint" not in ending and "usage" not in ending  # no "usage": null
    assert event(env.usage(USAGE)) == {
        "id": "c", "object": "text_completion", "created": 7, "model": "m", "choices": [],
        "usage": USAGE, "system_fingerprint": "fp",
    }  # fmt: skip


def test_a_vllm_chat_stream() -> None:
    env = envelope("c", 7, "m", False, CHAT_CHUNK, "vllm")
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}  # fmt: skip
    first = event(env.chunk([role], None, [1, 2]))
    assert first["choices"] == [role]
    assert (first["prompt_token_ids"], first["prompt_text"]) == ([1, 2], None)
    text = {"index": 0, "delta": {"content": "a"}, "logprobs": None, "finish_reason": None}
    assert event(env.chunk([text]))["choices"][0] == {**text, "token_ids": None}
    last = event(env.chunk([{**text, "finish_reason": "stop"}], USAGE))
    assert last["choices"][0] == {**text, "finish_reason": "stop", "token_ids": None,
                                  "stop_reason": None}  # fmt: skip
    assert last["usage"] == {**USAGE, "completion_tokens_details": None}  # a chat's running one


# ---------------------------------------------------------------- the server's fingerprint


def test_the_chunks_that_end_a_choice_wait_for_the_fingerprint() -> None:
    """The gateway asks vLLM's server for usage, which then writes the fingerprint on the usage
    chunk only: for a caller who did not ask, the ending chunks wait for it."""
    feed = StreamNormalizer(Normalization("t", False, keep_empty=True, await_fingerprint=True))
    going = feed.feed({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
    assert going and "system_fingerprint" not in going[0]  # an empty delta kept, at once
    assert feed.feed({"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}) == []
    released = feed.feed({"choices": [], "usage": USAGE, "system_fingerprint": "fp"})
    assert [c["system_fingerprint"] for c in released] == ["fp"]
    assert released[0]["choices"][0]["text"] == "b"
    assert feed.end() == [{"choices": [], "usage": USAGE}]  # type: ignore[comparison-overlap]


def test_a_chat_stream_without_a_fingerprint_ends_with_what_waited() -> None:
    feed = ChatStreamNormalizer(ChatNormalization("t", False, await_fingerprint=True))
    ending = {"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}
    assert feed.feed({"choices": [ending]}) == []
    out = feed.end()
    assert out[0]["choices"][0]["delta"] == {"content": "b"}


# ---------------------------------------------------------------- the setting


def test_vllm_paths_answer_in_vllms_shape_unless_told_otherwise() -> None:
    assert engine_settings({"model": "m"}, "p").answer_shape == "vllm"
    assert engine_settings({"model": "m", "answer_shape": "openai"}, "p").answer_shape == "openai"
    server = {"base_url": "http://h/v1"}
    assert parse_settings(server, "p", ("vllm", "openai")).answer_shape == "vllm"
    assert parse_settings(server, "p").answer_shape == "openai"  # OpenAI and the others


@pytest.mark.parametrize(
    ("shapes", "value", "says"),
    [((), "vllm", "openai shape only"), (("vllm", "openai"), "fireworks", "expected one of")],
)
def test_a_shape_a_type_cannot_take_is_refused(
    shapes: tuple[str, ...], value: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        parse_settings({"base_url": "http://h/v1", "answer_shape": value}, "providers.p",
                       shapes or ("openai",))  # type: ignore[arg-type]  # fmt: skip
    assert refused.value.path == "providers.p.answer_shape"

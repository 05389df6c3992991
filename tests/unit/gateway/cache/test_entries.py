"""An entry's encoding: what was put is what a hit decodes, each hit a copy of its own; bytes
that are not an entry of this version are a miss."""

from __future__ import annotations

import orjson

from gateway.cache.entries import Entry, decode

ANSWER = {"choices": [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip


def test_an_entry_decodes_as_it_was_put() -> None:
    entry = Entry(12.5, "up", "gpt", "vllm", ["top_k"], ANSWER, [{"choices": []}])
    assert decode(entry.encode()) == entry


def test_each_decode_is_its_own_copy() -> None:
    data = Entry(1.0, "up", "gpt", "openai", (), ANSWER, None).encode()
    first, second = decode(data), decode(data)
    assert first is not None and second is not None
    first.answer["choices"][0]["text"] = "changed"
    assert second.answer["choices"][0]["text"] == "hi"


def test_what_is_not_an_entry_is_a_miss() -> None:
    assert decode(b"not json") is None
    assert decode(orjson.dumps([2, 1.0, "up", "m", "openai", [], ANSWER, None])) is None
    assert decode(orjson.dumps({"answer": ANSWER})) is None
    assert decode(orjson.dumps([1, 1.0, "up", "m", "openai", [], [], None])) is None
    assert decode(orjson.dumps([1, 1.0, "up", "m", "other", [], ANSWER, None])) is None
    assert decode(orjson.dumps([1, 1.0, 7, "m", "openai", [], ANSWER, None])) is None
    assert decode(orjson.dumps([1, 1.0, "up", "m", "openai", [], ANSWER])) is None

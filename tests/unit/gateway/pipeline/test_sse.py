"""SSE rendering of canonical chunks (gateway.pipeline.sse.Envelope)."""

from __future__ import annotations

import orjson

from core.answers import Usage
from gateway.pipeline.sse import Envelope

CHOICES = [{"text": "a", "index": 0, "logprobs": None, "finish_reason": None}]
USAGE: Usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def event(data: bytes) -> dict[str, object]:
    assert data.startswith(b"data: ") and data.endswith(b"\n\n")
    return orjson.loads(data[6:-2])  # type: ignore[no-any-return]


def test_content_chunk_usage_null_only_when_usage_was_asked_for() -> None:
    assert "usage" not in event(Envelope("c", 1, "m", include_usage=False).chunk(CHOICES))
    assert event(Envelope("c", 1, "m", include_usage=True).chunk(CHOICES))["usage"] is None


def test_content_chunk_with_its_choice_usage() -> None:
    """vLLM's continuous usage: the chunk's usage instead of null."""
    env = Envelope("c", 1, "m", include_usage=True)
    assert event(env.chunk(CHOICES, USAGE)) == {
        "id": "c",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": CHOICES,
        "usage": USAGE,
    }
    env.fingerprint("fp")
    assert event(env.chunk(CHOICES, USAGE))["system_fingerprint"] == "fp"
    assert event(env.usage(USAGE)) == {**event(env.chunk([], USAGE)), "choices": []}

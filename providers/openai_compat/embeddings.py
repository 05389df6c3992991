"""Embeddings through OpenAI-compatible upstreams: each dialect's parameter table for
CreateEmbeddingRequest, and the upstream's answer in the canonical form (core/responses.py).

`encoding_format` goes upstream where the upstream is known to send OpenAI's base64 (OpenAI,
vLLM's server, whose default is float32 in the machine's byte order: little-endian on every
platform it runs on); elsewhere the gateway asks for floats and encodes them itself. Either way
the caller gets what it asked for: an answer in the other form is converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from core.embeddings import VLLM_FIELDS, decode, encode
from core.responses import Embeddings, EmbeddingUsage
from providers.params import EMULATE, UNKNOWN, Action, FieldRule, derive, passes

from .errors import bad_answer

OPENAI: Mapping[str, FieldRule] = MappingProxyType(
    {
        "model": passes(),
        "input": passes(),
        "encoding_format": passes(),
        "dimensions": passes(1),
        "user": passes(),
        **{name: FieldRule(Action.REJECT, note="a vLLM extra") for name in VLLM_FIELDS},
        UNKNOWN: FieldRule(Action.REJECT, note="unknown to OpenAI's embeddings API"),
    }
)
VLLM_PASS = {name: passes() for name in (*VLLM_FIELDS, UNKNOWN)}
RULES: Mapping[str, Mapping[str, FieldRule]] = MappingProxyType(
    {
        "openai": OPENAI,
        # Fireworks documents floats only: the gateway encodes base64 itself.
        "fireworks": derive(
            OPENAI,
            encoding_format=EMULATE,
            **{
                UNKNOWN: FieldRule(
                    Action.REJECT, note="Fireworks' embeddings API has no such field"
                )
            },
        ),
        # vLLM's own extras (truncate_prompt_tokens, add_special_tokens, …) pass.
        "vllm-server": derive(OPENAI, **VLLM_PASS),
        "openai-compatible": derive(OPENAI, encoding_format=EMULATE, **VLLM_PASS),
    }
)


def answer(body: Mapping[str, Any], count: int, encoding: str, label: str) -> Embeddings:
    """The canonical embeddings of an upstream's CreateEmbeddingResponse: `count` of them, in
    input order, in `encoding` ("float" or "base64")."""
    data = body.get("data")
    if not isinstance(data, list) or len(data) != count:
        raise bad_answer(label, f"an embeddings response without {count} embeddings")
    ordered = sorted(data, key=_index)
    if [_index(item) for item in ordered] != list(range(count)):
        raise bad_answer(label, "embeddings whose indexes are not those of the inputs")
    vectors = [_as(item.get("embedding"), encoding, label) for item in ordered]
    return {"data": vectors, "usage": usage(body.get("usage"))}


def _index(item: Any) -> int:
    index = item.get("index") if isinstance(item, dict) else None
    return index if type(index) is int else -1


def _as(embedding: Any, encoding: str, label: str) -> Any:
    if isinstance(embedding, str):
        if encoding == "base64":
            return embedding
        try:
            return decode(embedding)
        except ValueError:  # not base64, or not whole float32 values
            raise bad_answer(label, "an embedding that is not valid base64 float32") from None
    if isinstance(embedding, list) and _numbers(embedding):
        return encode(embedding) if encoding == "base64" else embedding
    raise bad_answer(label, "an embedding that is neither a list of numbers nor base64")


def _numbers(values: list[Any]) -> bool:
    """Whether every value is a number. `sum` checks in C (anything else raises TypeError): a
    per-value Python loop costs more than parsing the whole batch's JSON."""
    try:
        sum(values)
    except TypeError:
        return False
    return True


def usage(raw: Any) -> EmbeddingUsage:
    """OpenAI's embeddings usage: prompt tokens, and a total that equals them."""
    prompt = raw.get("prompt_tokens") if isinstance(raw, dict) else None
    prompt = prompt if type(prompt) is int and prompt >= 0 else 0
    return {"prompt_tokens": prompt, "total_tokens": prompt}

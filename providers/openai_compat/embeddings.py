"""Embeddings through OpenAI-compatible upstreams: each dialect's parameter table for
CreateEmbeddingRequest, and the upstream's answer in the canonical form (core/answers.py).

`encoding_format` goes upstream where the upstream is known to send OpenAI's base64 (OpenAI,
Azure, vLLM's server, whose default is float32 in the machine's byte order: little-endian on
every platform it runs on); elsewhere the gateway asks for floats and encodes them itself.
Either way the caller gets what it asked for: an answer in the other form is converted.

Floats asked for and answered are relayed as the upstream wrote them (`Arrays`): each
embedding's array is checked to hold numbers only and goes into the caller's answer as its
bytes, and only the rest of the answer is parsed. Parsing the ~25,000 numbers of a 16-input
answer and writing them again cost three times what relaying its bytes does
(`make bench`, embeddings-float).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson

from core.answers import Embeddings, EmbeddingUsage
from core.embeddings import VLLM_FIELDS, decode, encode
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, derive, passes
from providers.transport.errors import bad_answer

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
        "azure-openai": OPENAI,  # its embeddings API is OpenAI's, base64 included
    }
)


# What an array of numbers is written with in JSON: an array holding anything else is parsed.
NUMERIC = b"0123456789.eE+-, \t\r\n"
BRACKETED = NUMERIC + b"[]"  # the same, checked with the array's own brackets


class Arrays:
    """An answer's arrays of numbers, each cut out of its bytes and replaced by a number of
    its own (`skeleton`), so that parsing the rest leaves the numbers unread. The stand-ins
    are this answer's random 62-bit base plus the array's rank: no upstream's embedding is a
    bare number, let alone one of those. An array inside a string is cut out too, which keeps
    the string JSON but changes it: only the embeddings of a skeleton are used."""

    __slots__ = ("_arrays", "_base", "skeleton")

    def __init__(self, raw: bytes) -> None:
        self._base = secrets.randbits(61) + (1 << 61)
        spans = _numeric_arrays(raw)
        parts: list[bytes] = []
        at = 0
        for rank, (start, array) in enumerate(spans):
            parts += (raw[at:start], b"%d" % (self._base + rank))
            at = start + len(array)
        self.skeleton = b"".join([*parts, raw[at:]]) if spans else raw
        self._arrays = [array for _, array in spans]

    def fragment(self, value: Any) -> orjson.Fragment | None:
        """The array `value` stands in for, as its bytes; None if it stands for none."""
        rank = value - self._base if type(value) is int else -1
        if not 0 <= rank < len(self._arrays):
            return None
        return orjson.Fragment(self._arrays[rank])


def _numeric_arrays(raw: bytes) -> list[tuple[int, bytes]]:
    """The arrays holding only numbers: where each begins, and its bytes from `[` to `]` (the
    copy that was checked is the one relayed: one copy of the numbers, not two)."""
    arrays: list[tuple[int, bytes]] = []
    find = raw.find
    at = find(b"[")
    while at != -1:
        end = find(b"]", at + 1)
        if end == -1:
            break
        inner = find(b"[", at + 1, end)
        if inner != -1:  # an array in this one: it holds more than numbers
            at = inner
            continue
        array = raw[at : end + 1]  # no other bracket inside: the first `]` after the only `[`
        if not array.translate(None, BRACKETED):
            arrays.append((at, array))
        at = find(b"[", end + 1)
    return arrays


def answer(
    body: Mapping[str, Any], count: int, encoding: str, label: str, arrays: Arrays | None = None
) -> Embeddings:
    """The canonical embeddings of an upstream's CreateEmbeddingResponse: `count` of them, in
    input order, in `encoding` ("float" or "base64"). With `arrays`, `body` is their skeleton:
    an embedding that stands for one of them is relayed as its bytes."""
    data = body.get("data")
    if not isinstance(data, list) or len(data) != count:
        raise bad_answer(label, f"an embeddings response without {count} embeddings")
    ordered = sorted(data, key=_index)
    if [_index(item) for item in ordered] != list(range(count)):
        raise bad_answer(label, "embeddings whose indexes are not those of the inputs")
    vectors = [_as(item.get("embedding"), encoding, label, arrays) for item in ordered]
    return {"data": vectors, "usage": usage(body.get("usage"))}


def _index(item: Any) -> int:
    index = item.get("index") if isinstance(item, dict) else None
    return index if type(index) is int else -1


def _as(embedding: Any, encoding: str, label: str, arrays: Arrays | None) -> Any:
    relayed = arrays.fragment(embedding) if arrays is not None else None
    if relayed is not None:
        return relayed
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

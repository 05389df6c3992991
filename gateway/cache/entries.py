"""A cache entry: one complete answer as the gateway's canonical answer, the stream it was
first written as (when it was), and what the target that made it said about it, encoded as one
JSON document. Backends keep the bytes, never the objects: every hit decodes its own copy, so
no request can change what another is served."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from core.provider import AnswerShape

VERSION = 1  # an entry of another version is a miss (written by another release)


class Entry(NamedTuple):  # a tuple: made per hit, in a fraction of a dataclass's time
    stored_at: float  # Unix time: a hit's `age`
    provider: str  # the target that answered: its provider and model
    model: str
    shape: AnswerShape  # the answer's shape (vLLM's server's, or OpenAI's)
    dropped: Sequence[str]  # the parameters the target dropped (x-gateway-dropped-params)
    answer: Mapping[str, Any]  # the canonical answer, as its endpoint's JSON answer holds it
    # The canonical stream chunks (a Responses stream's events) as the target first streamed
    # them; None: it was first answered whole.
    chunks: Sequence[Mapping[str, Any]] | None

    def encode(self) -> bytes:
        return orjson.dumps([VERSION, *self])


FIELDS = len(Entry._fields)
SHAPES = ("openai", "vllm")


def decode(data: bytes) -> Entry | None:
    """The entry, or None when it is not one of this version's (or not one at all)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not list or len(doc) != FIELDS + 1 or doc[0] != VERSION:
        return None
    entry = Entry._make(doc[1:])
    if not (type(entry.provider) is type(entry.model) is str and entry.shape in SHAPES
            and type(entry.answer) is dict and type(entry.dropped) is list
            and type(entry.stored_at) in (int, float)):  # fmt: skip
        return None
    return entry

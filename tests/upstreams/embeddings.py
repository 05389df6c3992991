"""`POST …/embeddings` of the scripted upstreams: OpenAI's CreateEmbeddingRequest/Response over a
deterministic fake model.

* A vector is a function of the input (text or token ids) and the model: unit length, 16
  dimensions, or `dimensions` of them (the vector shortened and normalized again, as OpenAI's
  text-embedding-3 models do). `text-embedding-ada-002` refuses `dimensions`, as OpenAI does.
* OpenAI: `encoding_format` float (default) or base64 (little-endian float32). Unknown fields are
  400s (`Unrecognized request argument supplied`).
* Fireworks: floats only; its schema forbids other fields (422, FastAPI's shape), so
  `encoding_format` is one of them.
* Usage: the fake tokenizer's count (fakegen), `total_tokens` equal to `prompt_tokens`.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from typing import Any

from tests.upstreams.errors import detail_item, openai_error, validation_error
from tests.upstreams.fakegen import prompt_from_text

NATIVE_DIMENSIONS = 16
FIXED_DIMENSION_MODELS = ("text-embedding-ada-002",)
OPENAI_FIELDS = ("model", "input", "encoding_format", "dimensions", "user")
FIREWORKS_FIELDS = ("model", "input", "dimensions", "user")


def vector(item: str | list[int], model: str, dimensions: int | None) -> list[float]:
    seed = zlib.crc32(f"{model}|{item!r}".encode())
    raw = [math.sin(seed % 9973 + 1.7 * (i + 1)) for i in range(NATIVE_DIMENSIONS)]
    raw = raw[: dimensions or NATIVE_DIMENSIONS]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def tokens(item: str | list[int]) -> int:
    return len(item) if isinstance(item, list) else len(prompt_from_text(item))


def inputs(body: dict[str, Any]) -> list[Any]:
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and type(raw[0]) is int):
        return [raw]
    if isinstance(raw, list) and raw:
        return raw
    raise openai_error(400, "'input' must be a non-empty string or array.", param="input")


def check(dialect: str, body: dict[str, Any]) -> None:
    known = FIREWORKS_FIELDS if dialect == "fireworks" else OPENAI_FIELDS
    extra = [name for name in body if name not in known]
    if extra and dialect == "fireworks":
        raise validation_error(
            [
                detail_item(name, "Extra inputs are not permitted", "extra_forbidden")
                for name in extra
            ]
        )
    if extra:
        raise openai_error(400, f"Unrecognized request argument supplied: {extra[0]}")
    model = body.get("model")
    if body.get("dimensions") is not None and model in FIXED_DIMENSION_MODELS:
        raise openai_error(
            400, "This model does not support specifying dimensions.", param="dimensions"
        )


def answer(dialect: str, body: dict[str, Any]) -> dict[str, Any]:
    """The upstream's whole answer to a valid request; an UpstreamError otherwise."""
    check(dialect, body)
    items = inputs(body)
    model = str(body.get("model"))
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for i, item in enumerate(items):
        values = vector(item, model, body.get("dimensions"))
        embedding: Any = values
        if as_base64:
            embedding = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    used = sum(tokens(item) for item in items)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": used, "total_tokens": used},
    }

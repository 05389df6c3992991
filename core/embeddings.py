"""`POST /v1/embeddings`: OpenAI's CreateEmbeddingRequest, checked as OpenAI checks it, and the
CreateEmbeddingResponse the gateway renders.

`input` is a string, an array of strings, an array of token ids or an array of token-id arrays:
never empty, no empty string, at most 2048 items. `encoding_format` is `float` (the default) or
`base64`: the embedding's float32 values, little-endian, base64-encoded, as OpenAI sends them (the
openai SDK asks for base64 unless told otherwise, and decodes it).
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core.answers import EmbeddingUsage
from core.checks import INT64_MAX, INT64_MIN, bad, batch
from core.errors import InvalidRequest
from core.fields import VLLM, Declaration, boolean, choice, integer, string, structured
from core.wire import Json, validated

MAX_INPUTS = 2048  # OpenAI: "any array must be 2048 dimensions or less"
ENCODINGS = ("float", "base64")


@dataclass(slots=True)
class EmbeddingRequest:
    model: str
    inputs: list[str] | list[list[int]]  # always a batch: one element for a single input
    input_is_tokens: bool
    encoding_format: str  # effective: "float" when absent
    fields: dict[str, Any]  # every non-null field as sent (validated), unknown ones included
    unknown: tuple[str, ...] = field(default=())

    @property
    def dimensions(self) -> int | None:
        value = self.fields.get("dimensions")
        return value if type(value) is int else None


def _input(v: Any, name: str) -> Any:
    if type(v) is str:
        if not v:
            raise bad(name, "a non-empty string", v)
        return v
    if type(v) is not list or not v:
        raise bad(name, "a string or a non-empty array of strings or token ids", v)
    if len(v) > MAX_INPUTS:
        raise InvalidRequest(
            f"'{name}' has {len(v)} items; at most {MAX_INPUTS} are allowed.", param=name
        )
    batch(v, name, empty_strings=False)
    return v


EMBEDDINGS = Declaration(
    "CreateEmbeddingRequest",
    required=("model", "input"),
    fields=(
        string("model"),
        structured("input", ("string", "array"), _input),
        choice("encoding_format", *ENCODINGS, default="float"),
        integer("dimensions", 1),
        string("user"),
        # vLLM's own extras (its EmbeddingCompletionRequest), checked as vLLM checks them;
        # upstreams that are not vLLM refuse them (their dialect rows).
        integer("truncate_prompt_tokens", -1, family=VLLM),
        choice("truncation_side", "left", "right", family=VLLM),
        boolean("add_special_tokens", family=VLLM),
        boolean("use_activation", family=VLLM),
        integer("priority", INT64_MIN, INT64_MAX, family=VLLM),
    ),
)


FIELDS = EMBEDDINGS.names()
VLLM_FIELDS = EMBEDDINGS.names(VLLM)


def parse_embedding(body: bytes) -> EmbeddingRequest:
    return validated(body, validate_embedding)


def validate_embedding(data: Mapping[str, Any]) -> EmbeddingRequest:
    fields, unknown = EMBEDDINGS.validate(data)
    raw = fields["input"]
    is_tokens = type(raw) is list and type(raw[0]) is not str
    single = type(raw) is str or (is_tokens and type(raw[0]) is int)
    return EmbeddingRequest(
        model=fields["model"],
        inputs=[raw] if single else raw,
        input_is_tokens=is_tokens,
        encoding_format=fields.get("encoding_format", "float"),
        fields=fields,
        unknown=unknown,
    )


def embedding_defaults(req: EmbeddingRequest, defaults: Mapping[str, Any]) -> EmbeddingRequest:
    """Model-level defaults fill only the fields the caller did not set."""
    missing = {k: v for k, v in defaults.items() if k not in req.fields}
    if not missing:
        return req
    fields = missing | req.fields
    return replace(req, fields=fields, encoding_format=fields.get("encoding_format", "float"))


# ---------------------------------------------------------------- the response


def encode(vector: Sequence[float]) -> str:
    """OpenAI's base64 form: float32 values, little-endian."""
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def decode(text: str) -> list[float]:
    """The floats of OpenAI's base64 form."""
    packed = array("f")
    packed.frombytes(base64.b64decode(text, validate=True))
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def document(vectors: Sequence[object], usage: EmbeddingUsage, model: str) -> Json:
    """CreateEmbeddingResponse: one `embedding` per input, in input order."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": usage,
    }

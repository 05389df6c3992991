"""Embeddings on the in-process engine: a pooling model (vLLM's pooling runner, e.g.
`engine_args: {runner: pooling, convert: embed}`, or a model vLLM pools by itself), served as
vLLM's server serves /v1/embeddings.

Each input is rendered by the engine's renderer (special tokens and truncation as asked), checked
against the window, and pooled by its own engine request; the vectors come back in input order,
and usage is the inputs' tokens. `dimensions` works on Matryoshka models only (vLLM's own check,
`PoolingParams.verify`), else it is a 400. Base64 is encoded by the gateway from the float32
values, as vLLM's server does by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from core.answers import Embeddings
from core.embeddings import VLLM_FIELDS, EmbeddingRequest, encode
from core.errors import ContextLengthExceeded, InvalidRequest, ServiceUnavailable, UpstreamError
from providers.rules.params import EMULATE, UNKNOWN, Action, FieldRule, passes
from providers.vllm_engine import submit

if TYPE_CHECKING:
    from vllm import PoolingParams
    from vllm.config import ModelConfig
    from vllm.outputs import PoolingRequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM

TASK: Final = "embed"

RULES: Mapping[str, FieldRule] = MappingProxyType(
    {
        "model": passes(),
        "input": passes(),
        "encoding_format": EMULATE,  # the gateway encodes base64 from the engine's floats
        "dimensions": passes(1),  # Matryoshka models only: `verified`
        "user": passes(),  # accepted and unused, as by vLLM's server
        **{name: passes() for name in VLLM_FIELDS},
        UNKNOWN: FieldRule(Action.REJECT, note="not supported by the in-process vLLM engine"),
    }
)


@dataclass(frozen=True, slots=True)
class EngineEmbedding:
    """An embeddings request mapped for the engine: `Prepared.state`."""

    body: Mapping[str, Any]  # the fields the engine serves
    encoding: str  # "float" | "base64"
    request: EmbeddingRequest  # as validated: its inputs


def verified(body: Mapping[str, Any], config: ModelConfig) -> PoolingParams:
    """The request's PoolingParams, checked by vLLM against the model (dimensions a Matryoshka
    model supports); its refusal is a 400 naming the parameter."""
    from vllm import PoolingParams
    from vllm.exceptions import VLLMValidationError

    params = PoolingParams(
        task=TASK, dimensions=body.get("dimensions"), use_activation=body.get("use_activation")
    )
    try:
        params.verify(config)
    except VLLMValidationError as exc:
        param = "dimensions" if body.get("dimensions") is not None else exc.parameter
        raise InvalidRequest(str(exc), param=param) from None
    return params


async def embed(
    llm: AsyncLLM, plan: EngineEmbedding, rid: str, label: str, trace: str = ""
) -> Embeddings:
    """The canonical answer for one request on a pooling engine."""
    req = plan.request
    params = verified(plan.body, llm.model_config)
    if req.input_is_tokens:
        for ids in req.inputs:
            llm.renderer.validate_token_ids(ids, parameter="input")  # type: ignore[arg-type]
    tokenizing = submit.embedding_tokenizing(plan.body, llm)
    inputs = await submit.render(llm, req.inputs, tokenizing)
    check_lengths([len(i["prompt_token_ids"]) for i in inputs], llm.model_config.max_model_len)
    priority = plan.body.get("priority", 0)
    results = await submit.finals(
        [
            llm.encode(
                inp, params, f"{rid}-{i}", priority=priority, trace_headers=submit.traced(trace)
            )
            for i, inp in enumerate(inputs)
        ]
    )
    return document(results, plan.encoding, label)


def check_lengths(lengths: list[int], window: int) -> None:
    """Every input within the model's window, or a 400 with OpenAI's wording naming it."""
    for i, length in enumerate(lengths):
        if length > window:
            where = f" (input {i})" if len(lengths) > 1 else ""
            raise ContextLengthExceeded(
                f"This model's maximum context length is {window} tokens, however you "
                f"requested {length} tokens{where}. Please reduce your input.",
                param="input",
            )


def document(results: list[PoolingRequestOutput], encoding: str, label: str) -> Embeddings:
    vectors: list[Any] = []
    for result in results:
        error = result.error
        if error is not None:
            raise _failed(error.message, error.retryable, label)
        values = result.outputs.data.tolist()
        vectors.append(encode(values) if encoding == "base64" else values)
    tokens = sum(len(r.prompt_token_ids or ()) for r in results)
    return {"data": vectors, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _failed(message: str, retryable: bool, label: str) -> Exception:
    """A request-level error of the engine's (vLLM's server: a retryable one is a 503)."""
    if retryable:
        return ServiceUnavailable(f"{label}: {message}", headers={"retry-after": "1"})
    return UpstreamError(
        f"The vLLM engine of {label} failed: {message}",
        target=label,
        status=500,
        code="engine_error",
    )

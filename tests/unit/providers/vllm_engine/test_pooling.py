"""Embeddings on the in-process engine without an engine: the parameter table, the endpoint a
model can serve, vLLM's own check of `dimensions` against real model configs of the tiny model
(Matryoshka or not), truncation, lengths and the canonical answer."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import pytest

from core.completions import RequestLimits, validate_completion
from core.embeddings import VLLM_FIELDS, decode, validate_embedding
from core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ServiceUnavailable,
    UnsupportedParameter,
    UpstreamError,
)
from core.provider import Target
from providers import registry, tiny_model
from providers.vllm_engine.adapter import VllmEngineProvider
from providers.vllm_engine.pooling import check_lengths, document, verified
from providers.vllm_engine.submit import truncation
from tests.vllm_proc import MODEL_DIR

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("vllm.config")
    from vllm.config import ModelConfig


def engine(tasks: frozenset[str] = frozenset()) -> VllmEngineProvider:
    provider = registry.build("pool", {"type": "vllm", "model": "./m"}, "providers.pool")
    assert isinstance(provider, VllmEngineProvider)
    provider.engine.tasks = tasks
    return provider


def target(policy: str = "reject") -> Target:
    return Target("embed", "pool", "m", 30.0, policy)  # type: ignore[arg-type]


def embedding(**fields: Any) -> Any:
    return validate_embedding({"model": "embed", "input": ["a", "b"], **fields})


# ---------------------------------------------------------------- the table


def test_vllm_extras_pass_and_base64_is_the_gateways() -> None:
    extras = {"truncate_prompt_tokens": 3, "add_special_tokens": False, "use_activation": True}
    req = embedding(encoding_format="base64", dimensions=64, user="u", priority=2, **extras)
    prepared = engine().prepare_embedding(req, target())
    body = prepared.state.body
    assert body == {"dimensions": 64, "user": "u", "priority": 2, **extras}
    assert prepared.state.encoding == "base64" and prepared.dropped == ()
    assert set(VLLM_FIELDS) <= set(body) | {"truncation_side"}


def test_fields_the_engine_does_not_serve_follow_the_policy() -> None:
    req = embedding(embed_dtype="float16")
    with pytest.raises(UnsupportedParameter) as caught:
        engine().prepare_embedding(req, target())
    assert caught.value.param == "embed_dtype"
    assert engine().prepare_embedding(req, target("drop")).dropped == ("embed_dtype",)


def test_each_endpoint_is_refused_by_an_engine_whose_model_cannot_serve_it() -> None:
    with pytest.raises(InvalidRequest) as caught:
        engine(frozenset({"generate"})).prepare_embedding(embedding(), target())
    assert caught.value.param == "model" and "does not serve embeddings" in caught.value.message
    completion = validate_completion({"model": "embed", "prompt": "hi"}, RequestLimits())
    with pytest.raises(InvalidRequest) as caught:
        engine(frozenset({"embed", "token_embed"})).prepare(completion, target())
    assert caught.value.param == "model" and "POST /v1/embeddings" in caught.value.message
    # Until the engine is up, nothing is known: both prepare (the call then waits for it).
    engine().prepare(completion, target())
    engine().prepare_embedding(embedding(), target())


# ---------------------------------------------------------------- dimensions, by vLLM


@dataclass(frozen=True)
class Configs:
    plain: Any
    matryoshka: Any


@pytest.fixture(scope="module")
def configs() -> Configs:
    model = str(tiny_model.build(MODEL_DIR))
    kw: dict[str, Any] = {"runner": "pooling", "convert": "embed", "dtype": "float32"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return Configs(
            ModelConfig(model=model, **kw),
            ModelConfig(model=model, hf_overrides={"matryoshka_dimensions": [32, 64]}, **kw),
        )


def test_dimensions_need_a_matryoshka_model(configs: Configs) -> None:
    assert verified({}, configs.plain).dimensions is None
    with pytest.raises(InvalidRequest) as caught:
        verified({"dimensions": 64}, configs.plain)
    assert caught.value.param == "dimensions" and "Matryoshka" in caught.value.message
    assert verified({"dimensions": 64}, configs.matryoshka).dimensions == 64
    for size in (48, 200):
        with pytest.raises(InvalidRequest) as caught:
            verified({"dimensions": size}, configs.matryoshka)
        assert caught.value.param == "dimensions" and str(size) in caught.value.message


def test_use_activation_reaches_the_pooler(configs: Configs) -> None:
    assert verified({}, configs.plain).use_activation is True  # vLLM's default: normalized
    assert verified({"use_activation": False}, configs.plain).use_activation is False


# ---------------------------------------------------------------- lengths and the answer


def test_truncation_as_vllm_reads_it() -> None:
    assert truncation({}, 512) is None
    assert truncation({"truncate_prompt_tokens": -1}, 512) == 512
    assert truncation({"truncate_prompt_tokens": 512}, 512) == 512
    with pytest.raises(InvalidRequest) as caught:
        truncation({"truncate_prompt_tokens": 513}, 512)
    assert caught.value.param == "truncate_prompt_tokens"


def test_every_input_must_fit_the_window() -> None:
    check_lengths([512, 3], 512)
    with pytest.raises(ContextLengthExceeded) as caught:
        check_lengths([3, 513], 512)
    assert caught.value.param == "input"
    assert "maximum context length is 512 tokens" in caught.value.message
    assert "513 tokens (input 1)" in caught.value.message


@dataclass
class Data:
    values: list[float]

    def tolist(self) -> list[float]:
        return self.values


@dataclass
class Pooled:
    data: Data


@dataclass
class Error:
    message: str
    retryable: bool


@dataclass
class Result:
    outputs: Pooled
    prompt_token_ids: list[int]
    error: Error | None = None


def results(*vectors: list[float]) -> list[Any]:
    return [Result(Pooled(Data(v)), [1] * (i + 2)) for i, v in enumerate(vectors)]


def test_the_answer_in_either_encoding_with_the_inputs_tokens() -> None:
    floats = document(results([0.5, -1.0], [0.25]), "float", "pool/m")
    assert floats == {
        "data": [[0.5, -1.0], [0.25]],
        "usage": {"prompt_tokens": 5, "total_tokens": 5},
    }
    encoded = document(results([0.5, -1.0], [0.25]), "base64", "pool/m")
    assert [decode(v) for v in encoded["data"] if isinstance(v, str)] == [[0.5, -1.0], [0.25]]


@pytest.mark.parametrize(
    ("retryable", "error"), [(True, ServiceUnavailable), (False, UpstreamError)]
)
def test_a_failed_engine_request_is_a_gateway_error(
    retryable: bool, error: type[GatewayError]
) -> None:
    failed = results([1.0])
    failed[0].error = Error("out of blocks", retryable)
    with pytest.raises(error) as caught:
        document(failed, "float", "pool/m")
    assert "pool/m" in caught.value.message

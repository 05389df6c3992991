"""The embeddings request (OpenAI's CreateEmbeddingRequest) and response pieces, and the
`endpoint` of a model alias."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from core.answers import EmbeddingUsage
from core.embeddings import decode, document, encode, validate_embedding
from core.errors import ConfigError, InvalidRequest
from gateway import config
from gateway.auth import Authenticator
from gateway.routing.plans import Router


def parse(**fields: Any) -> Any:
    return validate_embedding({"model": "e", "input": "hi", **fields})


@pytest.mark.parametrize(
    ("given", "inputs", "tokens"),
    [
        ("a b", ["a b"], False),
        (["a", "b"], ["a", "b"], False),
        ([1, 2, 3], [[1, 2, 3]], True),
        ([[1], [2, 3]], [[1], [2, 3]], True),
    ],
    ids=["string", "strings", "token-ids", "token-id-arrays"],
)
def test_the_four_input_forms(given: Any, inputs: Any, tokens: bool) -> None:
    req = parse(input=given)
    assert (req.inputs, req.input_is_tokens) == (inputs, tokens)
    assert req.encoding_format == "float" and req.dimensions is None


def test_fields_as_given() -> None:
    req = parse(encoding_format="base64", dimensions=8, user="u", extra_thing=1)
    assert req.encoding_format == "base64" and req.dimensions == 8
    assert req.unknown == ("extra_thing",)
    assert parse(encoding_format=None).encoding_format == "float"  # null: the default


BAD = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", ""]}, "input[1]"),
    ({"input": ["a", 1]}, "input[1]"),
    ({"input": [1, -2]}, "input[1]"),
    ({"input": [1, "a"]}, "input[1]"),
    ({"input": [[1], []]}, "input[1]"),
    ({"input": [[1], [2, "x"]]}, "input[1][1]"),
    ({"input": [1.5]}, "input[0]"),
    ({"input": {"text": "a"}}, "input"),
    ({"input": ["a"] * 2049}, "input"),
    ({"encoding_format": "bytes"}, "encoding_format"),
    ({"dimensions": 0}, "dimensions"),
    ({"dimensions": "8"}, "dimensions"),
    ({"user": 3}, "user"),
    ({"model": 3}, "model"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_names_the_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        parse(**fields)
    assert exc.value.param == param and exc.value.status == 400


@pytest.mark.parametrize("missing", ["model", "input"])
def test_required(missing: str) -> None:
    body = {"model": "e", "input": "x"}
    del body[missing]
    with pytest.raises(InvalidRequest) as exc:
        validate_embedding(body)
    assert exc.value.param == missing


def test_base64_is_little_endian_float32() -> None:
    values = [0.5, -1.25, 3.0e-8, 1234.5]
    text = encode(values)
    assert base64.b64decode(text) == struct.pack("<4f", *values)
    assert decode(text) == [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]


def test_document() -> None:
    usage: EmbeddingUsage = {"prompt_tokens": 2, "total_tokens": 2}
    assert document([[0.5], "AAAAPw=="], usage, "e") == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5]},
            {"object": "embedding", "index": 1, "embedding": "AAAAPw=="},
        ],
        "model": "e",
        "usage": usage,
    }


# ---------------------------------------------------------------- a model's endpoint

CONFIG = """\
auth:
  keys: [{id: t, key: k}]
providers:
  p: {type: openai, base_url: 'http://p.invalid/v1'}
models:
  text: {targets: [{provider: p}]}
  vectors: {endpoint: embeddings, defaults: {dimensions: 4}, targets: [{provider: p}]}
"""


def test_endpoint_of_an_alias() -> None:
    cfg = config.parse(CONFIG)
    assert (cfg.models["text"].endpoint, cfg.models["vectors"].endpoint) == (
        "completions",
        "embeddings",
    )
    router = Router(cfg)
    who = Authenticator(cfg).authenticate({"authorization": "Bearer k"})
    router.plan(who, "vectors", None, endpoint="embeddings")
    router.plan(who, "text", None)
    for alias, endpoint in (("vectors", "completions"), ("text", "embeddings")):
        with pytest.raises(InvalidRequest) as exc:
            router.plan(who, alias, None, endpoint=endpoint)
        assert exc.value.param == "model" and exc.value.status == 400
        assert f"POST /v1/{'embeddings' if alias == 'vectors' else 'completions'}" in str(
            exc.value.message
        )


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ("endpoint: chat, ", "models.vectors.endpoint"),
        ("defaults: {dimensions: 0}, ", "models.vectors.defaults.dimensions"),
        ("defaults: {temperature: 1}, ", "models.vectors.defaults.temperature"),
    ],
)
def test_endpoint_config_errors(change: str, path: str) -> None:
    text = CONFIG.replace("endpoint: embeddings, defaults: {dimensions: 4}, ", change)
    if "endpoint" not in change:
        text = text.replace("{" + change, "{endpoint: embeddings, " + change)
    with pytest.raises(ConfigError) as exc:
        config.parse(text)
    assert exc.value.path == path


# ---------------------------------------------------------------- OpenAI-compatible upstreams

TAGS = ("openai", "fireworks", "vllm-server", "openai-compatible")


@pytest.mark.parametrize("tag", TAGS)
def test_every_embeddings_field_has_a_row_in_every_dialect(tag: str) -> None:
    from core.embeddings import FIELDS
    from providers.openai_compat.embeddings import RULES
    from providers.rules.params import UNKNOWN

    assert [name for name in (*FIELDS, UNKNOWN) if name not in RULES[tag]] == []


def prepared_body(tag: str, policy: str = "reject", **fields: Any) -> dict[str, Any]:
    import orjson

    from core.provider import Target
    from providers.openai_compat import OpenAICompatProvider

    provider = OpenAICompatProvider.from_config(
        "up", tag, {"type": tag, "base_url": "http://127.0.0.1:9/v1"}, "providers.up"
    )
    target = Target("alias", "up", "emb-x", 30.0, policy)  # type: ignore[arg-type]
    prepared = provider.prepare_embedding(parse(**fields), target)
    body: dict[str, Any] = orjson.loads(prepared.state.payload)
    return body


def test_prepared_bodies() -> None:
    asked: dict[str, Any] = {
        "input": ["a", "b"],
        "encoding_format": "base64",
        "dimensions": 4,
        "user": "u",
    }
    assert prepared_body("openai", **asked) == {**asked, "model": "emb-x"}
    assert prepared_body("vllm-server", **asked, truncate_prompt_tokens=3) == {
        **asked,
        "model": "emb-x",
        "truncate_prompt_tokens": 3,
    }
    # Floats upstream where base64 is not known to be OpenAI's; the gateway encodes.
    for tag in ("fireworks", "openai-compatible"):
        assert "encoding_format" not in prepared_body(tag, **asked)
    with pytest.raises(InvalidRequest) as exc:
        prepared_body("openai", truncate_prompt_tokens=3)
    assert exc.value.param == "truncate_prompt_tokens"
    assert "truncate_prompt_tokens" not in prepared_body(
        "fireworks", "drop", truncate_prompt_tokens=3
    )


def test_upstream_answers_in_the_callers_format() -> None:
    from providers.openai_compat.embeddings import answer

    floats = {"data": [{"index": 1, "embedding": [1.0]}, {"index": 0, "embedding": [0.5, 2]}]}
    out = answer({**floats, "usage": {"prompt_tokens": 3, "total_tokens": 3}}, 2, "float", "t")
    assert out == {"data": [[0.5, 2], [1.0]], "usage": {"prompt_tokens": 3, "total_tokens": 3}}
    encoded = answer(floats, 2, "base64", "t")["data"]
    assert [decode(v) for v in encoded if isinstance(v, str)] == [[0.5, 2.0], [1.0]]
    back = {"data": [{"index": 0, "embedding": encode([0.25, -1.0])}]}
    assert answer(back, 1, "float", "t")["data"] == [[0.25, -1.0]]
    assert answer(back, 1, "float", "t")["usage"] == {"prompt_tokens": 0, "total_tokens": 0}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"data": [{"index": 0, "embedding": [1.0]}]},  # one of two
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": "%%%"}, {"index": 1, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": {"x": 1}}, {"index": 1, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": [1.0, None]}, {"index": 1, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [[1.0], "2"]}]},
    ],
)
def test_bad_upstream_answers_are_upstream_errors(body: dict[str, Any]) -> None:
    from core.errors import UpstreamError
    from providers.openai_compat.embeddings import answer

    with pytest.raises(UpstreamError):
        answer(body, 2, "float", "t")


# ---------------------------------------------------------------- floats relayed as written

RELAYED_BODIES = [
    # in order, OpenAI's own layout
    b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-2,1e-3]},'
    b'{"object":"embedding","index":1,"embedding":[1.25E+2,0]}],"model":"m",'
    b'"usage":{"prompt_tokens":3,"total_tokens":3}}',
    # out of order, pretty-printed, an empty embedding
    b'{\n  "data": [\n    {"index": 1, "embedding": [\n      0.1,\n      0.2\n    ]},\n'
    b'    {"index": 0, "embedding": []}\n  ],\n  "usage": {"prompt_tokens": 2}\n}',
    # one in base64 (decoded), arrays of numbers inside strings (kept as they were)
    b'{"model":"x[1,2]","data":[{"index":0,"embedding":"AACAPwAAAEA="},'
    b'{"index":1,"embedding":[3.5]}],"note":"[7]"}',
]


@pytest.mark.parametrize("raw", RELAYED_BODIES)
def test_floats_relayed_as_written_are_the_floats_parsed(raw: bytes) -> None:
    import orjson

    from providers.openai_compat.embeddings import Arrays, answer

    arrays = Arrays(raw)
    relayed = answer(orjson.loads(arrays.skeleton), 2, "float", "t", arrays)
    parsed = answer(orjson.loads(raw), 2, "float", "t")
    assert relayed["usage"] == parsed["usage"]
    as_sent = orjson.dumps(document(relayed["data"], relayed["usage"], "e"))
    assert orjson.loads(as_sent) == document(parsed["data"], parsed["usage"], "e")
    assert any(isinstance(v, orjson.Fragment) for v in relayed["data"])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"data":[{"index":0,"embedding":[NaN]},{"index":1,"embedding":[1]}]}',
        b'{"data":[{"index":0,"embedding":[1,null]},{"index":1,"embedding":[1]}]}',
        b'{"data":[{"index":0,"embedding":[[1],"2"]},{"index":1,"embedding":[1]}]}',
        b'{"data":[{"index":0,"embedding":[1]}]}',  # one of two
        b'{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}]}',
        b'{"data":[{"index":0,"embedding":3},{"index":1,"embedding":[2]}]}',  # a bare number
    ],
)
def test_answers_not_relayed_are_refused_as_before(raw: bytes) -> None:
    import orjson

    from core.errors import UpstreamError
    from providers.openai_compat.embeddings import Arrays, answer

    arrays = Arrays(raw)
    with pytest.raises((UpstreamError, orjson.JSONDecodeError)):
        answer(orjson.loads(arrays.skeleton), 2, "float", "t", arrays)


def test_only_arrays_of_numbers_are_cut_out() -> None:
    from providers.openai_compat.embeddings import Arrays

    raw = b'{"a":[1,[2,3]],"b":["x"],"c":[4, 5],"d":[{"e":[6]}],"f":"[7"}'
    skeleton = Arrays(raw).skeleton
    assert b"[2,3]" not in skeleton and b"[4, 5]" not in skeleton and b"[6]" not in skeleton
    assert b'["x"]' in skeleton and b'"[7"' in skeleton and b'"a":[1,' in skeleton

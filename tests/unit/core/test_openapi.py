"""The OpenAPI document (core.openapi): a valid OpenAPI 3.1 document; every route the gateway
serves documented, and nothing else; and held to validation: each declaration's fields with their
types, ranges, options and families, and values generated from each property's schema (inside
and just outside its range, of its types and of the others) accepted by `Declaration.validate`
exactly when the schema accepts them (jsonschema judging), as are the Files and Batch API's
requests by their parsers. The answers the gateway renders are checked against theirs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_spec
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from core import batches, files
from core.answers import EmbeddingUsage, Usage
from core.chat import CHAT
from core.completions import COMPLETIONS
from core.embeddings import EMBEDDINGS
from core.embeddings import document as embeddings_document
from core.errors import InvalidRequest
from core.fields import Declaration, Field
from core.openapi import build, document_json, error_tree
from core.responses import RESPONSES
from gateway.api.app import EXACT, PREFIXED
from gateway.config.portkey import HEADERS as PORTKEY_HEADERS
from gateway.jobs.filestore import file_object
from gateway.pipeline.sse import Envelope

DOC = build()
SCHEMAS: dict[str, Any] = DOC["components"]["schemas"]
BASE_URI = "urn:openapi"
REGISTRY: Registry[Any] = Registry().with_resource(
    BASE_URI, Resource.from_contents(DOC, default_specification=DRAFT202012)
)
OPERATIONS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def judge(name: str) -> Draft202012Validator:
    """A validator for the document's schema `name`, its references resolved in the document."""
    ref = {"$ref": f"{BASE_URI}#/components/schemas/{name}"}
    return Draft202012Validator(ref, registry=REGISTRY)


def methods(item: Mapping[str, Any]) -> set[str]:
    return {m.upper() for m in item if m in OPERATIONS}


# ---------------------------------------------------------------- a valid document


def test_a_valid_openapi_3_1_document() -> None:
    assert DOC["openapi"].startswith("3.1.")
    validate_spec(DOC)
    for schema in SCHEMAS.values():
        Draft202012Validator.check_schema(schema)


def test_served_bytes_are_the_document_built_once() -> None:
    assert orjson.loads(document_json()) == DOC
    assert document_json() is document_json()


# ---------------------------------------------------------------- routes ⇔ paths


def test_every_route_is_documented_and_every_path_is_a_route() -> None:
    """A route added to gateway.api.app without its document (or the reverse) fails here. HEAD is
    served with every GET and not documented apart."""
    paths: dict[str, Any] = DOC["paths"]
    for path, (_, served) in EXACT.items():
        assert path in paths, f"{path} is served but not documented"
        assert methods(paths[path]) == set(served) - {"HEAD"}, path
    for prefix, (_, served) in PREFIXED.items():
        under = [p for p in paths if p.startswith(prefix)]
        assert under, f"{prefix}… is served but not documented"
        assert all("{" in p for p in under), under
        documented = set().union(*(methods(paths[p]) for p in under))
        assert documented == set(served) - {"HEAD"}, prefix
    for path in paths:
        assert path in EXACT or any(path.startswith(p) for p in PREFIXED), f"{path}: no route"


def test_each_endpoint_takes_its_declaration() -> None:
    taken = {
        "/v1/completions": COMPLETIONS,
        "/completions": COMPLETIONS,
        "/v1/chat/completions": CHAT,
        "/chat/completions": CHAT,
        "/v1/embeddings": EMBEDDINGS,
        "/embeddings": EMBEDDINGS,
    }
    for path, decl in taken.items():
        body = DOC["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{decl.name}"}


# ---------------------------------------------------------------- auth and errors


def test_auth_schemes_and_portkey_headers() -> None:
    schemes = DOC["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    for name, header in (
        ("portkeyApiKey", "x-portkey-api-key"),
        ("portkeyVirtualKey", "x-portkey-virtual-key"),
    ):
        assert (schemes[name]["type"], schemes[name]["in"], schemes[name]["name"]) == (
            "apiKey",
            "header",
            header,
        )
    params = DOC["components"]["parameters"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
        op = DOC["paths"][path]["post"]
        assert {"bearerAuth": [], "portkeyVirtualKey": []} in op["security"]
        headers = {params[p["$ref"].rsplit("/", 1)[1]]["name"] for p in op["parameters"]}
        assert set(PORTKEY_HEADERS) <= headers  # x-portkey-config, x-portkey-request-timeout
    for path in ("/livez", "/readyz", "/metrics", "/openapi.json"):
        assert DOC["paths"][path]["get"]["security"] == []
    assert DOC["paths"]["/v1/files"]["get"]["security"] == DOC["security"]


def test_every_error_has_the_documented_shape_and_status() -> None:
    error = judge("Error")
    responses = DOC["components"]["responses"]
    tree = list(error_tree())
    assert len(tree) == len(set(tree)) > 15
    for cls in tree:
        err = cls("wrong", param="x")
        error.validate(orjson.loads(orjson.dumps(err.body())))
        listed = responses["ClientError" if err.status < 500 else "ServerError"]["description"]
        assert f"{err.status}: " in listed and f"`{cls.type}`" in listed, cls.__name__
    for path, item in DOC["paths"].items():
        for method in methods(item):
            assert {"4XX", "5XX"} <= item[method.lower()]["responses"].keys(), (path, method)


# ---------------------------------------------------------------- declarations ⇔ schemas

DECLARATIONS = (COMPLETIONS, CHAT, EMBEDDINGS, RESPONSES)
# A body with valid required fields, to which one field at a time is added.
BASES: dict[str, dict[str, Any]] = {
    COMPLETIONS.name: {"model": "m", "prompt": "hi"},
    CHAT.name: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    EMBEDDINGS.name: {"model": "m", "input": "hi"},
    RESPONSES.name: {"model": "m", "input": "hi"},
}


def _kinds(schema: Mapping[str, Any]) -> list[str]:
    kind = schema["type"]
    return [kind] if isinstance(kind, str) else list(kind)


@pytest.mark.parametrize("decl", DECLARATIONS, ids=lambda d: d.name)
def test_every_field_is_documented_with_its_type_range_and_options(decl: Declaration) -> None:
    schema = SCHEMAS[decl.name]
    assert list(schema["properties"]) == list(decl.names())
    assert schema["required"] == list(decl.required)

    def check(f: Field, prop: Mapping[str, Any], required: bool) -> None:
        null = [] if required else ["null"]
        assert _kinds(prop) == [*f.type, *null], f.name
        assert prop["x-family"] == f.family.value, f.name
        assert prop.get("minimum") == (None if f.lo_open else f.lo), f.name
        assert prop.get("exclusiveMinimum") == (f.lo if f.lo_open else None), f.name
        assert prop.get("maximum") == f.hi, f.name
        nullable = [] if required else [None]
        assert prop.get("enum") == ([*f.options, *nullable] if f.options else None), f.name
        assert prop.get("default") == f.default, f.name
        assert list(prop.get("properties", {})) == [p.name for p in f.parts], f.name
        for part in f.parts:
            check(part, prop["properties"][part.name], required=False)

    for f in decl.fields:
        check(f, schema["properties"][f.name], f.name in decl.required)


# JSON values of each type, for the values of a type a property does not take.
OTHERS: dict[str, Any] = {
    "null": None,
    "boolean": True,
    "integer": 7,
    "number": 2.5,
    "string": "7",
    "array": [1],
    "object": {"a": 1},
}


def samples(prop: Mapping[str, Any]) -> list[Any]:
    """Values generated from a property's schema alone: its bounds and just outside them, its
    options and one that is not, values of its types and of every other JSON type. (An
    integer-valued float like 1.0 is left out: JSON Schema calls it an integer, the body's JSON
    parse gives a float, and the gateway, like OpenAI, wants an integer.)"""
    kinds = _kinds(prop)
    out: list[Any] = [OTHERS[k] for k in OTHERS if k not in kinds or k == "null"]
    if "enum" in prop:
        return [*out, *prop["enum"], "not-an-option", ""]
    lo, hi = prop.get("minimum"), prop.get("maximum")
    above = prop.get("exclusiveMinimum")
    if "integer" in kinds:
        for bound, step in ((lo, -1), (hi, 1)):
            if bound is not None:
                out += [bound, bound + step, bound - step]
        base = lo if lo is not None else (hi if hi is not None else 0)
        half = base + 0.5  # not an integer: unless the base is too large for a float to tell
        out += [base + 10**6 if hi is None else base, 2.5 if half.is_integer() else half, 0]
    if "number" in kinds:
        for bound, eps in ((lo, -0.001), (hi, 0.001)):
            if bound is not None:
                out += [bound, bound + eps, bound - eps, int(bound)]
        if above is not None:
            out += [above, above + 1e-6, above - 1e-6, above + 1]
        out += [0, 0.5, -3.25, 1e300, -1e300]
    if "boolean" in kinds:
        out += [True, False, 0, "true"]
    if "string" in kinds:
        out += ["", "text"]
    if "array" in kinds:
        out += [[], ["a"], [1, 2], [[1]]]
    if "object" in kinds:
        out += [{}, {"k": "v"}]
        for key, part in prop.get("properties", {}).items():
            out += [{key: value} for value in samples(part)]
    return out


def declared(f: Field) -> list[Any]:
    """The other side's values: the declaration's own options and bounds, just inside and
    outside (so that an option or a stretch of range the document left out is tried too)."""
    out: list[Any] = [*f.options]
    step = 1 if f.type == ("integer",) else 0.001
    for bound in (f.lo, f.hi):
        if bound is not None:
            out += [bound, bound - step, bound + step]
    return out


def _accepted(decl: Declaration, body: Mapping[str, Any]) -> bool:
    try:
        decl.validate(body)
    except InvalidRequest:
        return False
    return True


def _in_range(f: Field, value: Any) -> bool:
    """A range each target's table checks (test_rules holds every table to it)."""
    if not f.ranged_by_target or type(value) is not int:
        return True
    return (f.lo is None or value >= f.lo) and (f.hi is None or value <= f.hi)


def _of_its_types(value: Any, kinds: list[str]) -> bool:
    judge_types = Draft202012Validator({"type": kinds})
    return bool(judge_types.is_valid(value))


@pytest.mark.parametrize("decl", DECLARATIONS, ids=lambda d: d.name)
def test_validation_accepts_exactly_what_the_schema_accepts(decl: Declaration) -> None:
    """Each field's values generated from its schema (and from its declaration), one at a time
    on a valid body: validation and the schema agree on each. A structured field (prompt,
    messages, stop, …) is documented by its types only: there, a value of another type is
    refused by both, and whatever validation accepts the schema accepts."""
    schema, base = judge(decl.name), BASES[decl.name]
    assert schema.is_valid(base) and _accepted(decl, base)
    assert schema.is_valid({**base, "an_unknown_field": [1]})
    assert _accepted(decl, {**base, "an_unknown_field": [1]})
    compared = 0
    for f in decl.fields:
        prop = SCHEMAS[decl.name]["properties"][f.name]
        for value in [*samples(prop), *declared(f)]:
            body = {**base, f.name: value}
            documented = schema.is_valid(body)
            accepted = _accepted(decl, body) and _in_range(f, value)
            where = f"{decl.name}.{f.name} = {value!r}"
            if not f.structured:
                assert documented == accepted, (
                    f"{where}: schema {documented}, validation {accepted}"
                )
            elif not _of_its_types(value, _kinds(prop)):
                assert not documented and not accepted, where
            else:
                assert documented or not accepted, f"{where}: validation accepts, schema not"
            compared += 1
    assert compared > 10 * len(decl.fields)


def test_the_sample_ranges_straddle_each_bound() -> None:
    """The generator really goes just outside: a bounded number and integer each give values
    the schema refuses and values it accepts."""
    prop = SCHEMAS[COMPLETIONS.name]["properties"]["temperature"]
    values = [v for v in samples(prop) if type(v) in (int, float)]
    inside = [v for v in values if 0 <= v <= 2]
    assert inside and len(inside) < len(values)
    assert any(math.isclose(v, 2.001) for v in values)


# ---------------------------------------------------------------- files and batches


def test_upload_form_agrees_with_its_schema() -> None:
    schema = judge("CreateFileRequest")
    lo, hi = files.EXPIRES_SECONDS
    forms: list[dict[str, Any]] = [{"purpose": p} for p in (*files.PURPOSES, "nope", "")]
    forms += [
        {"purpose": "batch", "expires_after": {"anchor": a, "seconds": s}}
        for a in (files.EXPIRES_ANCHOR, "uploaded_at")
        for s in (lo - 1, lo, hi, hi + 1)
    ]
    forms.append({})
    for form in forms:
        documented = schema.is_valid({"file": "bytes…", **form})
        fields = {k: v for k, v in form.items() if k != "expires_after"}
        if "expires_after" in form:
            fields["expires_after[anchor]"] = form["expires_after"]["anchor"]
            fields["expires_after[seconds]"] = str(form["expires_after"]["seconds"])
        try:
            files.upload(fields)
            accepted = True
        except InvalidRequest:
            accepted = False
        assert documented == accepted, form


def test_file_listing_query_agrees_with_its_parameters() -> None:
    """A query string carries text: the integers generated for `limit` are sent as digits."""
    listed = {p["name"]: p["schema"] for p in DOC["paths"]["/v1/files"]["get"]["parameters"]}
    limits = [v for v in samples(listed["limit"]) if type(v) is int]
    queries = [("limit", v) for v in limits] + [("order", v) for v in (*files.ORDERS, "up")]
    for name, value in queries:
        documented = Draft202012Validator(listed[name]).is_valid(value)
        try:
            files.list_query({name: str(value)})
            accepted = True
        except InvalidRequest:
            accepted = False
        assert documented == accepted, (name, value)


def test_batch_request_agrees_with_its_schema() -> None:
    schema = judge("CreateBatchRequest")
    ok = {"input_file_id": "file-1", "endpoint": "/v1/completions", "completion_window": "24h"}
    bodies: list[dict[str, Any]] = [ok, {**ok, "unknown": 1}]
    bodies += [{**ok, "endpoint": e} for e in (*batches.ENDPOINTS, "/v1/models", 3)]
    bodies += [{**ok, "completion_window": w} for w in (*batches.WINDOWS, "48h", None)]
    bodies += [{**ok, "input_file_id": v} for v in (7, None, "")]
    bodies += [{k: v for k, v in ok.items() if k != name} for name in ok]
    many = batches.MAX_METADATA_KEYS
    for metadata in (
        None,
        {},
        {str(i): "v" for i in range(many)},
        {str(i): "v" for i in range(many + 1)},
        {"k" * 64: "v" * 512},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"k": 1},
        ["k"],
    ):
        bodies.append({**ok, "metadata": metadata})
    for body in bodies:
        try:
            batches.create_batch(body)
            accepted = True
        except InvalidRequest:
            accepted = False
        assert schema.is_valid(body) == accepted, body


# ---------------------------------------------------------------- answers


def test_answers_the_gateway_renders_match_their_schemas() -> None:
    judge("FileObject").validate(file_object("file-1", 3, "a.jsonl", "batch", 3600))
    judge("FileObject").validate(file_object("file-2", 3, "out.jsonl", files.BATCH_OUTPUT, None))
    usage: EmbeddingUsage = {"prompt_tokens": 2, "total_tokens": 2}
    judge("CreateEmbeddingResponse").validate(
        embeddings_document([[0.5, 1.0], "AAAAPw=="], usage, "m")
    )
    choice = {"text": "a", "index": 0, "logprobs": None, "finish_reason": None}
    delta = {"index": 0, "delta": {"content": "a"}, "logprobs": None, "finish_reason": None}
    totals: Usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    for kind, name, item in (
        ("text_completion", "CreateCompletionChunk", choice),
        ("chat.completion.chunk", "CreateChatCompletionChunk", delta),
    ):
        for include_usage in (False, True):
            envelope = Envelope("cmpl-1", 1, "m", include_usage, kind)
            for event in (envelope.chunk([item]), envelope.usage(totals)):
                assert event.startswith(b"data: ") and event.endswith(b"\n\n")
                judge(name).validate(orjson.loads(event[6:]))
    batch: dict[str, Any] = {
        "id": "batch_1",
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "errors": {
            "object": "list",
            "data": [{"code": "c", "message": "m", "param": None, "line": 1}],
        },
        "input_file_id": "file-1",
        "completion_window": "24h",
        "status": "failed",
        "created_at": 1,
        "expires_at": 2,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": None,
    }
    for key in batches.BatchObject.__annotations__:
        batch.setdefault(key, None)
    judge("BatchObject").validate(batch)
    assert not judge("BatchObject").is_valid({**batch, "status": "unheard_of"})


def test_typeddicts_keep_their_required_and_optional_keys() -> None:
    """NotRequired, Required and total=False survive the conversion (Python 3.11's
    `__required_keys__` misses them under `from __future__ import annotations`)."""
    assert SCHEMAS["Completion"]["required"] == ["choices", "usage"]
    assert SCHEMAS["Choice"]["required"] == ["text", "index", "logprobs", "finish_reason"]
    assert SCHEMAS["ToolCallDelta"]["required"] == ["index"]
    assert SCHEMAS["ChatDelta"]["required"] == []
    assert SCHEMAS["Usage"]["properties"]["prompt_tokens_details"] == {
        "anyOf": [
            {"type": "object", "additionalProperties": {"type": "integer"}},
            {"type": "null"},  # vLLM's shape writes it null
        ]
    }
    assert SCHEMAS["Choice"]["properties"]["logprobs"] == {
        "anyOf": [{"$ref": "#/components/schemas/Logprobs"}, {"type": "null"}]
    }

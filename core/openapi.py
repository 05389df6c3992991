"""`GET /openapi.json`: the OpenAPI 3.1 document of every endpoint the gateway serves, built from
the definitions the gateway runs on, so that what is documented and what is served cannot drift.

* Requests: each endpoint's `Declaration` (`COMPLETIONS`, `CHAT`, `EMBEDDINGS`), field by field
  (`request_schema`): its JSON types, range, options, default and nested keys, its family as
  `x-family` (`openai`, `extension`: the provider extensions, `vllm`: vLLM's extras), the
  required ones, and the rules between fields (`CROSS_CHECKS`) in words. A field that is not
  required may be null: validation takes null as "the default".
* The Files and Batch APIs' requests from their modules' constants (purposes, windows,
  endpoints, statuses, ranges).
* Answers: the TypedDicts of `core.answers`, `core.files` and `core.batches`, converted
  (`type_schema`); what the gateway stamps on them, and the few answers no type defines, are
  declared here by hand and say so.
* Errors: `{"error": {message, type, param, code}}`, its keys those of `GatewayError.body()`, and
  the error tree's statuses and codes listed from its classes.
* Authentication: Bearer, `x-portkey-api-key`, `x-portkey-virtual-key` (inference only), and
  the Portkey routing headers as parameters.

Which paths exist is the gateway's (`gateway.api.app`'s tables); a test holds the two together, and
holds each declaration's schema to its validation.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import orjson

from core import answers as r
from core import batches, files, response_items
from core.chat import CHAT
from core.chat import CROSS_CHECKS as CHAT_RULES
from core.completions import COMPLETIONS, RequestLimits
from core.completions import CROSS_CHECKS as COMPLETION_RULES
from core.embeddings import EMBEDDINGS
from core.errors import GatewayError
from core.fields import Declaration, Field
from core.responses import RESPONSES

OPENAPI = "3.1.0"
REF = "#/components/schemas/"
Schema = dict[str, Any]

# ---------------------------------------------------------------- requests, from declarations


def field_schema(f: Field, required: bool = False) -> Schema:
    """One declared field as a JSON Schema property. Null is "the default" unless required."""
    kinds = [*f.type] if required else [*f.type, "null"]
    schema: Schema = {"type": kinds[0] if len(kinds) == 1 else kinds}
    if f.options:
        schema["enum"] = [*f.options] if required else [*f.options, None]
    if f.lo is not None:
        schema["exclusiveMinimum" if f.lo_open else "minimum"] = f.lo
    if f.hi is not None:
        schema["maximum"] = f.hi
    if f.default is not None:
        schema["default"] = f.default
    if f.parts:
        schema["properties"] = {p.name: field_schema(p) for p in f.parts}
        schema["description"] = "Its known keys are checked (null: left alone); others are kept."
    if f.structured:
        schema["description"] = (
            "Its structure is checked as the API defines it, beyond its JSON type; a bad value "
            "is a 400 whose `param` names the part that is wrong."
        )
    schema["x-family"] = f.family.value
    return schema


def request_schema(decl: Declaration, rules: tuple[str, ...] = ()) -> Schema:
    """A declaration's request body: its fields, its required ones; unknown fields are kept as
    sent, for the serving target's dialect rules to pass, drop or refuse."""
    required = set(decl.required)
    schema: Schema = {
        "type": "object",
        "title": decl.name,
        "required": [*decl.required],
        "properties": {f.name: field_schema(f, f.name in required) for f in decl.fields},
        "additionalProperties": True,
    }
    text = "Unknown fields are kept as sent: the serving target's dialect passes or refuses them."
    if rules:
        text += " Rules between fields: " + " ".join(rules)
    schema["description"] = text
    return schema


def _limits(*names: str) -> str:
    """The gateway's bounds (`RequestLimits`) a request is held to beside its fields' ranges."""
    bounds = ", ".join(
        f"`{b.name}` {b.default}"
        for b in dataclasses.fields(RequestLimits)
        if not names or b.name in names
    )
    return f"The gateway's own bounds apply on top (config `server:`, defaults {bounds})."


# ---------------------------------------------------------------- answers, from TypedDicts

_SIMPLE: Mapping[object, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def type_schema(tp: Any, named: dict[str, Schema]) -> Schema:
    """A Python type of an answer as JSON Schema: str, int, float, bool, None, list[X],
    dict[str, X], Literal, unions, Any, and TypedDicts (registered in `named`, referenced)."""
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if tp is Any or tp is object:
        return {}
    if typing.is_typeddict(tp):
        return typed_dict_schema(tp, named)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Required, typing.NotRequired):
        return type_schema(args[0], named)
    if origin is list:
        return {"type": "array", "items": type_schema(args[0], named)}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1], named)}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        members = [type_schema(a, named) for a in args]
        if all(m.keys() == {"type"} and isinstance(m["type"], str) for m in members):
            return {"type": [m["type"] for m in members]}
        return {"anyOf": members}
    raise TypeError(f"no JSON Schema for {tp!r}")


def typed_dict_schema(td: Any, named: dict[str, Schema]) -> Schema:
    """A TypedDict as an object schema under its own name. Required keys are worked out from
    the annotations (`from __future__ import annotations` hides NotRequired from
    `__required_keys__` before Python 3.12)."""
    name = td.__name__
    if name not in named:
        named[name] = {}  # a placeholder while it is converted (a type may refer to itself)
        hints = typing.get_type_hints(td, include_extras=True)
        required = [k for k, tp in hints.items() if _required(tp, td.__total__)]
        schema: Schema = {
            "type": "object",
            "properties": {k: type_schema(tp, named) for k, tp in hints.items()},
            "required": required,
        }
        if td.__doc__ and not td.__doc__.startswith(name + "("):
            schema["description"] = " ".join(td.__doc__.split())
        named[name] = schema
    return {"$ref": REF + name}


def _required(tp: Any, total: bool) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Required:
        return True
    if origin is typing.NotRequired:
        return False
    return total


def _refine(named: dict[str, Schema], name: str, **properties: Schema) -> None:
    """What a TypedDict states as `str` but the module's constants pin down."""
    named[name]["properties"].update(properties)


def _stamped(named: dict[str, Schema], base: str, kind: str, *, stream: bool = False) -> Schema:
    """A canonical answer as the caller gets it: the gateway stamps `id`, `object`, `created`
    and `model` (the caller's alias) on it (gateway.pipeline's write stage and its SSE: declared
    here by hand). A stream's content chunks carry `"usage": null` when usage was asked for."""
    schema = named[base]
    properties: Schema = {
        "id": {"type": "string"},
        "object": {"const": kind},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        **schema["properties"],
    }
    if stream:
        properties["usage"] = {"anyOf": [{"$ref": REF + "Usage"}, {"type": "null"}]}
    return {
        "type": "object",
        "properties": properties,
        "required": ["id", "object", "created", "model", *schema["required"]],
    }


def _list_of(item: Schema, paged: bool) -> Schema:
    """OpenAI's list shape (hand-declared: the gateway builds it inline)."""
    schema: Schema = {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": item}},
        "required": ["object", "data"],
    }
    if paged:
        for key in ("first_id", "last_id"):
            schema["properties"][key] = {"type": ["string", "null"]}
        schema["properties"]["has_more"] = {"type": "boolean"}
        schema["required"] += ["first_id", "last_id", "has_more"]
    return schema


def answer_schemas() -> dict[str, Schema]:
    named: dict[str, Schema] = {}
    for td in (
        r.Completion,
        r.Chunk,
        r.ChatCompletion,
        r.ChatChunk,
        r.EmbeddingUsage,
        files.FileObject,
        batches.BatchObject,
        batches.LineError,
    ):
        type_schema(td, named)
    named["CreateCompletionResponse"] = _stamped(named, "Completion", "text_completion")
    named["CreateCompletionChunk"] = _stamped(named, "Chunk", "text_completion", stream=True)
    named["CreateChatCompletionResponse"] = _stamped(named, "ChatCompletion", "chat.completion")
    named["CreateChatCompletionChunk"] = _stamped(
        named, "ChatChunk", "chat.completion.chunk", stream=True
    )
    # core.embeddings.document builds the embeddings answer inline: declared here by hand.
    named["Embedding"] = {
        "type": "object",
        "properties": {
            "object": {"const": "embedding"},
            "index": {"type": "integer"},
            "embedding": {
                "description": "floats, or (encoding_format base64) little-endian float32s",
                "anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}],
            },
        },
        "required": ["object", "index", "embedding"],
    }
    embeddings = _list_of({"$ref": REF + "Embedding"}, paged=False)
    embeddings["properties"]["model"] = {"type": "string"}
    embeddings["properties"]["usage"] = {"$ref": REF + "EmbeddingUsage"}
    embeddings["required"] += ["model", "usage"]
    named["CreateEmbeddingResponse"] = embeddings
    # The model card (gateway.api.handlers builds it inline): declared here by hand.
    named["Model"] = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
        },
        "required": ["id", "object", "created", "owned_by"],
    }
    named["ListModelsResponse"] = _list_of({"$ref": REF + "Model"}, paged=False)
    named.update(response_schemas())
    _refine(
        named,
        "FileObject",
        object={"const": "file"},
        purpose={"enum": [*files.PURPOSES, files.BATCH_OUTPUT]},
    )
    named["ListFilesResponse"] = _list_of({"$ref": REF + "FileObject"}, paged=True)
    # A deletion's answer (gateway.jobs.files builds it inline): declared here by hand.
    named["DeleteFileResponse"] = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "file"},
            "deleted": {"type": "boolean"},
        },
        "required": ["id", "object", "deleted"],
    }
    _refine(
        named,
        "BatchObject",
        object={"const": "batch"},
        endpoint={"enum": [*batches.ENDPOINTS]},
        completion_window={"enum": [*batches.WINDOWS]},
        status={"enum": [*batches.STATUSES]},
    )
    _refine(
        named,
        "BatchErrors",
        object={"const": "list"},
        data={
            "type": "array",
            "items": {"$ref": REF + "LineError"},
            "maxItems": batches.MAX_ERRORS_SHOWN,
        },
        total={
            "type": "integer",
            "minimum": 0,
            "description": "An extension of this gateway: how many line errors there are "
            f"(`data` shows the first {batches.MAX_ERRORS_SHOWN}; when the input file failed "
            "its checks, the error file lists them all).",
        },
    )
    named["ListBatchesResponse"] = _list_of({"$ref": REF + "BatchObject"}, paged=True)
    # The probes' answers (gateway.api.handlers): declared here by hand.
    named["Status"] = {
        "type": "object",
        "properties": {"status": {"enum": ["ok", "ready", "starting"]}},
        "required": ["status"],
    }
    return named


# ---------------------------------------------------------------- Files and Batch API requests


def files_schemas() -> dict[str, Schema]:
    lo, hi = files.EXPIRES_SECONDS
    return {
        "CreateFileRequest": {
            "type": "object",
            "required": ["file", "purpose"],
            "properties": {
                "file": {"type": "string", "contentMediaType": "application/octet-stream"},
                "purpose": {"enum": [*files.PURPOSES]},
                "expires_after": {
                    "type": "object",
                    "description": "Sent as the form fields `expires_after[anchor]` and "
                    "`expires_after[seconds]`.",
                    "required": ["anchor", "seconds"],
                    "properties": {
                        "anchor": {"enum": [files.EXPIRES_ANCHOR]},
                        "seconds": {"type": "integer", "minimum": lo, "maximum": hi},
                    },
                },
            },
        },
    }


def batches_schemas() -> dict[str, Schema]:
    return {
        "CreateBatchRequest": {
            "type": "object",
            "required": ["input_file_id", "endpoint", "completion_window"],
            "properties": {
                "input_file_id": {"type": "string", "description": "a file of purpose `batch`"},
                "endpoint": {"enum": [*batches.ENDPOINTS]},
                "completion_window": {"enum": [*batches.WINDOWS]},
                "metadata": {
                    "type": ["object", "null"],
                    "maxProperties": batches.MAX_METADATA_KEYS,
                    "propertyNames": {"maxLength": 64},
                    "additionalProperties": {"type": "string", "maxLength": 512},
                },
            },
        },
    }


# ---------------------------------------------------------------- errors


def error_tree() -> Iterator[type[GatewayError]]:
    """The classes of core.errors' tree (an adapter's own subclasses are its business, and
    whether they are imported yet must not change the document)."""
    stack: list[type[GatewayError]] = [GatewayError]
    while stack:
        cls = stack.pop()
        yield cls
        stack.extend(
            c for c in reversed(cls.__subclasses__()) if c.__module__ == GatewayError.__module__
        )


def error_statuses() -> dict[int, list[str]]:
    """Each status of the error tree and the `type`/`code` of the errors that answer it."""
    found: dict[int, list[str]] = {}
    for cls in error_tree():
        what = f"`{cls.type}`" + (f" `{cls.code}`" if cls.code else "")
        listed = found.setdefault(cls.status, [])
        if what not in listed:
            listed.append(what)
    return dict(sorted(found.items()))


def error_schema() -> Schema:
    nullable = {"param", "code"}
    keys = GatewayError("").body()["error"].keys()
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": [*keys],
                "properties": {
                    k: {"type": ["string", "null"] if k in nullable else "string"} for k in keys
                },
            }
        },
    }


def _error_responses() -> Schema:
    listed = error_statuses()

    def response(lo: int, hi: int) -> Schema:
        rows = "; ".join(f"{s}: {', '.join(w)}" for s, w in listed.items() if lo <= s < hi)
        return {
            "description": f"OpenAI's error shape; `param` names the field at fault. {rows}.",
            "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
            "content": {"application/json": {"schema": {"$ref": REF + "Error"}}},
        }

    return {"ClientError": response(400, 500), "ServerError": response(500, 600)}


# ---------------------------------------------------------------- paths

KEY: list[dict[str, list[str]]] = [{"bearerAuth": []}, {"portkeyApiKey": []}]
# A virtual key names the provider an inference request goes to; the key must list it.
INFERENCE_KEY = [
    *KEY,
    {"bearerAuth": [], "portkeyVirtualKey": []},
    {"portkeyApiKey": [], "portkeyVirtualKey": []},
]
ERRORS = {
    "4XX": {"$ref": "#/components/responses/ClientError"},
    "5XX": {"$ref": "#/components/responses/ServerError"},
}
HEAD = "HEAD is answered wherever GET is."


def _json(schema: str, description: str = "OK") -> Schema:
    return {
        "description": description,
        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
        "content": {"application/json": {"schema": {"$ref": REF + schema}}},
    }


# What a created file or batch leads to (OpenAPI links: clients and stateful tests follow them).
_FILE_ID = {"file_id": "$response.body#/id"}
FILE_LINKS = {
    "RetrieveFile": {"operationId": "retrieveFile", "parameters": _FILE_ID},
    "DownloadFile": {"operationId": "downloadFile", "parameters": _FILE_ID},
    "DeleteFile": {"operationId": "deleteFile", "parameters": _FILE_ID},
    "CreateBatch": {
        "operationId": "createBatch",
        "requestBody": {
            "input_file_id": "$response.body#/id",
            "endpoint": batches.ENDPOINTS[0],
            "completion_window": next(iter(batches.WINDOWS)),
        },
    },
}
_BATCH_ID = {"batch_id": "$response.body#/id"}
BATCH_LINKS = {
    "RetrieveBatch": {"operationId": "retrieveBatch", "parameters": _BATCH_ID},
    "CancelBatch": {"operationId": "cancelBatch", "parameters": _BATCH_ID},
}


def _linked(response: Schema, links: Schema) -> Schema:
    return {**response, "links": links}


def _op(op_id: str, summary: str, ok: Schema, security: list[Any], **more: Any) -> Schema:
    return {
        "operationId": op_id,
        "summary": summary,
        "security": security,
        **more,
        "responses": {"200": ok, **ERRORS},
    }


def response_schemas() -> dict[str, Schema]:
    """The Responses API's answer and its stream's events (gateway.pipeline.shapes builds the
    response object, gateway.pipeline.events the events): declared here by hand, their items
    as OpenAI's (open objects with their `type`)."""
    item = {"type": "object", "properties": {"type": {"type": "string"}}, "required": ["type"]}
    nullable_object = {"type": ["object", "null"]}
    response: Schema = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
            "error": nullable_object,
            "incomplete_details": nullable_object,
            "model": {"type": "string"},
            "output": {"type": "array", "items": item},
            "usage": {
                "type": ["object", "null"],
                "properties": {
                    key: {"type": "integer"}
                    for key in ("input_tokens", "output_tokens", "total_tokens")
                },
            },
        },
        "required": ["id", "object", "created_at", "status", "model", "output"],
    }
    event: Schema = {
        "type": "object",
        "description": "One event (`event: <type>`): its `type`, its `sequence_number` from 0, "
        "and the fields of its kind; those that carry the response hold a Response.",
        "properties": {
            "type": {"type": "string"},
            "sequence_number": {"type": "integer", "minimum": 0},
            "response": {"$ref": REF + "Response"},
        },
        "required": ["type", "sequence_number"],
    }
    return {"Response": response, "ResponseStreamEvent": event}


CACHE_PARAMETERS = ("PortkeyCacheForceRefresh", "PortkeyCacheNamespace", "CacheControl")


def _inference(op_id: str, summary: str, request: str, answer: str, chunk: str | None) -> Schema:
    ok = _json(answer)
    ok["headers"] = {**ok["headers"], **CACHE_HEADERS}
    if chunk is not None:
        ok["description"] = (
            "The answer; with `stream: true`, server-sent events: each `data:` a chunk, then "
            '`data: [DONE]`. An error after the first byte is an event `data: {"error": …}`.'
        )
        ok["content"]["text/event-stream"] = {"schema": {"$ref": REF + chunk}}
    parameters = [
        {"$ref": "#/components/parameters/" + p}
        for p in ("PortkeyConfig", "PortkeyRequestTimeout", "RequestId", "TraceId",
                  *CACHE_PARAMETERS)
    ]  # fmt: skip
    body = {"required": True, "content": {"application/json": {"schema": {"$ref": REF + request}}}}
    return _op(op_id, summary, ok, INFERENCE_KEY, parameters=parameters, requestBody=body)


def _path_param(name: str, description: str) -> Schema:
    schema: Schema = {"type": "string"}
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def _query(name: str, schema: Schema, description: str = "") -> Schema:
    param: Schema = {"name": name, "in": "query", "required": False, "schema": schema}
    if description:
        param["description"] = description
    return param


def paths() -> Schema:
    return {
        **_inference_paths(),
        **_files_paths(),
        **_batches_paths(),
        **_stored_responses_paths(),
        **_service_paths(),
        **_admin_paths(),
    }


@dataclass(frozen=True, slots=True)
class InferenceDoc:
    """An inference endpoint's entry: its path (documented also without `/v1`), operation,
    request (its declaration, the rules between its fields and the gateway's bounds on it),
    answer and stream chunk (None: it does not stream)."""

    path: str
    op_id: str
    summary: str
    request: Declaration
    rules: tuple[str, ...]
    limits: str
    answer: str
    chunk: str | None


COMPLETIONS_DOC = InferenceDoc(
    "/v1/completions",
    "createCompletion",
    "Create a completion",
    COMPLETIONS,
    tuple(rule.message for rule in COMPLETION_RULES),
    _limits(),
    "CreateCompletionResponse",
    "CreateCompletionChunk",
)
CHAT_DOC = InferenceDoc(
    "/v1/chat/completions",
    "createChatCompletion",
    "Create a chat completion",
    CHAT,
    tuple(rule.message for rule in CHAT_RULES),
    _limits("max_n", "max_tokens"),
    "CreateChatCompletionResponse",
    "CreateChatCompletionChunk",
)
EMBEDDINGS_DOC = InferenceDoc(
    "/v1/embeddings",
    "createEmbedding",
    "Create embeddings",
    EMBEDDINGS,
    (),
    "",
    "CreateEmbeddingResponse",
    None,
)
RESPONSES_DOC = InferenceDoc(
    "/v1/responses",
    "createResponse",
    "Create a model response",
    RESPONSES,
    (),
    _limits("max_tokens"),
    "Response",
    "ResponseStreamEvent",
)
# The inference endpoints' entries, in the document's order (gateway.pipeline.endpoints: each
# row names its own).
INFERENCE = (COMPLETIONS_DOC, CHAT_DOC, EMBEDDINGS_DOC, RESPONSES_DOC)


def _inference_paths() -> Schema:
    out: Schema = {}
    for doc in INFERENCE:
        spec = (doc.summary, doc.request.name, doc.answer, doc.chunk)
        out[doc.path] = {"post": _inference(doc.op_id, *spec)}
        # The same endpoint without the /v1 prefix.
        out[doc.path.removeprefix("/v1")] = {"post": _inference(doc.op_id + "Unversioned", *spec)}
    out["/v1/models"] = {
        "get": _op(
            "listModels", "The aliases the caller's key may use", _json("ListModelsResponse"), KEY
        )
    }
    model = _path_param("model", "An alias; it may contain `/` (raw or `%2F`).")
    out["/v1/models/{model}"] = {
        "get": _op("retrieveModel", "One alias", _json("Model"), KEY, parameters=[model])
    }
    return out


def _collection(
    created: tuple[str, str, str, Schema, Schema], listed: tuple[str, str, str], query: list[Schema]
) -> Schema:
    """A collection's path: POST creates one (its answer linked to what it leads to), GET
    lists the caller's. `created`: operation id, summary, answer, links, request body;
    `listed`: operation id, summary, answer."""
    op_id, summary, answer, links, body = created
    list_id, list_summary, page = listed
    return {
        "post": _op(op_id, summary, _linked(_json(answer), links), KEY, requestBody=body),
        "get": _op(list_id, list_summary, _json(page), KEY, parameters=query),
    }


def _files_paths() -> Schema:
    lo, hi = files.LIST_LIMIT
    upload = {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {"$ref": REF + "CreateFileRequest"},
                "encoding": {"expires_after": {"style": "deepObject", "explode": True}},
            }
        },
    }
    query = [
        _query("purpose", {"type": "string", "maxLength": files.MAX_PURPOSE_CHARS}),
        _query("limit", {"type": "integer", "minimum": lo, "maximum": hi, "default": hi}),
        _query("order", {"enum": [*files.ORDERS], "default": "desc"}),
        _query("after", {"type": "string"}, "A file id: the page starts after it."),
    ]
    file_id = _path_param("file_id", "A file of the caller's key.")
    content = {
        "description": "The file's bytes",
        "content": {
            "application/octet-stream": {"schema": {"contentMediaType": "application/octet-stream"}}
        },
    }
    return {
        "/v1/files": _collection(
            ("createFile", "Upload a file", "FileObject", FILE_LINKS, upload),
            ("listFiles", "The caller's files", "ListFilesResponse"),
            query,
        ),
        "/v1/files/{file_id}": {
            "get": _op("retrieveFile", "A file", _json("FileObject"), KEY, parameters=[file_id]),
            "delete": _op(
                "deleteFile",
                "Delete a file",
                _json("DeleteFileResponse"),
                KEY,
                parameters=[file_id],
            ),
        },
        "/v1/files/{file_id}/content": {
            "get": _op("downloadFile", "A file's bytes", content, KEY, parameters=[file_id])
        },
    }


def _batches_paths() -> Schema:
    lo, hi = batches.LIST_LIMIT
    create = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": REF + "CreateBatchRequest"}}},
    }
    limit = {"type": "integer", "minimum": lo, "maximum": hi, "default": batches.DEFAULT_LIST_LIMIT}
    query = [
        _query("limit", limit),
        _query("after", {"type": "string"}, "A batch id: the page starts after it."),
    ]
    batch_id = _path_param("batch_id", "A batch of the caller's key.")
    return {
        "/v1/batches": _collection(
            ("createBatch", "Create a batch", "BatchObject", BATCH_LINKS, create),
            ("listBatches", "The caller's batches, newest first", "ListBatchesResponse"),
            query,
        ),
        "/v1/batches/{batch_id}": {
            "get": _op("retrieveBatch", "A batch", _json("BatchObject"), KEY, parameters=[batch_id])
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": _op(
                "cancelBatch",
                "Cancel a batch under way",
                _json("BatchObject"),
                KEY,
                parameters=[batch_id],
            )
        },
    }


def _service_paths() -> Schema:
    """The probes, the metrics and this document: no key."""
    ready = _json("Status", "Ready (503 with `starting` until the providers are up)")
    metrics = {
        "description": "Prometheus' text format (404 when metrics.enabled is false)",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    document = {
        "description": "This document",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
    return {
        "/livez": {"get": _op("livez", "Liveness", _json("Status"), [])},
        "/readyz": {"get": _op("readyz", "Readiness", ready, [])},
        "/metrics": {"get": _op("metrics", "Metrics", metrics, [])},
        "/openapi.json": {"get": _op("openapi", "The OpenAPI document", document, [])},
    }


# ---------------------------------------------------------------- stored responses
# The Responses API's stored responses: retrieve, delete, list input items (gateway.api.responses).
# `POST /v1/responses` is an inference endpoint: its entry is in INFERENCE, not here. The
# listing's bounds are core.response_items', which the gateway checks too.


def stored_responses_schemas() -> dict[str, Schema]:
    """The stored responses' answers (gateway.jobs.responsestore builds them): declared here
    by hand. A stored response is the `Response` that `POST /v1/responses` answered."""
    item = {
        "type": "object",
        "description": "An input item as OpenAI lists it: its id (the caller's, or one the "
        "gateway made), a message's text as content parts, `status` where OpenAI's item has one.",
        "properties": {"id": {"type": "string"}, "type": {"type": "string"}},
        "required": ["id", "type"],
    }
    return {
        "ResponseInputItem": item,
        "ResponseItemList": _list_of({"$ref": REF + "ResponseInputItem"}, paged=True),
        "DeleteResponseResponse": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "object": {"const": "response"},
                "deleted": {"type": "boolean"},
            },
            "required": ["id", "object", "deleted"],
        },
    }


def _stored_responses_paths() -> Schema:
    """Each path also without `/v1`, as the gateway serves it."""
    lo, hi = response_items.LIST_LIMIT
    response_id = _path_param(
        "response_id", "A response of the caller's team (of its key, when it has no team)."
    )
    include = _query(
        "include",
        {"type": "array", "items": {"enum": [*response_items.INCLUDABLE]}},
        "Accepted (also as `include[]`); nothing more is added to the answer.",
    )
    stream = _query(
        "stream",
        {"type": "boolean", "const": False, "default": False},
        "`true` (replaying a background response's events) is refused: a 400 naming `stream`.",
    )
    items = [
        response_id,
        _query("limit", {"type": "integer", "minimum": lo, "maximum": hi, "default": 20}),
        _query("order", {"enum": [*response_items.ORDERS], "default": "desc"}),
        _query("after", {"type": "string"}, "An item id: the page starts after it."),
        include,
    ]
    out: Schema = {}
    for prefix, suffix in (("/v1", ""), ("", "Unversioned")):
        out[f"{prefix}/responses/{{response_id}}"] = {
            "get": _op(
                "retrieveResponse" + suffix,
                "A stored response",
                _json("Response"),
                KEY,
                parameters=[response_id, include, stream],
            ),
            "delete": _op(
                "deleteResponse" + suffix,
                "Delete a stored response",
                _json("DeleteResponseResponse"),
                KEY,
                parameters=[response_id],
            ),
        }
        out[f"{prefix}/responses/{{response_id}}/input_items"] = {
            "get": _op(
                "listInputItems" + suffix,
                "A stored response's input items",
                _json("ResponseItemList"),
                KEY,
                parameters=items,
            )
        }
    return out


# ---------------------------------------------------------------- the admin API

# The gateway's own bounds on what the admin API takes (gateway.config.accounts' ids, budget
# periods, gateway.governance's rotation grace, spend range and groups): stated here, where
# core cannot import them; tests/unit/gateway/api/test_admin.py holds the two together.
ADMIN_ID = "^[A-Za-z0-9._@+=-]{1,64}$"
BUDGET_PERIODS = ("day", "week", "month", "total")
MAX_GRACE_S = 30 * 86400
MAX_SPEND_DAYS = 400
SPEND_GROUPS = ("key", "team", "model")
LIMIT_NAMES = ("rpm", "tpm", "max_parallel")
ADMIN_KEY_NOTE = (
    "An admin key (`auth.admin_keys`), presented as any key is; any other key is refused "
    "(401, or 403 for an inference key)."
)


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _admin_parts() -> dict[str, Schema]:
    """What keys and teams are made of: limits, budgets, glob lists, as sent and as shown."""
    positive = {"type": "integer", "minimum": 1}
    globs = {"type": "array", "items": {"type": "string"}}
    usd = {"type": "string", "description": "US dollars, an exact decimal number"}
    return {
        "Limits": {
            "type": "object",
            "properties": {name: positive for name in LIMIT_NAMES},
            "additionalProperties": False,
        },
        "BudgetRequest": {
            "type": "object",
            "required": ["usd", "period"],
            "properties": {
                "usd": {"type": ["number", "string"], "description": "US dollars, read exactly"},
                "period": {"enum": [*BUDGET_PERIODS]},
            },
            "additionalProperties": False,
        },
        "Budget": {
            "type": "object",
            "required": ["usd", "period"],
            "properties": {"usd": usd, "period": {"enum": [*BUDGET_PERIODS]}},
        },
        "BudgetState": {
            "type": "object",
            "description": "A budget in its current period; `spent_usd` counts what requests "
            "under way hold too. `resets_at`: when the period ends (null: a total budget). A "
            "model budget (scope key_model or team_model) has a row per configured alias it "
            "covers, naming it in `model`.",
            "required": ["scope", "usd", "period", "spent_usd", "remaining_usd", "resets_at"],
            "properties": {
                "scope": {"enum": ["key", "team", "key_model", "team_model"]},
                "model": {"type": "string"},
                "usd": usd,
                "period": {"enum": [*BUDGET_PERIODS]},
                "spent_usd": usd,
                "remaining_usd": usd,
                "resets_at": {"type": ["string", "null"], "format": "date-time"},
            },
        },
        "Globs": globs,
    }


def _settings(shown: bool, team: bool) -> Schema:
    """The settings of a key (team: of a team), as a request sends them (null: the default) or
    as an object shows them."""
    ref = {"$ref": REF + "Globs"}
    limits = {"$ref": REF + "Limits"}
    budget = {"$ref": REF + ("Budget" if shown else "BudgetRequest")}
    out: Schema = {
        "models": ref if shown else _nullable(ref),
        "providers": _nullable(ref) if team or not shown else ref,
        "limits": limits if shown else _nullable(limits),
        "budget": _nullable(budget),
        "model_budgets": {"type": "object", "additionalProperties": budget},
    }
    if not shown:
        out["model_budgets"] = _nullable(out["model_budgets"])
    if not team:
        per_model = {"type": "object", "additionalProperties": limits}
        out["model_limits"] = per_model if shown else _nullable(per_model)
        out["team"] = {"type": ["string", "null"]}
        moment = {"type": ["integer", "number", "string", "null"]}
        out["expires_at"] = {"type": ["integer", "number", "null"]} if shown else moment
    return out


def _admin_object(kind: str, team: bool) -> Schema:
    properties: Schema = {
        "id": {"type": "string"},
        "object": {"const": kind},
        "source": {
            "enum": ["config", "runtime"],
            "description": "config: the YAML's (read-only here); runtime: made here",
        },
        **_settings(shown=True, team=team),
        "created_at": {"type": ["integer", "null"]},
    }
    if not team:
        properties["rotated_until"] = {
            "type": ["integer", "number", "null"],
            "description": "When the secret a rotation replaced stops working (null: none).",
        }
    return {"type": "object", "required": [*properties], "properties": properties}


def admin_schemas() -> dict[str, Schema]:
    named = _admin_parts()
    key, team = _admin_object("gateway.key", False), _admin_object("gateway.team", True)
    ident = {"type": "string", "pattern": ADMIN_ID}
    named["AdminKey"] = key
    named["AdminKeyDetail"] = {
        "allOf": [{"$ref": REF + "AdminKey"}],
        "type": "object",
        "required": ["budgets"],
        "properties": {"budgets": {"type": "array", "items": {"$ref": REF + "BudgetState"}}},
    }
    named["AdminKeyIssued"] = {
        "allOf": [{"$ref": REF + "AdminKey"}],
        "type": "object",
        "required": ["key"],
        "properties": {
            "key": {"type": "string", "description": "The secret: shown once, never again."}
        },
    }
    named["AdminTeam"] = team
    named["AdminKeyList"] = _list_of({"$ref": REF + "AdminKey"}, paged=False)
    named["AdminTeamList"] = _list_of({"$ref": REF + "AdminTeam"}, paged=False)
    named["AdminDeleted"] = {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"enum": ["gateway.key", "gateway.team"]},
            "deleted": {"const": True},
        },
    }
    for name, team_kind, with_id in (
        ("CreateKeyRequest", False, True),
        ("UpdateKeyRequest", False, False),
        ("CreateTeamRequest", True, True),
        ("UpdateTeamRequest", True, False),
    ):
        properties = _settings(shown=False, team=team_kind)
        if with_id:
            properties = {"id": _nullable(ident), **properties}
        named[name] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
            "description": "Unknown fields are refused (400). A null is the field's default"
            + ("." if with_id else "; a field left out keeps its value."),
        }
    named["RotateKeyRequest"] = {
        "type": "object",
        "properties": {"grace_s": {"type": "number", "minimum": 0, "maximum": MAX_GRACE_S}},
        "additionalProperties": False,
    }
    named["AdminSpend"] = _spend_schema()
    return named


def _spend_schema() -> Schema:
    row = {
        "type": "object",
        "required": ["date", "spend_usd"],
        "properties": {
            "date": {"type": "string", "format": "date"},
            **{group: {"type": "string"} for group in SPEND_GROUPS},
            "spend_usd": {"type": "string", "description": "US dollars, an exact decimal number"},
        },
        "description": "One day's spend of one member of the group (its field: `group_by`).",
    }
    listed = _list_of(row, paged=False)
    listed["properties"].update(
        group_by={"enum": [*SPEND_GROUPS]},
        start={"type": "string", "format": "date"},
        end={"type": "string", "format": "date"},
    )
    listed["required"] += ["group_by", "start", "end"]
    return listed


# Each admin operation: path, method, operation id, summary, answer, request body (None: none;
# "?" after it: optional).
ADMIN_OPS: tuple[tuple[str, str, str, str, str, str | None], ...] = (
    ("/admin/keys", "get", "adminListKeys", "Every key: the YAML's and runtime ones",
     "AdminKeyList", None),
    ("/admin/keys", "post", "adminCreateKey", "Create a runtime key (its secret shown once)",
     "AdminKeyIssued", "CreateKeyRequest"),
    ("/admin/keys/{key_id}", "get", "adminGetKey", "A key, and its budgets this period",
     "AdminKeyDetail", None),
    ("/admin/keys/{key_id}", "patch", "adminUpdateKey", "Change a runtime key", "AdminKey",
     "UpdateKeyRequest"),
    ("/admin/keys/{key_id}", "delete", "adminDeleteKey", "Revoke a runtime key", "AdminDeleted",
     None),
    ("/admin/keys/{key_id}/rotate", "post", "adminRotateKey",
     "A new secret (shown once); the old one works for grace_s more", "AdminKeyIssued",
     "RotateKeyRequest?"),
    ("/admin/teams", "get", "adminListTeams", "Every team: the YAML's and runtime ones",
     "AdminTeamList", None),
    ("/admin/teams", "post", "adminCreateTeam", "Create a runtime team", "AdminTeam",
     "CreateTeamRequest"),
    ("/admin/teams/{team_id}", "get", "adminGetTeam", "A team", "AdminTeam", None),
    ("/admin/teams/{team_id}", "patch", "adminUpdateTeam", "Change a runtime team", "AdminTeam",
     "UpdateTeamRequest"),
    ("/admin/teams/{team_id}", "delete", "adminDeleteTeam",
     "Delete a runtime team (409 while keys belong to it)", "AdminDeleted", None),
    ("/admin/spend", "get", "adminSpend", "Spend per UTC day by key, team or model",
     "AdminSpend", None),
)  # fmt: skip


def _admin_parameters() -> dict[str, list[Schema]]:
    """The parameters of each admin path."""
    date = {"type": "string", "format": "date"}
    key_id = _path_param("key_id", "A key's id (the YAML's or a runtime one).")
    team_id = _path_param("team_id", "A team's id (the YAML's or a runtime one).")
    start = (
        f"UTC, inclusive (default: 29 days before end); at most {MAX_SPEND_DAYS} days from "
        "start to end."
    )
    spend = [
        _query("group_by", {"enum": [*SPEND_GROUPS], "default": "key"}),
        _query("start", date, start),
        _query("end", date, "UTC, inclusive (default: today)."),
    ]
    return {
        "/admin/keys/{key_id}": [key_id],
        "/admin/keys/{key_id}/rotate": [key_id],
        "/admin/teams/{team_id}": [team_id],
        "/admin/spend": spend,
    }


def _admin_paths() -> Schema:
    parameters = _admin_parameters()
    out: Schema = {}
    for path, method, op_id, summary, answer, body in ADMIN_OPS:
        more: Schema = {"description": ADMIN_KEY_NOTE}
        if path in parameters:
            more["parameters"] = parameters[path]
        if body is not None:
            schema = {"$ref": REF + body.rstrip("?")}
            more["requestBody"] = {
                "required": not body.endswith("?"),
                "content": {"application/json": {"schema": schema}},
            }
        out.setdefault(path, {})[method] = _op(op_id, summary, _json(answer), KEY, **more)
    return out


# ---------------------------------------------------------------- the document


def build() -> Schema:
    schemas: dict[str, Schema] = {}
    for doc in INFERENCE:
        name = doc.request.name
        schemas[name] = request_schema(doc.request, doc.rules)
        schemas[name]["description"] += " " + doc.limits if doc.limits else ""
    schemas.update(files_schemas())
    schemas.update(batches_schemas())
    schemas.update(stored_responses_schemas())
    schemas.update(answer_schemas())
    schemas.update(admin_schemas())
    schemas["Error"] = error_schema()
    return {
        "openapi": OPENAPI,
        "info": {
            "title": "completions-gateway",
            "version": _version(),
            "description": (
                "OpenAI's completions, chat, embeddings, files and batches APIs. Each request "
                "field's `x-family` says who defines it: `openai`, `extension` (the provider "
                "extensions any target may serve) or `vllm` (vLLM's extras). "
                + HEAD
                + " The headers "
                "x-portkey-provider and x-portkey-custom-host are refused (400)."
            ),
        },
        "security": KEY,
        "paths": paths(),
        "components": {
            "schemas": schemas,
            "responses": _error_responses(),
            "headers": {
                "RequestId": {
                    "description": "The request's id: the caller's x-request-id if short and "
                    "plain, else the gateway's.",
                    "schema": {"type": "string"},
                }
            },
            "parameters": {
                "PortkeyConfig": _header(
                    "x-portkey-config",
                    "A Portkey config: a JSON object, or the name of one in the gateway's config.",
                ),
                "PortkeyRequestTimeout": _header(
                    "x-portkey-request-timeout",
                    "Milliseconds before the request is given up (408).",
                ),
                "RequestId": _header("x-request-id", "Echoed if short and plain."),
                "TraceId": _header("x-portkey-trace-id", "Echoed if short and plain."),
                "PortkeyCacheForceRefresh": _header(
                    "x-portkey-cache-force-refresh",
                    "`true`: a cache-enabled request calls the upstream and replaces its entry.",
                ),
                "PortkeyCacheNamespace": _header(
                    "x-portkey-cache-namespace",
                    "Partitions the cache's entries further, within the caller's team.",
                ),
                "CacheControl": _header(
                    "cache-control",
                    "`no-cache`: as x-portkey-cache-force-refresh; `no-store`: the cache is not "
                    "used.",
                ),
            },
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer"},
                "portkeyApiKey": {"type": "apiKey", "in": "header", "name": "x-portkey-api-key"},
                "portkeyVirtualKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-portkey-virtual-key",
                    "description": "A configured provider's name: the request goes to it (the "
                    "key must list it). With the key, never instead of it.",
                },
            },
        },
    }


# On every answer to a request whose model (or Portkey config) caches.
CACHE_HEADERS: Schema = {
    "x-portkey-cache-status": {
        "description": "The cache's part in the answer: HIT, MISS, REFRESH or DISABLED.",
        "schema": {"type": "string", "enum": ["HIT", "MISS", "REFRESH", "DISABLED"]},
    },
    "age": {
        "description": "On a hit: the entry's age, in seconds.",
        "schema": {"type": "integer", "minimum": 0},
    },
}


def _header(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": description,
    }


def _version() -> str:
    try:
        return metadata.version("completions-gateway")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@functools.cache
def document_json() -> bytes:
    """The document's bytes, built once per process."""
    return orjson.dumps(build())

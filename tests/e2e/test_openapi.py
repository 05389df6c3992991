"""`GET /openapi.json` from a running gateway: served without a key, the document core.openapi
builds, and the gateway's real answers (a completion, a chat completion, the model list, a 400)
valid against the schemas it documents for them."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from core.openapi import build
from tests.e2e.conftest import Env
from tests.e2e.support import OA, auth


def _judge(doc: dict[str, Any], response: httpx.Response, path: str) -> None:
    """The response against the schema the document gives `path`'s POST/GET for its status."""
    item = doc["paths"][path]
    op = item.get("post") or item["get"]
    answer = op["responses"].get(str(response.status_code))
    if answer is None:
        answer = doc["components"]["responses"]["ClientError"]
    schema = answer["content"]["application/json"]["schema"]
    registry: Registry[Any] = Registry().with_resource(
        "urn:doc", Resource.from_contents(doc, default_specification=DRAFT202012)
    )
    ref = {"$ref": "urn:doc" + schema["$ref"]}
    Draft202012Validator(ref, registry=registry).validate(response.json())


def test_the_document_is_served_and_describes_the_answers(env: Env) -> None:
    resp = env.http.get("/openapi.json")  # no key
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.headers["x-request-id"]
    doc = orjson.loads(resp.content)
    assert doc == build()
    assert doc["openapi"].startswith("3.1.")

    completion = env.http.post(
        "/v1/completions", headers=auth(), json={"model": OA, "prompt": "hi", "max_tokens": 4}
    )
    assert completion.status_code == 200
    _judge(doc, completion, "/v1/completions")
    chat = env.http.post(
        "/v1/chat/completions",
        headers=auth(),
        json={"model": OA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert chat.status_code == 200
    _judge(doc, chat, "/v1/chat/completions")
    models = env.http.get("/v1/models", headers=auth())
    _judge(doc, models, "/v1/models")
    refused = env.http.post(
        "/v1/completions", headers=auth(), json={"model": OA, "prompt": "hi", "top_p": 1.5}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_p"
    _judge(doc, refused, "/v1/completions")

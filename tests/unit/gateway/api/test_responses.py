"""The stored responses' routes in-process (gateway.api.responses), on a temporary directory
store seeded through ResponseStore.keep: retrieve, delete and the input items' pages with the
openai SDK (`client.responses.retrieve`, `.delete`, `.input_items.list`) and with plain HTTP
(the paths without /v1, HEAD, each bad query parameter named, stream=true refused), who owns a
response, and the routes' bounds held to the API document."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest
import yaml
from openai.types.responses import (
    ResponseFunctionToolCallOutputItem,
    ResponseInputMessageItem,
    ResponseOutputMessage,
)

from core import openapi, response_items
from gateway.api.app import GatewayApp, create_app
from gateway.config import parse
from gateway.jobs.responsestore import owner
from tests.unit.core.test_openapi import judge

# Keys: two of team `a`, one of team `b`, one with no team whose id is `a` (the team's name).
KEYS = {"one": "sk-one", "mate": "sk-mate", "b-key": "sk-b", "a": "sk-alone"}
TEAM_OF = {"one": "a", "mate": "a", "b-key": "b"}


def document(store: Path) -> dict[str, Any]:
    keys = [
        {
            "id": kid,
            "key": secret,
            "models": ["*"],
            **({"team": TEAM_OF[kid]} if kid in TEAM_OF else {}),
        }
        for kid, secret in KEYS.items()
    ]
    return {
        "auth": {"keys": keys},
        "teams": {"a": {"models": ["*"]}, "b": {"models": ["*"]}},
        "providers": {},
        "models": {},
        "files": {"store": str(store)},
        "responses": {"ttl_days": 7},
    }


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[GatewayApp]:
    app = create_app(parse(yaml.safe_dump(document(tmp_path / "store"))))
    await app.runtime.start()
    try:
        yield app
    finally:
        await app.runtime.aclose()


@pytest.fixture
async def http(app: GatewayApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client


def sdk_for(app: GatewayApp, key: str) -> openai.AsyncOpenAI:
    transport = httpx2.ASGITransport(app=app)
    http_client = httpx2.AsyncClient(transport=transport, base_url="http://gw")
    return openai.AsyncOpenAI(
        base_url="http://gw/v1", api_key=key, max_retries=0, http_client=http_client
    )


@pytest.fixture
async def sdk(app: GatewayApp) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk_for(app, KEYS["one"]) as client:
        yield client


ITEMS: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": "Answer briefly."},
    {"type": "message", "role": "user", "content": "What is the weather?"},
    {"type": "message", "role": "assistant", "content": "Where?"},
    {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Kielce"}]},
]


def answer(response_id: str = "resp_0001", **more: Any) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": 1_900_000_000,
        "status": "completed",
        "model": "m",
        "output": [
            {
                "id": "msg_out",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        **more,
    }


async def seed(app: GatewayApp, key_id: str = "one", **more: Any) -> dict[str, Any]:
    principal = app.runtime.auth.principal(key_id)
    assert principal is not None
    made = answer(**more)
    await app.runtime.responses.keep(owner(principal), made, ITEMS, [])
    return made


def auth(key_id: str = "one") -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[key_id]}"}


def assert_error(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    return error


# ---------------------------------------------------------------- with the SDK


async def test_retrieve(app: GatewayApp, sdk: openai.AsyncOpenAI) -> None:
    made = await seed(app)
    got = await sdk.responses.retrieve("resp_0001")
    assert (got.id, got.object, got.created_at, got.model) == (
        "resp_0001",
        "response",
        made["created_at"],
        "m",
    )
    assert got.output_text == "Sunny."
    included = await sdk.responses.retrieve("resp_0001", include=["message.output_text.logprobs"])
    assert included.id == "resp_0001"
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.responses.retrieve("resp_0002")
    assert missing.value.body["message"] == "Response with id 'resp_0002' not found."  # type: ignore[index]


async def test_stream_is_refused(app: GatewayApp, sdk: openai.AsyncOpenAI) -> None:
    await seed(app)
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.responses.retrieve("resp_0001", stream=True)
    assert refused.value.param == "stream"
    assert "not supported" in refused.value.message


async def test_delete(app: GatewayApp, sdk: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    await seed(app)
    r = await http.delete("/v1/responses/resp_0001", headers=auth())
    assert r.status_code == 200 and r.json() == {
        "id": "resp_0001",
        "object": "response",
        "deleted": True,
    }
    judge("DeleteResponseResponse").validate(r.json())
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.delete("resp_0001")  # a second delete
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve("resp_0001")
    await seed(app)
    await sdk.responses.delete("resp_0001")  # the SDK reads no body
    assert_error(await http.get("/v1/responses/resp_0001", headers=auth()), 404, None)


async def test_input_items(app: GatewayApp, sdk: openai.AsyncOpenAI) -> None:
    await seed(app)
    page = await sdk.responses.input_items.list("resp_0001")
    assert len(page.data) == len(ITEMS) and not page.has_more
    newest_first = [item.id for item in page.data]
    assert len(set(newest_first)) == len(ITEMS)
    types = [item.type for item in reversed(page.data)]
    assert types == [item["type"] for item in ITEMS]
    developer, _, assistant, output, _ = reversed(page.data)
    assert isinstance(developer, ResponseInputMessageItem) and developer.role == "developer"
    assert developer.content[0].type == "input_text"
    assert developer.id.startswith("msg_") and developer.status == "completed"
    assert isinstance(assistant, ResponseOutputMessage)
    assert assistant.content[0].type == "output_text"
    assert isinstance(output, ResponseFunctionToolCallOutputItem) and output.id.startswith("fco_")
    assert (output.call_id, output.output, output.status) == ("call_1", "18C", "completed")
    asc = await sdk.responses.input_items.list("resp_0001", order="asc")
    assert [item.id for item in asc.data] == newest_first[::-1]
    # Pages of two, which the SDK follows by `after`.
    small = await sdk.responses.input_items.list("resp_0001", limit=2)
    assert [item.id for item in small.data] == newest_first[:2] and small.has_more
    assert [item.id async for item in small] == newest_first
    after = await sdk.responses.input_items.list("resp_0001", limit=2, after=newest_first[1])
    assert [item.id for item in after.data] == newest_first[2:4]
    listed = await sdk.responses.input_items.list(
        "resp_0001", order="asc", limit=3, include=["message.input_image.image_url"]
    )
    assert [item.id async for item in listed] == newest_first[::-1]


# ---------------------------------------------------------------- over HTTP


async def test_both_paths_head_and_the_document(app: GatewayApp, http: httpx.AsyncClient) -> None:
    made = await seed(app)
    for prefix in ("/v1", ""):
        r = await http.get(f"{prefix}/responses/resp_0001", headers=auth())
        assert r.status_code == 200 and r.json() == made
        head = await http.head(f"{prefix}/responses/resp_0001", headers=auth())
        assert head.status_code == 200
        items = await http.get(f"{prefix}/responses/resp_0001/input_items", headers=auth())
        assert items.status_code == 200
        judge("ResponseItemList").validate(items.json())
        assert items.json()["first_id"] == items.json()["data"][0]["id"]
    r = await http.delete("/responses/resp_0001", headers=auth())
    assert r.status_code == 200
    r = await http.get("/responses/resp_0001", headers=auth())
    assert_error(r, 404, None)


async def test_bad_queries_name_their_parameter(app: GatewayApp, http: httpx.AsyncClient) -> None:
    await seed(app)
    items = "/v1/responses/resp_0001/input_items"
    for query, param in (
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=x", "limit"),
        ("limit=", "limit"),
        ("limit=" + "9" * 30, "limit"),
        ("order=up", "order"),
        ("include=everything", "include"),
        ("include[]=message.output_text.logprobs&include[]=nope", "include"),
    ):
        r = await http.get(f"{items}?{query}", headers=auth())
        assert_error(r, 400, param)
    for query in ("limit=1&order=asc", "limit=100", "include[]=reasoning.encrypted_content"):
        assert (await http.get(f"{items}?{query}", headers=auth())).status_code == 200
    one = "/v1/responses/resp_0001"
    for query, param in (
        ("stream=true", "stream"),
        ("stream=yes", "stream"),
        ("include=x", "include"),
    ):
        assert_error(await http.get(f"{one}?{query}", headers=auth()), 400, param)
    err = assert_error(await http.get(f"{one}?stream=true", headers=auth()), 400, "stream")
    assert err["code"] == "unsupported_parameter"
    for query in ("stream=false", "include_obfuscation=true&starting_after=3"):
        assert (await http.get(f"{one}?{query}", headers=auth())).status_code == 200


async def test_a_response_is_its_teams(app: GatewayApp, http: httpx.AsyncClient) -> None:
    await seed(app, "one")
    for key_id in ("b-key", "a"):  # another team; a key named like the team, without one
        for method, path in (
            ("GET", "/v1/responses/resp_0001"),
            ("GET", "/v1/responses/resp_0001/input_items"),
            ("DELETE", "/v1/responses/resp_0001"),
        ):
            r = await http.request(method, path, headers=auth(key_id))
            assert_error(r, 404, None)
    r = await http.get("/v1/responses/resp_0001", headers=auth("mate"))
    assert r.status_code == 200  # a key of the same team
    await seed(app, "a", id="resp_0009")
    assert (await http.get("/v1/responses/resp_0009", headers=auth("a"))).status_code == 200
    assert_error(await http.get("/v1/responses/resp_0009", headers=auth("one")), 404, None)


async def test_paths_methods_keys_and_odd_ids(app: GatewayApp, http: httpx.AsyncClient) -> None:
    await seed(app)
    assert_error(await http.get("/v1/responses/resp_0001"), 401, None)
    assert_error(await http.get("/v1/responses/resp_0001/other", headers=auth()), 404, None)
    assert_error(await http.post("/v1/responses/resp_0001", headers=auth()), 405, None)
    r = await http.delete("/v1/responses/resp_0001/input_items", headers=auth())
    assert_error(r, 405, None)
    for odd in ("resp_..%2F..%2Fx", "..", "resp_0001.json", "resp_%00", "resp_" + "a" * 5000, ""):
        r = await http.get(f"/v1/responses/{odd}", headers=auth())
        assert r.status_code == 404, (odd, r.text)
        assert len(r.json()["error"]["message"]) < 150


# ---------------------------------------------------------------- the document


def test_the_bounds_are_the_documents() -> None:
    doc = openapi.build()["paths"]
    for prefix in ("/v1", ""):
        listed = doc[f"{prefix}/responses/{{response_id}}/input_items"]["get"]["parameters"]
        schemas = {p["name"]: p["schema"] for p in listed}
        assert (
            schemas["limit"]["minimum"],
            schemas["limit"]["maximum"],
        ) == response_items.LIST_LIMIT
        assert schemas["limit"]["default"] == response_items.LIST_DEFAULT
        assert schemas["order"]["enum"] == [*response_items.ORDERS]
        assert schemas["include"]["items"]["enum"] == [*response_items.INCLUDABLE]

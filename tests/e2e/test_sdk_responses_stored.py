"""Stored responses with the openai SDK, on a gateway of its own with a local store seeded through
ResponseStore.keep (as `POST /v1/responses` keeps what it answers): retrieve, the input items'
pages (both orders, followed by the SDK), delete, stream=true refused, and ownership: a response
is its key's team's, and no other team's or lone key's."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import openai
import pytest

from gateway.auth import Principal
from gateway.jobs.filestore import FileStore
from gateway.jobs.responsestore import ResponseStore, owner
from tests.gateway_proc import GatewayProcess
from tests.unit.gateway.api.test_responses import answer

KEY, MATE, OTHER, ALONE = "sk-resp-one", "sk-resp-mate", "sk-resp-other", "sk-resp-alone"
ITEMS = [{"type": "message", "role": "user", "content": f"Question {i}"} for i in range(5)] + [
    {"type": "function_call_output", "call_id": "call_1", "output": "18C"}
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("responses")
    config = f"""
auth:
  keys:
    - {{id: one, key: {KEY}, models: ["*"], team: red}}
    - {{id: mate, key: {MATE}, models: ["*"], team: red}}
    - {{id: other, key: {OTHER}, models: ["*"], team: blue}}
    - {{id: red, key: {ALONE}, models: ["*"]}}
teams: {{red: {{models: ["*"]}}, blue: {{models: ["*"]}}}}
providers: {{}}
models: {{}}
files: {{store: "{workdir / "store"}"}}
responses: {{ttl_days: 2}}
"""
    with GatewayProcess(config, workdir) as gw:
        yield gw


def client(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def keep(gateway: GatewayProcess, response_id: str, key_id: str, team: str | None) -> None:
    """Store a response as the gateway's POST /v1/responses does, for the key `key_id`."""
    store = ResponseStore(FileStore(str(gateway.config.parent / "store"), 1), ttl_days=2)
    principal = Principal(key_id, re.compile(".*"), frozenset(), team)
    kept = answer(response_id, created_at=int(time.time()))
    asyncio.run(store.keep(owner(principal), kept, ITEMS, []))


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with client(gateway, KEY) as c:
        yield c


def test_retrieve_list_delete(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    keep(gateway, "resp_e2e1", "one", "red")
    got = sdk.responses.retrieve("resp_e2e1")
    assert (got.id, got.object, got.output_text) == ("resp_e2e1", "response", "Sunny.")
    newest_first = [item.id for item in sdk.responses.input_items.list("resp_e2e1")]
    assert len(newest_first) == len(ITEMS) == len(set(newest_first))
    assert [i.type for i in sdk.responses.input_items.list("resp_e2e1", order="asc")] == [
        i["type"] for i in ITEMS
    ]
    page = sdk.responses.input_items.list("resp_e2e1", limit=2)
    assert [i.id for i in page.data] == newest_first[:2] and page.has_more
    assert [i.id for i in page] == newest_first  # the SDK follows the pages
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.retrieve("resp_e2e1", stream=True)
    assert refused.value.param == "stream"
    sdk.responses.delete("resp_e2e1")
    for call in (
        lambda: sdk.responses.retrieve("resp_e2e1"),
        lambda: sdk.responses.delete("resp_e2e1"),
        lambda: sdk.responses.input_items.list("resp_e2e1"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()


def test_a_response_is_its_teams(gateway: GatewayProcess) -> None:
    keep(gateway, "resp_e2e2", "one", "red")
    with client(gateway, MATE) as mate:
        assert mate.responses.retrieve("resp_e2e2").id == "resp_e2e2"
    for key in (OTHER, ALONE):  # another team; a key named like the team, without one
        with client(gateway, key) as stranger:
            for call in (
                lambda: stranger.responses.retrieve("resp_e2e2"),
                lambda: stranger.responses.input_items.list("resp_e2e2"),
                lambda: stranger.responses.delete("resp_e2e2"),
            ):
                with pytest.raises(openai.NotFoundError):
                    call()


def test_odd_ids_are_404(sdk: openai.OpenAI, gateway: GatewayProcess) -> None:
    for odd in ("resp_../../x", "resp_a.json", "file-1", "resp_" + "a" * 500, "resp_%00"):
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(odd)
    assert not list((gateway.config.parent / "store").rglob("*x*.json"))

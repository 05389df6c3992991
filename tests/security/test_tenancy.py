"""Files and batches stay their owner's: ids that hide a path, and another key's ids, are 404s
(probes that held from the start, kept so that they hold).

Sentinel files sit where a file or batch id with `..` in it would land if it were joined to the
store's paths (`<store>/<owner>/<id>.json`, `<store>/batches/<owner>/<id>.json`): beside the
store, in it, and in its batches. Each is a valid file object whose name is a token; every probe
must be a 404 whose body never holds the token, and afterwards the sentinels are as they were
and no file has appeared outside the owners' own directories (a cancel, say, writes a marker
beside its batch). Alice's file and batch, probed with Bob's key, are 404s and absent from Bob's
listings, and stay as they were for Alice.
"""

from __future__ import annotations

import io
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.gateway_proc import GatewayProcess
from tests.security.held_support import RawResponse, bearer, exchange, json_request, request_bytes

ALICE, BOB = "sk-tenancy-alice", "sk-tenancy-bob"
TOKEN = "SENTINEL-5f0c2e4b-never-served"
ALICE_TOKEN = "ALICE-ONLY-8d1e7c3a"
# The paths a joined id would reach: beside the store, in it, in its batches.
SENTINEL_DIRS = (".", "store", "store/batches")


def _sentinel(name: str) -> dict[str, Any]:
    return {
        "id": "file-secret",
        "object": "file",
        "bytes": len(TOKEN),
        "created_at": 1,
        "expires_at": None,
        "filename": f"{TOKEN}-{name}",
        "purpose": "batch",
        "status": "processed",
    }


@dataclass(frozen=True)
class Site:
    workdir: Path
    gateway: GatewayProcess
    sentinels: dict[Path, bytes]

    def loose_files(self) -> set[Path]:
        """Files outside the owners' directories: beside the store (recursively), and directly
        in the store and in its batches."""
        store = self.workdir / "store"
        beside = {p for p in self.workdir.rglob("*") if p.is_file() and store not in p.parents}
        within = {p for d in (store, store / "batches") for p in d.iterdir() if p.is_file()}
        return beside | within

    def assert_untouched(self) -> None:
        assert {p: p.read_bytes() for p in self.sentinels} == self.sentinels
        assert self.loose_files() == {*self.sentinels, self.gateway.config}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    workdir = tmp_path_factory.mktemp("tenancy")
    sentinels: dict[Path, bytes] = {}
    for where in SENTINEL_DIRS:
        directory = workdir / where
        directory.mkdir(parents=True, exist_ok=True)
        sentinels[directory / "secret.json"] = orjson.dumps(_sentinel(where))
        sentinels[directory / "secret.data"] = TOKEN.encode()
    for path, content in sentinels.items():
        path.write_bytes(content)
    # poll_s: the runner looks for work once, at the start, so a batch made later stays
    # `validating`: one that another key's cancel would visibly change.
    config = f"""
auth:
  keys:
    - {{id: alice, key: {ALICE}, models: ["*"]}}
    - {{id: bob, key: {BOB}, models: ["*"]}}
providers: {{}}
models: {{}}
files: {{store: "{workdir / "store"}"}}
batches: {{poll_s: 3600}}
"""
    with GatewayProcess(config, workdir) as gw:
        yield Site(workdir, gw, sentinels)


def send(site: Site, method: str, target: str, body: dict[str, Any] | None = None) -> RawResponse:
    """One request on a connection of its own, its target as given (no dot segment removed)."""
    if body is not None:
        data = json_request(target, ALICE, body)
    else:
        data = request_bytes(method, target, {**bearer(ALICE), "Connection": "close"})
    (response,) = exchange(site.gateway.port, data, (method,), until_close=False).responses
    return response


def assert_not_found(response: RawResponse) -> None:
    assert response.status == 404, response
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert TOKEN.encode() not in response.body


# ---------------------------------------------------------------- ids that hide a path


def _traversals(workdir: str) -> dict[str, str]:
    """Ids as they appear in a request target, to the sentinels (relative and absolute)."""
    absolute = urllib.parse.quote(f"{workdir}/secret", safe="")
    return {
        "dot-dot": "..",
        "up-one": "../secret",
        "up-two": "../../secret",
        "up-three": "../../../secret",
        "encoded-slash": "..%2f..%2fsecret",
        "encoded-dots": "%2e%2e%2f%2e%2e%2fsecret",
        "mixed-dots": ".%2e/.%2e/secret",
        "encoded-backslash": "..%5c..%5csecret",
        "backslash": "..\\..\\secret",
        "double-encoded": "%252e%252e%252f%252e%252e%252fsecret",
        "prefixed": "file-..%2f..%2fsecret",
        "prefixed-dots": "file-%2e%2e",
        "nul": "file-secret%00",
        "fullwidth-dots": "file-%ef%bc%8e%ef%bc%8e%ef%bc%8fsecret",
        "absolute-encoded": absolute,
        "absolute": f"{workdir}/secret",
        "batch-prefixed": "batch_..%2f..%2f..%2fsecret",
        "batch-backslash": "batch_..\\..\\..\\secret",
    }


TARGETS = {
    "file": ("GET", "/v1/files/{}"),
    "file-content": ("GET", "/v1/files/{}/content"),
    "file-delete": ("DELETE", "/v1/files/{}"),
    "batch": ("GET", "/v1/batches/{}"),
    "batch-cancel": ("POST", "/v1/batches/{}/cancel"),
}


@pytest.mark.parametrize("target", TARGETS)
def test_ids_that_hide_a_path_are_404s_and_reach_nothing(site: Site, target: str) -> None:
    method, template = TARGETS[target]
    for name, hidden in _traversals(str(site.workdir)).items():
        response = send(site, method, template.format(hidden))
        assert response.status == 404, (name, response)
        assert_not_found(response)
    site.assert_untouched()


def test_an_input_file_id_that_hides_a_path_is_a_404(site: Site) -> None:
    for name, hidden in _traversals(str(site.workdir)).items():
        file_id = urllib.parse.unquote(hidden)  # a JSON string: nothing decodes it further
        asked = {
            "input_file_id": file_id,
            "endpoint": "/v1/completions",
            "completion_window": "24h",
        }
        response = send(site, "POST", "/v1/batches", asked)
        assert (response.status, response.json()["error"]["param"]) == (404, "input_file_id"), name
        assert_not_found(response)
    site.assert_untouched()


# ---------------------------------------------------------------- another key's objects


@dataclass(frozen=True)
class Owned:
    file: dict[str, Any]
    batch: dict[str, Any]


@pytest.fixture(scope="module")
def alices(site: Site) -> Owned:
    """Alice's file (holding her token) and a batch on it, as the API shows them to her."""
    with openai.OpenAI(base_url=site.gateway.url + "/v1", api_key=ALICE, max_retries=0) as sdk:
        line = {"custom_id": ALICE_TOKEN, "method": "POST", "url": "/v1/completions", "body": {}}
        made = sdk.files.with_raw_response.create(
            file=(f"{ALICE_TOKEN}.jsonl", io.BytesIO(orjson.dumps(line) + b"\n")),
            purpose="batch",
        )
        file = orjson.loads(made.content)
        batch = sdk.batches.with_raw_response.create(
            input_file_id=file["id"], endpoint="/v1/completions", completion_window="24h"
        )
    owned = Owned(file, orjson.loads(batch.content))
    assert owned.batch["status"] == "validating"
    return owned


@pytest.fixture
def bob(site: Site) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=site.gateway.url, headers=bearer(BOB), trust_env=False) as c:
        yield c


@pytest.fixture
def alice(site: Site) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=site.gateway.url, headers=bearer(ALICE), trust_env=False) as c:
        yield c


def assert_alices_intact(alice: httpx.Client, owned: Owned) -> None:
    """Alice still has her file, its bytes, and her batch, not cancelled."""
    file_id, batch_id = owned.file["id"], owned.batch["id"]
    assert alice.get(f"/v1/files/{file_id}").json() == owned.file
    assert ALICE_TOKEN.encode() in alice.get(f"/v1/files/{file_id}/content").content
    batch = alice.get(f"/v1/batches/{batch_id}").json()
    assert (batch["id"], batch["status"], batch["cancelling_at"]) == (batch_id, "validating", None)


# Bob's calls on Alice's objects: each answered as if they did not exist.
OTHERS: dict[str, tuple[str, str, str]] = {
    "file": ("GET", "/v1/files/{file}", "id"),
    "file-content": ("GET", "/v1/files/{file}/content", "id"),
    "file-delete": ("DELETE", "/v1/files/{file}", "id"),
    "batch": ("GET", "/v1/batches/{batch}", "batch_id"),
    "batch-cancel": ("POST", "/v1/batches/{batch}/cancel", "batch_id"),
}


@pytest.mark.parametrize("call", OTHERS)
def test_another_keys_objects_do_not_exist(
    alices: Owned, alice: httpx.Client, bob: httpx.Client, call: str
) -> None:
    method, template, param = OTHERS[call]
    path = template.format(file=alices.file["id"], batch=alices.batch["id"])
    response = bob.request(method, path)
    assert (response.status_code, response.json()["error"]["param"]) == (404, param)
    assert ALICE_TOKEN.encode() not in response.content
    assert_alices_intact(alice, alices)  # and her calls on the same ids succeed


def test_a_batch_cannot_be_made_from_another_keys_file(
    alices: Owned, alice: httpx.Client, bob: httpx.Client
) -> None:
    asked = {
        "input_file_id": alices.file["id"],
        "endpoint": "/v1/completions",
        "completion_window": "24h",
    }
    response = bob.post("/v1/batches", json=asked)
    assert (response.status_code, response.json()["error"]["param"]) == (404, "input_file_id")
    assert bob.get("/v1/batches").json()["data"] == []
    assert_alices_intact(alice, alices)


# Listings, and which of Alice's objects her own listing shows there (None: none to show).
LISTINGS: dict[str, tuple[str, str | None]] = {
    "files": ("/v1/files", "file"),
    "files-by-purpose": ("/v1/files?purpose=batch", "file"),
    "files-after-hers": ("/v1/files?after={file}", None),
    "batches": ("/v1/batches", "batch"),
}


@pytest.mark.parametrize("listing", LISTINGS)
def test_another_keys_objects_are_not_listed(
    alices: Owned, alice: httpx.Client, bob: httpx.Client, listing: str
) -> None:
    template, hers = LISTINGS[listing]
    path = template.format(file=alices.file["id"])
    if hers is not None:
        shown = [o["id"] for o in alice.get(path).json()["data"]]
        assert shown == [getattr(alices, hers)["id"]]
    response = bob.get(path)
    assert response.status_code == 200
    assert (response.json()["data"], response.json()["has_more"]) == ([], False)
    assert ALICE_TOKEN.encode() not in response.content

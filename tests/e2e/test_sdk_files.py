"""The Files API with the openai SDK, on a gateway of its own with a local store: upload
(streamed, bounded by files.max_bytes), list (purpose, order, limit, after), retrieve, content,
delete, and ownership: another key's files do not exist for a key."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import FilePurpose

from tests.gateway_proc import GatewayProcess

KEY, OTHER = "sk-files-one", "sk-files-two"
MAX_BYTES = 4096
LINES = b"".join(
    b'{"custom_id": "r%d", "method": "POST", "url": "/v1/completions", "body": {}}\n' % i
    for i in range(20)
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("files")
    config = f"""
auth:
  keys:
    - {{id: one, key: {KEY}, models: ["*"]}}
    - {{id: two, key: {OTHER}, models: ["*"]}}
providers: {{}}
models: {{}}
files: {{store: "{workdir / "store"}", max_bytes: {MAX_BYTES}}}
"""
    with GatewayProcess(config, workdir) as gw:
        yield gw


@pytest.fixture
def store(gateway: GatewayProcess) -> Path:
    return gateway.config.parent / "store"


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client
        for f in client.files.list():
            client.files.delete(f.id)


@pytest.fixture
def other(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=OTHER, max_retries=0) as client:
        yield client


def test_upload_retrieve_content_delete(sdk: openai.OpenAI, store: Path) -> None:
    made = sdk.files.create(file=("requests.jsonl", io.BytesIO(LINES)), purpose="batch")
    assert made.id.startswith("file-") and made.object == "file"
    assert (made.bytes, made.filename, made.purpose) == (len(LINES), "requests.jsonl", "batch")
    assert made.expires_at is None and made.status == "processed"
    assert sdk.files.retrieve(made.id) == made
    assert sdk.files.content(made.id).read() == LINES
    stored = list(store.rglob("*.data"))
    assert [p.read_bytes() for p in stored] == [LINES]
    gone = sdk.files.delete(made.id)
    assert (gone.id, gone.deleted) == (made.id, True)
    assert list(store.rglob("*.data")) == []
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.files.retrieve(made.id)
    assert missing.value.body["param"] == "id"  # type: ignore[index]


def test_expires_after(sdk: openai.OpenAI) -> None:
    made = sdk.files.create(
        file=("a.jsonl", io.BytesIO(b"{}\n")),
        purpose="user_data",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert made.expires_at == made.created_at + 3600
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.files.create(
            file=("a.jsonl", io.BytesIO(b"{}\n")),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 10},
        )
    assert bad.value.param == "expires_after.seconds"


def test_listing(sdk: openai.OpenAI) -> None:
    purposes: tuple[FilePurpose, ...] = ("batch", "batch", "user_data", "batch")
    made = [
        sdk.files.create(file=(f"f{i}.jsonl", io.BytesIO(b"{}\n")), purpose=purpose)
        for i, purpose in enumerate(purposes)
    ]
    newest_first = list(reversed([f.id for f in made]))
    assert [f.id for f in sdk.files.list()] == newest_first
    assert [f.id for f in sdk.files.list(order="asc")] == [f.id for f in made]
    batch = [f.id for f in made if f.purpose == "batch"]
    assert [f.id for f in sdk.files.list(purpose="batch", order="asc")] == batch
    page = sdk.files.list(limit=2)
    assert [f.id for f in page.data] == newest_first[:2] and page.has_more
    assert [f.id for f in sdk.files.list(limit=2, after=newest_first[1])] == newest_first[2:]
    assert [f.id for f in sdk.files.list(limit=2)] == newest_first  # the SDK follows the pages


def test_files_belong_to_their_key(sdk: openai.OpenAI, other: openai.OpenAI) -> None:
    made = sdk.files.create(file=("mine.jsonl", io.BytesIO(LINES)), purpose="batch")
    assert list(other.files.list()) == []
    for call in (
        lambda: other.files.retrieve(made.id),
        lambda: other.files.content(made.id),
        lambda: other.files.delete(made.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert sdk.files.retrieve(made.id).id == made.id


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"purpose": "nonsense"}, "purpose"),
        ({"purpose": "batch_output"}, "purpose"),  # the gateway's own, not a caller's
    ],
)
def test_bad_fields_are_400s_naming_them(
    sdk: openai.OpenAI, kw: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), **kw)
    assert bad.value.param == param
    assert list(sdk.files.list()) == []


def test_a_file_name_past_255_characters_is_a_400_naming_file(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.files.create(file=("n" * 250 + ".jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    assert bad.value.param == "file"
    assert list(sdk.files.list()) == []
    kept = sdk.files.create(file=("n" * 249 + ".jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    assert len(kept.filename) == 255


def test_a_file_past_the_limit_is_a_413_and_is_not_kept(
    gateway: GatewayProcess, sdk: openai.OpenAI, store: Path
) -> None:
    big = b"x" * (MAX_BYTES + 1)
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
    assert caught.value.status_code == 413
    assert list(sdk.files.list()) == [] and list(store.rglob("*.data")) == []

    # Streamed without a length: still cut off at the limit.
    def body() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="s"\r\n\r\n'
        for _ in range(8):
            yield b"y" * 1024
        yield b"\r\n--b--\r\n"

    headers = {"authorization": f"Bearer {KEY}", "content-type": "multipart/form-data; boundary=b"}
    resp = httpx.post(gateway.url + "/v1/files", content=body(), headers=headers)
    assert resp.status_code == 413 and resp.json()["error"]["param"] == "file"
    assert list(store.rglob("*.data")) == []


def test_not_multipart_and_no_file(gateway: GatewayProcess) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    resp = httpx.post(gateway.url + "/v1/files", json={"purpose": "batch"}, headers=headers)
    assert resp.status_code == 415 and resp.json()["error"]["param"] == "content-type"
    form = {"purpose": (None, "batch")}
    resp = httpx.post(gateway.url + "/v1/files", files=form, headers=headers)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"
    resp = httpx.get(gateway.url + "/v1/files", params={"limit": 0}, headers=headers)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "limit"
    resp = httpx.get(gateway.url + "/v1/files/file-x/other", headers=headers)
    assert resp.status_code == 404
    assert httpx.get(gateway.url + "/v1/files").status_code == 401

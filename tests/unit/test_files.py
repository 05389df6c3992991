"""Files without HTTP: the upload's fields and a listing's query as OpenAI checks them, the
`files:` and `batches:` config blocks, the store (local directory), the streaming multipart reader,
and the batches' records, line answers, cancel markers and leases in the store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.errors import (
    ConfigError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
)
from core.files import ListQuery, list_query, upload
from gateway import config
from gateway.batchstore import BatchStore
from gateway.filestore import FileStore, check_store, file_object, owner_of
from gateway.http import Message
from gateway.uploads import Form, file_bytes, parser_for

# ---------------------------------------------------------------- the requests


def test_upload_fields() -> None:
    assert upload({"purpose": "batch"}).expires_after is None
    asked = upload(
        {
            "purpose": "user_data",
            "expires_after[anchor]": "created_at",
            "expires_after[seconds]": "7200",
        }
    )
    assert (asked.purpose, asked.expires_after) == ("user_data", 7200)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "purpose"),
        ({"purpose": "batch_output"}, "purpose"),
        ({"purpose": "batch", "expires_after[seconds]": "7200"}, "expires_after.anchor"),
        (
            {
                "purpose": "batch",
                "expires_after[anchor]": "created_at",
                "expires_after[seconds]": "x",
            },
            "expires_after.seconds",
        ),
        (
            {
                "purpose": "batch",
                "expires_after[anchor]": "created_at",
                "expires_after[seconds]": str(31 * 24 * 3600),
            },
            "expires_after.seconds",
        ),
    ],
)
def test_bad_upload_fields(fields: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        upload(fields)
    assert exc.value.param == param


def test_list_query() -> None:
    assert list_query({}) == ListQuery(None, 10_000, "desc", None)
    assert list_query({"purpose": "batch", "limit": "5", "order": "asc", "after": "file-1"}) == (
        ListQuery("batch", 5, "asc", "file-1")
    )
    for params, param in (({"limit": "0"}, "limit"), ({"order": "up"}, "order")):
        with pytest.raises(InvalidRequest) as exc:
            list_query(params)
        assert exc.value.param == param


def test_the_files_block() -> None:
    base = "auth: {keys: []}\n"
    assert config.parse(base).files == config.FilesConfig()
    parsed = config.parse(base + "files: {store: s3://bucket/prefix, max_bytes: 1000}").files
    assert (parsed.store, parsed.max_bytes) == ("s3://bucket/prefix", 1000)
    for block, path in (
        ("files: {store: ftp://x}", "files.store"),
        ("files: {max_bytes: 0}", "files.max_bytes"),
        ("files: {where: x}", "files"),
    ):
        with pytest.raises(ConfigError) as exc:
            config.parse(base + block)
        assert exc.value.path.startswith(path)


def test_the_batches_block() -> None:
    base = "auth: {keys: []}\n"
    assert config.parse(base).batches == config.BatchesConfig()
    parsed = config.parse(base + "batches: {max_concurrency: 8, live_concurrency: 2}").batches
    assert (parsed.max_concurrency, parsed.live_concurrency) == (8, 2)
    parsed = config.parse(base + "batches: {max_concurrency: 2, window_s: 60, lease_s: 5}").batches
    assert (parsed.max_concurrency, parsed.window_s, parsed.lease_s) == (2, 60, 5)
    for block, path in (
        ("batches: {max_concurrency: 0}", "batches.max_concurrency"),
        ("batches: {max_concurrency: 2, live_concurrency: 3}", "batches.live_concurrency"),
        ("batches: {live_concurrency: 0}", "batches.live_concurrency"),
        ("batches: {lease_s: 0.5}", "batches.lease_s"),
        ("batches: {poll_s: 0}", "batches.poll_s"),
        ("batches: {window_s: 1.5}", "batches.window_s"),
        ("batches: {every: 1}", "batches"),
    ):
        with pytest.raises(ConfigError) as exc:
            config.parse(base + block)
        assert exc.value.path.startswith(path), block


def test_check_store_stores_nothing(tmp_path: Path) -> None:
    assert "made when the first file is stored" in check_store(str(tmp_path / "a" / "b"))
    assert not (tmp_path / "a").exists()
    assert check_store(str(tmp_path)) == f"the directory {tmp_path}"
    assert check_store("memory:///") == "the object store memory:///"
    (tmp_path / "file").write_text("")
    for bad in (str(tmp_path / "file"), str(tmp_path / "file" / "x"), "s3://", "ftp://x"):
        with pytest.raises(ConfigError) as exc:
            check_store(bad)
        assert exc.value.path == "files.store" and "\n" not in exc.value.message


# ---------------------------------------------------------------- the store


async def pieces(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@pytest.mark.asyncio
async def test_the_store(tmp_path: Path) -> None:
    files = FileStore(str(tmp_path / "store"), max_bytes=10)
    assert not (tmp_path / "store").exists()  # opened when first used
    owner = owner_of("key-a")
    file_id, size = await files.put(owner, pieces(b"abc", b"def"))
    assert size == 6
    made = file_object(file_id, size, "a.jsonl", "batch", None)
    await files.describe(owner, made)
    assert await files.get(owner, file_id) == made
    assert b"".join([p async for p in await files.content(owner, file_id)]) == b"abcdef"
    with pytest.raises(NotFound):
        await files.get(owner_of("key-b"), file_id)
    with pytest.raises(NotFound):
        await files.get(owner, "../" + file_id)
    with pytest.raises(PayloadTooLarge):
        await files.put(owner, pieces(b"x" * 6, b"y" * 6))
    assert len(list((tmp_path / "store").rglob("*.data"))) == 1  # the refused one is not kept
    await files.delete(owner, file_id)
    assert list((tmp_path / "store").rglob("*")) == [tmp_path / "store" / owner]
    listed, more = await files.listing(owner, ListQuery(None, 10, "desc", None))
    assert (listed, more) == ([], False)


@pytest.mark.asyncio
async def test_an_expired_file_is_gone(tmp_path: Path) -> None:
    files = FileStore(str(tmp_path), max_bytes=10)
    file_id, size = await files.put("o", pieces(b"a"))
    made = file_object(file_id, size, "a", "batch", 3600)
    await files.describe("o", {**made, "expires_at": made["created_at"] - 1})
    with pytest.raises(NotFound):
        await files.get("o", file_id)


# ---------------------------------------------------------------- uploads


def receiver(body: bytes, size: int) -> Any:
    chunks = [body[i : i + size] for i in range(0, len(body), size)]

    async def receive() -> Message:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    return receive


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [1, 7, 10_000])
async def test_a_form_read_as_it_comes(size: int) -> None:
    content = b"line one\r\n--not the boundary\r\nline two\n" * 50
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + content + b"\r\n--XyZ--\r\n"
    )
    form = Form()
    parser = parser_for("multipart/form-data; boundary=XyZ", form)
    got = b"".join([c async for c in file_bytes(receiver(body, size), parser, form)])
    assert got == content
    assert (form.fields, form.filename, form.seen_file) == ({"purpose": "batch"}, "in.jsonl", True)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "body",
    [b"--XyZ\r\nNone--XyZ--\r\n", b"no boundary at all", b"--XyZ\r\nbroken header\r\n\r\nx"],
)
async def test_a_body_that_is_not_multipart_is_a_400_naming_file(body: bytes) -> None:
    """Found by fuzzing: the parser's own error was a 500."""
    form = Form()
    parser = parser_for("multipart/form-data; boundary=XyZ", form)
    with pytest.raises(InvalidRequest) as exc:
        _ = [c async for c in file_bytes(receiver(body, 5), parser, form)]
    assert exc.value.param == "file" and "cannot be parsed" in exc.value.message


@pytest.mark.asyncio
async def test_a_store_that_cannot_be_made_is_a_503(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    files = FileStore(str(blocked / "store"), max_bytes=10)
    with pytest.raises(ServiceUnavailable) as exc:
        await files.put("o", pieces(b"a"))
    assert "cannot be used" in exc.value.message


# ---------------------------------------------------------------- batches' records and leases


def record(batch_id: str = "batch_0001") -> Any:
    return {"batch": {"id": batch_id, "status": "in_progress"}, "key_id": "k", "owner": "o"}


@pytest.mark.asyncio
async def test_records_lines_and_cancel_markers(tmp_path: Path) -> None:
    store = BatchStore(FileStore(str(tmp_path), max_bytes=10))
    one, two = record("batch_0001"), record("batch_0002")
    for r in (one, two):
        await store.save(r)
    assert sorted(r["batch"]["id"] for r in await store.records("o")) == [
        "batch_0001",
        "batch_0002",
    ]
    assert await store.load("o", "batch_0001") == one
    assert await store.load("o", "../x") is None and await store.load("p", "batch_0001") is None
    await store.put_answers(one, [(3, True, b'"three"'), (1, False, b'"one"')])
    await store.put_answers(one, [(4, True, b'"four"'), (1, True, b'"one again"')])  # run twice
    assert await store.finished(one) == {1, 3, 4}
    answers = [answer async for answer in store.answers(one)]
    assert len(answers) == 3 and (3, True, b'"three"') in answers
    assert (4, True, b'"four"') in answers
    assert await store.finished(two) == set()
    assert await store.under_way() == []  # saved "in_progress", never "validating": not new
    validating: Any = {**two, "batch": {"id": "batch_0002", "status": "validating"}}
    await store.save(validating)
    assert [r["batch"]["id"] for r in await store.under_way()] == ["batch_0002"]
    completed: Any = {**two, "batch": {"id": "batch_0002", "status": "completed"}}
    await store.save(completed)
    assert await store.under_way() == []
    assert await store.cancel_requested(one) is None
    await store.request_cancel(one, 123)
    assert await store.cancel_requested(one) == 123


@pytest.mark.asyncio
async def test_looking_for_batches_makes_no_directory(tmp_path: Path) -> None:
    store = BatchStore(FileStore(str(tmp_path / "never"), max_bytes=10))
    assert await store.under_way() == []
    assert not (tmp_path / "never").exists()

"""Files without HTTP: the upload's fields and a listing's query as OpenAI checks them, the
`files:` and `batches:` config blocks, the store (local directory), the streaming multipart reader,
and the batches' records, line answers, cancel markers and leases in the store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import (
    ConfigError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    UnsupportedMediaType,
)
from core.files import ListQuery, is_file_id, list_query, new_file_id, upload
from gateway import config
from gateway.asgi import Message
from gateway.jobs.batchstore import BatchStore
from gateway.jobs.filestore import FileStore, check_store, file_object, owner_of
from gateway.jobs.uploads import (
    BOUNDARY_PARAM,
    MAX_BOUNDARY_CHARS,
    MAX_FIELD_BYTES,
    MAX_FILENAME_CHARS,
    Form,
    file_bytes,
    parser_for,
)
from tests.odd_ids import WIDE_DIGIT, odd_ids

# A digit to str.isalnum() (MATHEMATICAL DOUBLE-STRUCK DIGIT ZERO), four bytes in UTF-8.


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


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": "²"}, "limit"),  # str.isdigit() takes it, int() does not: it was a 500
        ({"limit": "--5"}, "limit"),  # "-" stripped, then int() refused it: a 500
        ({"limit": "9" * 5000}, "limit"),  # past int()'s 4,300 digits: a 500
        ({"limit": "٣"}, "limit"),
        ({"purpose": "p" * 65}, "purpose"),
    ],
)
def test_odd_listing_queries_are_400s_naming_them(params: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        list_query(params)
    assert exc.value.param == param


def test_an_after_of_no_file_starts_an_empty_page() -> None:
    """It is only compared with the listed ids: any string will do, none reaches the store."""
    for after in ("../x", "\x00", "file-" + "a" * 10_000):
        assert list_query({"after": after}).after == after


@pytest.mark.parametrize("seconds", ["²", "--3600", "3" * 5000, " 3600"])
def test_odd_expiry_seconds_are_400s(seconds: str) -> None:
    fields = {"purpose": "batch", "expires_after[anchor]": "created_at"}
    with pytest.raises(InvalidRequest) as exc:
        upload({**fields, "expires_after[seconds]": seconds})
    assert exc.value.param == "expires_after.seconds"


def test_file_ids_have_the_shape_the_gateway_makes() -> None:
    assert is_file_id(new_file_id())
    made = new_file_id()
    for odd in (
        "file-" + "a" * 24 + "\x00",
        "file-" + "A" * 24,
        "file-" + WIDE_DIGIT * 24,  # of 96 bytes
        "file-" + "a" * 500,
        made + "/../x",
        made[:-1],
        "",
        "../" + made,
    ):
        assert not is_file_id(odd), odd


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


ODD_IDS = odd_ids(10_000)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(odd=ODD_IDS)
@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["directory", "memory:///"])
async def test_an_odd_id_is_a_404_on_every_store(tmp_path: Path, where: str, odd: str) -> None:
    """Ids of any characters and length (NUL, slashes, dots, %-encodings, 10,000 characters):
    a file's is a 404 and a batch's is None, never the store's own error (a 500)."""
    files = FileStore(str(tmp_path) if where == "directory" else where, max_bytes=10)
    file_id, _ = await files.put("o", pieces(b"x"))  # the store is there: the ids are looked for
    await files.describe("o", file_object(file_id, 1, "a", "batch", None))
    for call in (files.get, files.content, files.delete):
        with pytest.raises(NotFound) as exc:
            await call("o", odd)
        assert exc.value.param == "id" and len(exc.value.message) < 150
    assert await BatchStore(files).load("o", odd) is None
    assert (await files.get("o", file_id))["id"] == file_id


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


def form(*parts: bytes, boundary: bytes = b"XyZ") -> bytes:
    return b"".join(b"--" + boundary + b"\r\n" + part + b"\r\n" for part in parts) + (
        b"--" + boundary + b"--\r\n"
    )


FILE_PART = b'Content-Disposition: form-data; name="file"; filename="a"\r\n\r\nx'


@pytest.mark.parametrize("length", [MAX_BOUNDARY_CHARS + 1, 256, 300, 10_000])
def test_a_long_boundary_is_a_400_naming_it(length: int) -> None:
    """python-multipart refuses one over 256 characters with its own error: that was a 500."""
    with pytest.raises(InvalidRequest) as exc:
        parser_for(f"multipart/form-data; boundary={'b' * length}", Form())
    assert exc.value.param == BOUNDARY_PARAM and "boundary" in exc.value.message


@pytest.mark.asyncio
async def test_the_longest_boundary_is_read() -> None:
    boundary = b"b" * MAX_BOUNDARY_CHARS
    body = form(FILE_PART, boundary=boundary)
    got = Form()
    parser = parser_for(f"multipart/form-data; boundary={boundary.decode()}", got)
    assert b"".join([c async for c in file_bytes(receiver(body, 7), parser, got)]) == b"x"


@pytest.mark.asyncio
async def test_a_long_file_name_is_a_400_naming_file() -> None:
    named = b'Content-Disposition: form-data; name="file"; filename="%s"\r\n\r\nx'
    got = Form()
    parser = parser_for("multipart/form-data; boundary=XyZ", got)
    body = form(named % (b"n" * (MAX_FILENAME_CHARS + 1)))
    with pytest.raises(InvalidRequest) as exc:
        _ = [c async for c in file_bytes(receiver(body, 4096), parser, got)]
    assert exc.value.param == "file" and "name" in exc.value.message
    got = Form()
    parser = parser_for("multipart/form-data; boundary=XyZ", got)
    body = form(named % (b"n" * MAX_FILENAME_CHARS))
    _ = [c async for c in file_bytes(receiver(body, 4096), parser, got)]
    assert got.filename == "n" * MAX_FILENAME_CHARS


@pytest.mark.asyncio
async def test_many_small_fields_are_bounded_too() -> None:
    """Each part's headers count against the fields' bytes (python-multipart bounds one part's
    headers, not how many parts there are): ten thousand empty fields are a 413, not kept."""
    empty = [b'Content-Disposition: form-data; name="f%d"\r\n\r\n' % i for i in range(10_000)]
    got = Form()
    parser = parser_for("multipart/form-data; boundary=XyZ", got)
    with pytest.raises(PayloadTooLarge):
        _ = [c async for c in file_bytes(receiver(form(*empty), 65_536), parser, got)]
    assert len(got.fields) < MAX_FIELD_BYTES // 40


@settings(max_examples=300, deadline=None)
@given(
    content_type=st.one_of(
        st.text(alphabet=st.characters(max_codepoint=255), max_size=120),
        st.builds(
            lambda s: "multipart/form-data; " + s,
            st.text(alphabet=st.characters(max_codepoint=255), max_size=400),
        ),
    ),
    body=st.binary(max_size=600),
)
@pytest.mark.asyncio
async def test_any_content_type_and_body_is_a_4xx_or_read(content_type: str, body: bytes) -> None:
    """Whatever the Content-Type's parameters (latin-1, as headers are decoded) and the body:
    the form is read, or it is one of the gateway's 4xx errors, never the parser's own."""
    got = Form()
    try:
        parser = parser_for(content_type, got)
        _ = [c async for c in file_bytes(receiver(body or b"", 64), parser, got)]
    except (InvalidRequest, PayloadTooLarge, UnsupportedMediaType) as exc:
        assert 400 <= exc.status < 500


@pytest.mark.asyncio
async def test_a_store_that_cannot_be_made_is_a_503(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    files = FileStore(str(blocked / "store"), max_bytes=10)
    with pytest.raises(ServiceUnavailable) as exc:
        await files.put("o", pieces(b"a"))
    assert "cannot be used" in exc.value.message


# ---------------------------------------------------------------- batches' records and leases


ONE, TWO = "batch_0000000000000001deadbeef", "batch_0000000000000002deadbeef"


def record(batch_id: str = ONE) -> Any:
    return {"batch": {"id": batch_id, "status": "in_progress"}, "key_id": "k", "owner": "o"}


@pytest.mark.asyncio
async def test_records_lines_and_cancel_markers(tmp_path: Path) -> None:
    store = BatchStore(FileStore(str(tmp_path), max_bytes=10))
    one, two = record(ONE), record(TWO)
    for r in (one, two):
        await store.save(r)
    assert sorted(r["batch"]["id"] for r in await store.records("o")) == [ONE, TWO]
    assert sorted(await store.ids("o")) == [ONE, TWO]
    assert await store.load("o", ONE) == one
    assert await store.load("o", "../x") is None and await store.load("p", ONE) is None
    await store.put_answers(one, [(3, True, b'"three"'), (1, False, b'"one"')])
    await store.put_answers(one, [(4, True, b'"four"'), (1, True, b'"one again"')])  # run twice
    assert await store.finished(one) == {1, 3, 4}
    answers = [answer async for answer in store.answers(one)]
    assert len(answers) == 3 and (3, True, b'"three"') in answers
    assert (4, True, b'"four"') in answers
    assert await store.finished(two) == set()
    assert await store.under_way() == []  # saved "in_progress", never "validating": not new
    validating: Any = {**two, "batch": {"id": TWO, "status": "validating"}}
    await store.save(validating)
    assert [r["batch"]["id"] for r in await store.under_way()] == [TWO]
    completed: Any = {**two, "batch": {"id": TWO, "status": "completed"}}
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

"""The Batch API's request and the checks of an input file's lines, as OpenAI makes them: each
bad line named in `errors.data` with a code, a message, the field and the line number; and the
runner's room for lines, which yields to live requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from core.batches import (
    MAX_ERRORS_SHOWN,
    MAX_LINES,
    CreateBatch,
    LineCheck,
    check_lines,
    create_batch,
    is_batch_id,
    list_query,
    new_batch_id,
)
from core.errors import InvalidRequest
from core.files import ListQuery
from gateway import config
from gateway.jobs.batches import Run, Runner, shown
from gateway.jobs.batchstore import BatchStore
from gateway.jobs.filestore import file_object
from gateway.runtime import Runtime

URL = "/v1/chat/completions"
BATCH_ID = "batch_0000000000000001deadbeef"  # of the shape the gateway makes (new_batch_id)
# A digit to str.isalnum() (MATHEMATICAL DOUBLE-STRUCK DIGIT ZERO), four bytes in UTF-8.
WIDE_DIGIT = "\U0001d7d8"


def line(custom_id: str = "a", **over: Any) -> bytes:
    data = {
        "custom_id": custom_id,
        "method": "POST",
        "url": URL,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    return orjson.dumps({**data, **over})


def test_create_batch() -> None:
    body = {"input_file_id": "file-1", "endpoint": URL, "completion_window": "24h"}
    assert create_batch(body) == CreateBatch("file-1", URL, "24h", None)
    assert create_batch({**body, "metadata": {"team": "eval"}}).metadata == {"team": "eval"}


@pytest.mark.parametrize(
    ("over", "param"),
    [
        ({"input_file_id": None}, "input_file_id"),
        ({"input_file_id": 3}, "input_file_id"),
        ({"endpoint": "/v1/images"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"metadata": {str(i): "x" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata.k"),
    ],
)
def test_bad_batches_are_400s_naming_the_field(over: dict[str, Any], param: str) -> None:
    body = {"input_file_id": "file-1", "endpoint": URL, "completion_window": "24h", **over}
    with pytest.raises(InvalidRequest) as exc:
        create_batch({k: v for k, v in body.items() if v is not None})
    assert exc.value.param == param


def test_good_lines() -> None:
    checked = check_lines([line("a"), b"", b"  \n", line("b")], URL)
    assert checked.errors == []
    assert [(x.number, x.custom_id) for x in checked.lines] == [(1, "a"), (4, "b")]
    assert checked.model == "m"


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"{not json", "invalid_json_line", None),
        (b"[1, 2]", "invalid_json_line", None),
        (line("a"), "duplicate_custom_id", "custom_id"),
        (line("b", method="GET"), "invalid_method", "method"),
        (line("b", url="/v1/embeddings"), "mismatched_endpoint", "url"),
        (line("b", body="text"), "invalid_body", "body"),
        (line("b", body={"messages": []}), "missing_required_parameter", "body.model"),
        (line("b", body={"model": "other"}), "mismatched_model", "body.model"),
        (line(""), "missing_required_parameter", None),
    ],
)
def test_each_bad_line_is_named(raw: bytes, code: str, param: str | None) -> None:
    checked = check_lines([line("a"), raw, line("c")], URL)
    assert [(e["code"], e["param"], e["line"]) for e in checked.errors] == [(code, param, 2)]
    assert [x.custom_id for x in checked.lines] == ["a", "c"]


def test_several_problems_of_one_line() -> None:
    checked = check_lines([line("a", method="PUT", url="/x")], URL)
    assert [(e["code"], e["line"]) for e in checked.errors] == [
        ("invalid_method", 1),
        ("mismatched_endpoint", 1),
    ]


def test_an_empty_file_and_too_many_lines() -> None:
    assert [e["code"] for e in check_lines([b"", b"\n"], URL).errors] == ["empty_file"]
    many = (line(str(i)) for i in range(MAX_LINES + 1))
    checked = check_lines(many, URL)
    assert [(e["code"], e["line"]) for e in checked.errors] == [("too_many_lines", MAX_LINES + 1)]


def test_a_file_of_many_bad_lines_keeps_the_first_errors_and_counts_them() -> None:
    """10,000 errors held and shown whole made a 1 MB batch object."""
    n = 3 * MAX_ERRORS_SHOWN
    checked = check_lines([b"{oops"] * n + [line("a", method="GET", url="/x")], URL)
    assert len(checked.errors) == MAX_ERRORS_SHOWN and checked.error_count == n + 2
    assert [e["line"] for e in checked.errors] == list(range(1, MAX_ERRORS_SHOWN + 1))


def test_each_lines_errors_are_there_as_it_is_read() -> None:
    check = LineCheck(URL)
    steps = []
    for raw in (line("a"), b"{oops", line("b", method="GET", url="/x"), b""):
        check.feed(raw)
        steps.append(([e["code"] for e in check.fresh], check.custom_id))
    assert steps == [
        ([], "a"),
        (["invalid_json_line"], None),
        (["invalid_method", "mismatched_endpoint"], "b"),
        ([], None),
    ]
    check.done()
    assert check.fresh == []
    empty = LineCheck(URL)
    empty.done()
    assert [e["code"] for e in empty.fresh] == ["empty_file"]


def test_batch_ids_have_the_shape_the_gateway_makes() -> None:
    assert is_batch_id(new_batch_id())
    wide = "batch_" + WIDE_DIGIT * 24
    for odd in ("batch_" + "a" * 500, wide, "batch_..", "", new_batch_id() + "\x00"):
        assert not is_batch_id(odd), odd


@pytest.mark.parametrize("limit", ["0", "101", "²", "٣", "-1", "9" * 5000, "", " 5"])
def test_a_bad_listing_limit_is_a_400_naming_it(limit: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        list_query({"limit": limit})
    assert exc.value.param == "limit"


def test_listing_query() -> None:
    assert (list_query({}).limit, list_query({}).after) == (20, None)
    assert list_query({"limit": "100", "after": "x" * 10_000}).limit == 100


# ---------------------------------------------------------------- the runner's room for lines


async def holders(
    runner: Runner, n: int, release: asyncio.Event
) -> tuple[list[int], list[asyncio.Task[None]]]:
    """n lines asking for a slot, each holding it until `release`; how many got one so far."""
    got: list[int] = []

    async def line(i: int) -> None:
        async with runner.line_slot():
            got.append(i)
            await release.wait()

    tasks = [asyncio.create_task(line(i)) for i in range(n)]
    for _ in range(10):  # let every task run up to its wait
        await asyncio.sleep(0)
    return got, tasks


@pytest.mark.asyncio
async def test_lines_yield_to_live_requests() -> None:
    """`max_concurrency` lines in flight while nothing else is served; while a live request is,
    new lines wait until fewer than `live_concurrency` are in flight."""
    text = "auth: {keys: []}\nbatches: {max_concurrency: 3, live_concurrency: 1}\n"
    rt = Runtime.build(config.parse(text))
    runner = Runner(lambda: rt)
    release = asyncio.Event()
    got, tasks = await holders(runner, 5, release)
    assert got == [0, 1, 2]  # idle: max_concurrency
    rt.live = 1  # a live request arrives
    release.set()
    await asyncio.sleep(0)
    release.clear()
    for _ in range(10):
        await asyncio.sleep(0)
    assert got == [0, 1, 2, 3]  # the other waits: one line at a time while live work is served
    rt.live = 0
    release.set()
    await asyncio.gather(*tasks)
    assert got == [0, 1, 2, 3, 4]
    await runner.leases.aclose()


# ---------------------------------------------------------------- the output files


@pytest.mark.asyncio
async def test_output_files_written_again_replace_the_first(tmp_path: Path) -> None:
    """A runner that dies while writing a batch's files writes the same two again (their ids
    are in the record beforehand), whatever their size (the upload limit is not theirs)."""
    text = f"auth: {{keys: []}}\nfiles: {{store: {tmp_path}, max_bytes: 10}}\n"
    rt = Runtime.build(config.parse(text))
    runner = Runner(lambda: rt)
    record: Any = {
        "batch": {"id": BATCH_ID, "status": "in_progress", "request_counts": {}},
        "key_id": "k",
        "owner": "o",
    }
    store = BatchStore(rt.files)
    await store.save(record)
    for number, status in ((1, 200), (2, 400), (3, 200)):
        answer = {"custom_id": f"c{number}", "response": {"status_code": status, "body": "x" * 50}}
        await store.put_answers(record, [(number, status == 200, orjson.dumps(answer))])
    run = Run(runner, record)
    first = await run._files([])
    loaded = await store.load("o", BATCH_ID)
    assert loaded is not None
    again = await Run(runner, loaded)._files([])
    output_id, error_id = first
    assert first == again and output_id is not None and error_id is not None
    listed, _ = await rt.files.listing("o", ListQuery(None, 100, "asc", None))
    assert sorted(f["id"] for f in listed) == sorted([output_id, error_id])  # two files, not four
    output = b"".join([piece async for piece in await rt.files.content("o", output_id)])
    assert sorted(orjson.loads(x)["custom_id"] for x in output.splitlines()) == ["c1", "c3"]
    assert record["batch"]["request_counts"] == {"completed": 2, "failed": 1}
    await runner.leases.aclose()


# ---------------------------------------------------------------- a file that fails its checks


@pytest.mark.asyncio
async def test_a_failed_batch_shows_1000_errors_and_its_error_file_has_them_all(
    tmp_path: Path,
) -> None:
    text = f"auth: {{keys: []}}\nfiles: {{store: {tmp_path}, max_bytes: 1000000}}\n"
    rt = Runtime.build(config.parse(text))
    runner = Runner(lambda: rt)
    n = MAX_ERRORS_SHOWN + 500
    content = b"\n".join([line("ok")] + [line(f"c{i}", method="GET") for i in range(n)])

    async def chunks() -> Any:
        for at in range(0, len(content), 1000):  # lines spread over pieces
            yield content[at : at + 1000]

    file_id, size = await rt.files.put("o", chunks())
    await rt.files.describe("o", file_object(file_id, size, "in.jsonl", "batch", None))
    batch: Any = {
        "id": BATCH_ID,
        "endpoint": URL,
        "input_file_id": file_id,
        "status": "validating",
        "errors": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
    }
    record: Any = {"batch": batch, "key_id": "k", "owner": "o"}
    await Run(runner, record).carry_out()
    loaded = await BatchStore(rt.files).load("o", BATCH_ID)
    assert loaded is not None
    done = loaded["batch"]
    assert done["status"] == "failed" and done["errors"] is not None
    assert len(done["errors"]["data"]) == MAX_ERRORS_SHOWN and done["errors"]["total"] == n
    assert done["error_file_id"] is not None
    raw = b"".join([p async for p in await rt.files.content("o", done["error_file_id"])])
    got = [orjson.loads(x) for x in raw.splitlines()]
    assert [(x["custom_id"], x["error"]["line"], x["error"]["code"]) for x in got] == [
        (f"c{i}", i + 2, "invalid_method") for i in range(n)
    ]
    assert {x["response"] for x in got} == {None}
    assert (await rt.files.get("o", done["error_file_id"]))["purpose"] == "batch_output"
    await runner.leases.aclose()


@pytest.mark.asyncio
async def test_a_batch_stored_with_all_its_errors_is_shown_with_the_first(tmp_path: Path) -> None:
    """A record written before the errors were bounded: its object is bounded when shown."""
    store = BatchStore(
        Runtime.build(config.parse(f"auth: {{keys: []}}\nfiles: {{store: {tmp_path}}}\n")).files
    )
    error = {"code": "invalid_json_line", "message": "m", "param": None, "line": 1}
    batch: Any = {
        "id": BATCH_ID,
        "status": "failed",
        "errors": {"object": "list", "data": [error] * (MAX_ERRORS_SHOWN * 2)},
    }
    seen = await shown(store, {"batch": batch, "key_id": "k", "owner": "o"})
    assert seen["errors"] is not None
    assert len(seen["errors"]["data"]) == MAX_ERRORS_SHOWN
    assert seen["errors"]["total"] == MAX_ERRORS_SHOWN * 2

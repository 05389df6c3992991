"""The Batch API's request and the checks of an input file's lines, as OpenAI makes them: each
bad line named in `errors.data` with a code, a message, the field and the line number; and the
runner's room for lines, which yields to live requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from core.batches import MAX_LINES, CreateBatch, check_lines, create_batch
from core.errors import InvalidRequest
from core.files import ListQuery
from gateway import config
from gateway.batches import Run, Runner
from gateway.batchstore import BatchStore
from gateway.runtime import Runtime

URL = "/v1/chat/completions"


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
        "batch": {"id": "batch_01", "status": "in_progress", "request_counts": {}},
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
    loaded = await store.load("o", "batch_01")
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

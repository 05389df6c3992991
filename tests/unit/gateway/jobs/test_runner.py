"""gateway.jobs.runner: its room for lines beside live requests, its output files, a file that fails
its checks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from core.batches import MAX_ERRORS_SHOWN
from core.files import ListQuery
from gateway import config
from gateway.jobs.batchstore import BatchStore
from gateway.jobs.filestore import file_object
from gateway.jobs.runner import Run, Runner
from gateway.pipeline.stages import Pipeline
from gateway.runtime import Runtime
from tests.unit.core.test_batches import BATCH_ID, URL, line

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
    runner = Runner(lambda: rt, Pipeline().lines())
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
    runner = Runner(lambda: rt, Pipeline().lines())
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
    runner = Runner(lambda: rt, Pipeline().lines())
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

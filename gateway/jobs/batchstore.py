"""Where batches live, in the file store's object store: each batch's record
(`batches/<owner>/<id>.json`: its `batch` object and the key it runs for) and each finished
line's answer (under `batches/<owner>/<id>/`, the lines that finished together in one object),
stored before the line counts as done, so that a gateway started again goes on where it was and
runs no finished line twice. A batch id a caller sends becomes a name in the store only if it has
the shape of the ids the gateway makes (`core.batches.BATCH_IDS`): any other cannot exist."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import NotRequired, TypedDict

import obstore
import orjson

from core.batches import BatchObject, is_batch_id
from gateway.jobs.filestore import FileStore

ROOT = "batches"
UNDER_WAY = "batches-under-way"  # one empty object per batch with work left: what runners list
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
# Stored answers read at once: each read is a round trip to the store (a file, or an object
# store's request); one at a time, a 10,000-line batch's ~1,500 reads took most of its
# finalizing.
READS_AT_ONCE = 32


# A finished line's answer: its number, whether it succeeded (a 200) and its JSON.
Answer = tuple[int, bool, bytes]


class Record(TypedDict):
    batch: BatchObject
    key_id: str  # the key it was created with: its lines run as that key's requests
    owner: str
    # The output and error files' ids, chosen before they are written: a runner that dies while
    # writing them writes the same files again, not a second pair.
    files: NotRequired[dict[str, str]]


class BatchStore:
    def __init__(self, files: FileStore) -> None:
        self.files = files

    async def save(self, record: Record) -> None:
        batch = record["batch"]
        path = f"{ROOT}/{record['owner']}/{batch['id']}.json"
        mark = f"{UNDER_WAY}/{record['owner']}/{batch['id']}"
        if batch["status"] == "validating":  # new: runners will find it
            await obstore.put_async(self.files.store, mark, b"")
        await obstore.put_async(self.files.store, path, orjson.dumps(record))
        if batch["status"] not in ACTIVE:  # over: no runner needs to look at it again
            with contextlib.suppress(FileNotFoundError):
                await obstore.delete_async(self.files.store, mark)

    async def under_way(self) -> list[Record]:
        """The batches with work left, of every owner."""
        if not self.files.present():
            return []
        out: list[Record] = []
        async for batch in obstore.list(self.files.store, prefix=f"{UNDER_WAY}/"):
            for meta in batch:
                _, owner, batch_id = meta["path"].split("/")
                record = await self.load(owner, batch_id)
                if record is not None:
                    out.append(record)
        return out

    async def load(self, owner: str, batch_id: str) -> Record | None:
        """The batch's record; None for an id of no batch."""
        if not is_batch_id(batch_id):  # not an id the gateway makes: no such batch, store unasked
            return None
        try:
            found = await obstore.get_async(self.files.store, f"{ROOT}/{owner}/{batch_id}.json")
        except FileNotFoundError:
            return None
        record: Record = orjson.loads(bytes(await found.bytes_async()))
        return record

    async def records(self, owner: str) -> list[Record]:
        """The batches of one owner."""
        out: list[Record] = []
        for batch_id in await self.ids(owner):
            record = await self.load(owner, batch_id)
            if record is not None:
                out.append(record)
        return out

    async def ids(self, owner: str) -> list[str]:
        """The ids of one owner's batches, from the store's listing alone (a listing reads the
        records of its page only: a failed batch's record may hold a thousand errors)."""
        if not self.files.present():
            return []
        prefix = f"{ROOT}/{owner}/"
        out: list[str] = []
        async for batch in obstore.list(self.files.store, prefix=prefix):
            for meta in batch:
                path = meta["path"]
                if path.endswith(".json") and path.count("/") == 2:
                    out.append(path.removeprefix(prefix).removesuffix(".json"))
        return out

    async def request_cancel(self, record: Record, at: int) -> None:
        """A cancel is a marker of its own: while a batch runs, only its runner writes its
        record, so no write of the API's can be lost under one of the runner's."""
        await obstore.put_async(self.files.store, self._marker(record), str(at).encode())

    async def cancel_requested(self, record: Record) -> int | None:
        """When a cancel was asked for, if it was."""
        try:
            found = await obstore.get_async(self.files.store, self._marker(record))
        except FileNotFoundError:
            return None
        return int(bytes(await found.bytes_async()))

    async def put_answers(self, record: Record, answers: list[Answer]) -> None:
        """Finished lines' answers, stored together as one object (`<line> <0|1> <answer>` a
        line, 1: it succeeded): one write for many lines, named so that no two writes, of any
        runner, share a name."""
        body = b"".join(b"%d %d %s\n" % (number, ok, answer) for number, ok, answer in answers)
        name = f"{time.time_ns():020d}-{secrets.token_hex(4)}.answers"
        await obstore.put_async(self.files.store, self._lines(record) + name, body)

    async def finished(self, record: Record) -> set[int]:
        """The lines whose answers are stored."""
        return {number async for number, _, _ in self.answers(record)}

    async def answers(self, record: Record) -> AsyncIterator[Answer]:
        """The stored answers, each line's once (a line run again after a runner lost its lease
        may have two: the first found stands), as they are read."""
        seen: set[int] = set()
        async for listed in obstore.list(self.files.store, prefix=self._lines(record)):
            paths = [meta["path"] for meta in listed]
            for at in range(0, len(paths), READS_AT_ONCE):
                group = paths[at : at + READS_AT_ONCE]
                for body in await asyncio.gather(*map(self._read, group)):
                    for entry in body.splitlines():
                        number, ok, answer = entry.split(b" ", 2)
                        if int(number) not in seen:
                            seen.add(int(number))
                            yield int(number), ok == b"1", answer

    async def _read(self, path: str) -> bytes:
        found = await obstore.get_async(self.files.store, path)
        return bytes(await found.bytes_async())

    @staticmethod
    def _marker(record: Record) -> str:
        return f"{ROOT}/{record['owner']}/{record['batch']['id']}.cancel"

    @staticmethod
    def _lines(record: Record) -> str:
        return f"{ROOT}/{record['owner']}/{record['batch']['id']}/"


def lease_name(record: Record) -> str:
    """What a batch's lease is called (gateway.jobs.leases)."""
    return f"{record['owner']}/{record['batch']['id']}"

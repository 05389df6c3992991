"""The runtime keys and teams in the files store (`files.store`: a directory by default), for a
gateway whose limits are kept in memory: a restart loses nothing, and the worker processes of
one machine share them.

Each version is an object of its own, written whole and never changed:
`_gateway/accounts/<n>.json`. A change writes version n+1 only if it does not exist yet (a
conditional create), so that of two processes changing the set at once one wins and the other
reads again. A poll asks whether the next version exists; old versions are pruned, and a
listing now and then finds the newest if a process fell that far behind.
"""

from __future__ import annotations

import contextlib

import obstore
import orjson
from obstore.exceptions import AlreadyExistsError

from gateway.governance.storage import Changes, Snapshot
from gateway.jobs.filestore import FileStore

PREFIX = "_gateway/accounts/"
KEEP = 100  # versions kept behind the newest
RELIST_EVERY = 40  # polls between listings (10 s at the store's pace)


class FileStorage:
    def __init__(self, location: str) -> None:
        self.where = f"the files store ({location})"
        self._files = FileStore(location, 0)  # opened when first used: no directory made early
        self._newest = 0  # the newest version seen here (0: none)
        self._polls = 0

    async def version(self) -> str:
        if not self._files.present():
            return ""
        if self._polls % RELIST_EVERY == 0:
            self._newest = await self._listed()
        self._polls += 1
        while await self._exists(self._newest + 1):
            self._newest += 1
        return str(self._newest) if self._newest else ""

    async def load(self) -> Snapshot:
        version = await self.version()
        if not version:
            return Snapshot()
        found = await obstore.get_async(self._files.store, _path(int(version)))
        data = orjson.loads(bytes(await found.bytes_async()))
        return Snapshot(version, data["keys"], data["teams"])

    async def commit(self, base: Snapshot, changes: Changes) -> str | None:
        n = int(base.version or "0") + 1
        after = base.applied(changes, str(n))
        body = orjson.dumps({"keys": after.keys, "teams": after.teams})
        try:
            await obstore.put_async(self._files.store, _path(n), body, mode="create")
        except AlreadyExistsError:
            return None
        self._newest = max(self._newest, n)
        if n > KEEP:
            with contextlib.suppress(FileNotFoundError):
                await obstore.delete_async(self._files.store, _path(n - KEEP))
        return str(n)

    async def _exists(self, n: int) -> bool:
        try:
            await obstore.head_async(self._files.store, _path(n))
        except FileNotFoundError:
            return False
        return True

    async def _listed(self) -> int:
        newest = 0
        async for batch in obstore.list(self._files.store, prefix=PREFIX):
            for meta in batch:
                name = meta["path"].removeprefix(PREFIX).removesuffix(".json")
                if name.isascii() and name.isdigit():
                    newest = max(newest, int(name))
        return newest

    async def aclose(self) -> None:
        return None


def _path(n: int) -> str:
    return f"{PREFIX}{n:012d}.json"

"""Where files live: a local directory (the default) or an object store (`s3://bucket/prefix`,
`gs://…`, `az://…`), through obstore, one API for all of them.

Each file is two objects under its owner's prefix: `<owner>/<id>.data` (the bytes, streamed in
and out, never whole in memory) and `<owner>/<id>.json` (its `file` object, written once the
bytes are stored, so a listed file is always complete). The owner is a digest of the key's id:
another key's prefix is not reachable by any id it could send. An id a caller sends becomes a
name in the store only if it has the shape of the ids the gateway makes (`core.files.FILE_IDS`):
any other cannot exist, so it is a 404 before the store is asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path

import obstore
import orjson
from obstore.store import ObjectStore, from_url

from core.errors import ConfigError, PayloadTooLarge, ServiceUnavailable
from core.files import FileObject, ListQuery, is_file_id, new_file_id, not_found

URL_SCHEMES = ("file", "s3", "gs", "az", "memory")
READ_CHUNK = 256 * 1024


def open_store(location: str, path: str = "files.store") -> ObjectStore:
    """A store from the config's `files.store`: a directory (created if missing) or a URL."""
    scheme = location.split("://", 1)[0] if "://" in location else ""
    if not scheme:
        directory = Path(location).expanduser().resolve()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(path, f"cannot create {directory} ({exc.strerror})") from None
        return from_url(directory.as_uri())
    if scheme not in URL_SCHEMES:
        raise ConfigError(path, f"'{scheme}://' is not one of {', '.join(URL_SCHEMES)}")
    try:
        return from_url(location)
    except Exception as exc:  # obstore's own errors (a bad bucket URL, missing settings)
        first = str(exc).strip().splitlines()[0]  # the rest is the library's debug dump
        raise ConfigError(path, f"not a usable store: {first}") from None


def check_store(location: str) -> str:
    """What `files.store` names, checked without storing anything: an object store URL that
    its library accepts (settings it reads from the environment included), or a directory that
    exists or has no file in its way. ConfigError otherwise. (Whether this process may write
    there is not asked: the check may run elsewhere than the server, as a deployment's does.)"""
    if "://" in location:
        open_store(location)
        return f"the object store {location}"
    directory = Path(location).expanduser().resolve()
    if directory.is_dir():
        return f"the directory {directory}"
    parent = next(p for p in directory.parents if p.exists())
    if directory.exists() or not parent.is_dir():
        raise ConfigError("files.store", f"{directory} is not a directory that can be made")
    return f"the directory {directory} (made when the first file is stored)"


def owner_of(key_id: str) -> str:
    return hashlib.sha256(key_id.encode()).hexdigest()[:32]


class FileStore:
    """The files of every key, in one store (opened when first used: a gateway that serves no
    files creates no directory)."""

    def __init__(self, location: str, max_bytes: int) -> None:
        self.location = location
        self.max_bytes = max_bytes
        self._store: ObjectStore | None = None

    def present(self) -> bool:
        """Whether anything can be stored here yet: a local directory that was never made holds
        nothing (looking must not make it)."""
        return self._store is not None or "://" in self.location or Path(self.location).exists()

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = open_store(self.location)
            except ConfigError as exc:  # e.g. a read-only filesystem where the directory goes
                raise ServiceUnavailable(f"The file store cannot be used: {exc.message}") from None
        return self._store

    async def put(
        self, owner: str, content: AsyncIterator[bytes], file_id: str | None = None
    ) -> tuple[str, int]:
        """Stream `content` in as a file's bytes; its id and size. An upload (no `file_id`: a
        new one) past `max_bytes` is a 413, and nothing is kept; the gateway's own files (their
        id chosen beforehand, so that writing one again replaces it) are not bounded."""
        bound = self.max_bytes if file_id is None else None
        file_id = file_id or new_file_id()
        path = f"{owner}/{file_id}.data"
        counted = _Counted(content, bound)
        try:
            await obstore.put_async(self.store, path, counted.chunks())
        except BaseException:  # too large, the caller gone, the store failing: nothing is kept
            await self._forget(path)
            raise
        return file_id, counted.size

    async def describe(self, owner: str, file: FileObject) -> None:
        """Write the file's object: from now on it is listed and served."""
        await obstore.put_async(self.store, f"{owner}/{file['id']}.json", orjson.dumps(file))

    async def get(self, owner: str, file_id: str) -> FileObject:
        """The file's object; a 404 for an id of no file. Every call that takes a caller's id
        (content, delete, a batch's input file) asks here first."""
        if not is_file_id(file_id):  # not an id the gateway makes: no such file, store unasked
            raise not_found(file_id)
        try:
            found = await obstore.get_async(self.store, f"{owner}/{file_id}.json")
            raw = await found.bytes_async()
        except FileNotFoundError:
            raise not_found(file_id) from None
        file: FileObject = orjson.loads(bytes(raw))
        if _expired(file):
            raise not_found(file_id)
        return file

    async def listing(self, owner: str, query: ListQuery) -> tuple[list[FileObject], bool]:
        """The owner's files the query asks for, and whether more follow."""
        files = []
        async for batch in obstore.list(self.store, prefix=f"{owner}/"):
            for meta in batch:
                path = meta["path"]
                if path.endswith(".json"):
                    raw = await (await obstore.get_async(self.store, path)).bytes_async()
                    files.append(orjson.loads(bytes(raw)))
        files = [f for f in files if not _expired(f)]
        if query.purpose is not None:
            files = [f for f in files if f["purpose"] == query.purpose]
        files.sort(key=lambda f: (f["created_at"], f["id"]), reverse=query.order == "desc")
        if query.after is not None:
            ids = [f["id"] for f in files]
            files = files[ids.index(query.after) + 1 :] if query.after in ids else []
        return files[: query.limit], len(files) > query.limit

    async def content(self, owner: str, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes, in pieces."""
        await self.get(owner, file_id)
        try:
            found = await obstore.get_async(self.store, f"{owner}/{file_id}.data")
        except FileNotFoundError:
            raise not_found(file_id) from None
        return _pieces(found.stream(min_chunk_size=READ_CHUNK))

    async def delete(self, owner: str, file_id: str) -> None:
        await self.get(owner, file_id)
        await obstore.delete_async(self.store, f"{owner}/{file_id}.json")
        await self._forget(f"{owner}/{file_id}.data")

    async def discard(self, owner: str, file_id: str) -> None:
        """Whatever is stored of a file that is not to be kept (an upload refused at its end)."""
        await self._forget(f"{owner}/{file_id}.json")
        await self._forget(f"{owner}/{file_id}.data")

    async def _forget(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await obstore.delete_async(self.store, path)


class _Counted:
    """A file's bytes, counted on the way into the store (and bounded, for an upload)."""

    def __init__(self, content: AsyncIterator[bytes], limit: int | None) -> None:
        self._content = content
        self._limit = limit
        self.size = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._content:
            self.size += len(chunk)
            if self._limit is not None and self.size > self._limit:
                raise PayloadTooLarge(
                    f"The file exceeds the limit of {self._limit} bytes (files.max_bytes).",
                    param="file",
                )
            if chunk:
                yield chunk


async def _pieces(stream: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for piece in stream:
        yield bytes(piece)


def _expired(file: FileObject) -> bool:
    expires = file.get("expires_at")
    return expires is not None and expires <= time.time()


def file_object(
    file_id: str, size: int, filename: str, purpose: str, expires_after: int | None
) -> FileObject:
    created = int(time.time())
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": created,
        "expires_at": created + expires_after if expires_after is not None else None,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
    }

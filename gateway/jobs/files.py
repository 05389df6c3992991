"""The Files API: `POST /v1/files` (a multipart upload, streamed into the file store),
`GET /v1/files` (the caller's files), `GET /v1/files/{id}`, `GET /v1/files/{id}/content` and
`DELETE /v1/files/{id}`. A file belongs to the key that uploaded it: to any other key it does not
exist (404). A caller's id reaches the store only if it has the shape of the ids the gateway
makes (gateway.jobs.filestore); the form's parts are bounded as they are read
(gateway.jobs.uploads)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

import orjson

from core.errors import InvalidRequest, PayloadTooLarge
from core.files import FileObject, list_query, upload
from gateway.asgi import JSON_HEADERS
from gateway.auth import Principal
from gateway.jobs.filestore import FileStore, file_object, owner_of
from gateway.jobs.uploads import FILE_FIELD, Form, file_bytes, parser_for
from gateway.pipeline.exchange import Inbound, Reply

FILE_HEADERS = [(b"content-type", b"application/octet-stream")]
# Multipart framing around the file: the body may exceed the file's limit by this much.
FORM_OVERHEAD = 64 * 1024 + 4096
# A Content-Length worth comparing: ASCII digits (str.isdigit() takes "²", which int() refuses),
# not so many that int() is slow; the HTTP parser has refused one that is not a number.
LENGTH = re.compile(r"[0-9]{1,18}")


async def create(inbound: Inbound, reply: Reply, principal: Principal, store: FileStore) -> None:
    length = inbound.headers.get("content-length", "")
    if LENGTH.fullmatch(length) and int(length) > store.max_bytes + FORM_OVERHEAD:
        raise PayloadTooLarge(
            f"The file exceeds the limit of {store.max_bytes} bytes (files.max_bytes).",
            param="file",
        )
    form = Form()
    parser = parser_for(inbound.headers.get("content-type"), form)
    owner = owner_of(principal.key_id)
    chunks = file_bytes(inbound.receive, parser, form)
    file_id, size = await store.put(owner, chunks)
    try:
        if not form.seen_file:
            raise InvalidRequest("Missing required parameter: 'file'.", param=FILE_FIELD)
        asked = upload(form.fields)
        file = file_object(
            file_id, size, form.filename or "upload", asked.purpose, asked.expires_after
        )
        await store.describe(owner, file)
    except BaseException:
        await store.discard(owner, file_id)
        raise
    inbound.runtime.metrics.file_stored(file["purpose"], size)
    await reply.respond(200, orjson.dumps(file), JSON_HEADERS)


async def listing(inbound: Inbound, reply: Reply, principal: Principal, store: FileStore) -> None:
    query = list_query(dict(parse_qsl(inbound.query.decode("latin-1"))))
    files, more = await store.listing(owner_of(principal.key_id), query)
    page = {
        "object": "list",
        "data": files,
        "first_id": files[0]["id"] if files else None,
        "last_id": files[-1]["id"] if files else None,
        "has_more": more,
    }
    await reply.respond(200, orjson.dumps(page), JSON_HEADERS)


async def retrieve(reply: Reply, principal: Principal, store: FileStore, file_id: str) -> None:
    file: FileObject = await store.get(owner_of(principal.key_id), file_id)
    await reply.respond(200, orjson.dumps(file), JSON_HEADERS)


async def content(reply: Reply, principal: Principal, store: FileStore, file_id: str) -> None:
    pieces = await store.content(owner_of(principal.key_id), file_id)
    await reply.start_stream(FILE_HEADERS)
    async for piece in pieces:
        await reply.send({"type": "http.response.body", "body": piece, "more_body": True})
    await reply.send({"type": "http.response.body", "body": b"", "more_body": False})


async def delete(reply: Reply, principal: Principal, store: FileStore, file_id: str) -> None:
    await store.delete(owner_of(principal.key_id), file_id)
    gone = {"id": file_id, "object": "file", "deleted": True}
    await reply.respond(200, orjson.dumps(gone), JSON_HEADERS)

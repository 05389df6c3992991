"""The Batch API: `create`, `listing`, `retrieve` and `cancel` only read and write batch records
in the store (gateway.jobs.batchstore); the runner (gateway.jobs.runner) carries them out.

What a caller sends is bounded before it reaches the store: a batch id or an input file id not of
the shape the gateway makes is a 404 (gateway.jobs.batchstore, gateway.jobs.filestore); a failed
batch's object keeps at most MAX_ERRORS_SHOWN line errors (all are in its error file); a listing's
page stops at PAGE_BYTES.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import parse_qsl

import orjson

from core.batches import (
    MAX_ERRORS_SHOWN,
    WINDOWS,
    BatchErrors,
    BatchObject,
    LineError,
    create_batch,
    list_query,
    new_batch_id,
)
from core.errors import InvalidRequest, NotFound
from core.wire import parse_json
from gateway.asgi import JSON_HEADERS
from gateway.auth import Principal
from gateway.jobs.batchstore import ACTIVE, BatchStore, Record
from gateway.jobs.filestore import owner_of
from gateway.pipeline.exchange import Inbound, Reply
from gateway.runtime import Runtime

log = logging.getLogger("gateway.batches")
# A listing's page ends before its batches pass this many bytes (it has at least one): a page of
# 100 failed batches, each with its 1,000 errors shown, would be tens of megabytes. `has_more`
# and `last_id` lead on, as for a page cut at `limit`.
PAGE_BYTES = 512 * 1024

# ---------------------------------------------------------------- the API


async def create(inbound: Inbound, reply: Reply, principal: Principal, body: bytes) -> None:
    rt = inbound.runtime
    asked = create_batch(parse_json(body))
    owner = owner_of(principal.key_id)
    try:
        input_file = await rt.files.get(owner, asked.input_file_id)
    except NotFound as missing:
        missing.param = "input_file_id"
        raise
    if input_file["purpose"] != "batch":
        raise InvalidRequest(
            f"The file {asked.input_file_id} was uploaded for '{input_file['purpose']}', not "
            "'batch'.",
            param="input_file_id",
        )
    now = int(time.time())
    window = rt.config.batches.window_s or WINDOWS[asked.completion_window]
    batch: BatchObject = {
        "id": new_batch_id(),
        "object": "batch",
        "endpoint": asked.endpoint,
        "errors": None,
        "input_file_id": asked.input_file_id,
        "completion_window": asked.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + window,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": asked.metadata,
    }
    await BatchStore(rt.files).save({"batch": batch, "key_id": principal.key_id, "owner": owner})
    rt.metrics.batch_status("validating")
    await reply.respond(200, orjson.dumps(batch), JSON_HEADERS)


async def retrieve(inbound: Inbound, reply: Reply, principal: Principal, batch_id: str) -> None:
    store = BatchStore(inbound.runtime.files)
    record = await _owned(inbound.runtime, principal, batch_id)
    await reply.respond(200, orjson.dumps(await shown(store, record)), JSON_HEADERS)


async def listing(inbound: Inbound, reply: Reply, principal: Principal) -> None:
    """The caller's batches, newest first: `limit` of them, fewer if they would pass
    PAGE_BYTES. Only the page's records are read."""
    query = list_query(dict(parse_qsl(inbound.query.decode("latin-1"))))
    store = BatchStore(inbound.runtime.files)
    owner = owner_of(principal.key_id)
    ids = sorted(await store.ids(owner), reverse=True)
    if query.after is not None:
        ids = ids[ids.index(query.after) + 1 :] if query.after in ids else []
    page: list[tuple[str, orjson.Fragment]] = []
    size = 0
    for batch_id in ids[: query.limit]:
        record = await store.load(owner, batch_id)
        if record is None:
            continue  # deleted from the store since it was listed
        shown_json = orjson.dumps(await shown(store, record))
        size += len(shown_json)
        if page and size > PAGE_BYTES:
            break
        page.append((batch_id, orjson.Fragment(shown_json)))
    body = {
        "object": "list",
        "data": [batch for _, batch in page],
        "first_id": page[0][0] if page else None,
        "last_id": page[-1][0] if page else None,
        "has_more": bool(page) and page[-1][0] != ids[-1],
    }
    await reply.respond(200, orjson.dumps(body), JSON_HEADERS)


async def cancel(inbound: Inbound, reply: Reply, principal: Principal, batch_id: str) -> None:
    """The batch stops taking new lines (its runner sees it within a second); what is done is
    kept, in the files it gets when it is cancelled."""
    store = BatchStore(inbound.runtime.files)
    record = await _owned(inbound.runtime, principal, batch_id)
    if record["batch"]["status"] not in ACTIVE:
        raise InvalidRequest(
            f"The batch is {record['batch']['status']}: only a batch under way can be cancelled.",
            param="batch_id",
        )
    if await store.cancel_requested(record) is None:
        await store.request_cancel(record, now())
    await reply.respond(200, orjson.dumps(await shown(store, record)), JSON_HEADERS)


async def shown(store: BatchStore, record: Record) -> BatchObject:
    """The batch as a caller sees it: "cancelling" from the moment a cancel was asked for; its
    errors bounded (a record stored before they were holds them all)."""
    batch = record["batch"]
    if batch["status"] in ("validating", "in_progress", "finalizing"):
        asked = await store.cancel_requested(record)
        if asked is not None:
            return {**batch, "status": "cancelling", "cancelling_at": asked}
    errors = batch["errors"]
    if errors is not None and "total" not in errors:
        return {**batch, "errors": bounded(errors["data"], len(errors["data"]))}
    return batch


def bounded(errors: list[LineError], total: int) -> BatchErrors:
    """A failed batch's `errors`: the first MAX_ERRORS_SHOWN, and how many there are."""
    return {"object": "list", "data": errors[:MAX_ERRORS_SHOWN], "total": total}


async def _owned(rt: Runtime, principal: Principal, batch_id: str) -> Record:
    record = await BatchStore(rt.files).load(owner_of(principal.key_id), batch_id)
    if record is None:
        raise NotFound(f"No such Batch object: {batch_id[:100]}", param="batch_id")
    return record


def now() -> int:
    return int(time.time())

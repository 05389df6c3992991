"""The HTTP handlers, one per endpoint. Each is short: it authenticates, reads the body and hands
the request to the service (`gateway.pipeline.service`), or answers itself (models, health, metrics,
the API document). Errors are raised, and rendered in one place (`Endpoint`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import orjson

from core.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound, internal
from core.openapi import document_json
from gateway.asgi import JSON_HEADERS, ClientGone, read_body
from gateway.auth import Principal
from gateway.jobs import batches as batches_api
from gateway.jobs import files as files_api
from gateway.metrics import OP_CHAT, OP_EMBEDDINGS, OP_TEXT_COMPLETION, RequestRecord
from gateway.pipeline import service
from gateway.pipeline.exchange import Inbound, Reply

log = logging.getLogger("gateway.handlers")

# Portkey headers the gateway does not implement: refusing beats ignoring them silently.
# (A custom host would make the gateway call a host its config does not name; a provider
# header would take the provider's key from the caller.)
UNSUPPORTED_HEADERS = ("x-portkey-custom-host", "x-portkey-provider")
CLIENT_GONE = 499  # nginx's "client closed request": the status the metrics give a disconnect

Handler = Callable[[Inbound, Reply], Awaitable[None]]
Serve = Callable[[Inbound, Reply, RequestRecord, Principal, bytes], Awaitable[None]]


class Endpoint:
    """A handler and the methods it answers: runs it and renders whatever error it raises (a
    405 and a 404 in OpenAI's error shape too)."""

    def __init__(self, handler: Handler, methods: tuple[str, ...]) -> None:
        self.handler = handler
        self.methods = methods

    async def __call__(self, inbound: Inbound, reply: Reply) -> None:
        try:
            if inbound.method not in self.methods:
                raise MethodNotAllowed(f"Method {inbound.method} is not allowed here.")
            await self.handler(inbound, reply)
        except ClientGone:
            pass  # nobody is left to answer
        except GatewayError as err:
            await reply.error(err)
        except Exception as exc:
            log.exception("request %s failed", inbound.request_id)
            await reply.error(internal(exc))


# ---------------------------------------------------------------- inference


# Plain functions: the shared coroutine is the handler's, without one of their own around it.
def completions(inbound: Inbound, reply: Reply) -> Awaitable[None]:
    return _inference(inbound, reply, service.complete, OP_TEXT_COMPLETION)


def chat_completions(inbound: Inbound, reply: Reply) -> Awaitable[None]:
    return _inference(inbound, reply, service.chat, OP_CHAT)


def embeddings(inbound: Inbound, reply: Reply) -> Awaitable[None]:
    return _inference(inbound, reply, service.embed, OP_EMBEDDINGS)


async def _inference(inbound: Inbound, reply: Reply, serve: Serve, operation: str) -> None:
    """What every inference endpoint shares: the request's record (observed once it is over),
    the in-flight gauge, the caller, the headers refused, the body."""
    rt = inbound.runtime
    record = RequestRecord(time.perf_counter(), operation=operation)
    rt.metrics.inflight_add(1)
    rt.live += 1
    try:
        principal = rt.auth.authenticate(inbound.headers)
        for name in UNSUPPORTED_HEADERS:
            if name in inbound.headers:
                raise InvalidRequest(
                    f"The header '{name}' is not supported by this gateway.", param=name
                )
        body = await read_body(inbound.headers, inbound.receive, rt.config.server.max_body_bytes)
        await serve(inbound, reply, record, principal, body)
        record.status = reply.status
    except Exception as exc:
        _failed(record, exc, reply.status)
        raise
    finally:
        rt.live -= 1
        rt.metrics.inflight_add(-1)
        rt.metrics.observe(record)


def _failed(record: RequestRecord, exc: Exception, sent: int) -> None:
    """The record's status is what the caller got: the error's, unless a response had begun
    with `sent` (a caller who left is counted as such either way)."""
    if isinstance(exc, ClientGone):
        status, kind = CLIENT_GONE, "ClientGone"
    elif isinstance(exc, GatewayError):
        status, kind = exc.status, type(exc).__name__
    else:
        status, kind = 500, "InternalError"
    record.error_type = kind
    record.status = status if not sent or status == CLIENT_GONE else sent


# ---------------------------------------------------------------- models


async def list_models(inbound: Inbound, reply: Reply) -> None:
    rt = inbound.runtime
    principal = rt.auth.authenticate(inbound.headers)
    data = [_model_card(a, rt.created) for a in rt.router.aliases() if principal.may_use_model(a)]
    await reply.respond(200, orjson.dumps({"object": "list", "data": data}), JSON_HEADERS)


MODEL_PREFIX = "/v1/models/"


async def get_model(inbound: Inbound, reply: Reply) -> None:
    rt = inbound.runtime
    principal = rt.auth.authenticate(inbound.headers)
    alias = inbound.path.removeprefix(MODEL_PREFIX)
    rt.router.model(principal, alias)
    await reply.respond(200, orjson.dumps(_model_card(alias, rt.created)), JSON_HEADERS)


def _model_card(alias: str, created: int) -> dict[str, object]:
    return {"id": alias, "object": "model", "created": created, "owned_by": "gateway"}


# ---------------------------------------------------------------- files


async def files(inbound: Inbound, reply: Reply) -> None:
    """`/v1/files`: POST uploads one, GET lists the caller's."""
    rt = inbound.runtime
    principal = rt.auth.authenticate(inbound.headers)
    if inbound.method == "POST":
        await files_api.create(inbound, reply, principal, rt.files)
    else:
        await files_api.listing(inbound, reply, principal, rt.files)


FILE_PREFIX = "/v1/files/"


async def file(inbound: Inbound, reply: Reply) -> None:
    """`/v1/files/{id}` (GET, DELETE) and `/v1/files/{id}/content` (GET)."""
    rt = inbound.runtime
    principal = rt.auth.authenticate(inbound.headers)
    file_id, _, rest = inbound.path.removeprefix(FILE_PREFIX).partition("/")
    if rest == "content":
        if inbound.method == "DELETE":
            raise MethodNotAllowed(f"Method {inbound.method} is not allowed here.")
        await files_api.content(reply, principal, rt.files, file_id)
    elif rest:
        raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")
    elif inbound.method == "DELETE":
        await files_api.delete(reply, principal, rt.files, file_id)
        rt.metrics.file_deleted()
    else:
        await files_api.retrieve(reply, principal, rt.files, file_id)


# ---------------------------------------------------------------- batches


async def batches(inbound: Inbound, reply: Reply) -> None:
    """`/v1/batches`: POST creates one, GET lists the caller's."""
    rt = inbound.runtime
    principal = rt.auth.authenticate(inbound.headers)
    if inbound.method == "POST":
        body = await read_body(inbound.headers, inbound.receive, rt.config.server.max_body_bytes)
        await batches_api.create(inbound, reply, principal, body)
    else:
        await batches_api.listing(inbound, reply, principal)


BATCH_PREFIX = "/v1/batches/"


async def batch(inbound: Inbound, reply: Reply) -> None:
    """`/v1/batches/{id}` (GET) and `/v1/batches/{id}/cancel` (POST)."""
    principal = inbound.runtime.auth.authenticate(inbound.headers)
    batch_id, _, rest = inbound.path.removeprefix(BATCH_PREFIX).partition("/")
    wanted = {"": ("GET", "HEAD"), "cancel": ("POST",)}.get(rest)
    if wanted is None:
        raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")
    if inbound.method not in wanted:
        raise MethodNotAllowed(f"Method {inbound.method} is not allowed here.")
    if rest == "cancel":
        await batches_api.cancel(inbound, reply, principal, batch_id)
    else:
        await batches_api.retrieve(inbound, reply, principal, batch_id)


# ---------------------------------------------------------------- health


async def livez(inbound: Inbound, reply: Reply) -> None:
    await reply.respond(200, b'{"status":"ok"}', JSON_HEADERS)


async def readyz(inbound: Inbound, reply: Reply) -> None:
    if inbound.runtime.ready():
        await reply.respond(200, b'{"status":"ready"}', JSON_HEADERS)
    else:
        await reply.respond(503, b'{"status":"starting"}', JSON_HEADERS)


async def metrics(inbound: Inbound, reply: Reply) -> None:
    """/metrics on the API port, unless it has a listener of its own (gateway.api.exporter); with
    metrics.require_key, for any configured key."""
    rt = inbound.runtime
    if not rt.metrics.enabled:
        raise NotFound("Metrics are disabled (metrics.enabled: false).")
    if rt.config.metrics.listen is not None:
        raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")
    if rt.config.metrics.require_key:
        rt.auth.authenticate(inbound.headers)
    body, ctype = await rt.metrics.scrape()
    await reply.respond(200, body, [(b"content-type", ctype.encode())])


async def openapi(inbound: Inbound, reply: Reply) -> None:
    """The OpenAPI document (core.openapi), built once per process; no key needed."""
    await reply.respond(200, document_json(), JSON_HEADERS)


async def not_found(inbound: Inbound, reply: Reply) -> None:
    raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")

"""The HTTP handlers of what is not inference (models, files, batches, health, metrics, the API
document); the inference endpoints' handlers are the pipeline's (gateway.pipeline.stages). Errors
are raised, and rendered in one place (`Route`), for every handler.
"""

from __future__ import annotations

import logging

import orjson

from core.errors import GatewayError, MethodNotAllowed, NotFound, internal
from core.openapi import document_json
from gateway.asgi import JSON_HEADERS, ClientGone, read_body
from gateway.jobs import batches as batches_api
from gateway.jobs import files as files_api
from gateway.pipeline.exchange import Inbound, Reply
from gateway.pipeline.stages import Handler

log = logging.getLogger("gateway.handlers")


class Route:
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
    metrics.require_key, for any configured key. OpenMetrics when the Accept header asks for it."""
    rt = inbound.runtime
    if not rt.metrics.enabled:
        raise NotFound("Metrics are disabled (metrics.enabled: false).")
    if rt.config.metrics.listen is not None:
        raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")
    if rt.config.metrics.require_key:
        rt.auth.authenticate(inbound.headers)
    body, ctype = await rt.metrics.scrape(inbound.headers.get("accept", ""))
    await reply.respond(200, body, [(b"content-type", ctype.encode())])


async def openapi(inbound: Inbound, reply: Reply) -> None:
    """The OpenAPI document (core.openapi), built once per process; no key needed."""
    await reply.respond(200, document_json(), JSON_HEADERS)


async def not_found(inbound: Inbound, reply: Reply) -> None:
    raise NotFound(f"Unknown path {inbound.method} {inbound.path[:200]}.")

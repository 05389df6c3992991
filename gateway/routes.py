"""The HTTP handlers. Each is short: authenticate, parse, plan, serve, render; errors are raised
and rendered in one place (`Endpoint`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway import serving
from gateway.auth import Principal
from gateway.config import portkey
from gateway.config.portkey import PortkeyConfig
from gateway.embeddings import parse_embedding
from gateway.errors import (
    ConfigError,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    internal,
)
from gateway.http import (
    JSON_HEADERS,
    ClientGone,
    RawHeaders,
    Receive,
    Scope,
    Send,
    read_body,
    send_bytes,
    send_error,
)
from gateway.metrics import EMBEDDINGS, TEXT_COMPLETION, RequestRecord
from gateway.ratelimit import Grant
from gateway.runtime import Runtime
from gateway.schemas import parse_completion

log = logging.getLogger("gateway.routes")

# Portkey headers the gateway does not implement: refusing beats ignoring them silently.
# (A custom host would make the gateway call a host its config does not name; a provider
# header would take the provider's key from the caller.)
UNSUPPORTED_HEADERS = ("x-portkey-custom-host", "x-portkey-provider")
PORTKEY_HEADERS = ("x-portkey-config", "x-portkey-request-timeout")


@dataclass(slots=True)
class Ctx:
    """One request's context for the handlers."""

    runtime: Runtime
    headers: dict[str, str]
    receive: Receive
    send: Send
    request_id: str
    started: bool = False  # response headers sent
    out_headers: RawHeaders = field(default_factory=list)
    record: RequestRecord | None = None  # completions: observed once the response is over

    async def respond(self, status: int, body: bytes, headers: RawHeaders) -> None:
        self.started = True
        if self.record is not None:
            self.record.status = status
        await send_bytes(self.send, status, body, headers + self.out_headers)

    async def start_stream(self, headers: RawHeaders) -> None:
        self.started = True
        if self.record is not None:
            self.record.status = 200
        start = {
            "type": "http.response.start",
            "status": 200,
            "headers": headers + self.out_headers,
        }
        await self.send(start)


Handler = Callable[[Ctx, Scope], Awaitable[None]]


class Endpoint:
    """A raw ASGI endpoint: runs a handler and renders whatever error it raises."""

    def __init__(self, handler: Handler, methods: tuple[str, ...]) -> None:
        self.handler = handler
        self.methods = methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = Ctx(
            scope["gateway.runtime"],
            scope["gateway.headers"],
            receive,
            send,
            scope["gateway.request_id"],
            out_headers=scope["gateway.echo"],
        )
        try:
            if scope["method"] not in self.methods:
                raise MethodNotAllowed(f"Method {scope['method']} is not allowed here.")
            await self.handler(ctx, scope)
        except ClientGone:
            _failed(ctx, CLIENT_GONE, "ClientGone")
        except GatewayError as err:
            _failed(ctx, err.status, type(err).__name__)
            if not ctx.started:
                await send_error(send, err, ctx.out_headers)
        except Exception as exc:
            log.exception("request %s failed", ctx.request_id)
            _failed(ctx, 500, "InternalError")
            if not ctx.started:
                await send_error(send, internal(exc), ctx.out_headers)
        finally:
            if ctx.record is not None:
                ctx.runtime.metrics.observe(ctx.record)


CLIENT_GONE = 499  # nginx's "client closed request": the status the metrics give a disconnect


def _failed(ctx: Ctx, status: int, error_type: str) -> None:
    """The record's status is what the caller got: the error's, unless a stream had begun."""
    rec = ctx.record
    if rec is not None:
        rec.error_type = error_type
        if not ctx.started or status == CLIENT_GONE:
            rec.status = status


# ---------------------------------------------------------------- completions


async def completions(ctx: Ctx, scope: Scope) -> None:
    await _counted(ctx, scope, _completion, TEXT_COMPLETION)


async def embeddings(ctx: Ctx, scope: Scope) -> None:
    await _counted(ctx, scope, _embedding, EMBEDDINGS)


Serve = Callable[[Ctx, Scope, Runtime, RequestRecord, bytes, Principal], Awaitable[None]]


async def _counted(ctx: Ctx, scope: Scope, serve: Serve, operation: str) -> None:
    """The part every inference endpoint shares: the request's record, the in-flight gauge,
    the caller, the headers refused, the body."""
    rt = ctx.runtime
    rec = ctx.record = RequestRecord(time.perf_counter(), operation=operation)
    rt.metrics.inflight_add(1)
    try:
        principal = rt.auth.authenticate(ctx.headers)
        for name in UNSUPPORTED_HEADERS:
            if name in ctx.headers:
                raise InvalidRequest(
                    f"The header '{name}' is not supported by this gateway.", param=name
                )
        body = await read_body(ctx.headers, ctx.receive, rt.config.server.max_body_bytes)
        await serve(ctx, scope, rt, rec, body, principal)
    finally:
        rt.metrics.inflight_add(-1)


async def _completion(
    ctx: Ctx, scope: Scope, rt: Runtime, rec: RequestRecord, body: bytes, principal: Principal
) -> None:
    config = _portkey(rt, ctx.headers)
    req = parse_completion(body, rt.config.server.limits)
    rec.model, rec.stream = rt.model_label(req.model), req.stream
    plan = rt.router.plan(principal, req.model, ctx.headers.get("x-portkey-virtual-key"), config)
    grant = await rt.limiter.admit(
        principal.key_id, req.model, rec.model, lambda: serving.reservation(rt, req, plan)
    )
    ctx.out_headers = ctx.out_headers + grant.headers
    cid = "cmpl-" + scope["gateway.ids"].next()
    serve = serving.serve_stream if req.stream else serving.serve_json
    await _settled(ctx, grant, rec, serve(ctx, req, plan, cid))


async def _embedding(
    ctx: Ctx, scope: Scope, rt: Runtime, rec: RequestRecord, body: bytes, principal: Principal
) -> None:
    config = _portkey(rt, ctx.headers)
    req = parse_embedding(body)
    rec.model = rt.model_label(req.model)
    virtual_key = ctx.headers.get("x-portkey-virtual-key")
    plan = rt.router.plan(principal, req.model, virtual_key, config, endpoint=EMBEDDINGS)
    grant = await rt.limiter.admit(
        principal.key_id, req.model, rec.model, lambda: serving.embedding_reservation(rt, req, plan)
    )
    ctx.out_headers = ctx.out_headers + grant.headers
    await _settled(ctx, grant, rec, serving.serve_embeddings(ctx, req, plan))


async def _settled(ctx: Ctx, grant: Grant, rec: RequestRecord, serving: Awaitable[None]) -> None:
    """Serve, then settle the rate limiter's reservation with what was used."""
    try:
        await serving
    except GatewayError:
        if not ctx.started:
            grant.settle(0)  # refused or failed before any output: nothing was generated
        raise
    finally:
        grant.settle(rec.total_tokens)  # None (unknown) keeps the reservation


def _portkey(rt: Runtime, headers: dict[str, str]) -> PortkeyConfig | None:
    """The request's Portkey config (x-portkey-config, x-portkey-request-timeout), if any; a
    400 naming the field that is wrong."""
    raw, timeout = (headers.get(name) for name in PORTKEY_HEADERS)
    if raw is None and timeout is None:
        return None
    try:
        config = PortkeyConfig(None)
        if raw is not None:
            config = portkey.from_header(raw, rt.config.configs, rt.config.providers)
        if timeout is not None:
            config = portkey.with_timeout(config, _milliseconds(timeout))
    except ConfigError as err:
        if err.path.startswith(portkey.ROOT):
            raise InvalidRequest(f"Invalid x-portkey-config: {err}.", param=err.path) from None
        raise InvalidRequest(f"Invalid {err.path}: {err.message}.", param=err.path) from None
    return config


def _milliseconds(raw: str) -> float:
    if not raw.isdigit() or not 0 < int(raw) <= portkey.MAX_TIMEOUT_MS:
        raise ConfigError(
            "x-portkey-request-timeout",
            f"expected milliseconds, an integer from 1 to {portkey.MAX_TIMEOUT_MS}",
        )
    return int(raw) / 1000


# ---------------------------------------------------------------- models


async def list_models(ctx: Ctx, scope: Scope) -> None:
    rt = ctx.runtime
    principal = rt.auth.authenticate(ctx.headers)
    data = [_model_card(a, rt.created) for a in rt.router.aliases() if principal.may_use_model(a)]
    await ctx.respond(200, orjson.dumps({"object": "list", "data": data}), JSON_HEADERS)


async def get_model(ctx: Ctx, scope: Scope) -> None:
    rt = ctx.runtime
    principal = rt.auth.authenticate(ctx.headers)
    alias = scope["path_params"]["model_id"]
    rt.router.model(principal, alias)
    await ctx.respond(200, orjson.dumps(_model_card(alias, rt.created)), JSON_HEADERS)


def _model_card(alias: str, created: int) -> dict[str, Any]:
    return {"id": alias, "object": "model", "created": created, "owned_by": "gateway"}


# ---------------------------------------------------------------- health


async def livez(ctx: Ctx, scope: Scope) -> None:
    await ctx.respond(200, b'{"status":"ok"}', JSON_HEADERS)


async def readyz(ctx: Ctx, scope: Scope) -> None:
    if ctx.runtime.ready():
        await ctx.respond(200, b'{"status":"ready"}', JSON_HEADERS)
    else:
        await ctx.respond(503, b'{"status":"starting"}', JSON_HEADERS)


async def metrics(ctx: Ctx, scope: Scope) -> None:
    m = ctx.runtime.metrics
    if not m.enabled:
        raise NotFound("Metrics are disabled (metrics.enabled: false).")
    body, ctype = m.render()
    await ctx.respond(200, body, [(b"content-type", ctype.encode())])


async def not_found(ctx: Ctx, scope: Scope) -> None:
    raise NotFound(f"Unknown path {scope['method']} {scope['path'][:200]}.")

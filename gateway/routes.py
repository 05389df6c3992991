"""The HTTP handlers. Each is short: authenticate, parse, plan, serve, render; errors are raised
and rendered in one place (`Endpoint`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway import serving
from gateway.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound, internal
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
from gateway.runtime import Runtime
from gateway.schemas import parse_completion

log = logging.getLogger("gateway.routes")

# Portkey headers the gateway does not implement yet: refusing beats ignoring them silently.
UNSUPPORTED_HEADERS = ("x-portkey-config", "x-portkey-custom-host", "x-portkey-provider")


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

    async def respond(self, status: int, body: bytes, headers: RawHeaders) -> None:
        self.started = True
        await send_bytes(self.send, status, body, headers + self.out_headers)

    async def start_stream(self, headers: RawHeaders) -> None:
        self.started = True
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
            return
        except GatewayError as err:
            if not ctx.started:
                await send_error(send, err, ctx.out_headers)
        except Exception as exc:
            log.exception("request %s failed", ctx.request_id)
            if not ctx.started:
                await send_error(send, internal(exc), ctx.out_headers)


# ---------------------------------------------------------------- completions


async def completions(ctx: Ctx, scope: Scope) -> None:
    rt = ctx.runtime
    principal = rt.auth.authenticate(ctx.headers)
    for name in UNSUPPORTED_HEADERS:
        if name in ctx.headers:
            raise InvalidRequest(
                f"The header '{name}' is not supported by this gateway.", param=name
            )
    body = await read_body(ctx.headers, ctx.receive, rt.config.server.max_body_bytes)
    req = parse_completion(body, rt.config.server.limits)
    plan = rt.router.plan(principal, req.model, ctx.headers.get("x-portkey-virtual-key"))
    cid = "cmpl-" + scope["gateway.ids"].next()
    if req.stream:
        await serving.serve_stream(ctx, req, plan, cid)
    else:
        await serving.serve_json(ctx, req, plan, cid)


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


async def not_found(ctx: Ctx, scope: Scope) -> None:
    raise NotFound(f"Unknown path {scope['method']} {scope['path'][:200]}.")

"""create_app(config): routes, the request-id middleware, and the lifespan that starts and
stops the providers. Everything lives on `app.state.runtime`; nothing is module-global."""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import Route, Router

from gateway import routes
from gateway.config import Config
from gateway.http import Message, Receive, Scope, Send
from gateway.routes import Endpoint
from gateway.runtime import Runtime

# A caller's x-request-id is echoed only if it is short and plain: it lands in our logs.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


class RequestIdMiddleware:
    """Pure ASGI: decodes the headers once, assigns the request id, echoes it (and Portkey's
    trace id) on every response."""

    def __init__(self, app: Router) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id")
        rid = given if given and _SAFE_ID.fullmatch(given) else "req_" + secrets.token_hex(12)
        scope["gateway.headers"] = headers
        scope["gateway.request_id"] = rid
        echo = [(b"x-request-id", rid.encode())]
        trace = headers.get("x-portkey-trace-id")
        if trace and _SAFE_ID.fullmatch(trace):
            echo.append((b"x-portkey-trace-id", trace.encode()))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *echo]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _routes() -> list[Route]:
    post, get = ("POST",), ("GET", "HEAD")
    table = [
        ("/v1/completions", routes.completions, post),
        ("/completions", routes.completions, post),
        ("/v1/models", routes.list_models, get),
        ("/v1/models/{model_id:path}", routes.get_model, get),
        ("/livez", routes.livez, get),
        ("/readyz", routes.readyz, get),
    ]
    # Methods are checked by Endpoint so that a 405 is in OpenAI's error shape too.
    return [Route(path, Endpoint(fn, methods)) for path, fn, methods in table]


def create_app(config: Config) -> Starlette:
    runtime = Runtime.build(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.aclose()

    app = Starlette(routes=_routes(), lifespan=lifespan)
    app.state.runtime = runtime
    any_method = ("GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS")
    app.router.default = Endpoint(routes.not_found, any_method)
    app.add_middleware(RequestIdMiddleware)  # type: ignore[arg-type]
    return app

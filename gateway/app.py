"""create_app(config): the ASGI app. One pure-ASGI entry decodes the headers once, assigns the
request id and dispatches exact paths from a table; the rest (path parameters, lifespan) goes
through Starlette. Every handler is an `Endpoint`, which echoes the ids on every response.
Everything lives on `app.state.runtime`; nothing is module-global."""

from __future__ import annotations

import contextlib
import gc
import itertools
import re
import secrets
from collections.abc import AsyncIterator, Iterator

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.routing import Route

from gateway import routes
from gateway.config import Config
from gateway.http import Receive, Scope, Send
from gateway.metrics import Metrics
from gateway.reload import Reloader, Snapshot
from gateway.routes import Endpoint
from gateway.runtime import Runtime

# A caller's x-request-id is echoed only if it is short and plain: it lands in our logs.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
POST, GET = ("POST",), ("GET", "HEAD")
ANY = ("GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS")

EXACT = {
    "/v1/completions": (routes.completions, POST),
    "/completions": (routes.completions, POST),
    "/v1/embeddings": (routes.embeddings, POST),
    "/embeddings": (routes.embeddings, POST),
    "/v1/models": (routes.list_models, GET),
    "/livez": (routes.livez, GET),
    "/readyz": (routes.readyz, GET),
    "/metrics": (routes.metrics, GET),
}
PATTERNS = {"/v1/models/{model_id:path}": (routes.get_model, GET)}


class Ids:
    """Unique ids without a system call per request: a random per-process prefix and a counter.
    They identify; they are not secrets."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._count: Iterator[int] = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):010x}"


class GatewayApp:
    def __init__(self, runtime: Runtime, fallback: Starlette) -> None:
        self.state: State = fallback.state
        self.state.runtime = runtime
        self.ids = Ids()
        self._fallback = fallback
        self._exact = {path: Endpoint(fn, methods) for path, (fn, methods) in EXACT.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._fallback(scope, receive, send)  # lifespan
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id")
        rid = given if given and _SAFE_ID.fullmatch(given) else "req_" + self.ids.next()
        echo = [(b"x-request-id", rid.encode())]
        trace = headers.get("x-portkey-trace-id")
        if trace and _SAFE_ID.fullmatch(trace):
            echo.append((b"x-portkey-trace-id", trace.encode()))
        # The request keeps the runtime it began on, whatever a reload swaps in meanwhile.
        runtime: Runtime = self.state.runtime
        scope["gateway.runtime"] = runtime
        scope["gateway.headers"] = headers
        scope["gateway.request_id"] = rid
        scope["gateway.echo"] = echo
        scope["gateway.ids"] = self.ids
        endpoint = self._exact.get(scope["path"])
        runtime.inflight += 1
        try:
            await (endpoint or self._fallback)(scope, receive, send)
        finally:
            runtime.inflight -= 1
            if runtime.idle is not None and not runtime.inflight:
                runtime.idle.set()

    @property
    def runtime(self) -> Runtime:
        """The runtime new requests get."""
        runtime: Runtime = self.state.runtime
        return runtime

    def swap(self, runtime: Runtime) -> None:
        """One assignment: requests from here on get `runtime`; those under way keep theirs."""
        self.state.runtime = runtime


# Collections of the youngest generation every 700 allocations cost a server ~20 µs a request;
# 10,000 keeps cyclic garbage bounded at a fraction of that cost.
GC_THRESHOLD = (10_000, 10, 10)


def settle_gc() -> None:
    """For a serving process, once it has started: what start-up built lives as long as the
    process, so full collections need not scan it again (vLLM's server does the same)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def create_app(
    config: Config, serving_process: bool = False, watch: Snapshot | None = None
) -> GatewayApp:
    """`serving_process`: this process only serves (gateway serve): tune its collector.
    `watch`: the config file `config` was read from, reloaded on SIGHUP and when it changes."""
    runtime = Runtime.build(config, Metrics(config.metrics.enabled))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        reloader = Reloader(app, watch) if watch is not None else None
        if reloader is not None:
            reloader.start()
        if serving_process:
            settle_gc()
        try:
            yield
        finally:
            if reloader is not None:
                await reloader.stop()  # first: it closes what swapped-out runtimes left
            await app.runtime.aclose()

    # Methods are checked by Endpoint so that a 405 is in OpenAI's error shape too.
    fallback = Starlette(
        routes=[Route(path, Endpoint(fn, methods)) for path, (fn, methods) in PATTERNS.items()],
        lifespan=lifespan,
    )
    fallback.router.default = Endpoint(routes.not_found, ANY)
    app = GatewayApp(runtime, fallback)
    return app

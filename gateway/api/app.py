"""create_app(config): the ASGI app. One pure-ASGI entry decodes the headers once, assigns the
request id, builds the request's context (gateway.pipeline.exchange) and dispatches by path from
tables to its handler's `Endpoint`, which echoes the ids on every response. Starlette runs the
lifespan. Everything lives on `app.state.runtime`; nothing is module-global."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Sequence

from starlette.applications import Starlette
from starlette.datastructures import State

from gateway.api import admin, handlers, responses
from gateway.api.exporter import Exporter
from gateway.api.handlers import Route
from gateway.asgi import Receive, Scope, Send, header_map, watched
from gateway.config import Config
from gateway.jobs.runner import Runner
from gateway.metrics import Metrics
from gateway.pipeline.endpoints import ENDPOINTS, AnyEndpoint, Endpoint
from gateway.pipeline.exchange import Ids, Inbound, Reply
from gateway.pipeline.flow import Stage
from gateway.pipeline.stages import Handler, Pipeline
from gateway.reload import Reloader, Snapshot
from gateway.runtime import Build, Runtime, build_provider

# A caller's x-request-id is echoed only if it is short and plain: it lands in our logs.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
POST, GET = ("POST",), ("GET", "HEAD")
ANY = ("GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS")

# The inference endpoints' paths are their rows' (gateway.pipeline.endpoints), served by the
# pipeline; the others are the handlers'.
EXACT: dict[str, tuple[Handler | AnyEndpoint, tuple[str, ...]]] = {
    **{path: (endpoint, POST) for endpoint in ENDPOINTS for path in endpoint.paths},
    "/v1/models": (handlers.list_models, GET),
    "/v1/files": (handlers.files, ("GET", "HEAD", "POST")),
    "/v1/batches": (handlers.batches, ("GET", "HEAD", "POST")),
    "/livez": (handlers.livez, GET),
    "/readyz": (handlers.readyz, GET),
    "/metrics": (handlers.metrics, GET),
    "/openapi.json": (handlers.openapi, GET),
    **{path: (admin.handle, methods) for path, methods in admin.EXACT_PATHS.items()},
}
# Paths that carry a parameter after a prefix (a model id may contain slashes).
PREFIXED: dict[str, tuple[Handler, tuple[str, ...]]] = {
    handlers.MODEL_PREFIX: (handlers.get_model, GET),
    handlers.FILE_PREFIX: (handlers.file, ("GET", "HEAD", "DELETE")),
    handlers.BATCH_PREFIX: (handlers.batch, ("GET", "HEAD", "POST")),
    # Stored responses (POST /v1/responses itself is an endpoint's row, in EXACT).
    **{prefix: (responses.response, ("GET", "HEAD", "DELETE")) for prefix in responses.PREFIXES},
    **{prefix: (admin.handle, methods) for prefix, methods in admin.PREFIXED_PATHS.items()},
}


class GatewayApp:
    def __init__(self, runtime: Runtime, lifespan: Starlette, pipeline: Pipeline) -> None:
        self.state: State = lifespan.state
        self.state.runtime = runtime
        self._runtime = runtime  # read per request (a State's attribute is a dict lookup call)
        self.ids = Ids()
        self._lifespan = lifespan
        self.pipeline = pipeline
        self._exact = {
            path: Route(fn.made(pipeline.handler) if isinstance(fn, Endpoint) else fn, methods)
            for path, (fn, methods) in EXACT.items()
        }
        self._prefixed = tuple(
            (prefix, Route(fn, methods)) for prefix, (fn, methods) in PREFIXED.items()
        )
        self._not_found = Route(handlers.not_found, ANY)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._lifespan(scope, receive, send)
            return
        headers = header_map(scope)
        given = headers.get("x-request-id")
        rid = given if given and _SAFE_ID.fullmatch(given) else "req_" + self.ids.next()
        echo = [(b"x-request-id", rid.encode())]
        trace = headers.get("x-portkey-trace-id")
        if trace and _SAFE_ID.fullmatch(trace):
            echo.append((b"x-portkey-trace-id", trace.encode()))
        runtime = self._runtime
        path: str = scope["path"]
        inbound = Inbound(
            runtime,
            scope["method"],
            path,
            headers,
            rid,
            self.ids,
            watched(scope, receive),
            scope.get("query_string", b""),
        )
        endpoint = self._exact.get(path) or self._route(path)
        runtime.inflight += 1
        try:
            await endpoint(inbound, Reply(send, echo))
        finally:
            runtime.inflight -= 1
            if runtime.idle is not None and not runtime.inflight:
                runtime.idle.set()

    def _route(self, path: str) -> Route:
        for prefix, endpoint in self._prefixed:
            if path.startswith(prefix):
                return endpoint
        return self._not_found

    @property
    def runtime(self) -> Runtime:
        """The runtime new requests get."""
        return self._runtime

    def swap(self, runtime: Runtime) -> None:
        """Requests from here on get `runtime`; those under way keep theirs."""
        self._runtime = self.state.runtime = runtime


def create_app(
    config: Config,
    serving_process: bool = False,
    watch: Snapshot | None = None,
    build: Build = build_provider,
    workers: int = 1,
    started: Callable[[], None] | None = None,
    stages: Sequence[Stage] = (),
) -> GatewayApp:
    """`serving_process`: this process only serves (gateway serve): it runs the batch runner.
    `watch`: the config file `config` was read from, reloaded on SIGHUP and when it changes.
    `build`: how a provider is built from its config block.
    `workers`: the serving processes of `gateway serve`, which a reloaded config must suit.
    `stages`: added to the pipeline of every inference endpoint, around the attempts
    (gateway.pipeline.stages).
    `started`: called once the runtime has started (the server tunes its process there:
    gateway.server.process)."""
    runtime = Runtime.build(
        config,
        Metrics(config.metrics.enabled, config.metrics.min_interval_s, config.metrics.team_labels),
        build,
    )
    runtime.workers = workers

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        exporter = _exporter(app)
        if exporter is not None:  # first: a taken address fails the start before the engine
            await exporter.start(reuse_port=workers > 1)
        await runtime.start()
        runner = Runner(lambda: app.runtime, pipeline.lines()) if serving_process else None
        if runner is not None:
            runner.start()
        reloader = Reloader(app, watch, build, workers) if watch is not None else None
        if reloader is not None:
            reloader.start()
        if started is not None:
            started()
        try:
            yield
        finally:
            if exporter is not None:
                await exporter.stop()
            if runner is not None:
                await runner.stop()  # lines in flight run again at the next start
            if reloader is not None:
                await reloader.stop()  # first: it closes what swapped-out runtimes left
            await app.runtime.aclose()
            app.runtime.metrics.flush()  # what was observed last is written (several workers)

    pipeline = Pipeline(stages)
    app = GatewayApp(runtime, Starlette(lifespan=lifespan), pipeline)
    return app


def _exporter(app: GatewayApp) -> Exporter | None:
    """The metrics listener of `metrics.listen` (read at start, as a reload keeps it), checking
    keys against the runtime of the moment."""
    config = app.runtime.config.metrics
    if config.listen is None:
        return None
    authorize = (
        (lambda headers: app.runtime.auth.authenticate(headers)) if config.require_key else None
    )
    return Exporter(config, app.runtime.metrics.scrape, authorize)

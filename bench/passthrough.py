"""The benchmark's yardsticks on the gateway's own stack: bare pass-throughs, and the least a
gateway can do.

The pass-throughs do no auth, validation, routing or normalization: each forwards the body of a
POST to /v1/completions, /v1/chat/completions, /v1/embeddings or /v1/responses to the same path
upstream over one client's pooled connections and relays the answer (JSON, or the SSE bytes as
they come: a Responses stream's `event:` lines with them).
Three kinds of app:

    starlette  a Starlette app (Request, Response, StreamingResponse): what a proxy written with a
               web framework costs
    raw        a bare ASGI callable: the floor of the stack itself (the server and the client),
               under which no gateway on it can go
    raw-cache  `raw` answering a repeated request from a dict: the floor of a cache hit
    minimal    `raw` plus the least a gateway does to a JSON completion or chat request (a key,
               one parse, type checks, an alias, the answer checked and rendered again): what a
               gateway's essential work costs on the floor (MinimalApp)

and three upstream clients: `http1`, the gateway's own (providers/transport/http1.py), and the
libraries it was chosen over, `aiohttp` (the one it replaced) and `rnet` (hyper). All run under
uvicorn with the gateway's own protocol and server options (and, with --workers N, N processes
on one socket as `gateway serve --workers N` runs them), so the difference between one and the
gateway is the gateway's work, and the difference between raw and direct is the floor that any
Python ASGI proxy on that client pays on the machine at hand.

Run: python bench/passthrough.py --upstream URL --port 9002 [--raw | --raw-cache] [--client rnet]
                                 [--workers N]
     python bench/passthrough.py --upstream URL --minimal KEY --models alias=model,…
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Protocol

import aiohttp
import orjson
import rnet
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.server.process import tune_allocator
from gateway.server.protocol import GatewayHttpProtocol
from providers.transport import http1

UPSTREAM_ENV = "BENCH_PASSTHROUGH_UPSTREAM"  # how uvicorn's worker processes learn it
CLIENT_ENV = "BENCH_PASSTHROUGH_CLIENT"
KEY_ENV = "BENCH_MINIMAL_KEY"
MODELS_ENV = "BENCH_MINIMAL_MODELS"  # alias=upstream model,…
EMBED = "/v1/embeddings"
MINIMAL_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})  # the minimal app's own
FORWARDED = frozenset({*MINIMAL_PATHS, EMBED, "/v1/responses"})
JSON_HEADERS = {"content-type": "application/json"}
SSE = "text/event-stream"
POOL = 100
CLIENTS = ("http1", "aiohttp", "rnet")  # the gateway's own first

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Answer(Protocol):
    """An upstream's answer, its status and content type in: the body whole or as it comes."""

    status: int
    content_type: str

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class AiohttpAnswer:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_type = resp.content_type

    async def read(self) -> bytes:
        return await self._resp.read()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.content.iter_any()

    async def close(self) -> None:
        self._resp.release()


class RnetAnswer:
    def __init__(self, resp: rnet.Response) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_type = (resp.headers.get("content-type") or b"").decode().split(";")[0]

    async def read(self) -> bytes:
        return await self._resp.bytes()

    async def chunks(self) -> AsyncIterator[bytes]:
        async with self._resp.stream() as streamed:
            async for chunk in streamed:
                yield chunk

    async def close(self) -> None:
        await self._resp.close()


class Http1Answer:
    def __init__(self, resp: http1.Response) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_type = resp.content_type

    async def read(self) -> bytes:
        return await self._resp.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._resp.chunk()) is not None:
            yield chunk

    async def close(self) -> None:
        self._resp.close()


class Upstream:
    """One pooled client of one of the clients, opened with the app."""

    def __init__(self, root: str, library: str) -> None:
        self.root = root
        self.library = library
        self._http1: http1.Pool | None = None
        self._aiohttp: aiohttp.ClientSession | None = None
        self._rnet: rnet.Client | None = None

    async def open(self) -> None:
        if self.library == "http1":
            self._http1 = http1.Pool(self.root, JSON_HEADERS, POOL, 30.0)
        elif self.library == "aiohttp":
            self._aiohttp = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=POOL))
        else:
            self._rnet = rnet.Client(
                default_headers=JSON_HEADERS,
                pool_max_size=POOL,
                no_proxy=True,
                http1_only=True,
                tcp_nodelay=True,
            )

    async def close(self) -> None:
        if self._http1 is not None:
            self._http1.close()
        if self._aiohttp is not None:
            await self._aiohttp.close()

    async def post(self, path: str, body: bytes) -> Answer:
        if self._http1 is not None:
            return Http1Answer(await self._http1.request("POST", path, body, 10.0))
        if self._aiohttp is not None:
            sent = self._aiohttp.post(self.root + path, data=body, headers=JSON_HEADERS)
            return AiohttpAnswer(await sent)
        assert self._rnet is not None
        return RnetAnswer(await self._rnet.request(rnet.Method.POST, self.root + path, body=body))


def create_app(upstream: Upstream) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await upstream.open()
        yield
        await upstream.close()

    async def forward(request: Request) -> Response:
        answer = await upstream.post(request.url.path, await request.body())
        if answer.content_type != SSE:
            data = await answer.read()
            await answer.close()
            return Response(data, answer.status, media_type=answer.content_type)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.chunks():
                    yield chunk
            finally:
                await answer.close()

        return StreamingResponse(relay(), answer.status, media_type=SSE)

    async def health(_: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [Route(path, forward, methods=["POST"]) for path in sorted(FORWARDED)]
    return Starlette(routes=[*routes, Route("/health", health)], lifespan=lifespan)


class RawApp:
    """The same forwarding as a bare ASGI callable: the body read, one upstream call, the answer
    sent in one or two messages (or one per chunk of a stream)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["path"] in FORWARDED:
            await self.forward(scope["path"], receive, send)
        else:
            await answer(send, 200, "text/plain", b"ok")

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.upstream.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.upstream.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def forward(self, path: str, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        got = await self.upstream.post(path, body)
        try:
            if got.content_type != SSE:
                await answer(send, got.status, got.content_type, await got.read())
                return
            start = {"type": "http.response.start", "status": got.status}
            await send({**start, "headers": [(b"content-type", SSE.encode())]})
            async for chunk in got.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await got.close()


class CachingRawApp(RawApp):
    """`raw` with the least a response cache does: a JSON answer kept under its request's path
    and body, and the same request answered from it, never reaching the upstream again. The
    floor of a cache hit on this stack, beside `raw`'s relay."""

    def __init__(self, upstream: Upstream) -> None:
        super().__init__(upstream)
        self.kept: dict[tuple[str, bytes], tuple[int, str, bytes]] = {}

    async def forward(self, path: str, receive: Receive, send: Send) -> None:
        body = await _body(receive)
        kept = self.kept.get((path, body))
        if kept is not None:
            await answer(send, *kept)
            return
        got = await self.upstream.post(path, body)
        try:
            if got.content_type == SSE:  # streams are relayed, never kept
                await super().forward(path, _replaying(body), send)
                return
            text = await got.read()
        finally:
            await got.close()
        if got.status == 200:
            self.kept[(path, body)] = (got.status, got.content_type, text)
        await answer(send, got.status, got.content_type, text)


async def _body(receive: Receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


class Refused(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


# The fields of the bench's requests and their JSON types: what the minimal app checks.
MINIMAL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model": str, "prompt": str, "messages": list, "max_tokens": int,
    "temperature": (int, float), "stream": bool,
}  # fmt: skip


class MinimalApp(RawApp):
    """The least a gateway does to a JSON completion or chat request, and nothing more: the
    caller's key checked (its SHA-256, compared in constant time), one parse of the body, each
    field's type checked against a table, the alias mapped to the upstream's model, one upstream
    call, the answer's choices and usage checked and rendered again under the alias and a
    completion id of its own, the request id echoed, the time taken noted. What the gateway
    does beyond it (its declared validation of every field, routing trees with retries and
    breakers, rate limits, Portkey headers, dialect tables, normalization, metrics) is the
    difference between the two in the bench. Streams, embeddings and the Responses API are
    relayed as `raw` does."""

    def __init__(self, upstream: Upstream, key: str, models: dict[str, str]) -> None:
        super().__init__(upstream)
        self.key_sha256 = hashlib.sha256(key.encode()).digest()
        self.models = models
        self.ids = itertools.count()
        self.took: list[float] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in MINIMAL_PATHS:
            try:
                await self.serve(scope, receive, send)
            except Refused as refused:
                await answer(send, refused.status, "application/json", b"{}")
            return
        await super().__call__(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        began = time.perf_counter()
        self.authenticate(scope["headers"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        request = self.checked(body)
        if request.get("stream"):
            await self.forward(scope["path"], _replaying(body), send)
            return
        alias = request["model"]
        upstream = self.models.get(alias)
        if upstream is None:
            raise Refused(404)
        got = await self.upstream.post(scope["path"], orjson.dumps({**request, "model": upstream}))
        try:
            raw = await got.read()
        finally:
            await got.close()
        rid = f"{next(self.ids):x}"
        doc = self.rendered(orjson.loads(raw), alias, rid)
        out = orjson.dumps(doc)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(out)),
            (b"x-request-id", rid.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})
        self.took.append(time.perf_counter() - began)
        if len(self.took) >= 1000:
            self.took.clear()

    def authenticate(self, headers: list[tuple[bytes, bytes]]) -> None:
        presented = dict(headers).get(b"authorization", b"").removeprefix(b"Bearer ")
        if not hmac.compare_digest(hashlib.sha256(presented).digest(), self.key_sha256):
            raise Refused(401)

    def checked(self, body: bytes) -> dict[str, Any]:
        request = orjson.loads(body)
        if type(request) is not dict or "model" not in request:
            raise Refused(400)
        for name, value in request.items():
            expected = MINIMAL_FIELDS.get(name)
            if expected is None or not isinstance(value, expected):
                raise Refused(400)
        if not 0 <= request.get("max_tokens", 16) <= 32768:
            raise Refused(400)
        return request

    def rendered(self, got: Any, alias: str, rid: str) -> dict[str, Any]:
        if type(got) is not dict or type(got.get("choices")) is not list:
            raise Refused(502)
        chat = got.get("object") == "chat.completion"
        choices = [_choice(c, chat) for c in got["choices"]]
        usage = got.get("usage")
        if type(usage) is not dict:
            raise Refused(502)
        counts = {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        return {
            "id": ("chatcmpl-" if chat else "cmpl-") + rid,
            "object": got["object"],
            "created": int(time.time()),
            "model": alias,
            "choices": choices,
            "usage": counts,
        }


def _choice(choice: Any, chat: bool) -> dict[str, Any]:
    if type(choice) is not dict:
        raise Refused(502)
    out = {"index": choice["index"], "finish_reason": choice.get("finish_reason")}
    if chat:
        message = choice["message"]
        if type(message.get("content")) is not str:
            raise Refused(502)
        out["message"] = {"role": "assistant", "content": message["content"]}
    else:
        if type(choice.get("text")) is not str:
            raise Refused(502)
        out |= {"text": choice["text"], "logprobs": None}
    return out


def _replaying(body: bytes) -> Receive:
    """A request's body read already, received again."""

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def answer(send: Send, status: int, content_type: str, body: bytes) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _upstream() -> Upstream:
    """The app's upstream, in a process whose C allocator is set as the gateway's serving
    process sets it (gateway.server.process): left to glibc's own thresholds, the large answers of
    the embeddings scenarios are served at one or at twice the rate from one run to the next."""
    tune_allocator()
    return Upstream(os.environ[UPSTREAM_ENV], os.environ.get(CLIENT_ENV, "http1"))


def starlette_from_env() -> Starlette:
    return create_app(_upstream())


def raw_from_env() -> RawApp:
    return RawApp(_upstream())


def raw_cache_from_env() -> RawApp:
    return CachingRawApp(_upstream())


def minimal_from_env() -> MinimalApp:
    pairs = (pair.split("=", 1) for pair in os.environ[MODELS_ENV].split(","))
    return MinimalApp(_upstream(), os.environ[KEY_ENV], {a: m for a, m in pairs})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bare ASGI pass-through")
    parser.add_argument("--upstream", required=True, help="the upstream's root URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9002)
    parser.add_argument("--raw", action="store_true", help="a bare ASGI app, not Starlette")
    parser.add_argument(
        "--raw-cache", action="store_true", help="the bare app answering repeats from a dict"
    )
    parser.add_argument(
        "--minimal",
        metavar="KEY",
        help="the minimal gateway (a bare ASGI app), callers presenting KEY as a Bearer token",
    )
    parser.add_argument(
        "--models",
        default="",
        help="the minimal gateway's aliases: alias=upstream model, comma-separated",
    )
    parser.add_argument("--client", choices=CLIENTS, default=CLIENTS[0])
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ[UPSTREAM_ENV] = args.upstream
    os.environ[CLIENT_ENV] = args.client
    app = "raw_from_env" if args.raw else "starlette_from_env"
    if args.raw_cache:
        app = "raw_cache_from_env"
    if args.minimal is not None:
        os.environ[KEY_ENV], os.environ[MODELS_ENV] = args.minimal, args.models
        app = "minimal_from_env"
    uvicorn.run(
        f"passthrough:{app}",
        factory=True,
        http=GatewayHttpProtocol,  # the gateway's server, as `gateway serve` runs it
        app_dir=os.path.dirname(os.path.abspath(__file__)),
        workers=args.workers,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()

"""The benchmark's yardsticks: bare pass-throughs on the gateway's own stack, nothing else.

No auth, validation, routing or normalization: each forwards the body of a POST to
/v1/completions, /v1/chat/completions or /v1/embeddings to the same path upstream with one pooled
aiohttp session and relays the answer (JSON, or the SSE bytes as they come). Two kinds:

    starlette  a Starlette app (Request, Response, StreamingResponse): what a proxy written with a
               web framework costs
    raw        a bare ASGI callable: the floor of the stack itself (uvicorn and aiohttp's client),
               under which no gateway on it can go

Both run under uvicorn with the gateway's own server options (and, with --workers N, N
processes on one socket as `gateway serve --workers N` runs them), so the difference between
one and the gateway is the gateway's work, and the difference between raw and direct is the floor
that any Python ASGI + aiohttp proxy pays on the machine at hand.

Run: python bench/passthrough.py --upstream http://127.0.0.1:9001 --port 9002 [--raw] [--workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

UPSTREAM_ENV = "BENCH_PASSTHROUGH_UPSTREAM"  # how uvicorn's worker processes learn it
FORWARDED = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings"})
JSON_HEADERS = {"content-type": "application/json"}
SSE = "text/event-stream"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def create_app(upstream: str) -> Starlette:
    sessions: list[aiohttp.ClientSession] = []

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)))
        yield
        await sessions.pop().close()

    async def forward(request: Request) -> Response:
        body = await request.body()
        resp = await sessions[0].post(upstream + request.url.path, data=body, headers=JSON_HEADERS)
        if resp.content_type != SSE:
            data = await resp.read()
            resp.release()
            return Response(data, resp.status, media_type=resp.content_type)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.release()

        return StreamingResponse(relay(), resp.status, media_type=SSE)

    async def health(_: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [Route(path, forward, methods=["POST"]) for path in sorted(FORWARDED)]
    return Starlette(routes=[*routes, Route("/health", health)], lifespan=lifespan)


class RawApp:
    """The same forwarding as a bare ASGI callable: the body read, one aiohttp call, the answer
    sent in one or two messages (or one per chunk of a stream)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.session: aiohttp.ClientSession | None = None

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
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def forward(self, path: str, receive: Receive, send: Send) -> None:
        assert self.session is not None
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        resp = await self.session.post(self.upstream + path, data=body, headers=JSON_HEADERS)
        try:
            if resp.content_type != SSE:
                await answer(send, resp.status, resp.content_type, await resp.read())
                return
            start = {"type": "http.response.start", "status": resp.status}
            await send({**start, "headers": [(b"content-type", SSE.encode())]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            resp.release()


async def answer(send: Send, status: int, content_type: str, body: bytes) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def starlette_from_env() -> Starlette:
    return create_app(os.environ[UPSTREAM_ENV])


def raw_from_env() -> RawApp:
    return RawApp(os.environ[UPSTREAM_ENV])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bare ASGI + aiohttp pass-through")
    parser.add_argument("--upstream", required=True, help="the upstream's root URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9002)
    parser.add_argument("--raw", action="store_true", help="a bare ASGI app, not Starlette")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ[UPSTREAM_ENV] = args.upstream
    uvicorn.run(
        "passthrough:raw_from_env" if args.raw else "passthrough:starlette_from_env",
        factory=True,
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

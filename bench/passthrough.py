"""The benchmark's yardstick: a bare Starlette + aiohttp pass-through, nothing else.

No auth, validation, routing or normalization: it forwards the body of a POST to
/v1/completions, /v1/chat/completions or /v1/embeddings to the same path upstream with one pooled
aiohttp session and relays the answer (JSON, or the SSE bytes as they come). It runs under
uvicorn with the gateway's own server options, so the difference between it and the gateway is
the gateway's work, and the difference between it and direct is the floor that any Python ASGI +
aiohttp proxy pays on the machine at hand.

Run: python bench/passthrough.py --upstream http://127.0.0.1:9001 --port 9002
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str) -> Starlette:
    sessions: list[aiohttp.ClientSession] = []

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)))
        yield
        await sessions.pop().close()

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": "application/json"}
        resp = await sessions[0].post(upstream + request.url.path, data=body, headers=headers)
        if resp.content_type != "text/event-stream":
            data = await resp.read()
            resp.release()
            return Response(data, resp.status, media_type=resp.content_type)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.release()

        return StreamingResponse(relay(), resp.status, media_type="text/event-stream")

    async def health(_: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/v1/completions", forward, methods=["POST"]),
        Route("/v1/chat/completions", forward, methods=["POST"]),
        Route("/v1/embeddings", forward, methods=["POST"]),
        Route("/health", health),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bare Starlette + aiohttp pass-through")
    parser.add_argument("--upstream", required=True, help="the upstream's root URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9002)
    args = parser.parse_args(argv)
    uvicorn.run(
        create_app(args.upstream),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()

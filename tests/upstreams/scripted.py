"""A scripted OpenAI, Fireworks or Azure OpenAI `/v1/completions` upstream (aiohttp), for
end-to-end tests.

    python -m tests.upstreams.scripted --dialect {azure,fireworks,openai} --port N
        [--host 127.0.0.1] [--api-key K] [--models a,b] [--context-window 2048]
        [--chunk-delay-ms 0]

Serves POST `…/completions`, `…/chat/completions` (chat_server.py) and `…/embeddings` (any
prefix: /v1, /inference/v1, none; Azure's own paths: dialect_azure.py), on the openai dialect
OpenAI's Responses API `…/responses` (responses_server.py), GET `/v1/models`,
`/v1/models/{id}` (also under /inference/v1), GET /health, and the test controls
GET /__requests, POST /__reset, GET /__stats, POST /__script. See README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import orjson
from aiohttp import web

from . import embeddings as fake_embeddings
from .chat_fake import message_texts
from .control import get_model, health, list_models, requests_log, reset, script, stats
from .dialect import Dialect
from .dialect_azure import AzureDialect
from .dialect_fireworks import FireworksDialect
from .dialect_openai import OpenAIDialect
from .errors import UpstreamError, not_json_error
from .fakegen import CONTEXT_WINDOW
from .magic import Magic, parse_magic
from .render import Result, build
from .state import STATE, ServerState, check_auth, dumps, error_response, loads
from .validate import Params, input_texts, prompt_texts

SLOW_CHUNKS = 600  # __slow_stream__: 600 chunks x 100 ms = 60 s
SLOW_DELAY_S = 0.1
MIDSTREAM_CHUNKS = 2
MODEL_PREFIXES = ("", "/v1", "/inference/v1")
DIALECTS: dict[str, type[Dialect]] = {
    "openai": OpenAIDialect,
    "fireworks": FireworksDialect,
    "azure": AzureDialect,
}


# ----------------------------------------------------------------------------- embeddings


async def embeddings(request: web.Request) -> web.StreamResponse:
    """`…/embeddings` (tests/upstreams/embeddings.py), with the same markers and script steps
    as completions (delays, statuses, dropped connections)."""
    return await logged(request, react_embeddings)


async def react_embeddings(
    request: web.Request, state: ServerState, body: Any, magic: Magic, seq: int
) -> web.StreamResponse:
    await misbehave(request, state, magic)
    return web.json_response(fake_embeddings.answer(state.dialect.name, body), dumps=dumps)


async def misbehave(request: web.Request, state: ServerState, magic: Magic) -> None:
    """What the markers and script steps do before any answer: wait, drop the connection, or
    fail with a status."""
    if magic.sleep_ms:
        await asyncio.sleep(magic.sleep_ms / 1000)
    if magic.close or magic.reset:
        drop_connection(request, reset=magic.reset)
    fail_fast(state.dialect, magic)


# ----------------------------------------------------------------------------- completions


async def completions(request: web.Request) -> web.StreamResponse:
    return await logged(request, react)


React = Callable[[web.Request, ServerState, Any, Magic, int], Awaitable[web.StreamResponse]]
Texts = Callable[[Any], list[str]]


def request_texts(body: Any) -> list[str]:
    """Where completions, embeddings and chat bodies hold the text markers are read in."""
    return prompt_texts(body) or input_texts(body) or message_texts(body)


async def logged(
    request: web.Request, reply: React, texts: Texts = request_texts
) -> web.StreamResponse:
    """One request, logged with its outcome; `reply` answers it after auth and the script.
    `texts`: the body's texts the markers are read in."""
    state = request.app[STATE]
    body = loads(await request.read())
    seq = state.record(request, body)
    try:
        resp = await answer(request, state, body, seq, reply, texts)
    except UpstreamError as exc:
        state.finish(seq, "error")
        return error_response(exc)
    except Dropped:
        state.finish(seq, "dropped")
        raise
    except asyncio.CancelledError:
        state.finish(seq, "cancelled")  # no-op when a stream already noted its disconnect
        raise
    state.finish(seq, "ok")
    return resp


async def answer(
    request: web.Request, state: ServerState, body: Any, seq: int, reply: React, texts: Texts
) -> web.StreamResponse:
    body = state.dialect.route(request.path, request.query, body)  # Azure's addresses
    check_auth(state, request)
    magic = parse_magic(texts(body))
    step = state.script.take()
    if step is not None:
        magic = step.as_magic(magic)
    try:
        return await reply(request, state, body, magic, seq)
    except UpstreamError as exc:
        exc.override_headers(magic.headers)
        raise


async def react(
    request: web.Request, state: ServerState, body: Any, magic: Magic, seq: int
) -> web.StreamResponse:
    """Everything after auth and the script step: the order of the README."""
    await misbehave(request, state, magic)
    params = state.dialect.parse(body, state.window)
    if state.strict_models and params.model not in state.models:
        raise state.dialect.model_not_found(params.model)
    if params.stream:
        return await stream(request, state, params, magic, seq)
    return await reply_json(request, state, params, magic)


async def reply_json(
    request: web.Request, state: ServerState, params: Params, magic: Magic
) -> web.StreamResponse:
    result = build(params, state.dialect.include_stop, state.window)
    headers = state.dialect.headers(params, result)
    resp = web.json_response(state.dialect.body(params, result), headers=headers, dumps=dumps)
    resp.headers.update(magic.headers)
    if magic.cut_after is not None:
        return await send_cut_body(request, resp)
    return resp


async def send_cut_body(request: web.Request, full: web.Response) -> web.StreamResponse:
    """`full`'s status line, headers (its true Content-Length) and half its body, then the
    connection closes: the client sees a body shorter than announced."""
    body = full.body
    assert isinstance(body, bytes)
    resp = web.StreamResponse(status=full.status, headers=full.headers)
    resp.content_length = len(body)
    await resp.prepare(request)
    await resp.write(body[: len(body) // 2])
    return drop_connection(request, flush=True)


def fail_fast(dialect: Dialect, magic: Magic) -> None:
    if magic.notjson is not None:
        raise not_json_error(magic.notjson)
    if magic.status is not None:
        raise dialect.status_error(magic.status, magic.quota)
    refusal = dialect.content_filter_error() if magic.content_filter else None
    if refusal is not None:
        raise refusal


class Dropped(asyncio.CancelledError):
    """The handler ends after closing the socket itself; aiohttp treats it as cancelled."""


def drop_connection(request: web.Request, *, reset: bool = False, flush: bool = False) -> NoReturn:
    """Close the socket where it stands (no answer, or a cut body): the client sees a
    disconnect. `flush`: what was written goes out first (a cut after exactly k events);
    `reset`: the client sees a TCP RST (connection reset) instead of a FIN."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if reset and sock is not None:
            # Linger on, timeout 0: close() discards the connection with an RST.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if flush:
            transport.close()
        else:
            transport.abort()
    raise Dropped


# ----------------------------------------------------------------------------- streaming


def sse(event: Any) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def slow_params(params: Params) -> Params:
    return replace(
        params,
        prompts=params.prompts[:1],
        n=1,
        best_of=1,
        max_tokens=SLOW_CHUNKS,
        stops=(),
        truncate=False,
        ignore_eos=True,
    )


def stream_payloads(dialect: Dialect, params: Params, result: Result, magic: Magic) -> list[bytes]:
    events = [sse(e) for e in dialect.stream_events(params, result)]
    if magic.cut_after is not None:
        return events[: magic.cut_after]
    if not magic.midstream_error:
        return [*events, DONE]
    error = dialect.midstream_error_event()
    if error is None:  # Fireworks: the connection just breaks
        return events[:MIDSTREAM_CHUNKS]
    return [*events[:MIDSTREAM_CHUNKS], sse(error), DONE]


async def stream(
    request: web.Request, state: ServerState, params: Params, magic: Magic, seq: int
) -> web.StreamResponse:
    dialect, window = state.dialect, state.window
    if magic.slow_stream:
        params, window = slow_params(params), window + SLOW_CHUNKS
    result = build(params, dialect.include_stop, window)
    payloads = stream_payloads(dialect, params, result, magic)
    resp, pace = await open_stream(request, state, magic, dialect.headers(params, result))
    return await send_stream(request, resp, payloads, pace, state, seq)


async def open_stream(
    request: web.Request, state: ServerState, magic: Magic, headers: dict[str, str]
) -> tuple[web.StreamResponse, Pace]:
    """An SSE response begun with `headers` (and the magic's), and how its events are paced
    (the magic's slow stream and stall, else the server's chunk delay)."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    resp.headers.update(magic.headers)
    await resp.prepare(request)
    state.stats.streams_started += 1
    delay = SLOW_DELAY_S if magic.slow_stream else state.chunk_delay_s
    return resp, Pace(delay, magic.stall_after, magic.stall_ms / 1000)


async def send_stream(
    request: web.Request,
    resp: web.StreamResponse,
    payloads: list[bytes],
    pace: Pace,
    state: ServerState,
    seq: int,
    whole: bool | None = None,
) -> web.StreamResponse:
    """One write per event; a cut stream (`whole` false; by default, one that does not end with
    `[DONE]`: a stream without it says so itself) ends with the connection dropped."""
    sent = Sent()
    if whole is None:
        whole = payloads[-1:] == [DONE]
    try:
        await write_all(resp, payloads, pace, sent)
        if not whole:  # cut: the client gets the events, then no end
            return drop_connection(request, flush=True)
        await resp.write_eof()
    except ConnectionError:
        note_disconnect(state, seq, sent.value)
        return resp
    except Dropped:
        raise
    except asyncio.CancelledError:
        note_disconnect(state, seq, sent.value)
        raise
    state.finish(seq, "completed_stream")
    return resp


@dataclass
class Sent:
    value: int = 0


@dataclass(frozen=True)
class Pace:
    """When stream events go out: `delay` s between events, and a `stall` s silence before
    event `stall_after` (none when the stream is shorter)."""

    delay: float = 0.0
    stall_after: int | None = None
    stall: float = 0.0

    def pause_before(self, index: int) -> float:
        pause = self.delay if index else 0.0
        return pause + (self.stall if index == self.stall_after else 0.0)


async def write_all(
    resp: web.StreamResponse, payloads: Sequence[bytes], pace: Pace, sent: Sent
) -> None:
    for payload in payloads:
        pause = pace.pause_before(sent.value)
        if pause:
            await asyncio.sleep(pause)
        await resp.write(payload)
        sent.value += 1


def note_disconnect(state: ServerState, seq: int, sent: int) -> None:
    state.finish(seq, "disconnect")
    state.stats.disconnect_events.append({"seq": seq, "time": time.time(), "chunks_sent": sent})


def create_app(state: ServerState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app.router.add_get("/health", health)
    app.router.add_get("/__requests", requests_log)
    app.router.add_post("/__reset", reset)
    app.router.add_get("/__stats", stats)
    app.router.add_post("/__script", script)
    for prefix in MODEL_PREFIXES:
        app.router.add_get(f"{prefix}/models", list_models)
        app.router.add_get(f"{prefix}/models/{{model_id:.+}}", get_model)
    from .chat_server import chat_completions  # here: chat_server imports this module
    from .responses_server import add_responses_routes  # … and so does responses_server

    # Before `…completions`, which matches `…/chat/completions` too: the first match wins.
    app.router.add_post("/{prefix:.*}chat/completions", chat_completions)
    app.router.add_post("/{prefix:.*}completions", completions)
    app.router.add_post("/{prefix:.*}embeddings", embeddings)
    if state.dialect.name == "openai":  # OpenAI's Responses API (responses_server.py)
        add_responses_routes(app)
    return app


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m tests.upstreams.scripted",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dialect", required=True, choices=sorted(DIALECTS))
    ap.add_argument("--port", required=True, type=int)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument(
        "--api-key", default=None, help="require Authorization: Bearer KEY (azure: api-key: KEY)"
    )
    ap.add_argument(
        "--models",
        default=None,
        help="comma-separated model ids; when given, other models answer 404",
    )
    ap.add_argument("--context-window", type=int, default=CONTEXT_WINDOW)
    ap.add_argument("--chunk-delay-ms", type=float, default=0.0, help="pause between stream chunks")
    return ap.parse_args(argv)


def state_from_args(args: argparse.Namespace) -> ServerState:
    dialect = DIALECTS[args.dialect]()
    models = tuple(m for m in (args.models or "").split(",") if m)
    return ServerState(
        dialect=dialect,
        api_key=args.api_key,
        models=models or dialect.default_models,
        strict_models=bool(models),
        window=args.context_window,
        chunk_delay_s=args.chunk_delay_ms / 1000,
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    app = create_app(state_from_args(args))
    with contextlib.suppress(KeyboardInterrupt):
        web.run_app(
            app,
            host=args.host,
            port=args.port,
            print=None,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=1.0,
        )


if __name__ == "__main__":
    main()

"""A fast mock of an OpenAI-compatible upstream, for the gateway benchmark.

One process, a raw asyncio protocol (uvloop when importable) and a minimal HTTP/1.1 parser:
keep-alive, pipelining, Content-Length request bodies. Responses are rendered once per
(model, kind) and only the completion id changes per request, so the mock stays far from
being the bottleneck of anything it is measured against.

    POST /v1/completions   JSON completion; with "stream": true an SSE stream of N chunks
                           (chunked transfer-encoding), a usage chunk when
                           stream_options.include_usage, then `data: [DONE]`
    POST /v1/chat/completions   the same as a chat completion (`chatcmpl-` ids, the message, a
                           first delta with the role, content deltas, a finish chunk)
    POST /v1/responses     OpenAI's Responses API: a response object (one message item, the text of
                           a completion, `status: completed`, usage in the Responses API's words);
                           with "stream": true OpenAI's event sequence, each event `event: <type>`
                           and its `data:` line numbered by sequence_number (response.created,
                           response.in_progress, response.output_item.added,
                           response.content_part.added, N response.output_text.delta,
                           response.output_text.done, response.content_part.done,
                           response.output_item.done, response.completed with the response and
                           its usage), no `[DONE]`
    POST /v1/embeddings    one embedding per input (--dims floats each, as a list of numbers or
                           OpenAI's base64 of little-endian float32 when asked)
    GET  /health           200
    GET  /v1/models        the one mock model
    GET  /stats            the connections accepted (by TLS version, over TLS) and the POST
                           requests answered since the start, as JSON

With --tls-cert (a PEM with the certificate chain, and the key unless --tls-key names it) it
serves HTTPS only, on the same port: the benchmark's TLS scenario.

Run: python bench/mock_upstream.py --port 9001 [--chunks 64] [--dims 1536]
     [--tls-cert cert.pem [--tls-key key.pem]]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import math
import socket
import ssl
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

Json = dict[str, Any]

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - the venv has orjson

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    loads = json.loads

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
ID_PLACEHOLDER = b"cmpl-" + b"#" * 24  # same length as every real id, so sizes stay valid
CHAT_ID_PLACEHOLDER = b"chatcmpl-" + b"#" * 24
RESPONSE_ID_PLACEHOLDER = b"resp_" + b"#" * 48  # OpenAI's: resp_ and 48 hex digits
MESSAGE_ID = "msg_" + "0" * 48
COMPLETION_TEXT = " This is a test. This is a test. This is a test. This is a test."
COMPLETION_TOKENS = 16
PROMPT_TOKENS = 5
STREAM_TOKENS = (" This", " is", " a", " test", ".")
MAX_CACHED_MODELS = 64
TOKENS_PER_INPUT = 8
DEFAULT_DIMS = 1536  # text-embedding-3-small


@dataclass(frozen=True, slots=True)
class Head:
    method: bytes
    path: bytes
    keep_alive: bool
    length: int
    expect_continue: bool


@dataclass(slots=True)
class Stats:
    """What GET /stats reports: counted once a connection, and once a POST answered."""

    connections: int = 0
    tls: Counter[str] = field(default_factory=Counter)  # TLS version → connections
    requests: int = 0

    def render(self) -> bytes:
        return http_response(200, dumps({"connections": self.connections, "tls": dict(self.tls),
                                         "requests": self.requests}))  # fmt: skip


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------- response rendering

REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Payload Too Large",
    431: b"Request Header Fields Too Large",
    501: b"Not Implemented",
}


def http_response(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (
        status,
        REASONS.get(status, b"Unknown"),
        content_type,
        len(body),
    )
    return head + body


def error_response(status: int, message: str) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return http_response(status, dumps({"error": error}))


def completion_body(model: str, created: int) -> bytes:
    return dumps(
        {
            "id": ID_PLACEHOLDER.decode(),
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {"text": COMPLETION_TEXT, "index": 0, "logprobs": None, "finish_reason": "length"}
            ],
            "usage": usage(COMPLETION_TOKENS),
        }
    )


def chat_body(model: str, created: int) -> bytes:
    message = {"role": "assistant", "content": COMPLETION_TEXT, "refusal": None}
    return dumps(
        {
            "id": CHAT_ID_PLACEHOLDER.decode(),
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
            ],
            "usage": usage(COMPLETION_TOKENS),
            "system_fingerprint": "fp_mock",
        }
    )


def chat_stream_events(model: str, created: int, chunks: int, include_usage: bool) -> list[bytes]:
    """OpenAI's chat stream: the role first, one content delta per token, the finish chunk."""
    base = {
        "id": CHAT_ID_PLACEHOLDER.decode(),
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": "fp_mock",
    }
    extra: dict[str, Any] = {"usage": None} if include_usage else {}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return dumps({**base, "choices": [choice], **extra})

    events = [event({"role": "assistant", "content": "", "refusal": None})]
    events += [event({"content": STREAM_TOKENS[i % len(STREAM_TOKENS)]}) for i in range(chunks)]
    events.append(event({}, "length"))
    if include_usage:
        events.append(dumps({**base, "choices": [], "usage": usage(chunks)}))
    events.append(b"[DONE]")
    return [b"data: " + event + b"\n\n" for event in events]


def usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
    }


def stream_events(model: str, created: int, chunks: int, include_usage: bool) -> list[bytes]:
    base = {"id": ID_PLACEHOLDER.decode(), "object": "text_completion", "created": created}
    extra: dict[str, Any] = {"usage": None} if include_usage else {}
    events = []
    for i in range(chunks):
        finish = "length" if i == chunks - 1 else None
        choice = {
            "text": STREAM_TOKENS[i % len(STREAM_TOKENS)],
            "index": 0,
            "logprobs": None,
            "finish_reason": finish,
        }
        events.append(dumps({**base, "model": model, "choices": [choice], **extra}))
    if include_usage:
        events.append(dumps({**base, "model": model, "choices": [], "usage": usage(chunks)}))
    events.append(b"[DONE]")
    return [b"data: " + event + b"\n\n" for event in events]


def response_object(model: str, created: int, store: bool, text: str, tokens: int) -> Json:
    """The response object as OpenAI writes it: the request's fields echoed (OpenAI's defaults
    for the bench's), one message item, usage in the Responses API's words."""
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    item = {"id": MESSAGE_ID, "type": "message", "status": "completed", "content": [part],
            "role": "assistant"}  # fmt: skip
    return {
        "id": RESPONSE_ID_PLACEHOLDER.decode(), "object": "response", "created_at": created,
        "status": "completed", "background": False, "completed_at": created, "error": None,
        "incomplete_details": None, "instructions": None, "max_output_tokens": COMPLETION_TOKENS,
        "max_tool_calls": None, "model": model, "output": [item], "parallel_tool_calls": True,
        "previous_response_id": None, "prompt_cache_key": None,
        "reasoning": {"effort": None, "summary": None}, "safety_identifier": None,
        "service_tier": "default", "store": store, "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto",
        "tools": [], "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
        "usage": {
            "input_tokens": PROMPT_TOKENS, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": PROMPT_TOKENS + tokens,
        },
        "user": None, "metadata": {},
    }  # fmt: skip


def response_body(model: str, created: int, store: bool) -> bytes:
    return dumps(response_object(model, created, store, COMPLETION_TEXT, COMPLETION_TOKENS))


def response_stream_events(model: str, created: int, chunks: int, store: bool) -> list[bytes]:
    """OpenAI's Responses stream of one message: `chunks` text deltas (each with OpenAI's
    obfuscation padding), then the whole response on response.completed."""
    tokens = [STREAM_TOKENS[i % len(STREAM_TOKENS)] for i in range(chunks)]
    final = response_object(model, created, store, "".join(tokens), chunks)
    started = {**final, "status": "in_progress", "completed_at": None, "output": [],
               "usage": None}  # fmt: skip
    item = final["output"][0]
    part = item["content"][0]
    where = {"item_id": MESSAGE_ID, "output_index": 0}
    events: list[Json] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **where, "content_index": 0,
         "part": {**part, "text": ""}},
        *({"type": "response.output_text.delta", **where, "content_index": 0, "delta": token,
           "logprobs": [], "obfuscation": "mock0pad"} for token in tokens),
        {"type": "response.output_text.done", **where, "content_index": 0, "text": part["text"],
         "logprobs": []},
        {"type": "response.content_part.done", **where, "content_index": 0, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": final},
    ]  # fmt: skip
    return [
        b"event: %s\ndata: %s\n\n"
        % (event["type"].encode(), dumps({"type": event["type"], "sequence_number": n, **event}))
        for n, event in enumerate(events)
    ]


def chunked_stream_response(events: list[bytes]) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    parts = [b"%x\r\n%s\r\n" % (len(event), event) for event in events]
    return head + b"".join(parts) + b"0\r\n\r\n"


def unit_vector(dims: int, seed: int) -> list[float]:
    """A fixed unit vector of float32 values (as an embedding model answers)."""
    raw = [math.sin(seed * 7.1 + i * 0.37) for i in range(dims)]
    norm = math.sqrt(sum(x * x for x in raw))
    return list(struct.unpack(f"<{dims}f", struct.pack(f"<{dims}f", *(x / norm for x in raw))))


def embeddings_body(model: str, count: int, dims: int, as_base64: bool) -> bytes:
    data = []
    for i in range(count):
        vector: Any = unit_vector(dims, i)
        if as_base64:
            vector = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": vector})
    tokens = TOKENS_PER_INPUT * count
    answer = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return http_response(200, dumps(answer))


class Renderer:
    """Renders each response once per (model, kind); per request only the id is replaced."""

    def __init__(self, chunks: int, dims: int = DEFAULT_DIMS) -> None:
        self.chunks = chunks
        self.dims = dims
        self.created = int(time.time())
        self.cache: dict[tuple[str, str], bytes] = {}
        self.ids = itertools.count(1)

    def embedding(self, model: str, count: int, as_base64: bool) -> bytes:
        key = (model, f"embeddings-{count}-{'base64' if as_base64 else 'float'}")
        answer = self.cache.get(key)
        if answer is None:
            answer = embeddings_body(model, count, self.dims, as_base64)
            if len(self.cache) < MAX_CACHED_MODELS * 3:
                self.cache[key] = answer
        return answer

    def completion(self, model: str, stream: bool, include_usage: bool, chat: bool) -> bytes:
        kind = "stream+usage" if include_usage else "stream" if stream else "json"
        key = (model, f"{'chat-' if chat else ''}{kind}")
        template = self.cache.get(key)
        if template is None:
            template = self.render(model, stream, include_usage, chat)
            if len(self.cache) < MAX_CACHED_MODELS * 3:
                self.cache[key] = template
        if chat:
            return template.replace(CHAT_ID_PLACEHOLDER, b"chatcmpl-%024x" % next(self.ids))
        return template.replace(ID_PLACEHOLDER, b"cmpl-%024x" % next(self.ids))

    def response(self, model: str, stream: bool, store: bool) -> bytes:
        key = (model, f"responses-{'stream' if stream else 'json'}-{'store' if store else ''}")
        template = self.cache.get(key)
        if template is None:
            if stream:
                events = response_stream_events(model, self.created, self.chunks, store)
                template = chunked_stream_response(events)
            else:
                template = http_response(200, response_body(model, self.created, store))
            if len(self.cache) < MAX_CACHED_MODELS * 3:
                self.cache[key] = template
        return template.replace(RESPONSE_ID_PLACEHOLDER, b"resp_%048x" % next(self.ids))

    def render(self, model: str, stream: bool, include_usage: bool, chat: bool) -> bytes:
        if not stream:
            body = chat_body if chat else completion_body
            return http_response(200, body(model, self.created))
        events = chat_stream_events if chat else stream_events
        return chunked_stream_response(events(model, self.created, self.chunks, include_usage))

    def models(self) -> bytes:
        model = {"id": "mock-model", "object": "model", "created": self.created, "owned_by": "mock"}
        return http_response(200, dumps({"object": "list", "data": [model]}))


# ---------------------------------------------------------------- HTTP/1.1 parsing


def parse_head(raw: bytes) -> Head:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise BadRequest(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    if b"transfer-encoding" in headers:
        raise BadRequest(501, "chunked request bodies are not supported; send Content-Length")
    length = parse_length(headers.get(b"content-length", b"0"))
    connection = headers.get(b"connection", b"").lower()
    keep_alive = connection != b"close" if version == b"HTTP/1.1" else connection == b"keep-alive"
    expect = headers.get(b"expect", b"").lower() == b"100-continue"
    return Head(method, target.partition(b"?")[0], keep_alive, length, expect)


def parse_length(value: bytes) -> int:
    if not value.isdigit():
        raise BadRequest(400, "invalid Content-Length")
    length = int(value)
    if length > MAX_BODY_BYTES:
        raise BadRequest(413, "request body too large")
    return length


# ---------------------------------------------------------------- the server


class MockProtocol(asyncio.Protocol):
    def __init__(self, renderer: Renderer, stats: Stats) -> None:
        self.renderer = renderer
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: Head | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.stats.connections += 1
        tls = transport.get_extra_info("ssl_object")  # made once the handshake is done
        if tls is not None:
            self.stats.tls[tls.version() or "unknown"] += 1
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            while self.transport is not None and self.next_request():
                pass
        except BadRequest as exc:
            self.send(error_response(exc.status, str(exc)), keep_alive=False)

    def next_request(self) -> bool:
        """Handles one complete request from the buffer; False when more bytes are needed."""
        if self.head is None and not self.read_head():
            return False
        head = self.head
        assert head is not None
        if len(self.buf) < head.length:
            return False
        body = bytes(self.buf[: head.length])
        del self.buf[: head.length]
        self.head = None
        self.send(self.route(head, body), head.keep_alive)
        return True

    def read_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise BadRequest(431, "request head too large")
            return False
        self.head = parse_head(bytes(self.buf[:end]))
        del self.buf[: end + 4]
        if self.head.expect_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def send(self, response: bytes, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        if keep_alive:
            transport.write(response)
            return
        head, sep, rest = response.partition(b"\r\n")
        transport.write(head + sep + b"Connection: close\r\n" + rest)
        transport.close()
        self.transport = None

    def route(self, head: Head, body: bytes) -> bytes:
        handler = POSTS.get(head.path)
        if handler is not None:
            if head.method != b"POST":
                return error_response(405, "use POST")
            try:
                request = loads(body)
            except ValueError:
                return error_response(400, "body is not valid JSON")
            if not isinstance(request, dict):
                return error_response(400, "body must be a JSON object")
            self.stats.requests += 1
            return handler(self.renderer, request)
        if head.path in (b"/health", b"/v1/health"):
            return http_response(200, b'{"status":"ok"}')
        if head.path == b"/stats":
            return self.stats.render()
        if head.path == b"/v1/models":
            return self.renderer.models()
        return error_response(404, f"no route {head.path.decode(errors='replace')}")


def completions(renderer: Renderer, request: dict[str, Any], chat: bool = False) -> bytes:
    model = request.get("model")
    model = model if isinstance(model, str) else "mock-model"
    stream = request.get("stream") is True
    options = request.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    return renderer.completion(model, stream, stream and wants_usage, chat)


def chat(renderer: Renderer, request: dict[str, Any]) -> bytes:
    if not isinstance(request.get("messages"), list):
        return error_response(400, "'messages' must be an array")
    return completions(renderer, request, chat=True)


def responses(renderer: Renderer, request: dict[str, Any]) -> bytes:
    if not isinstance(request.get("input"), str | list):
        return error_response(400, "'input' must be a string or an array of items")
    model = request.get("model")
    model = model if isinstance(model, str) else "mock-model"
    store = request.get("store") is not False  # OpenAI's default: stored
    return renderer.response(model, request.get("stream") is True, store)


def embeddings(renderer: Renderer, request: dict[str, Any]) -> bytes:
    count = input_count(request.get("input"))
    if count is None:
        return error_response(400, "'input' must be a string, strings or token ids")
    model = request.get("model")
    model = model if isinstance(model, str) else "mock-embedding"
    return renderer.embedding(model, count, request.get("encoding_format") == "base64")


POSTS: dict[bytes, Callable[[Renderer, dict[str, Any]], bytes]] = {
    b"/v1/completions": completions,
    b"/completions": completions,
    b"/v1/chat/completions": chat,
    b"/chat/completions": chat,
    b"/v1/responses": responses,
    b"/responses": responses,
    b"/v1/embeddings": embeddings,
    b"/embeddings": embeddings,
}


def input_count(value: Any) -> int | None:
    """How many embeddings an `input` asks for (OpenAI's four forms)."""
    if isinstance(value, str):
        return 1
    if not isinstance(value, list) or not value:
        return None
    return 1 if isinstance(value[0], int) else len(value)


def server_context(cert: str, key: str | None) -> ssl.SSLContext:
    """HTTPS with the certificate given (the library's defaults: TLS 1.2 or later)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def serve(
    host: str, port: int, chunks: int, dims: int, tls: ssl.SSLContext | None = None
) -> None:
    loop = asyncio.get_running_loop()
    renderer, stats = Renderer(chunks, dims), Stats()
    server = await loop.create_server(
        lambda: MockProtocol(renderer, stats), host, port, reuse_address=True, backlog=4096,
        ssl=tls,
    )  # fmt: skip
    scheme = "http" if tls is None else "https"
    print(f"mock upstream listening on {scheme}://{host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def run(coro_factory: Callable[[], Any]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro_factory())
        return
    uvloop.run(coro_factory())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fast mock OpenAI-compatible upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--chunks", type=int, default=64, help="content chunks per stream")
    parser.add_argument("--dims", type=int, default=DEFAULT_DIMS, help="floats per embedding")
    parser.add_argument("--tls-cert", help="serve HTTPS: PEM certificate chain (and key)")
    parser.add_argument("--tls-key", help="the certificate's key, when not in --tls-cert")
    args = parser.parse_args(argv)
    if args.tls_key is not None and args.tls_cert is None:
        parser.error("--tls-key needs --tls-cert")
    tls = None if args.tls_cert is None else server_context(args.tls_cert, args.tls_key)
    with contextlib.suppress(KeyboardInterrupt):
        run(lambda: serve(args.host, args.port, args.chunks, args.dims, tls))


if __name__ == "__main__":
    main()

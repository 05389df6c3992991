"""The adapter against a scripted upstream on 127.0.0.1: the bytes it sends, what it makes of
the answers, retries for "truncate", and closing the upstream when the caller goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from core.answers import Chunk
from core.completions import RequestLimits, validate_completion
from core.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from core.provider import Prepared, Target
from providers.openai_compat import OpenAICompatProvider
from providers.openai_compat.adapter import UpstreamCompletion

Responder = Callable[[web.Request], Awaitable[web.StreamResponse]]
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


class Upstream:
    """Answers each POST with the next scripted responder; records what it received."""

    def __init__(self) -> None:
        self.script: list[Responder] = []
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[Any] = []
        self.peers: list[Any] = []
        self.gone = asyncio.Event()  # a streaming handler saw the client disconnect
        self.base_url = ""
        # vLLM's context routes: GET /v1/models and POST /tokenize (None: 404, as elsewhere)
        self.max_model_len: int | None = None
        self.token_counts: dict[str, int] = {}  # prompt → what /tokenize answers
        self.extra_calls: list[str] = []  # "models", "tokenize <prompt>"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(orjson.loads(await request.read()))
        self.headers.append(request.headers.copy())  # case-insensitive
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        return await self.script.pop(0)(request)

    async def models(self, _: web.Request) -> web.StreamResponse:
        if self.max_model_len is None:
            raise web.HTTPNotFound()
        self.extra_calls.append("models")
        card = {"id": "org/model", "object": "model", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        if self.max_model_len is None:
            raise web.HTTPNotFound()
        body = orjson.loads(await request.read())
        self.extra_calls.append(f"tokenize {body['prompt']}")
        count = self.token_counts[body["prompt"]]
        return web.json_response({"count": count, "max_model_len": self.max_model_len})


def reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Responder:
    async def respond(_: web.Request) -> web.StreamResponse:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return web.Response(
            status=status, body=raw, headers=headers, content_type="application/json"
        )

    return respond


def sse(*events: Any, done: bool = True, crlf: bool = False, linger: float = 0.0) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        end = b"\r\n\r\n" if crlf else b"\n\n"
        for event in events:
            data = event if isinstance(event, bytes) else orjson.dumps(event)
            await resp.write(b"data: " + data + end)
        if done:
            await resp.write(b"data: [DONE]" + end)
        await asyncio.sleep(linger)  # the end of the body arrives apart from [DONE]
        await resp.write_eof()
        return resp

    return respond


def endless(up: Upstream) -> Responder:
    """Streams a token every 20 ms until the client goes away."""

    async def respond(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await asyncio.sleep(0.02)
        except (ConnectionResetError, asyncio.CancelledError):
            up.gone.set()
            raise

    return respond


def slow(seconds: float) -> Responder:
    async def respond(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return web.Response(body=b"{}", content_type="application/json")

    return respond


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    app = web.Application()
    app.router.add_post("/v1/completions", up.handle)
    app.router.add_get("/v1/models", up.models)
    app.router.add_post("/tokenize", up.tokenize)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    up.base_url = f"http://127.0.0.1:{port}/v1"
    yield up
    await runner.cleanup()


Factory = Callable[..., Awaitable[OpenAICompatProvider]]


@pytest.fixture
async def make(upstream: Upstream) -> AsyncIterator[Factory]:
    made: list[OpenAICompatProvider] = []

    async def build(tag: str, **settings: Any) -> OpenAICompatProvider:
        block = {"type": tag, "base_url": upstream.base_url, "api_key": "sk-test", **settings}
        p = OpenAICompatProvider.from_config("up", tag, block, "providers.up")
        await p.start()
        made.append(p)
        return p

    yield build
    for p in made:
        await p.aclose()


def prepare(
    p: OpenAICompatProvider, timeout_s: float = 5.0, **fields: Any
) -> Prepared[UpstreamCompletion]:
    req = validate_completion({"model": "alias", "prompt": "hi", **fields}, RequestLimits())
    return p.prepare(req, Target("alias", "up", "org/model", timeout_s))


async def collect(p: OpenAICompatProvider, prepared: Prepared[UpstreamCompletion]) -> list[Chunk]:
    """The chunks after the `[]` that says the upstream accepted the request; no other batch
    may be empty."""
    batches = [batch async for batch in p.stream(prepared)]
    assert batches[0] == []
    assert all(batches[1:])
    return [chunk for batch in batches[1:] for chunk in batch]


# ---------------------------------------------------------------- non-stream


async def test_complete_sends_one_json_body_and_normalizes(
    upstream: Upstream, make: Factory
) -> None:
    p = await make("openai", headers={"OpenAI-Project": "proj"})
    assert p.ready()
    upstream.script.append(
        reply(
            200,
            {
                "id": "cmpl-1",
                "choices": [{"index": 0, "text": "yo", "finish_reason": "stop", "logprobs": None}],
                "usage": USAGE,
            },
        )
    )
    out = await p.complete(prepare(p, temperature=0.2))
    assert out == {
        "choices": [{"text": "yo", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": USAGE,
    }
    assert upstream.bodies == [
        {
            "model": "org/model",
            "prompt": "hi",
            "temperature": 0.2,
            "max_tokens": 16,
            "stream": False,
        }
    ]
    headers = upstream.headers[0]
    assert headers["Authorization"] == "Bearer sk-test"
    assert headers["Content-Type"] == "application/json"
    assert headers["OpenAI-Project"] == "proj"


async def test_complete_error_status(upstream: Upstream, make: Factory) -> None:
    p = await make("vllm-server")
    upstream.script.append(
        reply(429, {"error": {"message": "busy", "type": "requests"}}, {"Retry-After": "2"})
    )
    with pytest.raises(RateLimited) as exc:
        await p.complete(prepare(p))
    assert exc.value.headers == {"retry-after": "2"}
    assert exc.value.message == "Upstream up/org/model returned 429: busy"


async def test_unreachable_and_timeout(upstream: Upstream, make: Factory) -> None:
    p = await make("openai")
    upstream.script.append(slow(1.0))
    with pytest.raises(UpstreamTimeout) as exc:
        await p.complete(prepare(p, timeout_s=0.2))
    assert exc.value.target == "up/org/model"
    dead = await make("openai", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(UpstreamUnreachable):
        await dead.complete(prepare(dead))
    with pytest.raises(UpstreamUnreachable):
        await collect(dead, prepare(dead, stream=True))


async def test_truncate_retries_once_with_the_room_left(upstream: Upstream, make: Factory) -> None:
    p = await make("vllm-server")
    message = (
        "This model's maximum context length is 1024 tokens. However, you requested 1000 output "
        "tokens and your prompt contains at least 30 input tokens, for a total of at least 1030."
    )
    upstream.script += [
        reply(
            400,
            {
                "error": {
                    "message": message,
                    "type": "BadRequestError",
                    "param": "input_tokens",
                    "code": 400,
                }
            },
        ),
        reply(
            200,
            {"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}], "usage": USAGE},
        ),
    ]
    out = await p.complete(prepare(p, max_tokens=1000, context_length_exceeded_behavior="truncate"))
    assert out["choices"][0]["text"] == "ok"
    assert [b["max_tokens"] for b in upstream.bodies] == [1000, 994]
    assert "context_length_exceeded_behavior" not in upstream.bodies[1]


async def test_truncate_gives_up_when_the_message_says_nothing(
    upstream: Upstream, make: Factory
) -> None:
    p = await make("openai")
    upstream.script.append(
        reply(400, {"error": {"message": "too long", "code": "context_length_exceeded"}})
    )
    with pytest.raises(ContextLengthExceeded) as exc:
        await p.complete(prepare(p, context_length_exceeded_behavior="truncate"))
    assert (exc.value.param, exc.value.code) == ("prompt", "context_length_exceeded")
    assert len(upstream.bodies) == 1


async def test_error_behavior_surfaces_context_errors(upstream: Upstream, make: Factory) -> None:
    p = await make("vllm-server")
    message = (
        "This model's maximum context length is 100 tokens. However, you requested 90 output "
        "tokens and your prompt contains at least 30 input tokens"
    )
    upstream.script.append(reply(400, {"error": {"message": message, "code": 400}}))
    with pytest.raises(ContextLengthExceeded):
        await p.complete(prepare(p, max_tokens=90))
    assert len(upstream.bodies) == 1


OK_ANSWER = {"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}], "usage": USAGE}


async def test_context_check_counts_only_prompts_that_may_not_fit(
    upstream: Upstream, make: Factory
) -> None:
    """vLLM clamps max_tokens instead of failing: for "error", when asked, the adapter checks
    first; unasked, vLLM's own clamp serves."""
    p = await make("vllm-server")
    upstream.max_model_len = 100
    long_prompt = "word " * 20  # 100 characters: cannot be proven to fit without counting
    upstream.token_counts[long_prompt] = 85
    upstream.script += [reply(200, OK_ANSWER) for _ in range(3)]
    await p.complete(prepare(p, prompt=long_prompt, max_tokens=16))  # unasked: not counted
    assert upstream.extra_calls == []
    error: dict[str, Any] = {"context_length_exceeded_behavior": "error"}
    await p.complete(prepare(p, max_tokens=50, **error))  # "hi": 2 bytes + 50 surely fit
    await p.complete(prepare(p, prompt=long_prompt, max_tokens=15, **error))  # 85 + 15 fit
    assert upstream.extra_calls == ["models", f"tokenize {long_prompt}"]  # the window: once
    with pytest.raises(ContextLengthExceeded) as exc:
        await p.complete(prepare(p, prompt=long_prompt, max_tokens=16, **error))
    assert exc.value.message == (
        "This model's maximum context length is 100 tokens, however you requested 101 tokens "
        "(85 in your prompt; 16 for the completion). Please reduce your prompt; or completion "
        "length."
    )
    assert (exc.value.status, exc.value.param) == (400, "prompt")
    with pytest.raises(ContextLengthExceeded) as exc:  # token ids are counted as they are
        prompt = [[1] * 10, [2] * 95]
        await collect(p, prepare(p, prompt=prompt, max_tokens=6, stream=True, **error))
    assert "(95 in your prompt 1; 6 for the completion)" in exc.value.message
    assert len(upstream.bodies) == 3  # nothing over the window reached the upstream


async def test_context_check_not_for_truncate_nor_without_a_window(
    upstream: Upstream, make: Factory
) -> None:
    p = await make("vllm-server")
    upstream.script += [reply(200, OK_ANSWER), reply(200, OK_ANSWER)]
    await p.complete(prepare(p, prompt=[7] * 500, max_tokens=16))  # no /v1/models: no window
    upstream.max_model_len = 100
    truncate: dict[str, Any] = {"context_length_exceeded_behavior": "truncate"}
    await p.complete(prepare(p, prompt=[7] * 99, max_tokens=16, **truncate))  # vLLM clamps
    assert upstream.extra_calls == []
    assert len(upstream.bodies) == 2


async def test_context_check_only_on_clamping_upstreams(upstream: Upstream, make: Factory) -> None:
    p = await make("openai")  # OpenAI fails by itself
    upstream.max_model_len = 100
    upstream.script.append(reply(200, OK_ANSWER))
    await p.complete(prepare(p, prompt=[7] * 99, max_tokens=16))
    assert upstream.extra_calls == []


async def test_best_of_emulated_end_to_end(upstream: Upstream, make: Factory) -> None:
    p = await make("vllm-server")

    def cand(i: int, text: str, logprob: float) -> dict[str, Any]:
        logprobs = {
            "tokens": [text],
            "token_logprobs": [logprob],
            "top_logprobs": [None],
            "text_offset": [0],
        }
        return {"index": i, "text": text, "finish_reason": "stop", "logprobs": logprobs}

    upstream.script.append(
        reply(
            200,
            {
                "choices": [cand(0, "a", -2.0), cand(1, "b", -0.5), cand(2, "c", -1.0)],
                "usage": USAGE,
            },
        )
    )
    out = await p.complete(prepare(p, best_of=3, n=2))
    assert upstream.bodies[0]["n"] == 3 and upstream.bodies[0]["logprobs"] == 0
    assert out["choices"] == [
        {"text": "b", "index": 0, "logprobs": None, "finish_reason": "stop"},
        {"text": "c", "index": 1, "logprobs": None, "finish_reason": "stop"},
    ]


# ---------------------------------------------------------------- streams


async def test_stream_openai_style_and_connection_reuse(upstream: Upstream, make: Factory) -> None:
    p = await make("openai")
    for _ in range(2):
        upstream.script.append(
            sse(
                {
                    "choices": [
                        {"index": 0, "text": "He", "finish_reason": None, "logprobs": None}
                    ],
                    "usage": None,
                },
                {"choices": [{"index": 0, "text": "", "finish_reason": None}]},
                {"choices": [{"index": 0, "text": "y", "finish_reason": "length"}], "usage": None},
                {"choices": [], "usage": USAGE},
                crlf=True,
                linger=0.05,
            )
        )
    for _ in range(2):
        chunks = await collect(p, prepare(p, stream=True))
        assert chunks == [
            {"choices": [{"text": "He", "index": 0, "logprobs": None, "finish_reason": None}]},
            {"choices": [{"text": "y", "index": 0, "logprobs": None, "finish_reason": "length"}]},
            {"choices": [], "usage": USAGE},
        ]
    assert upstream.bodies[0]["stream_options"] == {"include_usage": True}
    assert upstream.peers[0] == upstream.peers[1]  # the pooled connection was reused


async def test_stream_fireworks_usage_and_stop_hold_back(upstream: Upstream, make: Factory) -> None:
    p = await make("fireworks")
    upstream.script.append(
        sse(
            {"choices": [{"index": 0, "text": "1 2", "finish_reason": None}], "usage": None},
            {"choices": [{"index": 0, "text": " 3\n", "finish_reason": None}], "usage": None},
            {"choices": [{"index": 0, "text": "\n", "finish_reason": "stop"}], "usage": USAGE},
        )
    )
    chunks = await collect(p, prepare(p, stream=True, stop="\n\n"))
    assert chunks == [
        {"choices": [{"text": "1 2", "index": 0, "logprobs": None, "finish_reason": None}]},
        {"choices": [{"text": " 3", "index": 0, "logprobs": None, "finish_reason": "stop"}]},
        {"choices": [], "usage": USAGE},
    ]
    body = upstream.bodies[0]
    assert "stream_options" not in body
    assert body["context_length_exceeded_behavior"] == "error"


async def test_stream_error_before_first_chunk(upstream: Upstream, make: Factory) -> None:
    p = await make("fireworks")
    upstream.script.append(reply(422, {"detail": [{"loc": ["body", "top_k"], "msg": "bad"}]}))
    with pytest.raises(InvalidRequest) as exc:
        await collect(p, prepare(p, stream=True))
    assert (exc.value.status, exc.value.param) == (400, "top_k")


async def test_stream_error_event_midway(upstream: Upstream, make: Factory) -> None:
    p = await make("vllm-server")
    upstream.script.append(
        sse(
            {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
            {"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}},
        )
    )
    got: list[list[Chunk]] = []
    with pytest.raises(UpstreamError) as exc:
        async for batch in p.stream(prepare(p, stream=True)):
            got.append(batch)
    assert got[0] == [] and [c["choices"][0]["text"] for b in got for c in b] == ["a"]
    assert exc.value.message == "Upstream up/org/model returned 500: engine dead"


async def test_stream_bad_chunk_after_good_ones_in_one_read(
    upstream: Upstream, make: Factory
) -> None:
    p = await make("openai")
    upstream.script.append(
        sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}, {"choices": ["?"]})
    )
    got: list[list[Chunk]] = []
    with pytest.raises(UpstreamError) as exc:
        async for batch in p.stream(prepare(p, stream=True)):
            got.append(batch)
    assert [c["choices"][0]["text"] for b in got for c in b] == ["a"]
    assert "a choice that is not a JSON object" in exc.value.message


async def test_stream_answered_with_json(upstream: Upstream, make: Factory) -> None:
    p = await make("openai-compatible")
    upstream.script.append(
        reply(
            200, {"choices": [{"index": 0, "text": "all", "finish_reason": "stop"}], "usage": USAGE}
        )
    )
    chunks = await collect(p, prepare(p, stream=True))
    assert chunks == [
        {"choices": [{"text": "all", "index": 0, "logprobs": None, "finish_reason": "stop"}]},
        {"choices": [], "usage": USAGE},
    ]


async def test_stream_truncate_retry_before_first_byte(upstream: Upstream, make: Factory) -> None:
    p = await make("openai")
    message = (
        "This model's maximum context length is 50 tokens, however you requested 60 tokens "
        "(20 in your prompt; 40 for the completion)."
    )
    upstream.script += [
        reply(400, {"error": {"message": message, "code": "context_length_exceeded"}}),
        sse({"choices": [{"index": 0, "text": "z", "finish_reason": "length"}]}),
    ]
    chunks = await collect(
        p, prepare(p, stream=True, max_tokens=40, context_length_exceeded_behavior="truncate")
    )
    assert chunks == [
        {"choices": [{"text": "z", "index": 0, "logprobs": None, "finish_reason": "length"}]}
    ]
    assert [b["max_tokens"] for b in upstream.bodies] == [40, 30]


async def test_consumer_aclose_closes_upstream_at_once(upstream: Upstream, make: Factory) -> None:
    p = await make("vllm-server")
    upstream.script.append(endless(upstream))
    stream = p.stream(prepare(p, stream=True))
    assert await stream.__anext__() == []
    first = await stream.__anext__()
    assert first[0]["choices"][0]["text"] == "x"
    await stream.aclose()
    await asyncio.wait_for(upstream.gone.wait(), 10.0)


async def test_cancelled_consumer_closes_upstream_at_once(
    upstream: Upstream, make: Factory
) -> None:
    p = await make("fireworks")
    upstream.script.append(endless(upstream))
    stream = p.stream(prepare(p, stream=True))
    started = asyncio.Event()

    async def consume() -> None:
        async for chunk in stream:
            if chunk:
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 10.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await stream.aclose()
    await asyncio.wait_for(upstream.gone.wait(), 10.0)


async def test_aclose_before_iteration_closes_nothing_open(
    upstream: Upstream, make: Factory
) -> None:
    p = await make("openai")
    stream = p.stream(prepare(p, stream=True))
    await stream.aclose()
    assert upstream.bodies == []

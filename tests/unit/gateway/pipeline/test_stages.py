"""The pipeline's stages, seen from a stage added to it: one stage, inserted once, observes every
endpoint's JSON and stream requests (and a batch's lines), with the answer the caller gets. And
the provider contract: an adapter that does not implement an endpoint refuses it, by default."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
import orjson
import pytest
from orjson import Fragment

from core.answers import Choice, Completion, Embeddings, Usage
from core.completions import CompletionRequest
from core.embeddings import EmbeddingRequest
from core.provider import Adapter, Prepared, Target
from gateway.api.app import create_app
from gateway.asgi import Message, caller_stays
from gateway.auth import Principal
from gateway.config import Config, KeyConfig, ModelConfig, ProviderConfig, ServerConfig
from gateway.metrics import RequestRecord
from gateway.pipeline.endpoints import ENDPOINTS, A, K, R
from gateway.pipeline.exchange import Ids, Inbound, Reply
from gateway.pipeline.flow import Flow, Next, tapped
from gateway.pipeline.shapes import response_usage
from gateway.pipeline.stages import Pipeline
from gateway.routing.trees import Leaf
from tests.unit.gateway.api.test_app import FakeProvider

pytestmark = pytest.mark.asyncio
AUTH = {"authorization": "Bearer sk-a", "content-type": "application/json"}


class Embedder(FakeProvider):
    """The scripted provider, serving embeddings too."""

    def prepare_embedding(self, request: EmbeddingRequest, target: Target) -> Prepared[None]:
        return Prepared(target, (), None)

    async def embed(self, prepared: Prepared[None]) -> Embeddings:
        data: list[list[float] | Fragment] = [[0.5, 0.25], [0.25, 0.5]]  # the tests send two
        return {"data": data, "usage": {"prompt_tokens": 2, "total_tokens": 2}}


class CompletionsOnly(Adapter[None, None, None]):
    """Implements completions only: chat and embeddings are the contract's to refuse."""

    type_tags: ClassVar[tuple[str, ...]] = ("completions-only",)

    def __init__(self, name: str) -> None:
        self.name = name

    def prepare(self, request: CompletionRequest, target: Target) -> Prepared[None]:
        return Prepared(target, (), None)

    async def complete(self, prepared: Prepared[None]) -> Completion:
        choice: Choice = {"text": "ok", "index": 0, "logprobs": None, "finish_reason": "stop"}
        usage: Usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return {"choices": [choice], "usage": usage}


@dataclass
class Seen:
    """What the observing stage saw of one request."""

    endpoint: str
    model: str
    stream: bool
    answer: Any = None  # a JSON answer, as the attempts returned it
    batches: list[Any] = field(default_factory=list)  # a stream's batches, as they were written
    ended: bool | None = None  # a stream ran to its end (True) or not (False)
    status: int = 0  # what the caller got


class Observer:
    """A stage: for every endpoint, the request, then its answer or its stream."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []

    def __call__(self, proceed: Next[R, A, K]) -> Next[R, A, K]:
        async def observed(flow: Flow[R, A, K]) -> None:
            assert flow.request is not None
            seen = Seen(flow.endpoint.name, flow.request.model, flow.streams)
            self.seen.append(seen)
            await proceed(flow)
            if flow.stream is not None:
                flow.stream = tapped(flow.stream, seen.batches.append, _ended(seen))
            else:
                seen.answer = flow.answer

        return observed


def _ended(seen: Seen) -> Callable[[bool], None]:
    def ended(whole: bool) -> None:
        seen.ended = whole

    return ended


def config(providers: dict[str, Any]) -> Config:
    def model(alias: str, endpoint: str, provider: str) -> ModelConfig:
        target = Target(alias, provider, "up")
        leaf = Leaf(provider, "up", f"models.{alias}.targets[0]", target=target)
        return ModelConfig(alias, leaf, endpoint=endpoint)

    key = KeyConfig("a", hashlib.sha256(b"sk-a").digest(), ("*",), ())
    return Config(
        server=ServerConfig(),
        keys=(key,),
        providers={name: ProviderConfig(name, {"type": "fake"}) for name in providers},
        models={
            "gen": model("gen", "completions", "fake"),
            "emb": model("emb", "embeddings", "fake"),
            "only": model("only", "completions", "only"),
            "only-emb": model("only-emb", "embeddings", "only"),
        },
    )


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, Observer]]:
    providers: dict[str, Any] = {"fake": Embedder("fake"), "only": CompletionsOnly("only")}
    observer = Observer()
    app = create_app(
        config(providers), build=lambda block: providers[block.name], stages=(observer,)
    )
    await app.state.runtime.start()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c, observer


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"model": "gen", "prompt": "x"}),
    ("/v1/completions", {"model": "gen", "prompt": "x", "stream": True}),
    ("/v1/chat/completions", {"model": "gen", "messages": [{"role": "user", "content": "x"}]}),
    (
        "/v1/chat/completions",
        {"model": "gen", "messages": [{"role": "user", "content": "x"}], "stream": True},
    ),
    ("/v1/embeddings", {"model": "emb", "input": ["a", "b"]}),
    ("/v1/responses", {"model": "gen", "input": "x", "store": False}),
    ("/v1/responses", {"model": "gen", "input": "x", "store": False, "stream": True}),
]


async def test_a_stage_sees_every_endpoints_json_and_stream_requests(
    client: tuple[httpx.AsyncClient, Observer],
) -> None:
    c, observer = client
    for path, body in CALLS:
        r = await c.post(path, content=orjson.dumps(body), headers=AUTH)
        assert r.status_code == 200, r.text
        seen = observer.seen[-1]
        assert (seen.endpoint, seen.model, seen.stream) == (
            path.removeprefix("/v1/"),
            body["model"],
            body.get("stream", False),
        )
        if path == "/v1/responses":
            _seen_response(r, seen)
            continue
        if not seen.stream:  # the answer the caller got is the one the stage saw
            assert seen.answer is not None and r.json()["usage"] == seen.answer["usage"]
            continue
        events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and seen.ended is True
        chunks = [chunk for batch in seen.batches for chunk in batch if chunk.get("choices")]
        written = [orjson.loads(e) for e in events[:-1] if orjson.loads(e).get("choices")]
        assert len(chunks) == len(written) > 0
    assert {s.endpoint for s in observer.seen} == {e.name for e in ENDPOINTS}


def _seen_response(r: httpx.Response, seen: Seen) -> None:
    """A response's answer, or its stream's events, as the stage saw them: the same events,
    numbered, and the same usage in the Responses API's words."""
    if not seen.stream:
        assert seen.answer is not None
        assert r.json()["usage"] == response_usage(seen.answer["usage"])
        return
    blocks = [b for b in r.text.split("\n\n") if b]
    kinds = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    data = [orjson.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]
    assert [d["type"] for d in data] == kinds and kinds[-1] == "response.completed"
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert [e["type"] for batch in seen.batches for e in batch] == kinds
    assert seen.ended is True


async def test_a_request_refused_before_its_admission_does_not_reach_the_stage(
    client: tuple[httpx.AsyncClient, Observer],
) -> None:
    c, observer = client
    r = await c.post("/v1/completions", content=b'{"model": "gen"}', headers=AUTH)
    assert r.status_code == 400
    assert observer.seen == []


async def test_a_batch_line_goes_through_the_same_stage() -> None:
    providers: dict[str, Any] = {"fake": Embedder("fake")}
    observer = Observer()
    app = create_app(config(providers), build=lambda block: providers[block.name])
    rt = app.runtime
    await rt.start()
    lines = Pipeline((observer,)).lines()
    assert set(lines) == {e.batch_url for e in ENDPOINTS}
    sent: list[Message] = []

    async def capture(message: Message) -> None:
        sent.append(message)

    serve, operation = lines["/v1/chat/completions"]
    inbound = Inbound(rt, "POST", "/v1/chat/completions", {}, "batch", Ids(), caller_stays)
    body = orjson.dumps({"model": "gen", "messages": [{"role": "user", "content": "x"}]})
    principal = rt.auth.principal("a")
    assert isinstance(principal, Principal)
    line: Awaitable[None] = serve(
        inbound, Reply(capture), RequestRecord(0.0, operation=operation), principal, body
    )
    await line
    assert sent[0]["status"] == 200
    assert [s.endpoint for s in observer.seen] == ["chat/completions"]
    assert observer.seen[0].answer["choices"][0]["message"]["content"] == "fake:0"


@pytest.mark.parametrize(
    ("path", "body", "endpoint"),
    [
        ("/v1/chat/completions", {"model": "only", "messages": [{"role": "user", "content": "x"}]}, "chat completions"),  # noqa: E501
        ("/v1/embeddings", {"model": "only-emb", "input": "x"}, "embeddings"),
    ],
)  # fmt: skip
async def test_an_endpoint_an_adapter_does_not_implement_is_refused_naming_the_model(
    client: tuple[httpx.AsyncClient, Observer], path: str, body: dict[str, Any], endpoint: str
) -> None:
    c, _ = client
    r = await c.post(path, content=orjson.dumps(body), headers=AUTH)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "model"
    assert error["message"] == f"Target 'only/up' does not serve {endpoint}."


async def test_what_the_adapter_implements_is_served(
    client: tuple[httpx.AsyncClient, Observer],
) -> None:
    c, _ = client
    body = {"model": "only", "prompt": "x"}
    r = await c.post("/v1/completions", content=orjson.dumps(body), headers=AUTH)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"

"""The HTTP surface in-process, with a scripted Provider: status codes, error shapes, headers,
JSON and SSE rendering, fallback. (Real servers and the SDK are in tests/e2e.)"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import httpx
import orjson
import pytest

from core.chat import ChatRequest
from core.completions import CompletionRequest
from core.errors import GatewayError, UpstreamError
from core.provider import Adapter, Prepared, Target
from gateway.api.app import create_app
from gateway.config import Config, KeyConfig, ModelConfig, ProviderConfig, ServerConfig
from gateway.routing.trees import Group, Leaf

pytestmark = pytest.mark.asyncio


class FakeProvider(Adapter[CompletionRequest, None, ChatRequest]):
    """Answers with one choice per prompt and n; scripted failures by prompt text."""

    type_tags: ClassVar[tuple[str, ...]] = ("fake",)

    def __init__(self, name: str, fail: GatewayError | None = None) -> None:
        self.name = name
        self.fail = fail
        self.calls = 0

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        return None

    def ready(self) -> bool:
        return True

    def prepare(self, request: CompletionRequest, target: Target) -> Prepared[CompletionRequest]:
        dropped = tuple(n for n in request.unknown if n.startswith("drop_"))
        return Prepared(target, dropped, request)

    def _choices(self, p: Prepared[CompletionRequest]) -> list[dict[str, Any]]:
        n = p.state.n
        return [
            {"text": f"{self.name}:{i}", "index": i, "logprobs": None, "finish_reason": "length"}
            for i in range(p.state.n_prompts * n)
        ]

    def prepare_chat(self, request: ChatRequest, target: Target) -> Prepared[ChatRequest]:
        dropped = tuple(n for n in request.unknown if n.startswith("drop_"))
        return Prepared(target, dropped, request)

    async def complete_chat(self, prepared: Prepared[ChatRequest]) -> Any:
        self.calls += 1
        if self.fail:
            raise self.fail
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": f"{self.name}:{i}", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
            for i in range(prepared.state.n)
        ]
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        return {"choices": choices, "usage": usage, "system_fingerprint": "fp_fake"}

    async def stream_chat(self, prepared: Prepared[ChatRequest]) -> AsyncIterator[Any]:
        self.calls += 1
        if self.fail:
            raise self.fail
        yield []
        none = {"logprobs": None, "finish_reason": None}
        for i in range(prepared.state.n):
            yield [
                {"choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, **none}]},
                {"choices": [{"index": i, "delta": {"content": "hi"}, **none}]},
            ]
            yield [{"choices": [{"index": i, "delta": {}, **none, "finish_reason": "stop"}]}]
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        yield [{"choices": [], "usage": usage}]

    async def complete(self, prepared: Prepared[CompletionRequest]) -> Any:
        self.calls += 1
        if self.fail:
            raise self.fail
        usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        return {"choices": self._choices(prepared), "usage": usage}

    async def stream(self, prepared: Prepared[CompletionRequest]) -> AsyncIterator[Any]:
        self.calls += 1
        if self.fail:
            raise self.fail
        yield []
        for c in self._choices(prepared):
            # One batch of two chunks, then one of one: both must come out as events.
            yield [
                {"choices": [{**c, "text": "a", "finish_reason": None}]},
                {"choices": [{**c, "text": "b", "finish_reason": None}]},
            ]
            yield [{"choices": [{**c, "text": ""}]}]
        if prepared.state.fields["prompt"] == "break":
            raise UpstreamError("Upstream x/y broke mid-stream", target="x/y")
        usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
        yield [{"choices": [], "usage": usage}]


def _config(providers: dict[str, FakeProvider]) -> Config:
    def key(kid: str, secret: str, models: tuple[str, ...], vks: tuple[str, ...] = ()) -> KeyConfig:
        return KeyConfig(kid, hashlib.sha256(secret.encode()).digest(), models, vks)

    def model(alias: str, strategy: str, *names: str) -> ModelConfig:
        leaves = tuple(
            Leaf(
                n,
                f"up-{alias}",
                f"models.{alias}.targets[{i}]",
                target=Target(alias, n, f"up-{alias}"),
            )
            for i, n in enumerate(names)
        )
        return ModelConfig(alias, Group(strategy, leaves, f"models.{alias}"))

    return Config(
        server=ServerConfig(max_body_bytes=2048),
        keys=(
            key("a", "sk-a", ("m", "org/*"), ("good",)),
            key("b", "sk-b", ("m", "fb")),
            key("c", "sk-c", ("m", "emb")),
        ),
        providers={name: ProviderConfig(name, {"type": "fake"}) for name in providers},
        models={
            "m": model("m", "single", "good"),
            "org/model-1": model("org/model-1", "single", "good"),
            "fb": model("fb", "fallback", "bad", "good"),
            "emb": replace(model("emb", "single", "good"), endpoint="embeddings"),
        },
    )


@pytest.fixture
async def setup() -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, FakeProvider]]]:
    providers = {
        "good": FakeProvider("good"),
        "bad": FakeProvider("bad", UpstreamError("Upstream bad/x returned 503", status=502)),
    }
    app = create_app(_config(providers), build=lambda block: providers[block.name])
    await app.state.runtime.start()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client, providers


AUTH = {"authorization": "Bearer sk-a"}


async def post(
    client: httpx.AsyncClient,
    body: Any,
    headers: dict[str, str] | None = None,
    path: str = "/v1/completions",
) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    hdrs = {"content-type": "application/json", **AUTH, **(headers or {})}
    return await client.post(path, content=content, headers=hdrs)


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param
    return err  # type: ignore[no-any-return]


async def test_completion_json(setup: Any) -> None:
    client, _ = setup
    r = await post(client, {"model": "m", "prompt": ["x", "y"], "n": 2})
    assert r.status_code == 200
    doc = r.json()
    assert doc["id"].startswith("cmpl-") and doc["object"] == "text_completion"
    assert doc["model"] == "m" and isinstance(doc["created"], int)
    assert [c["index"] for c in doc["choices"]] == [0, 1, 2, 3]
    assert doc["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert r.headers["x-request-id"].startswith("req_")


async def test_both_paths_and_request_ids(setup: Any) -> None:
    client, _ = setup
    r = await post(
        client,
        {"model": "m", "prompt": "x"},
        {"x-request-id": "abc-1", "x-portkey-trace-id": "trace-9"},
        path="/completions",
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "abc-1"
    assert r.headers["x-portkey-trace-id"] == "trace-9"
    r = await post(client, {"model": "m", "prompt": "x"}, {"x-request-id": "bad id;drop"})
    assert r.headers["x-request-id"].startswith("req_")


async def test_errors(setup: Any) -> None:
    client, _ = setup
    assert_error(
        await post(client, {"model": "m", "prompt": "x"}, {"authorization": "Bearer no"}), 401
    )
    assert_error(await post(client, {"model": "zzz", "prompt": "x"}), 404, "model")
    assert_error(await post(client, {"model": "fb", "prompt": "x"}), 403, "model")
    assert_error(await post(client, b"{not json"), 400)
    assert_error(await post(client, {"model": "m", "prompt": "x", "n": "2"}), 400, "n")
    assert_error(await post(client, {"model": "m", "prompt": "x" * 5000}), 413, "body")
    r = await client.post(
        "/v1/completions",
        content=b"a=b",
        headers={**AUTH, "content-type": "application/x-www-form-urlencoded"},
    )
    assert_error(r, 415, "content-type")
    assert_error(await client.get("/v1/completions", headers=AUTH), 405)
    assert_error(await client.get("/nope"), 404)
    err = assert_error(
        await post(client, {"model": "m", "prompt": "x"}, {"x-portkey-custom-host": "http://h"}),
        400,
        "x-portkey-custom-host",
    )
    assert "not supported" in err["message"]
    err = assert_error(
        await post(client, {"model": "m", "prompt": "x"}, {"x-portkey-config": "{}"}), 400, "config"
    )
    assert "a config needs targets" in err["message"]


async def test_no_key_is_401_even_for_a_bad_body(setup: Any) -> None:
    client, _ = setup
    r = await client.post(
        "/v1/completions", content=b"{", headers={"content-type": "application/json"}
    )
    assert_error(r, 401)


async def test_virtual_key(setup: Any) -> None:
    client, _ = setup
    r = await post(
        client, {"model": "whatever/at-provider", "prompt": "x"}, {"x-portkey-virtual-key": "good"}
    )
    assert r.status_code == 200 and r.json()["model"] == "whatever/at-provider"
    assert_error(
        await post(client, {"model": "m", "prompt": "x"}, {"x-portkey-virtual-key": "bad"}),
        403,
        "x-portkey-virtual-key",
    )


async def test_dropped_params_header(setup: Any) -> None:
    client, _ = setup
    r = await post(client, {"model": "m", "prompt": "x", "drop_me": 1, "drop_too": 2})
    assert r.headers["x-gateway-dropped-params"] == "drop_me,drop_too"
    r = await post(client, {"model": "m", "prompt": "x"})
    assert "x-gateway-dropped-params" not in r.headers


async def test_fallback(setup: Any) -> None:
    client, providers = setup
    r = await post(client, {"model": "fb", "prompt": "x"}, {"authorization": "Bearer sk-b"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "good:0"
    assert providers["bad"].calls == 1 and providers["good"].calls == 1
    r = await post(
        client, {"model": "fb", "prompt": "x", "stream": True}, {"authorization": "Bearer sk-b"}
    )
    assert r.status_code == 200 and providers["bad"].calls == 2


async def test_models(setup: Any) -> None:
    client, _ = setup
    r = await client.get("/v1/models", headers=AUTH)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["m", "org/model-1"]
    assert r.json()["object"] == "list"
    for path in ("/v1/models/org/model-1", "/v1/models/org%2Fmodel-1"):
        r = await client.get(path, headers=AUTH)
        assert r.status_code == 200, path
        assert r.json() == {
            "id": "org/model-1",
            "object": "model",
            "created": r.json()["created"],
            "owned_by": "gateway",
        }
    assert_error(await client.get("/v1/models/zzz", headers=AUTH), 404)
    assert_error(await client.get("/v1/models"), 401)


async def test_health(setup: Any) -> None:
    client, _ = setup
    assert (await client.get("/livez")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200


def events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    return [e.removeprefix("data: ") for e in text.strip("\n").split("\n\n")]


async def test_stream_render(setup: Any) -> None:
    client, _ = setup
    body = {
        "model": "m",
        "prompt": "x",
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = await post(client, body)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    evs = events(r.text)
    assert evs[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in evs[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "text_completion" and c["model"] == "m" for c in chunks)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 5
    text = {0: "", 1: ""}
    for c in chunks[:-1]:
        for ch in c["choices"]:
            text[ch["index"]] += ch["text"]
    assert text == {0: "ab", 1: "ab"}


async def test_stream_without_usage(setup: Any) -> None:
    client, _ = setup
    r = await post(client, {"model": "m", "prompt": "x", "stream": True})
    chunks = [orjson.loads(e) for e in events(r.text)[:-1]]
    assert all("usage" not in c for c in chunks) and all(c["choices"] for c in chunks)


async def test_midstream_error_is_an_event_then_done(setup: Any) -> None:
    client, _ = setup
    r = await post(client, {"model": "m", "prompt": "break", "stream": True})
    assert r.status_code == 200
    evs = events(r.text)
    assert evs[-1] == "[DONE]"
    err = orjson.loads(evs[-2])["error"]
    assert err["message"] == "Upstream x/y broke mid-stream"


async def test_stream_error_before_first_byte_is_json(setup: Any) -> None:
    providers = {"good": FakeProvider("good", UpstreamError("Upstream down", status=502))}
    app = create_app(_config(providers), build=lambda block: providers[block.name])
    await app.state.runtime.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        r = await post(c, {"model": "m", "prompt": "x", "stream": True})
    assert_error(r, 502)


# ---------------------------------------------------------------- chat

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


async def test_chat_json(setup: Any) -> None:
    client, _ = setup
    r = await post(client, {"model": "m", "messages": HELLO, "n": 2}, path=CHAT)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["id"].startswith("chatcmpl-") and doc["object"] == "chat.completion"
    assert doc["model"] == "m" and isinstance(doc["created"], int)
    assert doc["system_fingerprint"] == "fp_fake"
    assert [c["message"]["content"] for c in doc["choices"]] == ["good:0", "good:1"]
    assert doc["choices"][0]["message"] == {
        "role": "assistant",
        "content": "good:0",
        "refusal": None,
    }
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    r = await post(client, {"model": "m", "messages": HELLO}, path="/chat/completions")
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"


async def test_chat_stream(setup: Any) -> None:
    client, _ = setup
    body = {
        "model": "m",
        "messages": HELLO,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = await post(client, body, path=CHAT)
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    evs = events(r.text)
    assert evs[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in evs[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 5
    firsts = [
        c["choices"][0] for c in chunks if c["choices"][0:1] and "role" in c["choices"][0]["delta"]
    ]
    assert [f["index"] for f in firsts] == [0, 1]
    assert {c["choices"][0]["finish_reason"] for c in chunks[:-1]} == {None, "stop"}


async def test_chat_stream_without_usage(setup: Any) -> None:
    client, _ = setup
    r = await post(client, {"model": "m", "messages": HELLO, "stream": True}, path=CHAT)
    chunks = [orjson.loads(e) for e in events(r.text)[:-1]]
    assert all("usage" not in c and c["choices"] for c in chunks)


async def test_chat_errors_name_the_field(setup: Any) -> None:
    client, _ = setup
    cases = [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": 7, "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": HELLO, "top_logprobs": 2}, "top_logprobs"),
        ({"model": "m", "messages": HELLO, "temperature": 3}, "temperature"),
        ({"model": "m", "messages": HELLO, "tool_choice": "required"}, "tool_choice"),
    ]
    for body, param in cases:
        assert_error(await post(client, body, path=CHAT), 400, param)
    c = {"authorization": "Bearer sk-c"}
    err = assert_error(await post(client, {"model": "emb", "messages": HELLO}, c, path=CHAT), 400)
    assert err["param"] == "model" and err["code"] == "wrong_endpoint"
    r = await post(client, {"model": "m", "input": "x"}, c, path="/v1/embeddings")
    err = assert_error(r, 400, "model")
    assert "completions and chat/completions" in err["message"]


async def test_chat_falls_back_and_reports_dropped(setup: Any) -> None:
    client, providers = setup
    r = await post(client, {"model": "m", "messages": HELLO, "drop_me": 1}, path=CHAT)
    assert r.headers["x-gateway-dropped-params"] == "drop_me"
    r = await post(
        client, {"model": "fb", "messages": HELLO}, {"authorization": "Bearer sk-b"}, path=CHAT
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "good:0"
    assert providers["bad"].calls == 1

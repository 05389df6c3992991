"""The response cache through the Portkey SDK (`portkey_ai.Portkey`), pointed at the gateway as
at Portkey's own: a config's `cache: {mode: simple, max_age}` caches the answers of a model that
has no `cache:` of its own (memory backend), `mode: semantic` is refused by name, and the SDK's
`cache_force_refresh` makes the gateway ask the upstream again and overwrite the entry."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from portkey_ai import Portkey
from portkey_ai.api_resources.types.chat_complete_type import ChatCompletions

from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream, start_scripted

KEY = "k-portkey-cache"
SIMPLE: dict[str, Any] = {"cache": {"mode": "simple", "max_age": 60}}
MAX_TOKENS = 6


def config(upstream: str) -> str:
    return f"""
auth:
  keys:
    - {{id: pk, key: {KEY}}}
providers:
  up: {{type: openai, base_url: "{upstream}", api_key: "{OPENAI_TEST_KEY}"}}
models:
  m: {{targets: [{{provider: up, model: gpt-test}}]}}
cache:
  backend: memory
"""


@dataclass
class Setup:
    gateway: GatewayProcess
    upstream: ScriptedUpstream
    http: httpx.Client  # the SDK's (it would not close the one it makes for its openai client)

    def calls(self) -> int:
        return len(self.upstream.requests())

    def portkey(self, **kw: Any) -> Portkey:
        client = Portkey(
            base_url=self.gateway.url + "/v1", api_key=KEY, max_retries=0, http_client=self.http,
            **kw,
        )  # fmt: skip
        # `max_retries` does not reach the openai client the SDK sends through (it retries once
        # whatever it is given): no retry may hide a request here
        client.openai_client.max_retries = 0
        return client


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with (
        start_scripted("openai", api_key=OPENAI_TEST_KEY) as up,
        GatewayProcess(config(up.url), tmp_path_factory.mktemp("gw")) as gw,
        httpx.Client(timeout=30.0, trust_env=False) as http,
    ):
        yield Setup(gw, up, http)


@pytest.fixture
def env(setup: Setup) -> Setup:
    setup.upstream.reset()
    return setup


def messages(prompt: str) -> list[Any]:
    return [{"role": "user", "content": prompt}]


def chat(client: Portkey, prompt: str) -> ChatCompletions:
    out = client.chat.completions.create(
        model="m", messages=messages(prompt), max_tokens=MAX_TOKENS
    )
    assert isinstance(out, ChatCompletions)  # not a stream
    return out


def status(out: ChatCompletions) -> str | None:
    """x-portkey-cache-status, as the SDK reads its response headers (prefix removed)."""
    headers = out.get_headers()
    assert headers is not None
    return headers.get("cache-status")


def content(out: ChatCompletions) -> str:
    assert out.choices is not None and out.choices[0].message is not None
    text = out.choices[0].message.content
    assert isinstance(text, str) and text
    return text


@dataclass
class Streamed:
    status: str | None
    texts: list[str]  # each content delta's text, in order


def stream(client: Portkey, prompt: str) -> Streamed:
    s: Any = client.chat.completions.create(
        model="m", messages=messages(prompt), max_tokens=MAX_TOKENS, stream=True
    )
    assert not isinstance(s, ChatCompletions)
    with s:
        chunks = list(s)
        cache_status = s.response.headers.get("x-portkey-cache-status")
    texts = [
        c.choices[0].delta.content
        for c in chunks
        if c.choices and c.choices[0].delta is not None and c.choices[0].delta.content
    ]
    return Streamed(cache_status, texts)


def test_the_second_identical_call_is_a_hit(env: Setup) -> None:
    before = scrape(env.gateway.url)
    client = env.portkey(config=SIMPLE)
    first = chat(client, "Cache me through Portkey")
    assert status(first) == "MISS"
    assert env.calls() == 1
    second = chat(client, "Cache me through Portkey")
    assert status(second) == "HIT"
    assert env.calls() == 1  # answered from the cache
    assert second.id != first.id
    assert content(second) == content(first)
    assert second.usage is not None and first.usage is not None
    assert second.usage.model_dump() == first.usage.model_dump()
    replay = stream(client, "Cache me through Portkey")  # the same answer, as a stream
    assert replay.status == "HIT" and "".join(replay.texts) == content(first)
    assert env.calls() == 1
    other = chat(client, "Another question entirely")  # another request: its own entry
    assert status(other) == "MISS" and env.calls() == 2
    after = scrape(env.gateway.url)
    assert after.delta(before, "gateway_cache_requests_total", model="m", result="hit") == 2
    assert after.delta(before, "gateway_cache_requests_total", model="m", result="miss") == 2
    assert after.value("gateway_cache_entries", backend="memory") >= 2

    # without the config, the model does not cache: no status, and the upstream is asked
    uncached = chat(env.portkey(), "Cache me through Portkey")
    assert status(uncached) is None and env.calls() == 3


def test_semantic_caching_is_refused_by_name(env: Setup) -> None:
    client = env.portkey(config={"cache": {"mode": "semantic", "max_age": 60}})
    with pytest.raises(Exception) as refused:
        chat(client, "Semantic, please")
    assert type(refused.value).__name__ == "BadRequestError"  # the openai client the SDK bundles
    assert refused.value.status_code == 400  # type: ignore[attr-defined]
    err = refused.value.body  # type: ignore[attr-defined]
    assert err["param"] == "config.cache.mode", err
    assert "semantic" in err["message"], err
    assert env.calls() == 0


def test_force_refresh_asks_the_upstream_and_overwrites_the_entry(env: Setup) -> None:
    prompt = "Refresh what the cache holds"
    client = env.portkey(config=SIMPLE)
    refreshing = env.portkey(config=SIMPLE, cache_force_refresh=True)
    first = chat(client, prompt)  # the entry is made by a JSON answer
    assert status(first) == "MISS" and env.calls() == 1
    replay = stream(client, prompt)  # replayed as the stream of that answer: one delta
    assert replay.status == "HIT" and replay.texts == [content(first)]
    assert env.calls() == 1

    refreshed = chat(refreshing, prompt)
    assert status(refreshed) == "REFRESH" and env.calls() == 2  # asked again
    sent = env.upstream.last_request()
    assert sent["body"]["messages"] == messages(prompt)
    assert content(refreshed) == content(first)
    assert refreshed.id != first.id

    # a refreshing stream overwrites the entry with the stream as the upstream wrote it
    live = stream(refreshing, prompt)
    assert live.status == "REFRESH" and env.calls() == 3
    assert len(live.texts) == MAX_TOKENS  # one delta per token
    again = stream(client, prompt)
    assert again.status == "HIT" and env.calls() == 3
    assert again.texts == live.texts  # the new entry's stream, not the first answer's
    whole = chat(client, prompt)
    assert status(whole) == "HIT" and content(whole) == content(first)
    assert env.calls() == 3

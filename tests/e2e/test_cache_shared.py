"""The response cache on Redis, shared by two gateway processes in front of the scripted OpenAI
upstream: an answer made on one gateway is a hit on the other (JSON, or the stream it means),
the entry as Redis holds it (compressed, with its TTL), Redis dying and coming back (requests
served uncached meanwhile), and identical misses on one gateway collapsed into one upstream
call."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI
from redis import Redis

from tests.e2e.metrics_text import scrape
from tests.e2e.support import RawStream
from tests.gateway_proc import GatewayProcess
from tests.redis_proc import RedisServer
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream, start_scripted

KEY = "k-cache"
TTL_S = 600
PREFIX = "llmgw:cache:"  # cache.key_prefix's default
INDEX = PREFIX + "index"  # the sorted set that counts the entries
STATUS = "x-portkey-cache-status"
POLL_DEADLINE_S = 15.0
POLL_INTERVAL_S = 0.05
COOLDOWN_S = 1.0  # after a Redis failure, a gateway leaves it alone this long


def config(upstream: str, redis_url: str) -> str:
    return f"""
teams:
  blue: {{}}
auth:
  keys:
    - {{id: cache, key: {KEY}}}
    - {{id: other, key: k-other}}
    - {{id: blue-a, key: k-blue-a, team: blue}}
    - {{id: blue-b, key: k-blue-b, team: blue}}
providers:
  up: {{type: openai, base_url: "{upstream}", api_key: "{OPENAI_TEST_KEY}"}}
models:
  m: {{targets: [{{provider: up, model: gpt-test}}], cache: {{ttl_s: {TTL_S}, when: always}}}}
cache:
  backend: redis
  redis_url: "{redis_url}"
"""


@dataclass
class Pair:
    redis: RedisServer
    upstream: ScriptedUpstream
    one: GatewayProcess
    two: GatewayProcess
    store: Redis  # redis-py, to look at the entries

    def calls(self) -> int:
        """The chat requests the upstream received since its last reset."""
        return len(self.upstream.requests())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with RedisServer() as server, start_scripted("openai", api_key=OPENAI_TEST_KEY) as up:
        text = config(up.url, server.url)
        with (
            GatewayProcess(text, tmp_path_factory.mktemp("gw1")) as one,
            GatewayProcess(text, tmp_path_factory.mktemp("gw2")) as two,
            Redis.from_url(server.url) as store,
        ):
            yield Pair(server, up, one, two, store)


@pytest.fixture
def cluster(pair: Pair) -> Pair:
    pair.upstream.reset()
    return pair


def body(prompt: str, **kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 6, **kw}


def post(url: str, payload: dict[str, Any], key: str = KEY) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json=payload,
        headers={"authorization": f"Bearer {key}"},
        timeout=30.0,
        trust_env=False,
    )


def sdk(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def streamed(url: str, payload: dict[str, Any]) -> RawStream:
    r = post(url, {**payload, "stream": True})
    return RawStream(r.status_code, r.headers, r.content)


def stream_text(chunks: list[Any]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def entries(store: Redis) -> set[bytes]:
    """The cache's entry keys in Redis (the index is not one)."""
    return set(store.scan_iter(match=PREFIX + "*")) - {INDEX.encode()}


def test_a_json_answer_from_one_gateway_is_a_hit_on_the_other(cluster: Pair) -> None:
    one, two = cluster.one.url, cluster.two.url
    before1, before2 = scrape(one), scrape(two)
    messages: Any = [{"role": "user", "content": "Tell me about the shared cache"}]
    with sdk(one) as first_client, sdk(two) as second_client:
        raw1 = first_client.chat.completions.with_raw_response.create(
            model="m", messages=messages, max_tokens=6
        )
        first = raw1.parse()
        assert raw1.headers[STATUS] == "MISS"
        assert "age" not in raw1.headers
        assert cluster.calls() == 1
        raw2 = second_client.chat.completions.with_raw_response.create(
            model="m", messages=messages, max_tokens=6
        )
        second = raw2.parse()
    assert raw2.headers[STATUS] == "HIT"
    assert 0 <= int(raw2.headers["age"]) <= 60
    assert cluster.calls() == 1  # the hit was not sent upstream
    assert second.id != first.id and second.id.startswith("chatcmpl-")
    assert second.model == first.model == "m"
    assert [c.model_dump() for c in second.choices] == [c.model_dump() for c in first.choices]
    assert first.choices[0].message.content  # a real answer, not an empty one
    assert second.usage is not None and first.usage is not None
    assert second.usage.model_dump() == first.usage.model_dump()
    after1, after2 = scrape(one), scrape(two)
    assert after1.delta(before1, "gateway_cache_requests_total", model="m", result="miss") == 1
    assert after2.delta(before2, "gateway_cache_requests_total", model="m", result="hit") == 1
    assert after2.delta(before2, "gateway_cache_requests_total", model="m", result="miss") == 0
    assert after1.value("gateway_cache_entries", backend="redis") >= 1


def test_a_json_answer_on_one_gateway_is_a_stream_on_the_other(cluster: Pair) -> None:
    payload = body("Stream what the other gateway answered")
    whole = post(cluster.one.url, payload)
    assert whole.status_code == 200, whole.text
    assert whole.headers[STATUS] == "MISS"
    answer = whole.json()
    assert cluster.calls() == 1

    hit = streamed(cluster.two.url, {**payload, "stream_options": {"include_usage": True}})
    assert hit.status == 200
    assert hit.headers[STATUS] == "HIT" and "age" in hit.headers
    assert hit.headers["content-type"].startswith("text/event-stream")
    chunks = hit.data()
    assert chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    assert cluster.calls() == 1  # no upstream call for the stream
    content = answer["choices"][0]["message"]["content"]
    assert content and stream_text(chunks) == content
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"] != answer["id"]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == [answer["choices"][0]["finish_reason"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == answer["usage"]

    # and the JSON again, on the first gateway: a hit of the same answer
    again = post(cluster.one.url, payload)
    assert again.headers[STATUS] == "HIT"
    assert again.json()["choices"] == answer["choices"]
    assert cluster.calls() == 1


def test_a_stream_on_one_gateway_is_replayed_on_the_other(cluster: Pair) -> None:
    payload = body("A stream kept whole", stream_options={"include_usage": True})
    first = streamed(cluster.one.url, payload)
    assert first.status == 200 and first.headers[STATUS] == "MISS"
    second = streamed(cluster.two.url, payload)
    assert second.status == 200 and second.headers[STATUS] == "HIT"
    assert cluster.calls() == 1
    a, b = first.data()[:-1], second.data()[:-1]

    def without_id(chunks: list[Any]) -> list[Any]:
        return [{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]

    assert without_id(b) == without_id(a)  # the stream as it was first written
    assert a[0]["id"] != b[0]["id"]
    whole = post(cluster.two.url, {k: v for k, v in payload.items() if k != "stream_options"})
    assert whole.headers[STATUS] == "HIT"  # stream_options and stream are not in the key
    assert whole.json()["choices"][0]["message"]["content"] == stream_text(a)
    assert cluster.calls() == 1


def test_a_stream_without_usage_is_replayed_with_it_when_asked(cluster: Pair) -> None:
    payload = body("A stream that did not ask for usage")
    first = streamed(cluster.one.url, payload)
    assert first.status == 200 and first.headers[STATUS] == "MISS"
    plain = first.data()[:-1]
    assert all("usage" not in c for c in plain)  # not asked: none written
    with_usage = streamed(cluster.two.url, {**payload, "stream_options": {"include_usage": True}})
    assert with_usage.status == 200 and with_usage.headers[STATUS] == "HIT"
    chunks = with_usage.data()[:-1]
    assert cluster.calls() == 1
    assert stream_text(chunks) == stream_text(plain)
    assert all(c["usage"] is None for c in chunks[:-1])  # OpenAI's "usage": null as it goes
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert last["usage"]["total_tokens"] == (
        last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    )
    again = streamed(cluster.two.url, payload)  # and without, again: as first written
    assert again.headers[STATUS] == "HIT"
    replayed = again.data()[:-1]
    stamps = {"id": replayed[0]["id"], "created": replayed[0]["created"]}
    assert replayed == [{**c, **stamps} for c in plain]


def test_entries_are_a_team_s_or_else_a_key_s(cluster: Pair) -> None:
    payload = body("Whose entry is this")
    statuses = [
        post(cluster.one.url, payload).headers[STATUS],
        post(cluster.two.url, payload, key="k-other").headers[STATUS],  # another key's: apart
        post(cluster.one.url, payload, key="k-blue-a").headers[STATUS],
        post(cluster.two.url, payload, key="k-blue-b").headers[STATUS],  # the team's: shared
        post(cluster.two.url, payload, key="k-other").headers[STATUS],
    ]
    assert statuses == ["MISS", "MISS", "MISS", "HIT", "HIT"]
    assert cluster.calls() == 3


def test_the_entry_in_redis_is_compressed_and_expires(cluster: Pair) -> None:
    before = entries(cluster.store)
    payload = body("What does Redis hold")
    answer = post(cluster.one.url, payload)
    assert answer.headers[STATUS] == "MISS"
    new = entries(cluster.store) - before
    assert len(new) == 1, new
    (name,) = new
    ttl = cluster.store.ttl(name)
    assert isinstance(ttl, int) and 0 < ttl <= TTL_S
    raw = cluster.store.get(name)
    assert isinstance(raw, bytes)
    assert raw[:1] == b"\x78"  # a zlib stream's header, where JSON would begin with "["
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    doc = orjson.loads(zlib.decompress(raw))  # zlib data holding the entry's JSON
    assert len(raw) < len(zlib.decompress(raw))
    assert isinstance(doc, list) and doc[0] == 1  # the entry's version
    content = answer.json()["choices"][0]["message"]["content"]
    assert content in zlib.decompress(raw).decode()
    expiry = cluster.store.zscore(INDEX, name)  # counted in the index, by expiry
    assert expiry is not None and time.time() < expiry <= time.time() + TTL_S


def test_redis_down_then_back(cluster: Pair) -> None:
    one, two = cluster.one.url, cluster.two.url
    payload = body("Served while Redis is away")
    before = scrape(one)
    cluster.redis.kill()
    killed = time.monotonic()
    try:
        during = [post(one, payload) for _ in range(3)] + [post(two, payload)]
        assert httpx.get(f"{one}/readyz", trust_env=False).status_code == 200
    finally:
        cluster.redis.start()  # empty, on the same port
    # Each gateway's first failure came after the kill: until killed + 1 s at least, it leaves
    # the new Redis alone. Checked only when this request was answered within that second.
    early = post(one, payload)
    if time.monotonic() < killed + COOLDOWN_S:
        stats = cluster.redis.command("INFO", "commandstats")
        assert b"cmdstat_get:" not in stats and b"cmdstat_set:" not in stats, stats
    assert [r.status_code for r in during] == [200] * 4, [r.text for r in during]
    assert [r.headers[STATUS] for r in during] == ["MISS"] * 4
    assert cluster.calls() == 5  # each served uncached (the early one too)
    assert early.status_code == 200 and early.headers[STATUS] == "MISS"
    after = scrape(one)
    assert after.delta(before, "gateway_cache_backend_errors_total", operation="get") >= 3
    assert after.delta(before, "gateway_cache_backend_errors_total", operation="put") >= 3
    assert after.delta(before, "gateway_cache_requests_total", model="m", result="miss") == 4

    # Redis back: once the gateway leaves its cooldown, an answer is kept again, and found
    deadline = time.monotonic() + POLL_DEADLINE_S
    while (r := post(one, payload)).headers[STATUS] != "HIT":
        assert r.status_code == 200 and r.headers[STATUS] == "MISS"
        if time.monotonic() > deadline:
            pytest.fail("the gateway never cached again after Redis came back")
        time.sleep(POLL_INTERVAL_S)
    assert r.status_code == 200
    assert len(entries(cluster.store)) >= 1  # in the new Redis
    deadline = time.monotonic() + POLL_DEADLINE_S
    while (hit := post(two, payload)).headers[STATUS] != "HIT":  # gateway 2 finds it too
        assert hit.status_code == 200
        if time.monotonic() > deadline:
            pytest.fail("the second gateway never used Redis again")
        time.sleep(POLL_INTERVAL_S)
    assert hit.json()["choices"] == r.json()["choices"]


def test_a_redis_that_does_not_answer(cluster: Pair) -> None:
    """Redis accepts but never answers (SIGSTOP): each request is served uncached after the
    gateway's short timeout; once it answers again, every key finds its own entry (no reply
    left behind on a pooled connection answers another request)."""
    one = cluster.one.url
    prompts = [f"Frozen Redis, question {i}" for i in range(4)]
    made = {}
    for prompt in prompts:
        r = post(one, body(prompt))
        assert r.headers[STATUS] == "MISS"
        made[prompt] = r.json()["choices"]
    assert len({str(c) for c in made.values()}) == len(prompts)  # four different answers
    before = scrape(one)
    cluster.redis.pause()
    try:
        during = [post(one, body(prompt)) for prompt in prompts]
    finally:
        cluster.redis.resume()
    assert [(r.status_code, r.headers[STATUS]) for r in during] == [(200, "MISS")] * 4
    assert [r.json()["choices"] for r in during] == [made[p] for p in prompts]
    assert cluster.calls() == 8
    after = scrape(one)
    assert after.delta(before, "gateway_cache_backend_errors_total", operation="get") >= 4

    deadline = time.monotonic() + POLL_DEADLINE_S
    while (r := post(one, body(prompts[0]))).headers[STATUS] != "HIT":
        if time.monotonic() > deadline:
            pytest.fail("the gateway never used Redis again")
        time.sleep(POLL_INTERVAL_S)
    calls = cluster.calls()
    for _ in range(2):
        hits = [post(one, body(prompt)) for prompt in prompts]
        assert [r.headers[STATUS] for r in hits] == ["HIT"] * 4
        assert [r.json()["choices"] for r in hits] == [made[p] for p in prompts]
    assert cluster.calls() == calls


async def burst(url: str, payload: dict[str, Any], count: int) -> list[httpx.Response]:
    headers = {"authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(timeout=30.0, trust_env=False, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(f"{url}/v1/chat/completions", json=payload, headers=headers)
                for _ in range(count)
            )
        )


def test_identical_misses_on_one_gateway_call_the_upstream_once(cluster: Pair) -> None:
    cluster.upstream.script({"delay_ms": 400})  # the first call is slow: the others come meanwhile
    before = scrape(cluster.one.url)
    answers = asyncio.run(burst(cluster.one.url, body("Six at once"), 6))
    assert [r.status_code for r in answers] == [200] * 6
    assert sorted(r.headers[STATUS] for r in answers) == ["HIT"] * 5 + ["MISS"]
    assert cluster.calls() == 1
    docs = [r.json() for r in answers]
    assert len({d["id"] for d in docs}) == 6  # each its own id
    assert all(d["choices"] == docs[0]["choices"] and d["usage"] == docs[0]["usage"] for d in docs)
    after = scrape(cluster.one.url)
    assert after.delta(before, "gateway_cache_requests_total", model="m", result="hit") == 5
    assert after.delta(before, "gateway_cache_requests_total", model="m", result="miss") == 1

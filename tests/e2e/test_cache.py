"""The response cache, end to end: the gateway under uvicorn in front of the scripted OpenAI
upstream, which logs every call it gets (a hit is a request the upstream never saw), on the
memory backend; clients are the real openai SDK and httpx for raw SSE."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI

from tests.e2e import batches
from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream, start_scripted

STATUS = "x-portkey-cache-status"
MODELS = """
  m: {targets: [{provider: up, model: gpt-test}], cache: {ttl_s: 600}}
  det: {targets: [{provider: up, model: gpt-test}], cache: {ttl_s: 600, when: deterministic}}
  short: {targets: [{provider: up, model: gpt-test}], cache: {ttl_s: 1}}
  plain: {targets: [{provider: up, model: gpt-test}]}
  vec: {endpoint: embeddings, targets: [{provider: up, model: text-embedding-3-small}],
        cache: {ttl_s: 600}}
"""


def config(upstream: str, log: Path, models: str = MODELS) -> str:
    return f"""
teams: {{ta: {{}}, tb: {{}}}}
auth:
  keys:
    - {{id: a1, key: k-a1, team: ta}}
    - {{id: a2, key: k-a2, team: ta}}
    - {{id: b1, key: k-b1, team: tb}}
    - {{id: solo, key: k-solo}}
    - {{id: meter, key: k-meter, limits: {{rpm: 100, tpm: 100000}}}}
providers:
  up:
    type: openai
    base_url: "{upstream}"
    api_key: "{OPENAI_TEST_KEY}"
    pricing: {{"*": {{input: 1, output: 2}}}}
models:{models}
cache: {{max_entry_bytes: 4096}}
request_log: {{path: "{log}"}}
"""


class Env:
    def __init__(self, gateway: GatewayProcess, upstream: ScriptedUpstream, log: Path) -> None:
        self.gateway, self.upstream, self.log = gateway, upstream, log
        self.http = httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False)

    def post(
        self, path: str, body: dict[str, Any], key: str = "k-a1", **headers: str
    ) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}", **headers}
        return self.http.post(path, json=body, headers=headers)

    def calls(self) -> int:
        return len(self.upstream.requests())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    work = tmp_path_factory.mktemp("cache")
    with start_scripted("openai", api_key=OPENAI_TEST_KEY) as up:
        gateway = GatewayProcess(config(up.url, work / "requests.log"), work)
        env = Env(gateway, up, work / "requests.log")
        try:
            yield env
        finally:
            env.http.close()
            gateway.stop()


@pytest.fixture(autouse=True)
def _fresh_upstream(env: Env) -> None:
    env.upstream.reset()


def chat(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8, **kw}


def events(response: httpx.Response) -> list[Any]:
    """A chat or completions stream's chunks, [DONE] last, as the caller read them."""
    out: list[Any] = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


def pieces(chunks: list[Any]) -> list[str]:
    """A chat stream's content deltas, in order, as split on the wire."""
    return [
        c["choices"][0]["delta"]["content"]
        for c in chunks[:-1]
        if c["choices"] and c["choices"][0]["delta"].get("content")
    ]


# ---------------------------------------------------------------- hits and misses


def test_a_repeat_is_a_hit_with_the_stored_answer_and_fresh_ids(env: Env) -> None:
    client = OpenAI(base_url=env.gateway.url + "/v1", api_key="k-a1", max_retries=0)
    with client:
        first = client.chat.completions.with_raw_response.create(**chat("hit me"))
        second = client.chat.completions.with_raw_response.create(**chat("hit me"))
    assert first.headers[STATUS] == "MISS" and "age" not in first.headers
    assert second.headers[STATUS] == "HIT" and int(second.headers["age"]) >= 0
    a, b = first.parse(), second.parse()
    assert b.choices == a.choices and b.usage == a.usage
    assert b.id != a.id and b.created >= a.created and b.model == "m"
    assert env.calls() == 1


def test_the_key_is_the_fields_that_shape_the_answer(env: Env) -> None:
    body = chat("keyed", temperature=0.5, user="u1", metadata={"run": "1"})
    assert env.post("/v1/chat/completions", body).headers[STATUS] == "MISS"
    reordered = dict(reversed(list({**body, "user": "u2", "metadata": {"run": "2"}}.items())))
    assert env.post("/v1/chat/completions", reordered).headers[STATUS] == "HIT"
    usage_asked = {**body, "stream": True, "stream_options": {"include_usage": True}}
    assert env.post("/v1/chat/completions", usage_asked).headers[STATUS] == "HIT"
    for changed in ({"temperature": 0.6}, {"max_tokens": 9}, {"model": "det", "seed": 1}):
        assert env.post("/v1/chat/completions", {**body, **changed}).headers[STATUS] == "MISS"
    assert (
        env.post("/v1/chat/completions", body, **{"x-portkey-cache-namespace": "other"}).headers[
            STATUS
        ]
        == "MISS"
    )
    assert env.calls() == 5


def test_an_uncached_model_says_nothing_of_the_cache(env: Env) -> None:
    for _ in range(2):
        r = env.post("/v1/chat/completions", chat("plain", model="plain"))
        assert r.status_code == 200 and STATUS not in r.headers
    assert env.calls() == 2


def test_a_stream_after_json_replays_the_answer(env: Env) -> None:
    whole = env.post("/v1/chat/completions", chat("json then stream")).json()
    r = env.post("/v1/chat/completions", chat("json then stream", stream=True))
    assert r.headers[STATUS] == "HIT" and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r)
    assert chunks[-1] == "[DONE]"
    assert "".join(pieces(chunks)) == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["id"] != whole["id"] for c in chunks[:-1])
    assert env.calls() == 1


def test_json_after_a_stream_and_a_stream_split_as_first_streamed(env: Env) -> None:
    body = chat("stream first", stream=True, stream_options={"include_usage": True})
    first = events(env.post("/v1/chat/completions", body))
    again = env.post("/v1/chat/completions", body)
    assert again.headers[STATUS] == "HIT"
    replayed = events(again)
    assert pieces(replayed) == pieces(first) and len(pieces(first)) > 1
    assert replayed[-2]["usage"] == first[-2]["usage"] and replayed[-2]["choices"] == []
    whole = env.post("/v1/chat/completions", chat("stream first"))
    assert whole.headers[STATUS] == "HIT"
    answer = whole.json()
    assert answer["choices"][0]["message"]["content"] == "".join(pieces(first))
    assert answer["usage"] == first[-2]["usage"]
    without = events(env.post("/v1/chat/completions", chat("stream first", stream=True)))
    assert all(c == "[DONE]" or c["choices"] for c in without)  # no usage chunk unasked
    assert env.calls() == 1


def test_completions_both_ways(env: Env) -> None:
    body = {"model": "m", "prompt": "count with me", "max_tokens": 6}
    streamed = events(env.post("/v1/completions", {**body, "stream": True}))
    whole = env.post("/v1/completions", body)
    assert whole.headers[STATUS] == "HIT"
    text = "".join(c["choices"][0]["text"] for c in streamed[:-1] if c["choices"])
    assert whole.json()["choices"][0]["text"] == text
    assert env.calls() == 1


def test_responses_both_ways(env: Env) -> None:
    client = OpenAI(base_url=env.gateway.url + "/v1", api_key="k-a1", max_retries=0)
    with client:
        first = client.responses.create(model="m", input="respond", store=False)
        with client.responses.stream(model="m", input="respond", store=False) as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(deltas) == first.output_text == final.output_text
    assert final.id != first.id and final.usage == first.usage
    assert env.calls() == 1


def test_embeddings_are_cached(env: Env) -> None:
    body = {"model": "vec", "input": ["one", "two"]}
    first, second = env.post("/v1/embeddings", body), env.post("/v1/embeddings", body)
    assert (first.headers[STATUS], second.headers[STATUS]) == ("MISS", "HIT")
    assert second.json()["data"] == first.json()["data"]
    assert env.calls() == 1


# ---------------------------------------------------------------- what the caller asks


def test_refresh_and_no_store(env: Env) -> None:
    body = chat("refresh me")
    env.post("/v1/chat/completions", body)
    forced = env.post("/v1/chat/completions", body, **{"x-portkey-cache-force-refresh": "true"})
    no_cache = env.post("/v1/chat/completions", body, **{"cache-control": "no-cache"})
    assert forced.headers[STATUS] == no_cache.headers[STATUS] == "REFRESH"
    assert env.calls() == 3
    no_store = {"cache-control": "no-store"}
    skipped = env.post("/v1/chat/completions", chat("never stored"), **no_store)
    assert skipped.headers[STATUS] == "DISABLED"
    assert env.post("/v1/chat/completions", chat("never stored")).headers[STATUS] == "MISS"
    bad = env.post("/v1/chat/completions", body, **{"x-portkey-cache-force-refresh": "maybe"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "x-portkey-cache-force-refresh"


def test_entries_are_per_team_or_key(env: Env) -> None:
    body = chat("whose answer")
    seen = {key: env.post("/v1/chat/completions", body, key=key).headers[STATUS]
            for key in ("k-a1", "k-a2", "k-b1", "k-solo")}  # fmt: skip
    assert seen == {"k-a1": "MISS", "k-a2": "HIT", "k-b1": "MISS", "k-solo": "MISS"}
    assert env.post("/v1/chat/completions", body, key="k-solo").headers[STATUS] == "HIT"
    assert env.calls() == 3


def test_an_entry_expires_after_its_ttl(env: Env) -> None:
    body = chat("short lived", model="short")
    assert env.post("/v1/chat/completions", body).headers[STATUS] == "MISS"
    assert env.post("/v1/chat/completions", body).headers[STATUS] == "HIT"
    time.sleep(1.1)  # the entry's one second, which no probe can shorten
    assert env.post("/v1/chat/completions", body).headers[STATUS] == "MISS"


def test_deterministic_caches_only_answers_that_repeat(env: Env) -> None:
    def status(**kw: Any) -> str:
        r = env.post("/v1/chat/completions", chat("det", model="det", **kw))
        return r.headers[STATUS]

    assert status(temperature=0.7) == "DISABLED" and status(temperature=0.7) == "DISABLED"
    assert status() == "DISABLED"  # temperature 1 by default
    assert status(temperature=0.7, seed=7) == "MISS"
    assert status(temperature=0.7, seed=7) == "HIT"
    assert status(temperature=0, n=2) == "DISABLED"
    assert status(temperature=0) == "MISS" and status(temperature=0) == "HIT"


def test_an_answer_that_may_not_repeat_is_still_cached_by_always(env: Env) -> None:
    body = chat("sampled", temperature=1.5, n=2)
    assert env.post("/v1/chat/completions", body).headers[STATUS] == "MISS"
    again = env.post("/v1/chat/completions", body)
    assert again.headers[STATUS] == "HIT" and len(again.json()["choices"]) == 2


def test_a_portkey_config_turns_the_cache_on(env: Env) -> None:
    header = {"x-portkey-config": '{"cache": {"mode": "simple", "max_age": 60}}'}
    body = chat("portkey", model="plain")
    assert env.post("/v1/chat/completions", body, **header).headers[STATUS] == "MISS"
    assert env.post("/v1/chat/completions", body, **header).headers[STATUS] == "HIT"
    assert STATUS not in env.post("/v1/chat/completions", body).headers  # not without it
    semantic = {"x-portkey-config": '{"cache": {"mode": "semantic"}}'}
    refused = env.post("/v1/chat/completions", body, **semantic)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "config.cache.mode"


# ---------------------------------------------------------------- what is never cached


def test_errors_and_cut_streams_are_not_cached(env: Env) -> None:
    env.upstream.script({"status": 400, "times": 1})  # not retried: one call
    failed = env.post("/v1/chat/completions", chat("fails once"))
    assert failed.status_code == 400 and failed.headers[STATUS] == "MISS"
    assert env.post("/v1/chat/completions", chat("fails once")).headers[STATUS] == "MISS"
    env.upstream.script({"cut_after": 2, "times": 1})
    cut = env.post("/v1/chat/completions", chat("cut short", stream=True))
    assert '"error"' in cut.text
    assert env.post("/v1/chat/completions", chat("cut short")).headers[STATUS] == "MISS"
    assert env.calls() == 4


def test_an_answer_larger_than_an_entry_is_not_cached(env: Env) -> None:
    body = chat("a long one", max_tokens=1000)  # well past the config's 4096 bytes an entry
    assert len(env.post("/v1/chat/completions", body).content) > 4096
    assert env.post("/v1/chat/completions", body).headers[STATUS] == "MISS"
    assert env.calls() == 2


def test_a_caller_who_left_stores_nothing(env: Env) -> None:
    env.upstream.script({"delay_ms": 2000, "times": 1})
    with pytest.raises(httpx.ReadTimeout):
        env.http.post(
            "/v1/chat/completions", json=chat("gone"), timeout=0.5,
            headers={"authorization": "Bearer k-a1"},
        )  # fmt: skip
    deadline = time.monotonic() + 10
    while env.upstream.requests()[0]["outcome"] == "ok" and time.monotonic() < deadline:
        time.sleep(0.05)  # until the upstream saw the gateway give up
    assert env.post("/v1/chat/completions", chat("gone")).headers[STATUS] == "MISS"


# ---------------------------------------------------------------- the pipeline


async def test_identical_misses_in_flight_make_one_call(env: Env) -> None:
    env.upstream.script({"delay_ms": 400, "times": 1})
    async with httpx.AsyncClient(base_url=env.gateway.url, timeout=30, trust_env=False) as c:
        answers = await asyncio.gather(*(
            c.post("/v1/chat/completions", json=chat("together"),
                   headers={"authorization": "Bearer k-a1"})
            for _ in range(6)
        ))  # fmt: skip
    statuses = sorted(a.headers[STATUS] for a in answers)
    assert statuses == ["HIT"] * 5 + ["MISS"]
    assert len({a.json()["choices"][0]["message"]["content"] for a in answers}) == 1
    assert env.calls() == 1


def test_a_hit_costs_a_request_but_no_tokens_and_nothing(env: Env) -> None:
    body = chat("what it costs")
    miss = env.post("/v1/chat/completions", body, key="k-meter")
    before = scrape(env.gateway.url)
    hit = env.post("/v1/chat/completions", body, key="k-meter")
    after = scrape(env.gateway.url)
    left = "x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens"
    assert int(hit.headers[left[0]]) < int(miss.headers[left[0]])
    # a miss's reservation is settled after it answered: the tokens it used are back but
    # what it used; a hit reserves none
    assert int(hit.headers[left[1]]) >= int(miss.headers[left[1]])
    assert after.delta(before, "gateway_spend_usd_total") == 0
    assert after.delta(before, "gateway_tokens_total") == 0
    assert after.delta(before, "gateway_cache_requests_total", model="m", result="hit") == 1
    assert after.value("gateway_cache_entries", backend="memory") >= 1
    hit_line, miss_line = logged(env, hit), logged(env, miss)
    assert hit_line["cache"] == "HIT" and hit_line["cost_usd"] == "0"
    assert miss_line["cache"] == "MISS" and float(miss_line["cost_usd"]) > 0


def logged(env: Env, answer: httpx.Response) -> dict[str, Any]:
    """The request log's line of an answer, once its writer has written it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in env.log.read_text().splitlines():
            entry: dict[str, Any] = orjson.loads(line)
            if entry["request_id"] == answer.headers["x-request-id"]:
                return entry
        time.sleep(0.05)
    raise AssertionError("the request log has no line for " + answer.headers["x-request-id"])


def test_entries_survive_a_reload(env: Env, tmp_path: Path) -> None:
    body = chat("before the reload")
    env.post("/v1/chat/completions", body)
    before = scrape(env.gateway.url).value("gateway_config_reloads_total", result="ok")
    extra = MODELS + "  added: {targets: [{provider: up, model: gpt-test}]}\n"
    env.gateway.config.write_text(config(env.upstream.url, env.log, extra))
    env.gateway.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while scrape(env.gateway.url).value("gateway_config_reloads_total", result="ok") == before:
        assert time.monotonic() < deadline, env.gateway.logs()
        time.sleep(0.05)
    assert env.post("/v1/chat/completions", body).headers[STATUS] == "HIT"
    assert env.calls() == 1


def test_identical_batch_lines_pay_the_upstream_once(env: Env) -> None:
    line = {"method": "POST", "url": "/v1/chat/completions", "body": chat("batched")}
    content = b"".join(orjson.dumps({"custom_id": f"line-{i}", **line}) + b"\n" for i in range(4))
    with OpenAI(base_url=env.gateway.url + "/v1", api_key="k-a1", max_retries=0) as client:
        batch = batches.start(client, content, "/v1/chat/completions")
        done = batches.until(client, batch.id, batches.finished)
        assert done.status == "completed" and batches.completed(done) == 4
        assert done.output_file_id is not None
        output = client.files.content(done.output_file_id).content.splitlines()
    texts = {orjson.loads(x)["response"]["body"]["choices"][0]["message"]["content"]
             for x in output}  # fmt: skip
    assert len(texts) == 1
    assert env.calls() == 1

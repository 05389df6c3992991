"""Batches on the in-process engine (`type: vllm`, the tiny model), with the openai SDK: each
line answered as the same request sent live is (greedy, so the same tokens), completions and
chat; and the engine serving a live request before the batch's lines queued ahead of it (their
lower vLLM priority). One engine for the module, running one sequence at a time
(`max_num_seqs: 1`), so that the order it serves requests in shows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.batches import completed, finished, lines_of, start, until
from tests.e2e.metrics_text import Scrape, parse
from tests.gateway_proc import GatewayProcess
from tests.vllm_proc import VLLM_ENV, engine_config, require_vllm

require_vllm()

KEY = "sk-engine-batches"
ENGINE_READY_TIMEOUT_S = 300.0
QUEUED = 8  # lines in the engine at once: one running, the others waiting
ENOUGH = 4  # lines the test needs still queued when the live request comes, to tell the two
LEFT = 2  # of those, still in flight when the live request is answered (first-come: none)
LINE_TOKENS = 400  # long enough that lines are still queued when the test has looked
SHORT_S = 5  # tiny-short's deadline, shorter than the lines wait
POLL_S = 0.05
BATCH_DEADLINE_S = 600.0  # QUEUED * LINE_TOKENS tokens, on a machine busy with other work


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("engine-batches")
    text = engine_config(
        KEY,
        {"max_model_len": 512, "seed": 0, "max_num_seqs": 1, "kv_cache_memory_bytes": 1 << 26},
        # tiny-short: a deadline shorter than the lines below wait in the engine's queue, which
        # does not apply to them there (they wait behind live requests by design)
        {"tiny": {}, "tiny-short": {"timeout_s": SHORT_S}},
        files={"store": str(workdir / "files")},
        batches={"max_concurrency": QUEUED, "live_concurrency": QUEUED, "poll_s": 0.05},
    )
    with GatewayProcess(text, workdir, env=VLLM_ENV, timeout=ENGINE_READY_TIMEOUT_S) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


def jsonl(url: str, bodies: list[dict[str, Any]]) -> bytes:
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body}
        for i, body in enumerate(bodies)
    ]
    return b"\n".join(orjson.dumps(line) for line in lines)


def answers(client: openai.OpenAI, content: bytes, url: str) -> dict[str, Any]:
    done = until(client, start(client, content, url).id, finished)
    assert done.status == "completed" and done.error_file_id is None
    return {x["custom_id"]: x["response"]["body"] for x in lines_of(client, done.output_file_id)}


def test_completions_lines_answer_as_live_requests(client: openai.OpenAI) -> None:
    bodies: list[dict[str, Any]] = [
        {"model": "tiny", "prompt": f"Once upon a time {i}", "max_tokens": 8, "temperature": 0}
        for i in range(4)
    ]
    out = answers(client, jsonl("/v1/completions", bodies), "/v1/completions")
    for i, body in enumerate(bodies):
        live = client.completions.create(**body)
        got = out[f"line-{i}"]
        assert got["object"] == "text_completion" and got["model"] == "tiny"
        assert got["choices"][0]["text"] == live.choices[0].text
        assert got["usage"]["completion_tokens"] == 8


def test_chat_lines_answer_as_live_requests(client: openai.OpenAI) -> None:
    bodies: list[dict[str, Any]] = [
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"Hello {i}"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        for i in range(3)
    ]
    out = answers(client, jsonl("/v1/chat/completions", bodies), "/v1/chat/completions")
    for i, body in enumerate(bodies):
        live = client.chat.completions.create(**body)
        got = out[f"line-{i}"]
        assert got["object"] == "chat.completion"
        assert got["choices"][0]["message"]["content"] == live.choices[0].message.content


def test_a_live_request_is_served_before_the_lines_queued_ahead_of_it(
    client: openai.OpenAI, gateway: GatewayProcess
) -> None:
    """QUEUED long lines in the engine, one running: a live request that arrives then is served
    next (vLLM's priority scheduling), while first-come it would wait for every line queued.
    And the lines waiting longer than their model's deadline are not cut by it."""
    body = {"model": "tiny-short", "prompt": "Once", "max_tokens": LINE_TOKENS, "ignore_eos": True}
    with httpx.Client(base_url=gateway.url, trust_env=False) as http:
        answered_before = answered(scrape_with(http))
        batch = start(client, jsonl("/v1/completions", [body] * QUEUED))
        queued = all_unanswered_in_engine(http, answered_before)
        assert queued >= ENOUGH, f"only {queued} lines were left to queue: lengthen them"
        live = client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
        # The engine's outputs reach the gateway in the order it made them: a line finished
        # before the live request is answered has left the flight by then.
        left = in_flight(scrape_with(http))
    assert live.usage is not None and live.usage.completion_tokens == 4
    assert left >= LEFT, (queued, left)
    done = until(client, batch.id, finished, BATCH_DEADLINE_S)
    errors = lines_of(client, done.error_file_id) if done.error_file_id else []
    assert done.status == "completed" and completed(done) == QUEUED, errors


def all_unanswered_in_engine(http: httpx.Client, answered_before: float) -> int:
    """Waits until every line of the batch not yet answered is in flight, and says how many
    are: from one scrape, so the two figures are of one moment. (The first line may finish
    before the test first looks, so not "all QUEUED in flight", which would then never come.)"""
    deadline = time.monotonic() + BATCH_DEADLINE_S
    while time.monotonic() < deadline:
        now = scrape_with(http)
        # A line is counted answered just before it leaves the flight: >=, not ==.
        if in_flight(now) + answered(now) - answered_before >= QUEUED:
            return in_flight(now)
        time.sleep(POLL_S)  # scrapes back to back would slow the gateway, not the engine
    raise AssertionError(f"lines not in flight: {in_flight(now)} in flight")


def scrape_with(http: httpx.Client) -> Scrape:
    return parse(http.get("/metrics"))


def in_flight(now: Scrape) -> int:
    return int(now.value("gateway_batch_lines_in_flight"))


def answered(now: Scrape) -> float:
    return now.value("gateway_batch_lines_total", operation="text_completion")

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

import openai
import orjson
import pytest

from tests.e2e.batches import DEADLINE_S, completed, finished, lines_of, start, until
from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.vllm_proc import VLLM_ENV, engine_config, require_vllm

require_vllm()

KEY = "sk-engine-batches"
ENGINE_READY_TIMEOUT_S = 300.0
QUEUED = 6  # lines in the engine at once: one running, the others waiting


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("engine-batches")
    text = engine_config(
        KEY,
        {"max_model_len": 512, "seed": 0, "max_num_seqs": 1, "kv_cache_memory_bytes": 1 << 26},
        {"tiny": {}},
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
    """QUEUED long lines in the engine, one running: a live request that arrives then is the
    next one served (vLLM's priority scheduling), not the last."""
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 200, "ignore_eos": True}
    batch = start(client, jsonl("/v1/completions", [body] * QUEUED))
    until(client, batch.id, lambda b: b.status == "in_progress")
    deadline = time.monotonic() + DEADLINE_S
    while scrape(gateway.url).value("gateway_batch_lines_in_flight") < QUEUED:
        assert time.monotonic() < deadline, "the batch's lines never all went to the engine"
    before = completed(client.batches.retrieve(batch.id))
    live = client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
    after = completed(client.batches.retrieve(batch.id))
    assert live.usage is not None and live.usage.completion_tokens == 4
    assert after - before <= 2, (before, after)  # served first-come, it would wait for all
    done = until(client, batch.id, finished)
    assert done.status == "completed" and completed(done) == QUEUED

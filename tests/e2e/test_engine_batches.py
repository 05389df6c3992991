"""Batches on the in-process engine (`type: vllm`, the tiny model), with the openai SDK: each
line answered as the same request sent live is (greedy, so the same tokens), completions and
chat; and the engine serving a live request before the batch's sequences queued ahead of it
(their lower vLLM priority). One engine for the module, running one sequence at a time
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
ENGINE_ARGS = {
    "max_model_len": 512,
    "seed": 0,
    "max_num_seqs": 1,
    "kv_cache_memory_bytes": 1 << 26,
    "enable_log_requests": True,  # the priority test waits on its word
}
CHILDREN = 16  # the line's sequences (n), each its own request in the engine's queue
CHILD_TOKENS = 160  # a sequence: about a second; the line: about 16 (a live request: 1 or 2)
ADDED = "Added request "  # what vLLM logs as the engine takes a request (enable_log_requests)
SHORT_S = 1  # tiny-short's deadline, shorter than the line takes
POLL_S = 0.05
BATCH_DEADLINE_S = 600.0  # CHILDREN * CHILD_TOKENS tokens, on a machine busy with other work


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("engine-batches")
    text = engine_config(
        KEY,
        ENGINE_ARGS,
        # tiny-short: a deadline shorter than the line below takes in the engine's queue, which
        # does not apply to it there (it waits behind live requests by design)
        {"tiny": {}, "tiny-short": {"timeout_s": SHORT_S}},
        files={"store": str(workdir / "files")},
        batches={"max_concurrency": 4, "live_concurrency": 4, "poll_s": 0.05},
    )
    with GatewayProcess(
        text, workdir, env=VLLM_ENV, timeout=ENGINE_READY_TIMEOUT_S, log_level="info"
    ) as gw:
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
    """A batch line in the engine as CHILDREN sequences, all queued there (vLLM says so as it
    adds each) and run one at a time: a live request that arrives then is served after the one
    running, while first-come it would wait for every one queued, and the line would be done
    first. And the line, waiting longer than its model's deadline, is not cut by it.

    Queued in the engine, not just sent: without the wait on vLLM's word, the live request
    could reach the engine first and pass without any priority. Many short sequences, not a
    few long ones, so that the line lasts long past the live request's own way through the
    gateway even on a busy machine (the tiny model makes a token in well under a millisecond)."""
    body = {
        "model": "tiny-short", "prompt": "Once", "n": CHILDREN, "max_tokens": CHILD_TOKENS,
        "ignore_eos": True, "temperature": 1.0,
    }  # fmt: skip
    with httpx.Client(base_url=gateway.url, trust_env=False) as http:
        added_before = added(gateway)
        batch = start(client, jsonl("/v1/completions", [body]))
        wait_added(gateway, added_before + CHILDREN)
        live = client.completions.create(model="tiny", prompt="Hi", max_tokens=4)
        left = in_flight(scrape_with(http))  # the line still runs when the live is answered
    assert live.usage is not None and live.usage.completion_tokens == 4
    assert left == 1, "the batch's line was done before the live request"
    done = until(client, batch.id, finished, BATCH_DEADLINE_S)
    errors = lines_of(client, done.error_file_id) if done.error_file_id else []
    assert done.status == "completed" and completed(done) == 1, errors
    (answer,) = lines_of(client, done.output_file_id)
    assert len(answer["response"]["body"]["choices"]) == CHILDREN


def added(gateway: GatewayProcess) -> int:
    """Sequences the engine has taken so far (vLLM logs each as it adds it)."""
    return gateway.logs().count(ADDED)


def wait_added(gateway: GatewayProcess, count: int) -> None:
    deadline = time.monotonic() + BATCH_DEADLINE_S
    while added(gateway) < count:
        assert time.monotonic() < deadline, gateway.logs()[-4000:]
        time.sleep(POLL_S)


def scrape_with(http: httpx.Client) -> Scrape:
    return parse(http.get("/metrics"))


def in_flight(now: Scrape) -> int:
    return int(now.value("gateway_batch_lines_in_flight"))

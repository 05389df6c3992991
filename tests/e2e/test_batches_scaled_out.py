"""Two gateway replicas on one object store (a real S3-compatible server, moto) and one Redis:
each sees the files the other stored, exactly one of them runs a batch (its lease in Redis), and
when that one dies (SIGKILL) the other takes the batch over and completes it, each line once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from tests.e2e.batches import finished, lines_of, requests, start, until
from tests.e2e.metrics_text import scrape
from tests.e2e.support import OPENAI_MODEL, scripted_providers
from tests.gateway_proc import GatewayProcess
from tests.redis_proc import RedisServer
from tests.s3_proc import S3Server
from tests.upstreams.procs import ScriptedUpstream

KEY = "sk-replicas"
LEASE_S = 2


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def replica_config(
    upstream: ScriptedUpstream, s3: S3Server, redis: RedisServer, prefix: str
) -> str:
    providers = orjson.dumps(scripted_providers(upstream.url, "http://127.0.0.1:9"))
    return f"""
auth:
  keys:
    - {{id: one, key: {KEY}, models: ["*"]}}
providers: {providers.decode()}
models:
  oa: {{targets: [{{provider: oai, model: {OPENAI_MODEL}}}]}}
rate_limit: {{backend: redis, redis_url: "{redis.url}"}}
files: {{store: "{s3.url(prefix)}"}}
batches: {{max_concurrency: 4, poll_s: 0.05, lease_s: {LEASE_S}}}
"""


@pytest.fixture
def replicas(
    scripted_openai_server: ScriptedUpstream,
    s3: S3Server,
    redis: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[list[GatewayProcess]]:
    scripted_openai_server.reset()
    config = replica_config(scripted_openai_server, s3, redis, request.node.name)
    started: list[GatewayProcess] = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            started.append(GatewayProcess(config, tmp_path / name, env=s3.env))
        yield started
    finally:
        for gw in started:
            gw.stop()


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)


def lines_run(gw: GatewayProcess) -> float:
    return scrape(gw.url).value("gateway_batch_lines_total")


def test_replicas_share_the_store_and_run_each_batch_once(
    replicas: list[GatewayProcess], scripted_openai_server: ScriptedUpstream, s3: S3Server
) -> None:
    a, b = replicas
    with client(a) as on_a, client(b) as on_b:
        batch = start(on_a, requests(30))
        assert on_b.files.retrieve(batch.input_file_id).purpose == "batch"
        assert on_b.files.content(batch.input_file_id).read() == requests(30)
        done = until(on_b, batch.id, finished)
        assert done.status == "completed"
        out = lines_of(on_b, done.output_file_id)
        assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(30))
    assert len(scripted_openai_server.requests()) == 30
    assert sorted([lines_run(a), lines_run(b)]) == [0, 30]  # one replica ran every line
    stored = s3.keys()
    assert any(k.endswith(f"{batch.input_file_id}.data") for k in stored)
    assert any(k.endswith(f"{done.output_file_id}.data") for k in stored)


def test_the_other_replica_takes_over_a_batch_whose_runner_died(
    replicas: list[GatewayProcess], scripted_openai_server: ScriptedUpstream
) -> None:
    scripted_openai_server.script({"delay_ms": 100, "times": -1})
    a, b = replicas
    with client(a) as on_a:
        batch = start(on_a, requests(60))
        until(
            on_a, batch.id, lambda x: (x.request_counts.completed if x.request_counts else 0) >= 8
        )
    running = [gw for gw in replicas if scrape(gw.url).value("gateway_batches_running") == 1]
    assert len(running) == 1
    dead = running[0]
    survivor = b if dead is a else a
    dead.send_signal(signal.SIGKILL)
    dead.stop()
    with client(survivor) as on_survivor:
        done = until(on_survivor, batch.id, finished)
        assert done.status == "completed"
        out = lines_of(on_survivor, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(60))
    assert lines_run(survivor) > 0
    sent = len(scripted_openai_server.requests())
    assert 60 <= sent <= 60 + 4  # max_concurrency: at most the lines in flight at the kill

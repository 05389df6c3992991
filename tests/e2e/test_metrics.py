"""/metrics after real traffic through a gateway process: the counts match what was sent, the
labels are bounded config values, and `--workers 2` adds both workers up (multiprocess mode,
its directory emptied at start)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.e2e.metrics_text import Scrape, scrape
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream, start_scripted

KEY = "k-metrics-secret"
LIMITED = "k-limited-secret"


def config(upstream: str, limited: bool = True) -> str:
    """Two keys, one with a limit (which several workers would need Redis for)."""
    tight = f"- {{id: tight, key: {LIMITED}, limits: {{rpm: 1}}}}" if limited else ""
    return f"""
auth:
  keys:
    - {{id: key-id-visible, key: {KEY}}}
    {tight}
providers:
  up: {{type: openai, base_url: "{upstream}", api_key: "{OPENAI_TEST_KEY}"}}
models:
  m: {{targets: [{{provider: up, model: gpt-test}}]}}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with start_scripted("openai", api_key=OPENAI_TEST_KEY) as up:
        yield up


@pytest.fixture(scope="module")
def gateway(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with GatewayProcess(config(upstream.url), tmp_path_factory.mktemp("metrics")) as gw:
        yield gw.url


def test_counts_match_the_traffic(gateway: str) -> None:
    before = scrape(gateway)
    usage = {"input": 0, "output": 0}
    with OpenAI(base_url=f"{gateway}/v1", api_key=KEY, max_retries=0) as sdk:
        for i in range(3):
            out = sdk.completions.create(model="m", prompt=f"a b c {i}", max_tokens=4)
            usage["input"] += out.usage.prompt_tokens  # type: ignore[union-attr]
            usage["output"] += out.usage.completion_tokens  # type: ignore[union-attr]
        for _ in range(2):
            chunks = list(
                sdk.completions.create(
                    model="m", prompt="d e", max_tokens=6, stream=True,
                    stream_options={"include_usage": True},
                )
            )  # fmt: skip
            final = chunks[-1].usage
            assert final is not None
            usage["input"] += final.prompt_tokens
            usage["output"] += final.completion_tokens

    def post(key: str, **kw: Any) -> httpx.Response:
        return httpx.post(
            f"{gateway}/v1/completions",
            json={"model": "m", "prompt": "x", **kw},
            headers={"authorization": f"Bearer {key}"},
        )

    assert post(KEY, prompt="__status_500__").status_code == 502
    assert post(KEY, temperature=9).status_code == 400
    assert post(LIMITED).status_code == 200
    assert post(LIMITED).status_code == 429
    after = scrape(gateway)

    def requests(**labels: str) -> float:
        return after.delta(before, "gateway_requests_total", **labels)

    assert requests() == 9
    assert requests(status="200", stream="false") == 4
    assert requests(status="200", stream="true") == 2
    assert requests(status="502", provider="up") == 1
    assert requests(status="400", provider="none") == 1
    assert requests(status="429", provider="none") == 1
    for kind, n in usage.items():
        assert after.delta(before, "gateway_tokens_total", type=kind) == n + (
            1 if kind == "input" else 16  # the tight key's request: "x", max_tokens 16
        )
    assert after.delta(before, "gateway_upstream_attempts_total", outcome="ok") == 6
    assert after.delta(before, "gateway_upstream_errors_total", kind="500") == 1
    assert after.delta(before, "gen_ai_server_time_to_first_token_seconds_count") == 2
    assert after.delta(before, "gen_ai_server_time_per_output_token_seconds_count") == 2
    assert after.delta(before, "gateway_overhead_seconds_count") == 7
    assert after.delta(before, "gen_ai_client_operation_duration_seconds_count") == 7
    assert after.delta(before, "gateway_request_duration_seconds_count") == 9
    decisions = "gateway_ratelimit_decisions_total"
    assert after.delta(before, decisions, result="allowed", backend="memory") == 1
    assert after.delta(before, decisions, result="rejected", limit="key_requests") == 1
    assert after.value("gateway_inflight_requests") == 0
    assert after.content_type.startswith("text/plain; version=")


def test_labels_carry_no_key_prompt_or_id(gateway: str) -> None:
    httpx.post(
        f"{gateway}/v1/completions",
        json={"model": "m", "prompt": "secret prompt words"},
        headers={"authorization": f"Bearer {KEY}", "x-request-id": "req-visible"},
    )
    text = httpx.get(f"{gateway}/metrics").text
    for secret in (KEY, LIMITED, "key-id-visible", "secret prompt", "req-visible", "cmpl-"):
        assert secret not in text
    labels = scrape(gateway)
    assert labels.label_values("model") <= {"m", "other"}
    assert labels.label_values("provider") <= {"up", "none"}


def test_workers_add_up_and_start_from_zero(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    shared = tmp_path / "prom"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared)}
    text = config(upstream.url, limited=False)
    with GatewayProcess(text, tmp_path, env=env, workers=2) as gw:
        for i in range(30):
            r = httpx.post(
                f"{gw.url}/v1/completions",
                json={"model": "m", "prompt": f"p {i}", "max_tokens": 2},
                headers={"authorization": f"Bearer {KEY}"},
            )
            assert r.status_code == 200
        scrapes = [scrape(gw.url) for _ in range(6)]  # whichever worker answers
        assert {s.value("gateway_requests_total") for s in scrapes} == {30}
        assert {s.value("gateway_tokens_total", type="output") for s in scrapes} == {60}
        assert len({f.name.rsplit("_", 1)[-1] for f in shared.glob("counter_*.db")}) == 2
    with GatewayProcess(text, tmp_path, env=env, workers=2) as again:
        fresh: Scrape = scrape(again.url)
        assert fresh.value("gateway_requests_total") == 0  # the old values were removed

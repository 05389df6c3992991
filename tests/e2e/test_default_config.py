"""The README's first command: the repository's own config.yaml, served as `make run` serves it
(from the repository root, the tiny model in ./models/tiny), answers the README's SDK call from
the in-process engine with the development key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from providers import tiny_model
from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.vllm_proc import VLLM_ENV, require_vllm

require_vllm()

ROOT = Path(__file__).resolve().parents[2]
DEV_KEY = "sk-local-dev"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tiny_model.build(ROOT / "models" / "tiny")  # what `make run` does first
    text = (ROOT / "config.yaml").read_text()
    workdir = tmp_path_factory.mktemp("default-config")
    with (
        GatewayProcess(text, workdir, env=VLLM_ENV, timeout=300.0, cwd=ROOT) as gw,
        openai.OpenAI(base_url=gw.url + "/v1", api_key=DEV_KEY, max_retries=0) as sdk,
    ):
        yield sdk


def test_the_readme_call_is_served_by_the_engine(client: openai.OpenAI) -> None:
    resp = client.completions.create(model="tiny-local", prompt="Say this is a test", max_tokens=16)
    assert resp.model == "tiny-local"
    assert len(resp.choices) == 1 and resp.choices[0].finish_reason in ("length", "stop")
    assert resp.usage is not None and 1 <= resp.usage.completion_tokens <= 16
    assert "tiny-local" in {m.id for m in client.models.list()}


def test_the_default_alias_streams(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny-local", "prompt": "Say it", "max_tokens": 8}
    full = client.completions.create(temperature=0, **kw)
    with client.completions.create(stream=True, temperature=0, **kw) as stream:
        text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == full.choices[0].text


def test_the_default_key_is_rate_limited_and_counted(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model="tiny-local", prompt="Say this is a test", max_tokens=4
    )
    # config.yaml: the per-model rpm 300 binds before the key's rpm 600; the key's tpm 200000
    assert raw.headers["x-ratelimit-limit-requests"] == "300"
    assert raw.headers["x-ratelimit-limit-tokens"] == "200000"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 200000
    metrics = scrape(str(client.base_url).removesuffix("/v1/"))
    counted = {"model": "tiny-local", "provider": "local", "status": "200"}
    assert metrics.value("gateway_requests_total", **counted, operation="text_completion") >= 1

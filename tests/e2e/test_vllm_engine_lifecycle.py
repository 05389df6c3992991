"""The engine's lifecycle and aborts, observed from inside: the gateway app under uvicorn in this
test's event loop (the engine's running requests are only visible in its process), one engine
for the module, real HTTP clients that disconnect.

* While the engine loads, /livez is 200, /readyz 503 and a completion a 503 that says so.
* A client that disconnects (streaming or not), and a request that times out, leave the engine
  with no running request within a second.
* Shutdown stops the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn

from gateway import config as config_mod
from gateway.api.app import GatewayApp, create_app
from providers.vllm_engine.adapter import VllmEngineProvider
from tests.upstreams.procs import free_port
from tests.vllm_proc import MODEL_DIR, engine_config, require_vllm

require_vllm()
pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY = "sk-life"
READY_TIMEOUT_S = 300.0
ABORT_DEADLINE_S = 1.0  # the bound: no running request a second after leaving
LONG: dict[str, Any] = {"model": "tiny", "prompt": "Once", "max_tokens": 1000, "ignore_eos": True}


@dataclass
class Served:
    url: str
    app: GatewayApp
    while_starting: dict[str, Any]  # what the gateway answered before the engine was up

    @property
    def provider(self) -> VllmEngineProvider:
        provider = self.app.state.runtime.providers["engine"]
        assert isinstance(provider, VllmEngineProvider)
        return provider

    def running(self) -> int:
        processor = self.provider.engine.llm.output_processor
        # vLLM leaves this method unannotated.
        return int(processor.get_num_unfinished_requests())  # type: ignore[no-untyped-call]

    async def settled(self) -> None:
        """Until the engine has no running request, for at most the issue's second."""
        await poll(lambda: self.running() == 0, ABORT_DEADLINE_S)


async def poll(condition: Callable[[], bool], timeout_s: float, every_s: float = 0.01) -> bool:
    """Whether `condition` held within `timeout_s` (state inside the engine has no event)."""
    deadline = time.monotonic() + timeout_s
    for _ in itertools.count():
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)
    return False


def write_config(workdir: Path) -> Path:
    path = workdir / "gateway.yaml"
    engine_args = {"max_model_len": 1024, "kv_cache_memory_bytes": 1 << 28}
    models = {"tiny": {}, "tiny-fast": {"timeout_s": 0.5}}
    path.write_text(engine_config(KEY, engine_args, models))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    path = write_config(tmp_path_factory.mktemp("engine-life"))
    from providers import tiny_model

    tiny_model.build(MODEL_DIR)
    app = create_app(config_mod.load(path))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, headers=auth(), timeout=10.0) as http:
        assert await poll(lambda: server.started, 60.0)
        early = {
            "livez": (await http.get("/livez")).status_code,
            "readyz": (await http.get("/readyz")).status_code,
            "completion": await http.post("/v1/completions", json={**LONG, "max_tokens": 1}),
        }
        await until_ready(http, app)
    yield Served(url, app, early)
    server.should_exit = True
    await task
    assert app.state.runtime.providers["engine"].ready() is False  # the engine was shut down


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


async def until_ready(http: httpx.AsyncClient, app: GatewayApp) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    engine = app.state.runtime.providers["engine"].engine
    while (await http.get("/readyz")).status_code != 200:
        assert engine.failure is None, engine.failure
        assert time.monotonic() < deadline, "the engine did not start"
        await asyncio.sleep(0.2)


async def test_not_ready_while_the_engine_loads(served: Served) -> None:
    early = served.while_starting
    assert early["livez"] == 200
    assert early["readyz"] == 503
    resp: httpx.Response = early["completion"]
    assert resp.status_code == 503
    assert "still starting" in resp.json()["error"]["message"]


async def test_serves_once_ready(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, headers=auth(), timeout=30.0) as http:
        resp = await http.post("/v1/completions", json={**LONG, "max_tokens": 3})
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == 3
    assert served.running() == 0


async def test_stream_disconnect_aborts_the_engine_request(served: Served) -> None:
    async with (
        httpx.AsyncClient(base_url=served.url, headers=auth(), timeout=30.0) as http,
        http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as resp,
    ):
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                break  # generating: now hang up
        assert served.running() == 1
    await served.settled()
    assert served.running() == 0


async def test_non_stream_disconnect_aborts_the_engine_request(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, headers=auth(), timeout=30.0) as http:
        request = asyncio.create_task(http.post("/v1/completions", json={**LONG, "n": 4}))
        assert await poll(lambda: served.running() > 0, 30.0)
        request.cancel()  # the client goes away mid-generation
        with pytest.raises(asyncio.CancelledError):
            await request
    await served.settled()
    assert served.running() == 0


async def test_beam_search_disconnect_aborts_the_engine_requests(served: Served) -> None:
    """Beam search runs one engine request per beam and step; leaving cancels the step."""
    body = {**LONG, "n": 3, "use_beam_search": True, "max_tokens": 400}
    async with httpx.AsyncClient(base_url=served.url, headers=auth(), timeout=30.0) as http:
        request = asyncio.create_task(http.post("/v1/completions", json=body))
        assert await poll(lambda: served.running() > 0, 30.0)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    await served.settled()
    assert served.running() == 0
    async with httpx.AsyncClient(base_url=served.url, headers=auth(), timeout=60.0) as http:
        resp = await http.post("/v1/completions", json={**body, "max_tokens": 4})
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 3


async def test_timeout_aborts_and_answers_504(served: Served) -> None:
    body = {**LONG, "model": "tiny-fast", "n": 8}
    async with httpx.AsyncClient(base_url=served.url, headers=auth(), timeout=30.0) as http:
        resp = await http.post("/v1/completions", json=body)
    assert resp.status_code == 504
    error = resp.json()["error"]
    assert error["code"] == "upstream_timeout" and "aborted" in error["message"]
    await served.settled()
    assert served.running() == 0


async def test_concurrent_streams_and_aborts_leave_nothing_running(served: Served) -> None:
    async def one(i: int) -> int:
        async with (
            httpx.AsyncClient(base_url=served.url, headers=auth(), timeout=60.0) as http,
            http.stream(
                "POST", "/v1/completions", json={**LONG, "max_tokens": 40, "stream": True}
            ) as resp,
        ):
            lines = 0
            async for line in resp.aiter_lines():
                lines += line.startswith("data:")
                if i % 2 and lines == 3:
                    break  # every other client leaves early
            return lines

    counts = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(c == 3 for c in counts[1::2])
    assert all(c > 3 for c in counts[::2])
    await served.settled()
    assert served.running() == 0

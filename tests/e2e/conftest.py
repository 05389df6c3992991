"""One gateway subprocess in front of the two scripted upstreams (OpenAI, Fireworks) for the
whole session (config: tests/e2e/support.py); the upstreams are reset before every test that
uses `env`. Clients are the real openai SDK (sync and async) with retries off, and httpx for
what the SDK hides (raw SSE, bad bodies, disconnects)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.e2e.support import FULL_KEY, LIMITED_KEY, UPSTREAM_OF, gateway_config
from tests.e2e.vllm_stack import (
    Stack,
    vllm_stack,  # noqa: F401  (a pytest fixture)
)
from tests.gateway_proc import GatewayProcess
from tests.upstreams.fixtures import (  # noqa: F401  (pytest fixtures)
    scripted_azure,
    scripted_azure_server,
    scripted_fireworks_server,
    scripted_openai,
    scripted_openai_server,
)
from tests.upstreams.procs import ScriptedUpstream, free_port


@dataclass(frozen=True)
class Env:
    gateway: GatewayProcess
    openai: ScriptedUpstream
    fireworks: ScriptedUpstream
    http: httpx.Client  # base_url = the gateway; no auth header by default
    sdk: OpenAI  # the full key
    limited: OpenAI  # the restricted key

    @property
    def url(self) -> str:
        return self.gateway.url

    def upstream(self, alias: str) -> ScriptedUpstream:
        """The scripted upstream that serves a dialect alias."""
        return self.fireworks if UPSTREAM_OF[alias] == "fireworks" else self.openai

    def client(self, key: str = FULL_KEY, **kw: Any) -> OpenAI:
        """A client of its own (close it), for options the shared ones do not have."""
        kw.setdefault("max_retries", 0)
        return OpenAI(base_url=self.url + "/v1", api_key=key, **kw)

    def async_client(self, key: str = FULL_KEY, **kw: Any) -> AsyncOpenAI:
        kw.setdefault("max_retries", 0)
        return AsyncOpenAI(base_url=self.url + "/v1", api_key=key, **kw)

    def reset(self) -> None:
        self.openai.reset()
        self.fireworks.reset()


@pytest.fixture(scope="session")
def scripted_env(
    scripted_openai_server: ScriptedUpstream,  # noqa: F811  (the imported fixture)
    scripted_fireworks_server: ScriptedUpstream,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("gateway-scripted")
    dead_port = free_port()  # nothing listens there
    text = gateway_config(scripted_openai_server.url, scripted_fireworks_server.url, dead_port)
    with GatewayProcess(text, workdir) as gw:
        url = gw.url + "/v1"
        with (
            httpx.Client(base_url=gw.url, timeout=30.0, trust_env=False) as http,
            OpenAI(base_url=url, api_key=FULL_KEY, max_retries=0) as sdk,
            OpenAI(base_url=url, api_key=LIMITED_KEY, max_retries=0) as limited,
        ):
            yield Env(gw, scripted_openai_server, scripted_fireworks_server, http, sdk, limited)


@pytest.fixture
def env(scripted_env: Env) -> Env:
    scripted_env.reset()
    return scripted_env


@pytest.fixture
def sdk(env: Env) -> OpenAI:
    return env.sdk


@pytest.fixture
def limited(env: Env) -> OpenAI:
    return env.limited


@pytest.fixture
async def async_sdk(env: Env) -> AsyncIterator[AsyncOpenAI]:
    async with env.async_client() as client:
        yield client


@pytest.fixture(scope="module")
def direct(vllm_stack: Stack) -> Iterator[OpenAI]:  # noqa: F811  (the imported fixture)
    """The openai SDK straight to the stack's vLLM server (the parity suites' reference)."""
    with vllm_stack.direct() as client:
        yield client

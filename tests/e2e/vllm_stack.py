"""The real-vLLM stack shared by the engine and vllm-server suites, started once per session:
vLLM's own OpenAI server on the tiny model, and one gateway serving the same model two ways,

    provider `server`   type: vllm-server → that vLLM server (a hop, vLLM's own answers)
    provider `engine`   type: vllm        → an in-process engine (same model, same settings)

Every alias has a target on each provider, so a test picks the path with the virtual-key header
(`x-portkey-virtual-key: server|engine`) and one scenario suite runs through both.

    tiny        no context behaviour: vLLM's own (max_tokens lowered to the room left); a
                request asks for OpenAI's error with ASK_ERROR
    tiny-trunc  context_length_exceeded_behavior: truncate
    tiny-fast   timeout_s 1 (engine timeouts)
    tiny-embed  an embeddings alias on the (generating) engine: refused
    tiny-cached its answers cached when they repeat (greedy or seeded)

The gateway traces every request, and both vLLMs (its engine, the server) are started with an
OTLP traces endpoint: all send their spans to one receiver (`Stack.traces`).

Both serve chat as `vllm serve --enable-auto-tool-choice --tool-call-parser hermes
--trust-request-chat-template` does (SERVER_CHAT_FLAGS and the engine's same settings): tool
calls in the tiny model's hermes format, and a request's own chat_template.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from tests.gateway_proc import GatewayProcess
from tests.otlp_receiver import Receiver, receiving
from tests.vllm_proc import MODEL_DIR, VLLM_ENV, VllmServer

KEY = "sk-test"
METERED_KEY = "sk-metered"  # a key with a token limit (tpm METERED_TPM)
METERED_TPM = 100000
MODEL = "tiny"  # the alias, and the vLLM server's served model name
WINDOW = 1024  # --max-model-len of the server, max_model_len of the engine
PATHS = ("server", "engine")
ENGINE_READY_TIMEOUT_S = 300.0
VIRTUAL_KEY = "x-portkey-virtual-key"
# OpenAI's context-overflow error, asked for (unasked, vLLM's paths lower max_tokens as vLLM does).
ASK_ERROR = {"context_length_exceeded_behavior": "error"}
# Chat on vLLM's server as on the engine (settings in CONFIG): completions are unaffected.
TOOL_PARSER = "hermes"
SERVER_CHAT_FLAGS = (
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    TOOL_PARSER,
    "--trust-request-chat-template",
)
CONFIG = """\
auth:
  keys:
    - {{id: t, key: {key}, models: ["*"], providers: [server, engine, server-openai]}}
    - {{id: metered, key: {metered}, providers: [engine], limits: {{tpm: {tpm}}}}}
providers:
  server: {{type: vllm-server, base_url: "{url}"}}
  server-openai: {{type: vllm-server, base_url: "{url}", answer_shape: openai}}
  engine:
    type: vllm
    model: {model_dir}
    tool_call_parser: {parser}
    enable_auto_tool_choice: true
    trust_request_chat_template: true
    engine_args:
      {{max_model_len: {window}, dtype: float32, enforce_eager: true, seed: 0,
       kv_cache_memory_bytes: 268435456, otlp_traces_endpoint: "{traces}/v1/traces"}}
models:
  tiny: {{targets: [{{provider: server, model: tiny}}, {{provider: engine}}]}}
  tiny-trunc:
    targets: [{{provider: server, model: tiny}}, {{provider: engine}}]
    defaults: {{context_length_exceeded_behavior: truncate}}
  tiny-fast:
    targets: [{{provider: server, model: tiny}}, {{provider: engine}}]
    timeout_s: 1
  tiny-embed: {{endpoint: embeddings, targets: [{{provider: engine}}]}}
  tiny-cached:
    targets: [{{provider: server, model: tiny}}, {{provider: engine}}]
    cache: {{ttl_s: 600, when: deterministic}}
telemetry: {{otlp_endpoint: "{traces}"}}
"""


@dataclass(frozen=True)
class Stack:
    server: VllmServer
    gateway: GatewayProcess
    traces: Receiver  # the gateway's, its engine's and the vLLM server's spans

    def headers(self, path: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}", VIRTUAL_KEY: path}

    def _sdk_options(self, path: str) -> dict[str, Any]:
        return {
            "base_url": self.gateway.url + "/v1",
            "api_key": KEY,
            "max_retries": 0,
            "default_headers": {VIRTUAL_KEY: path},
        }

    def client(self, path: str) -> openai.OpenAI:
        """The openai SDK on the gateway, pinned to a path (close it)."""
        return openai.OpenAI(**self._sdk_options(path))

    def async_client(self, path: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(**self._sdk_options(path))

    def direct(self) -> openai.OpenAI:
        """The openai SDK straight to vLLM's server."""
        return openai.OpenAI(base_url=self.server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("gateway-vllm")
    with (
        receiving() as traces,
        VllmServer(
            extra=(*SERVER_CHAT_FLAGS, "--otlp-traces-endpoint", f"{traces.url}/v1/traces")
        ) as server,
    ):
        text = CONFIG.format(
            traces=traces.url,
            key=KEY,
            metered=METERED_KEY,
            tpm=METERED_TPM,
            url=server.url,
            model_dir=MODEL_DIR,
            window=WINDOW,
            parser=TOOL_PARSER,
        )
        with GatewayProcess(text, workdir, env=VLLM_ENV, timeout=ENGINE_READY_TIMEOUT_S) as gw:
            yield Stack(server, gw, traces)

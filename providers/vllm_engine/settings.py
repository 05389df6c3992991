"""The `type: vllm` provider block, validated without importing vLLM (check-config stays fast);
every error names its YAML path.

    local: {type: vllm, model: ./models/tiny, engine_args: {max_model_len: 1024}}

Keys: `type`; `model` (required: a local model directory, relative paths from the working
directory, or a model id vLLM can load); `engine_args` (optional: vLLM `AsyncEngineArgs` fields,
checked against vLLM's own list when the engine starts). Defaults for CPU machines that vLLM
lacks (a bounded KV cache: vLLM's default of 92% of NUMA node 0 fails on small machines) are in
DEFAULT_ENGINE_ARGS; a configured value always wins. The statistics vLLM keeps per request are
off by default (`disable_log_stats`), unless `otlp_traces_endpoint` is set: vLLM's request
spans are made from them (its `llm_request` span, the child of the gateway's try).

Chat takes the settings `vllm serve` takes as flags (each off by default, as there):
`tool_call_parser` (`--tool-call-parser`: one of vLLM's tool parsers, e.g. hermes; checked
against vLLM's registry when the engine starts), `enable_auto_tool_choice`
(`--enable-auto-tool-choice`: `tool_choice` auto, required and named; it needs
`tool_call_parser`), `trust_request_chat_template` (`--trust-request-chat-template`: a request
may bring its own `chat_template`).

`answer_shape` (`vllm`, the default, or `openai`): answers as `vllm serve` writes them (every
field of its answers, null when not set, and its `system_fingerprint`), or in OpenAI's strict
shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from core.errors import ConfigError
from core.provider import AnswerShape, parse_answer_shape

KEYS = (
    "type",
    "model",
    "engine_args",
    "tool_call_parser",
    "enable_auto_tool_choice",
    "trust_request_chat_template",
    "answer_shape",
)
# Arguments the gateway sets itself: the model comes from `model`, and the Mirostat logits
# processor must always be loaded.
RESERVED_ENGINE_ARGS = frozenset({"model", "logits_processors"})
DEFAULT_ENGINE_ARGS: Mapping[str, Any] = MappingProxyType({"disable_log_stats": True})


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model: str
    engine_args: Mapping[str, Any]
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    trust_request_chat_template: bool = False
    answer_shape: AnswerShape = "vllm"


def parse_settings(settings: Mapping[str, Any], path: str) -> EngineSettings:
    for key in settings:
        if key not in KEYS:
            raise ConfigError(f"{path}.{key}", f"unknown key (known: {', '.join(KEYS)})")
    model = settings.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"{path}.model", "required: a model directory or id, e.g. ./models/tiny")
    parser = settings.get("tool_call_parser")
    if parser is not None and (not isinstance(parser, str) or not parser.strip()):
        raise ConfigError(f"{path}.tool_call_parser", "a vLLM tool parser's name, e.g. hermes")
    auto = _flag(settings, "enable_auto_tool_choice", path)
    if auto and parser is None:
        # vLLM's own rule: "--enable-auto-tool-choice requires --tool-call-parser".
        raise ConfigError(f"{path}.enable_auto_tool_choice", "requires tool_call_parser")
    return EngineSettings(
        model=model,
        engine_args=_engine_args(settings.get("engine_args"), path),
        tool_call_parser=parser,
        enable_auto_tool_choice=auto,
        trust_request_chat_template=_flag(settings, "trust_request_chat_template", path),
        answer_shape=parse_answer_shape(
            settings.get("answer_shape"), f"{path}.answer_shape", "vllm"
        ),
    )


def _flag(settings: Mapping[str, Any], key: str, path: str) -> bool:
    value = settings.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{path}.{key}", "expected true or false")
    return value


def _engine_args(value: Any, path: str) -> Mapping[str, Any]:
    where = f"{path}.engine_args"
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(where, "expected a mapping of vLLM engine arguments")
    for key in value:
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(where, f"{key!r} is not an engine argument name")
        if key in RESERVED_ENGINE_ARGS:
            raise ConfigError(f"{where}.{key}", "set by the gateway; not configurable here")
    defaults = dict(DEFAULT_ENGINE_ARGS)
    if value.get("otlp_traces_endpoint"):  # vLLM traces a request only with its stats kept
        defaults["disable_log_stats"] = False
    return MappingProxyType({**defaults, **value})

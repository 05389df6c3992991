"""The provider block of the config, validated; every error names its YAML path.

Keys: `type` (openai | fireworks | vllm-server | openai-compatible); `base_url` (required, the
API root such as https://api.fireworks.ai/inference/v1: requests go to base_url +
"/completions"); `api_key` (optional, sent as `Authorization: Bearer`); `headers` (optional
extra static headers); `max_connections` (pool size, default 512); `connect_timeout_s`
(default 10); `max_response_bytes` (the most of a response body the gateway reads, once
decoded, default 64 MiB: a larger answer is a 502); `answer_shape` (`vllm-server` only: `vllm`,
the default, writes answers as vLLM's server does, `openai` in OpenAI's strict shape).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from core.errors import ConfigError
from core.provider import AnswerShape, parse_answer_shape

KEYS = (
    "type",
    "base_url",
    "api_key",
    "headers",
    "max_connections",
    "connect_timeout_s",
    "max_response_bytes",
    "answer_shape",
)
DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
USER_AGENT = "completions-gateway"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 header field name
# Headers the gateway itself sets: a config value would break the request framing or body.
RESERVED = frozenset({"content-type", "content-length", "transfer-encoding", "host", "connection"})


@dataclass(frozen=True, slots=True)
class Settings:
    base_url: str  # the API root, without a trailing slash
    url: str  # the full completions URL
    headers: Mapping[str, str]  # every static header of every request
    api_key: str
    max_connections: int
    connect_timeout_s: float
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    answer_shape: AnswerShape = "openai"


def parse_settings(
    settings: Mapping[str, Any], path: str, shapes: tuple[AnswerShape, ...] = ("openai",)
) -> Settings:
    """`shapes`: the answer shapes the provider's type can take, its default first."""
    for key in settings:
        if key not in KEYS:
            raise ConfigError(f"{path}.{key}", f"unknown key (known: {', '.join(KEYS)})")
    api_key = _api_key(settings.get("api_key"), f"{path}.api_key")
    # Lower-case names throughout, so a configured header replaces a default one.
    headers = {"content-type": "application/json", "user-agent": USER_AGENT}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    headers.update(_headers(settings.get("headers"), f"{path}.headers", bool(api_key)))
    base_url = _base_url(settings.get("base_url"), f"{path}.base_url")
    return Settings(
        base_url=base_url,
        url=base_url + "/completions",
        headers=headers,
        api_key=api_key,
        max_connections=_at_least(
            settings.get("max_connections"), f"{path}.max_connections", DEFAULT_MAX_CONNECTIONS, 1
        ),
        connect_timeout_s=_seconds(settings.get("connect_timeout_s"), f"{path}.connect_timeout_s"),
        max_response_bytes=_at_least(
            settings.get("max_response_bytes"),
            f"{path}.max_response_bytes",
            DEFAULT_MAX_RESPONSE_BYTES,
            1024,
            "a number of bytes",
        ),
        answer_shape=_shape(settings.get("answer_shape"), f"{path}.answer_shape", shapes),
    )


def _shape(value: Any, path: str, shapes: tuple[AnswerShape, ...]) -> AnswerShape:
    shape = parse_answer_shape(value, path, shapes[0])
    if shape not in shapes:
        raise ConfigError(path, f"this provider type answers in {' or '.join(shapes)} shape only")
    return shape


def _base_url(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(path, "required: the upstream's API root, e.g. https://api.openai.com/v1")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(path, f"expected an http(s) URL, got {value!r}")
    if parts.query or parts.fragment:
        raise ConfigError(path, "must not have a query or fragment ('/completions' is appended)")
    if parts.username or parts.password:
        raise ConfigError(path, "must not carry credentials; use api_key or headers")
    return value.rstrip("/")


def _api_key(value: Any, path: str) -> str:
    if value is None:
        return ""  # e.g. `${KEY:-}` left empty, or an unauthenticated vLLM server
    if not isinstance(value, str):
        raise ConfigError(path, "expected a string")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(path, "must not contain whitespace or control characters")
    return value


def _headers(value: Any, path: str, has_key: bool) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, "expected a mapping of header name to value")
    out: dict[str, str] = {}
    for name, v in value.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ConfigError(where, "not a valid header name")
        if name.lower() in RESERVED:
            raise ConfigError(where, "set by the gateway; it cannot be configured")
        if name.lower() == "authorization" and has_key:
            raise ConfigError(where, "conflicts with api_key; set one of them")
        if not isinstance(v, str) or any(c in v for c in "\r\n\0"):
            raise ConfigError(where, "expected a single-line string")
        out[name.lower()] = v
    return out


def _at_least(value: Any, path: str, default: int, least: int, what: str = "an integer") -> int:
    """An integer of at least `least` (`default` when not set)."""
    if value is None:
        return default
    if type(value) is not int or value < least:
        raise ConfigError(path, f"expected {what} >= {least}, got {value!r}")
    return value


def _seconds(value: Any, path: str) -> float:
    if value is None:
        return DEFAULT_CONNECT_TIMEOUT_S
    if type(value) not in (int, float) or not 0 < value < 3600:
        raise ConfigError(path, f"expected a number of seconds in (0, 3600), got {value!r}")
    return float(value)

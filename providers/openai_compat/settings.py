"""The provider block of the config, validated; every error names its YAML path.

Keys: `type` (openai | fireworks | vllm-server | openai-compatible | azure-openai); `base_url`
(required, the API root such as https://api.fireworks.ai/inference/v1: requests go to base_url +
"/completions"; a query string on it, e.g. ?tenant=a, is kept on every call); `api_key`
(optional, sent as `Authorization: Bearer`); `headers` (optional extra static headers);
`max_connections` (pool size, default 512); `connect_timeout_s`
(default 10); `max_response_bytes` (the most of a response body the gateway reads, once
decoded, default 64 MiB: a larger answer is a 502); `answer_shape` (`vllm-server` only: `vllm`,
the default, writes answers as vLLM's server does, `openai` in OpenAI's strict shape).

Azure OpenAI (`azure-openai`): `base_url` is the resource's endpoint
(https://my-resource.openai.azure.com), the `api_key` goes in Azure's `api-key` header, and
`api_version` (e.g. "2024-10-21") sends each model to its deployment, named in `deployments`
(upstream model → deployment name): /openai/deployments/{deployment}/completions?api-version=….
Without `api_version`, Azure's v1 API: /openai/v1/completions, the model in the body as usual.

Networks: `tls` (https upstreams: `ca_file`, a CA added to the system's store; `cert_file` and
`key_file`, a client certificate; `verify: false`, no verification, warned of at every start;
the files are read here, so `gateway check-config` names one that is missing or does not load);
`proxy` (`http://user:pass@host:port`, or `none`; by default HTTPS_PROXY / HTTP_PROXY /
NO_PROXY from the environment, as curl reads them); `idle_timeout_s` (how long a pooled
connection is kept unused, default 30).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from core.errors import ConfigError
from core.provider import AnswerShape, parse_answer_shape
from providers.transport.client import KEEPALIVE_S
from providers.transport.proxy import Proxy, from_environment
from providers.transport.tls import FILES as TLS_FILES
from providers.transport.tls import KEYS as TLS_KEYS
from providers.transport.tls import TlsConfigError, TlsFiles, client_context

KEYS = (
    "type",
    "base_url",
    "api_key",
    "headers",
    "max_connections",
    "connect_timeout_s",
    "max_response_bytes",
    "answer_shape",
    "idle_timeout_s",
    "tls",
    "proxy",
)
# Azure OpenAI's own keys (type azure-openai only).
AZURE_KEYS = ("api_version", "deployments")
AZURE_KEY_HEADER = "api-key"
# An api-version is a date, maybe a preview's; a deployment's name has no character to escape.
_API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(-preview)?")
_DEPLOYMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
USER_AGENT = "completions-gateway"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 header field name
# Headers the gateway itself sets: a config value would break the request framing or body.
RESERVED = frozenset(
    {"content-type", "content-length", "transfer-encoding", "host", "connection"}
    | {"proxy-authorization"}  # the proxy's, from its URL: never through a tunnel to the upstream
)


@dataclass(frozen=True, slots=True)
class Urls:
    """Where one model's requests go: each endpoint's full URL, query included."""

    completions: str
    chat: str
    embeddings: str
    responses: str


def endpoints(root: str, query: str = "") -> Urls:
    """The endpoints under `root`, each with `query` ("?…" or "")."""
    return Urls(
        f"{root}/completions{query}",
        f"{root}/chat/completions{query}",
        f"{root}/embeddings{query}",
        f"{root}/responses{query}",
    )


NO_DEPLOYMENTS: Mapping[str, Urls] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Settings:
    base_url: str  # the API root, without a trailing slash or its query
    url: str  # the full completions URL (Azure's deployments: the resource's endpoint)
    headers: Mapping[str, str]  # every static header of every request
    api_key: str
    max_connections: int
    connect_timeout_s: float
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    answer_shape: AnswerShape = "openai"
    query: str = ""  # base_url's query string ("?tenant=a" or ""), kept on every call
    # Each endpoint's URL, the same for every model; None where each model has its own.
    urls: Urls | None = None
    # Azure: upstream model → its deployment's URLs
    deployments: Mapping[str, Urls] = field(default_factory=lambda: NO_DEPLOYMENTS)
    idle_timeout_s: float = KEEPALIVE_S  # a pooled connection kept unused, at most
    tls: ssl.SSLContext | None = None  # an https upstream's, when `tls` is set
    proxy: Proxy | None = None  # the proxy it is reached through (config or environment)


def parse_settings(
    settings: Mapping[str, Any],
    path: str,
    shapes: tuple[AnswerShape, ...] = ("openai",),
    azure: bool = False,
) -> Settings:
    """`shapes`: the answer shapes the provider's type can take, its default first; `azure`:
    Azure OpenAI's addressing (its keys, the `api-key` header)."""
    known = (*KEYS, *AZURE_KEYS) if azure else KEYS
    for key in settings:
        if key not in known:
            raise ConfigError(f"{path}.{key}", f"unknown key (known: {', '.join(known)})")
    api_key = _api_key(settings.get("api_key"), f"{path}.api_key")
    # Lower-case names throughout, so a configured header replaces a default one.
    headers = {"content-type": "application/json", "user-agent": USER_AGENT}
    key_header = AZURE_KEY_HEADER if azure else "authorization"
    if api_key:
        headers[key_header] = api_key if azure else f"Bearer {api_key}"
    taken = key_header if api_key else ""
    headers.update(_headers(settings.get("headers"), f"{path}.headers", taken))
    base_url, query = _base_url(settings.get("base_url"), f"{path}.base_url")
    if azure:
        urls, deployments = _azure(settings, path, base_url, query)
    else:
        urls, deployments = endpoints(base_url, query), NO_DEPLOYMENTS
    return Settings(
        base_url=base_url,
        url=urls.completions if urls else base_url + query,
        query=query,
        urls=urls,
        deployments=deployments,
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
        idle_timeout_s=_seconds(
            settings.get("idle_timeout_s"), f"{path}.idle_timeout_s", KEEPALIVE_S
        ),
        tls=_tls(settings.get("tls"), f"{path}.tls", base_url),
        proxy=_proxy(settings.get("proxy"), f"{path}.proxy", base_url),
    )


def _shape(value: Any, path: str, shapes: tuple[AnswerShape, ...]) -> AnswerShape:
    shape = parse_answer_shape(value, path, shapes[0])
    if shape not in shapes:
        raise ConfigError(path, f"this provider type answers in {' or '.join(shapes)} shape only")
    return shape


def _base_url(value: Any, path: str) -> tuple[str, str]:
    """The API root without a trailing slash, and its query string ("?…" or ""), which every
    call keeps (the endpoint's path goes between them)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(path, "required: the upstream's API root, e.g. https://api.openai.com/v1")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(path, "must not contain whitespace or control characters")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(path, f"expected an http(s) URL, got {value!r}")
    if "#" in value:
        raise ConfigError(path, "must not have a fragment")
    if parts.username or parts.password:
        raise ConfigError(path, "must not carry credentials; use api_key or headers")
    root = value.partition("?")[0].rstrip("/")
    return root, f"?{parts.query}" if parts.query else ""


def _azure(
    settings: Mapping[str, Any], path: str, root: str, query: str
) -> tuple[Urls | None, Mapping[str, Urls]]:
    """Azure OpenAI's URLs: with an api_version, each model's deployment's (None for the
    provider's own); without one, the v1 API's, the same for every model."""
    if urlsplit(root).path.endswith(("/openai", "/openai/v1")):
        raise ConfigError(
            f"{path}.base_url",
            "the resource's endpoint, e.g. https://my-resource.openai.azure.com: the gateway "
            "adds /openai/…",
        )
    version = _api_version(settings.get("api_version"), f"{path}.api_version")
    names = settings.get("deployments")
    if version is None:
        if names is not None:
            raise ConfigError(
                f"{path}.deployments",
                "only with api_version: Azure's v1 API takes the deployment's name as the model",
            )
        return endpoints(root + "/openai/v1", query), NO_DEPLOYMENTS
    if "api-version" in parse_qs(query[1:]):
        raise ConfigError(f"{path}.base_url", "has an api-version: set api_version instead")
    versioned = f"{query}&api-version={version}" if query else f"?api-version={version}"
    deployments = _deployments(names, f"{path}.deployments")
    return None, MappingProxyType(
        {
            model: endpoints(f"{root}/openai/deployments/{quote(name)}", versioned)
            for model, name in deployments.items()
        }
    )


def _api_version(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if type(value) is date:
        value = value.isoformat()  # YAML reads an unquoted 2024-10-21 as a date
    if not isinstance(value, str) or not _API_VERSION.fullmatch(value):
        raise ConfigError(
            path,
            'expected an Azure api-version such as "2024-10-21" or "2025-04-01-preview" (or '
            f"no api_version, for the v1 API), got {value!r}",
        )
    return value


def _deployments(value: Any, path: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(
            path,
            "required with api_version: each upstream model's deployment name, e.g. "
            "{gpt-4o-mini: my-gpt4o-mini}",
        )
    out: dict[str, str] = {}
    for model, name in value.items():
        where = f"{path}.{model}"
        if not isinstance(model, str) or not model:
            raise ConfigError(where, "expected an upstream model's name")
        if not isinstance(name, str) or not _DEPLOYMENT.fullmatch(name):
            raise ConfigError(
                where, f"expected a deployment's name (letters, digits, . _ -), got {name!r}"
            )
        out[model] = name
    return out


def _api_key(value: Any, path: str) -> str:
    if value is None:
        return ""  # e.g. `${KEY:-}` left empty, or an unauthenticated vLLM server
    if not isinstance(value, str):
        raise ConfigError(path, "expected a string")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(path, "must not contain whitespace or control characters")
    return value


def _headers(value: Any, path: str, taken: str) -> dict[str, str]:
    """`taken`: the header api_key fills ("" when there is no key)."""
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
        if name.lower() == taken:
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


def _seconds(value: Any, path: str, default: float = DEFAULT_CONNECT_TIMEOUT_S) -> float:
    if value is None:
        return default
    if type(value) not in (int, float) or not 0 < value < 3600:
        raise ConfigError(path, f"expected a number of seconds in (0, 3600), got {value!r}")
    return float(value)


def _tls(value: Any, path: str, base_url: str) -> ssl.SSLContext | None:
    """The context of an https upstream's connections, its files read now; None when `tls` is
    not set (the default context, built when the provider starts)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected a mapping of {', '.join(TLS_KEYS)}")
    for key in value:
        if key not in TLS_KEYS:
            raise ConfigError(f"{path}.{key}", f"unknown key (known: {', '.join(TLS_KEYS)})")
    if urlsplit(base_url).scheme != "https":
        raise ConfigError(path, "only for an https upstream: base_url is http://")
    verify = value.get("verify", True)
    if type(verify) is not bool:
        raise ConfigError(f"{path}.verify", f"expected true or false, got {verify!r}")
    files = {key: _file(value.get(key), f"{path}.{key}") for key in TLS_FILES}
    try:
        return client_context(TlsFiles(verify, **files))
    except TlsConfigError as exc:
        raise ConfigError(f"{path}.{exc.key}", exc.message) from None


def _file(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"expected a file's path, got {value!r}")
    return value


def _proxy(value: Any, path: str, base_url: str) -> Proxy | None:
    """The proxy named here (`none`: none), else the environment's for the upstream. A URL is
    never quoted in an error: it may hold the proxy's password."""
    if isinstance(value, str) and value.lower() == "none":
        return None
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(path, "expected a proxy's URL such as http://proxy.corp:3128, or none")
    parts = urlsplit(base_url)
    scheme, host = parts.scheme, parts.hostname or ""
    try:
        if value is None:
            return from_environment(scheme, host, parts.port or (443 if scheme == "https" else 80))
        return Proxy.of(value)
    except ValueError as exc:
        where = "" if value is not None else f" (the environment's {scheme}_proxy)"
        raise ConfigError(path, f"{exc}{where}; set {path} to a proxy's URL or none") from None

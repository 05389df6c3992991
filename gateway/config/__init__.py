"""YAML → typed Config, plain data. `${ENV}` / `${ENV:-default}` substitution; every error names
its YAML path.

Each provider block is checked here by its adapter (through the registry, by `type:` tag), so
that a bad block fails `gateway check-config` exactly as it would fail at startup; the runtime
builds the providers from the blocks (gateway.runtime).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from core.completions import RequestLimits
from core.errors import ConfigError
from gateway.config import accounts
from gateway.config.accounts import AdminKey, KeyConfig, TeamConfig
from gateway.config.caching import CacheConfig, cache_section
from gateway.config.models import ModelConfig, models
from gateway.config.portkey import PortkeyConfig
from gateway.config.portkey import parse as portkey_config
from gateway.config.tls import TlsConfig
from gateway.config.tls import parse as tls_config
from gateway.config.values import (
    boolean,
    integer,
    join,
    known,
    mapping,
    nonnegative,
    number,
    one_of,
    seq,
    text,
)
from gateway.governance import pricing
from gateway.governance.pricing import Price
from gateway.ratelimit import BreakerConfig, RateLimitConfig
from gateway.routing.circuits import CircuitPolicy
from providers import registry

__all__ = [
    "DEV_KEY",
    "AdminKey",
    "CacheConfig",
    "Config",
    "KeyConfig",
    "ModelConfig",
    "ProviderConfig",
    "RequestLogConfig",
    "ResponsesConfig",
    "ServerConfig",
    "ServerTimeouts",
    "TeamConfig",
    "TelemetryConfig",
    "TlsConfig",
    "load",
    "parse",
]

DEV_KEY = "sk-local-dev"
TOP_KEYS = (
    "server", "auth", "providers", "models", "configs", "circuit_breaker", "rate_limit", "metrics",
    "files", "batches", "responses", "teams", "request_log", "telemetry", "cache",
)  # fmt: skip
LIMIT_BACKENDS = ("memory", "redis")
MAX_REDACT = 64  # request_log.redact's patterns
MAX_OTLP_HEADERS = 32
OTLP_SCHEMES = ("http", "https", "grpc", "grpcs")
# The variables that name an OTLP endpoint for traces (the SDK's exporters read them).
OTLP_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
BACKEND_MODES = ("local", "open", "closed")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True, slots=True)
class ServerTimeouts:
    """The listener's timeouts, in seconds (a 408 for the first two, once no answer has begun)."""

    head_s: float = 10.0  # from a request's first byte until its head is complete
    body_s: float = 30.0  # the longest wait for a body's next bytes while the app waits for them
    keep_alive_s: float = 5.0  # an idle connection is closed after it


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 4 * 1024 * 1024
    limits: RequestLimits = field(default_factory=RequestLimits)
    watch_config_s: float = 2.0  # seconds between checks of the file for changes; 0: none
    # The listener's limits, read at start (a reload keeps the running ones). A request's line
    # and headers together, and its count of headers: a 431 past them.
    max_head_bytes: int = 65536
    max_headers: int = 100
    # Open connections per serving process; past it, requests are answered 503 (uvicorn's
    # limit_concurrency). 2048: uvicorn's default listen backlog; with what one connection may
    # hold (a head, 64 KB, and a body buffered before reading pauses, 64 KB), 256 MB at most.
    max_connections: int = 2048
    timeouts: ServerTimeouts = field(default_factory=ServerTimeouts)
    # TLS on the listener (None: plain HTTP), for deployments with no ingress to end it. Its
    # files are read by `gateway serve` and check-config (gateway.config.tls), and read again
    # in each serving process when they change; the block itself is read at start.
    tls: TlsConfig | None = None


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """A provider's block as written (after ${ENV}), checked by its adapter. It holds
    credentials: out of repr."""

    name: str
    settings: Mapping[str, Any] = field(repr=False)  # without `pricing`: a price is no rebuild
    pricing: Mapping[str, Price] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    enabled: bool = True
    # host and port of a listener of its own for /metrics (the API port then answers 404 there)
    listen: tuple[str, int] | None = None
    require_key: bool = False  # a scrape must present one of auth.keys, wherever it is served
    # How long a render's text answers the scrapes after it (0: none; scrapes during a render
    # share it all the same).
    min_interval_s: float = 0.0
    max_connections: int = 32  # the listener's open connections; more are answered 503
    timeout_s: float = 10.0  # the listener's time for a request head, and for writing an answer
    team_labels: int = 100  # teams labelled by id in the spend metrics; past them, `other`


@dataclass(frozen=True, slots=True)
class FilesConfig:
    """Where uploaded files live: a directory, or an object store URL (s3://, gs://, az://)."""

    store: str = "./data/files"
    max_bytes: int = 200 * 1024 * 1024  # per file (OpenAI's batch input limit)


@dataclass(frozen=True, slots=True)
class BatchesConfig:
    max_concurrency: int = 16  # lines in flight, all batches together
    # Lines in flight while live requests are being served: batch work yields to them.
    live_concurrency: int = 1
    poll_s: float = 0.5  # how often the runner looks for batches with work left
    window_s: int | None = None  # instead of the completion window's 24 h (tests, operators)
    lease_s: float = 30.0  # a runner that stops renewing loses its batches to another after it


@dataclass(frozen=True, slots=True)
class ResponsesConfig:
    """The Responses API's stored responses (in the files store: gateway.jobs.responsestore)."""

    ttl_days: int = 30  # a stored response is gone this long after its created_at


@dataclass(frozen=True, slots=True)
class RequestLogConfig:
    """One JSON line per request, written when it ends (gateway.observability)."""

    path: str | None = None  # None: off; "stdout"; or a file, appended to
    capture_content: bool = False  # prompts and answers in the lines, after `redact`
    redact: tuple[re.Pattern[str], ...] = ()  # matches replaced by [REDACTED] in captured text


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """OpenTelemetry traces, exported over OTLP (gateway.observability.tracing). Tracing is on
    when an endpoint is known: `otlp_endpoint`, else the standard OTEL_EXPORTER_OTLP_(TRACES_)
    ENDPOINT variables, which the SDK's exporter reads with the others (headers, protocol,
    timeout, certificates) when the config does not say."""

    endpoint: str | None = None  # the exporter's URL: OTLP/HTTP's /v1/traces, or gRPC's address
    protocol: str = "http"  # http (OTLP/HTTP, protobuf) or grpc
    headers: Mapping[str, str] = field(default_factory=dict)
    sample_ratio: float = 1.0  # of the traces that begin here; a caller's traceparent decides
    capture_content: bool = False  # prompts and answers on the spans, as GenAI events
    redact: tuple[re.Pattern[str], ...] = ()  # matches replaced by [REDACTED] in captured text

    @property
    def on(self) -> bool:
        return self.endpoint is not None or any(os.environ.get(v) for v in OTLP_ENDPOINT_ENV)


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig
    keys: tuple[KeyConfig, ...]
    providers: Mapping[str, ProviderConfig]
    models: Mapping[str, ModelConfig]
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    circuits: CircuitPolicy = field(default_factory=CircuitPolicy)
    configs: Mapping[str, PortkeyConfig] = field(default_factory=dict)  # x-portkey-config: NAME
    files: FilesConfig = field(default_factory=FilesConfig)
    batches: BatchesConfig = field(default_factory=BatchesConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    teams: Mapping[str, TeamConfig] = field(default_factory=dict)
    admin_keys: tuple[AdminKey, ...] = ()
    request_log: RequestLogConfig = field(default_factory=RequestLogConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    source: str = ""

    def has_dev_key(self) -> bool:
        dev = hashlib.sha256(DEV_KEY.encode()).digest()
        return any(k.sha256 == dev for k in self.keys)

    def check_workers(self, workers: int) -> None:
        """Several worker processes count rate limits apart on the memory backend, so a limit
        there would let each of them admit the whole of it: a ConfigError naming the limit."""
        if workers == 1 or self.rate_limit.backend != "memory":
            return
        limited = [
            f"auth.keys[{i}]"
            for i, k in enumerate(self.keys)
            if k.limits.limited or k.budget or k.model_budgets
        ]
        limited += [
            f"teams.{t.id}"
            for t in self.teams.values()
            if t.limits.items() or t.budget or t.model_budgets
        ]
        limited += [f"models.{name}.limits" for name, m in self.models.items() if m.limits.items()]
        if limited:
            raise ConfigError(
                limited[0],
                f"a rate limit with {workers} workers on the memory backend would be counted in "
                "each worker apart; set rate_limit.backend: redis (one count for every worker "
                "and replica) or run one worker",
            )


# ---------------------------------------------------------------- loading


def load(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read the config file ({exc.strerror})") from None
    return parse(text, source=str(p))


def parse(text: str, source: str = "<config>") -> Config:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"not valid YAML: {exc}") from None
    data = _substitute(raw if raw is not None else {}, "")
    top = mapping(data, "")
    known(top, "", TOP_KEYS)
    providers = _providers(mapping(top.get("providers", {}), "providers"))
    auth = mapping(top.get("auth", {}), "auth")
    known(auth, "auth", ("keys", "admin_keys"))
    teams = accounts.teams_section(mapping(top.get("teams", {}), "teams"), providers)
    rate_limit = _rate_limit(mapping(top.get("rate_limit", {}), "rate_limit"))
    return Config(
        server=_server(mapping(top.get("server", {}), "server")),
        keys=accounts.keys_section(auth, providers, teams),
        providers=providers,
        models=models(mapping(top.get("models", {}), "models"), providers),
        rate_limit=rate_limit,
        metrics=_metrics(mapping(top.get("metrics", {}), "metrics")),
        circuits=_circuits(mapping(top.get("circuit_breaker", {}), "circuit_breaker")),
        configs=_configs(mapping(top.get("configs", {}), "configs"), providers),
        files=_files(mapping(top.get("files", {}), "files")),
        batches=_batches(mapping(top.get("batches", {}), "batches")),
        responses=_responses(mapping(top.get("responses", {}), "responses")),
        teams=teams,
        admin_keys=accounts.admin_section(auth),
        request_log=_request_log(top.get("request_log", False)),
        telemetry=_telemetry(top.get("telemetry", {})),
        cache=cache_section(mapping(top.get("cache", {}), "cache"), rate_limit.redis_url),
        source=source,
    )


def _substitute(node: Any, path: str) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, join(path, str(k))) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, f"{path}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        return _ENV.sub(lambda m: _env(m, path), node)
    return node


def _env(match: re.Match[str], path: str) -> str:
    name, default = match.group(1), match.group(2)
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ConfigError(path, f"environment variable {name} is not set")
        return default
    return value


# ---------------------------------------------------------------- sections


def _server(s: Mapping[str, Any]) -> ServerConfig:
    known(s, "server", ServerConfig.__dataclass_fields__)
    lim = mapping(s.get("limits", {}), "server.limits")
    known(lim, "server.limits", RequestLimits.__dataclass_fields__)
    d = ServerConfig()
    return ServerConfig(
        host=text(s.get("host", "127.0.0.1"), "server.host"),
        port=integer(s.get("port", 8080), "server.port", 0, 65535),
        max_body_bytes=integer(s.get("max_body_bytes", 4 << 20), "server.max_body_bytes", 1024),
        limits=RequestLimits(**{k: integer(v, f"server.limits.{k}", 1) for k, v in lim.items()}),
        watch_config_s=nonnegative(s.get("watch_config_s", 2.0), "server.watch_config_s"),
        max_head_bytes=integer(
            s.get("max_head_bytes", d.max_head_bytes), "server.max_head_bytes", *HEAD_BYTES
        ),
        max_headers=integer(s.get("max_headers", d.max_headers), "server.max_headers", *HEADERS),
        max_connections=integer(
            s.get("max_connections", d.max_connections), "server.max_connections", 1
        ),
        timeouts=_timeouts(mapping(s.get("timeouts", {}), "server.timeouts")),
        tls=tls_config(mapping(s.get("tls", {}), "server.tls")),
    )


# What server.max_head_bytes and server.max_headers may be: a head of 1 KB fits any client's
# request; past 1 MB the parser would again hold the event loop for long
# (gateway/server/protocol.py).
HEAD_BYTES = (1024, 1 << 20)
HEADERS = (1, 10_000)


def _timeouts(t: Mapping[str, Any]) -> ServerTimeouts:
    path = "server.timeouts"
    known(t, path, ServerTimeouts.__dataclass_fields__)
    d = ServerTimeouts()
    return ServerTimeouts(
        **{
            k: _seconds(t.get(k, getattr(d, k)), f"{path}.{k}")
            for k in ServerTimeouts.__dataclass_fields__
        }
    )


def _seconds(v: Any, path: str) -> float:
    """A timer's seconds: more than 0 (a timer of 0 would fire without end), and finite."""
    if nonnegative(v, path) == 0:
        raise ConfigError(path, "expected a number > 0")
    return float(v)


def _providers(section: Mapping[str, Any]) -> dict[str, ProviderConfig]:
    out = {}
    for name, block in section.items():
        path = f"providers.{name}"
        settings = dict(mapping(block, path))
        prices = pricing.parse(settings.pop("pricing", {}), f"{path}.pricing")
        registry.check(settings, path)
        out[str(name)] = ProviderConfig(str(name), settings, prices)
    return out


# ---------------------------------------------------------------- limits and metrics


def _rate_limit(r: Mapping[str, Any]) -> RateLimitConfig:
    path = "rate_limit"
    fields = RateLimitConfig.__dataclass_fields__
    known(r, path, fields)
    d = RateLimitConfig()
    b = mapping(r.get("breaker", {}), f"{path}.breaker")
    known(b, f"{path}.breaker", BreakerConfig.__dataclass_fields__)
    return RateLimitConfig(
        backend=one_of(r.get("backend", d.backend), f"{path}.backend", LIMIT_BACKENDS),  # type: ignore[arg-type]
        redis_url=_redis_url(r.get("redis_url", d.redis_url), f"{path}.redis_url"),
        cluster=boolean(r.get("cluster", d.cluster), f"{path}.cluster"),
        on_backend_error=one_of(  # type: ignore[arg-type]
            r.get("on_backend_error", d.on_backend_error), f"{path}.on_backend_error", BACKEND_MODES
        ),
        replicas=integer(r.get("replicas", d.replicas), f"{path}.replicas", 1),
        key_prefix=_tag(r.get("key_prefix", d.key_prefix), f"{path}.key_prefix"),
        timeout_ms=integer(r.get("timeout_ms", d.timeout_ms), f"{path}.timeout_ms", 1, 60_000),
        pool_size=integer(r.get("pool_size", d.pool_size), f"{path}.pool_size", 1),
        lease_s=number(r.get("lease_s", d.lease_s), f"{path}.lease_s"),
        breaker=BreakerConfig(
            failures=integer(b.get("failures", 3), f"{path}.breaker.failures", 1),
            cooldown_s=number(b.get("cooldown_s", 5.0), f"{path}.breaker.cooldown_s"),
        ),
    )


def _redis_url(v: Any, path: str) -> str:
    url = text(v, path)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(path, "expected a redis://, rediss:// or unix:// URL")
    return url


def _tag(v: Any, path: str) -> str:
    tag = text(v, path)
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", tag):
        raise ConfigError(path, "expected 1-64 characters of letters, digits and ._:-")
    return tag


def _configs(
    section: Mapping[str, Any], providers: Mapping[str, ProviderConfig]
) -> dict[str, PortkeyConfig]:
    """Named Portkey configs. Their trees are rooted at `config` (Portkey's response headers
    name targets so); their errors at `configs.NAME`."""
    out = {}
    for name, raw in section.items():
        try:
            out[str(name)] = portkey_config(raw, providers)
        except ConfigError as err:
            raise ConfigError(
                f"configs.{name}{err.path.removeprefix('config')}", err.message
            ) from None
    return out


def _circuits(c: Mapping[str, Any]) -> CircuitPolicy:
    path = "circuit_breaker"
    known(c, path, CircuitPolicy.__dataclass_fields__)
    d = CircuitPolicy()
    return CircuitPolicy(
        failures=integer(c.get("failures", d.failures), f"{path}.failures", 0),
        cooldown_s=number(c.get("cooldown_s", d.cooldown_s), f"{path}.cooldown_s"),
    )


def _metrics(m: Mapping[str, Any]) -> MetricsConfig:
    path = "metrics"
    known(m, path, MetricsConfig.__dataclass_fields__)
    d = MetricsConfig()
    enabled = boolean(m.get("enabled", d.enabled), f"{path}.enabled")
    listen = None if m.get("listen") is None else _address(m["listen"], f"{path}.listen")
    if listen is not None and not enabled:
        raise ConfigError(f"{path}.listen", "metrics are disabled (metrics.enabled: false)")
    return MetricsConfig(
        enabled=enabled,
        listen=listen,
        require_key=boolean(m.get("require_key", d.require_key), f"{path}.require_key"),
        min_interval_s=nonnegative(
            m.get("min_interval_s", d.min_interval_s), f"{path}.min_interval_s"
        ),
        max_connections=integer(
            m.get("max_connections", d.max_connections), f"{path}.max_connections", 1, 10_000
        ),
        timeout_s=number(m.get("timeout_s", d.timeout_s), f"{path}.timeout_s"),
        team_labels=integer(m.get("team_labels", d.team_labels), f"{path}.team_labels", 0, 10_000),
    )


def _request_log(v: Any) -> RequestLogConfig:
    """`off` (YAML reads it as false), or `{path: off | stdout | a file}`."""
    path = "request_log"
    if v is False or v == "off":
        return RequestLogConfig()
    m = mapping(v, path)
    known(m, path, RequestLogConfig.__dataclass_fields__)
    where = m.get("path", False)
    if where is False or where == "off":
        return RequestLogConfig()
    where = text(where, f"{path}.path")
    if not where.strip() or len(where) > 4096 or "\0" in where:
        raise ConfigError(f"{path}.path", "expected off, stdout or a file's path")
    capture = boolean(m.get("capture_content", False), f"{path}.capture_content")
    return RequestLogConfig(where, capture, _redact(m, path))


def _redact(m: Mapping[str, Any], path: str) -> tuple[re.Pattern[str], ...]:
    patterns = seq(m.get("redact", []), f"{path}.redact")
    if len(patterns) > MAX_REDACT:
        raise ConfigError(f"{path}.redact", f"at most {MAX_REDACT} patterns")
    return tuple(_pattern(p, f"{path}.redact[{i}]") for i, p in enumerate(patterns))


def _telemetry(v: Any) -> TelemetryConfig:
    path = "telemetry"
    m = mapping(v, path)
    known(m, path, ("otlp_endpoint", "headers", "sample_ratio", "capture_content", "redact"))
    endpoint, protocol = _otlp_endpoint(m.get("otlp_endpoint"), f"{path}.otlp_endpoint")
    headers = mapping(m.get("headers", {}), f"{path}.headers")
    if len(headers) > MAX_OTLP_HEADERS:
        raise ConfigError(f"{path}.headers", f"at most {MAX_OTLP_HEADERS} headers")
    checked = {}
    for name, value in headers.items():
        where = f"{path}.headers.{name}"
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}", str(name)):
            raise ConfigError(where, "not a valid header name")
        value = text(value, where)
        if len(value) > 8192 or any(c in value for c in "\r\n\0"):
            raise ConfigError(where, "a header value of at most 8192 characters, on one line")
        checked[str(name).lower()] = value
    ratio = number(m.get("sample_ratio", 1.0), f"{path}.sample_ratio")
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"{path}.sample_ratio", "expected a number from 0 to 1")
    capture = boolean(m.get("capture_content", False), f"{path}.capture_content")
    return TelemetryConfig(endpoint, protocol, checked, ratio, capture, _redact(m, path))


def _otlp_endpoint(v: Any, path: str) -> tuple[str | None, str]:
    """http(s)://host:port[/path] (OTLP/HTTP: /v1/traces is added to a bare host, as the
    OTEL_EXPORTER_OTLP_ENDPOINT variable has it), or grpc(s)://host:port (OTLP/gRPC; grpcs:
    TLS). Absent: the environment's, or tracing off."""
    if v is None:
        return None, "http"
    url = urlsplit(text(v, path))
    if url.scheme not in OTLP_SCHEMES or not url.hostname or len(str(v)) > 2048:
        raise ConfigError(path, "expected http(s)://host:port[/path] or grpc(s)://host:port")
    try:
        url.port  # noqa: B018 (a port out of range raises)
    except ValueError:
        raise ConfigError(path, "the port is not valid") from None
    if url.scheme.startswith("grpc"):
        secure = url.scheme == "grpcs"
        return f"{'https' if secure else 'http'}://{url.netloc}", "grpc"
    if url.path in ("", "/"):
        return f"{url.scheme}://{url.netloc}/v1/traces", "http"
    return url.geturl(), "http"


def _pattern(v: Any, path: str) -> re.Pattern[str]:
    source = text(v, path)
    if not source or len(source) > 1000:
        raise ConfigError(path, "expected a regular expression of 1 to 1000 characters")
    try:
        return re.compile(source)
    except re.error as exc:
        raise ConfigError(path, f"not a valid regular expression: {exc}") from None


def _address(v: Any, path: str) -> tuple[str, int]:
    """`host:port`, an IPv6 address in brackets (`[::1]:9464`)."""
    host, _, port = text(v, path).rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not _is_ipv6(host):
            raise ConfigError(path, f"{host!r} in brackets is not an IPv6 address")
    elif not host or ":" in host or not re.fullmatch(r"[A-Za-z0-9.-]+", host):
        raise ConfigError(path, "expected host:port, e.g. 127.0.0.1:9464 (IPv6: [::1]:9464)")
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise ConfigError(path, f"expected a port from 1 to 65535 after the host, got {port!r}")
    return host, int(port)


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


STORE_SCHEMES = ("file", "s3", "gs", "az", "memory")
MIN_LEASE_S = 1.0


def _files(f: Mapping[str, Any]) -> FilesConfig:
    known(f, "files", ("store", "max_bytes"))
    d = FilesConfig()
    store = text(f.get("store", d.store), "files.store")
    scheme = store.split("://", 1)[0] if "://" in store else None
    if scheme is not None and scheme not in STORE_SCHEMES:
        raise ConfigError("files.store", f"'{scheme}://' is not one of {', '.join(STORE_SCHEMES)}")
    return FilesConfig(store, integer(f.get("max_bytes", d.max_bytes), "files.max_bytes", 1))


def _batches(b: Mapping[str, Any]) -> BatchesConfig:
    known(b, "batches", BatchesConfig.__dataclass_fields__)
    d = BatchesConfig()
    window = b.get("window_s")
    most = integer(b.get("max_concurrency", d.max_concurrency), "batches.max_concurrency", 1)
    live = integer(b.get("live_concurrency", d.live_concurrency), "batches.live_concurrency", 1)
    if live > most:
        raise ConfigError("batches.live_concurrency", f"at most max_concurrency ({most})")
    lease = number(b.get("lease_s", d.lease_s), "batches.lease_s")
    if lease < MIN_LEASE_S:  # renewed every sixth of it, checked every quarter second
        raise ConfigError("batches.lease_s", f"at least {MIN_LEASE_S:g} seconds")
    return BatchesConfig(
        max_concurrency=most,
        live_concurrency=live,
        poll_s=number(b.get("poll_s", d.poll_s), "batches.poll_s"),
        window_s=None if window is None else integer(window, "batches.window_s", 1),
        lease_s=lease,
    )


def _responses(r: Mapping[str, Any]) -> ResponsesConfig:
    known(r, "responses", ResponsesConfig.__dataclass_fields__)
    d = ResponsesConfig()
    return ResponsesConfig(
        ttl_days=integer(r.get("ttl_days", d.ttl_days), "responses.ttl_days", 1),
    )

"""Every metric, defined once, and the one observation per request.

A request's observation is added to the tally of the requests alike (the same labels) in plain
Python (its values appended to lists, binned in bulk when moved: in C, by a map of bisections
into a Counter), and the tallies are moved into prometheus_client's values in bulk: at once while no
other request is in flight, else at most FLUSH_S later, and before every scrape. Nine labelled
updates a request, each through prometheus_client's lock, measured a tenth of the gateway's CPU
a request under load.

Names follow OpenTelemetry's GenAI conventions where one exists, `gateway_*` otherwise. Labels
are bounded config values only: the model alias (virtual-key model ids are `other`), the
provider name, the status code, stream, the limit's scope and kind. Never a key, a user or an id
(an exemplar's trace id, below, is no label: it makes no series).

With `gateway serve --workers N` (N > 1) the CLI sets PROMETHEUS_MULTIPROC_DIR, cleaned at
start; each worker writes its values there and a scrape of any worker adds them all up.

A scrape's text is rendered off the event loop (a thread: prometheus_client's rendering is
plain CPU work, 846 KB took 72 ms), and shared: the scrapes that come while a render runs get
its text, and with `metrics.min_interval_s` set, those that come within that long of a render's
start get its text too (cached; 0, the default, keeps no text once sent, so a scrape never
answers with values older than the render it joined). So N scrapers cost one render. The
tallies are
flushed on the loop's thread before each render; prometheus_client's values each take their own
lock, so the render reads them while the loop adds to them (as its own HTTP server's thread
does).

A scrape whose Accept header lists `application/openmetrics-text` (Prometheus' does) gets the
OpenMetrics exposition, any other the text format; each format has its own shared renders, so a
scraper never gets the other's body. The request-duration and time-to-first-token histograms
carry exemplars in OpenMetrics (the text format has none): a traced request's trace id
(`trace_id`) on the bucket its value falls in, the latest traced one of each bucket. A tally
keeps at most one per bucket, and untraced requests cost one branch. prometheus_client keeps no
exemplars in multiprocess mode (`--workers N`, N > 1): there none are kept.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
)
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.samples import Exemplar

from gateway.governance.money import PICO
from gateway.routing.circuits import STATE_NAMES

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The operation (OpenTelemetry's gen_ai.operation.name): which endpoint served the request.
OP_TEXT_COMPLETION = "text_completion"
OP_EMBEDDINGS = "embeddings"
OP_CHAT = "chat"
OP_RESPONSES = "responses"
OTHER_MODEL = "other"
RELOAD_RESULTS = {True: "ok", False: "error"}
TASKS_HELP = "asyncio tasks alive in the process (single-worker mode only)."
FLUSH_S = 0.25  # under load, how long an observation may wait to reach the registry

# Seconds: a gateway adds hops, so the low end is coarser than an engine's.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92, 163.84, 327.68)  # fmt: skip
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 1)  # fmt: skip
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
GENAI = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")
GENAI_SERVER = ("gen_ai_request_model", "gen_ai_provider_name")

# attribute: (type, name, help, labels, options). Counters gain `_total` when exposed.
METRICS: dict[str, tuple[type[Any], str, str, tuple[str, ...], dict[str, Any]]] = {
    "requests": (Counter, "gateway_requests",
        "Inference requests answered (text_completion, embeddings), by final HTTP status "
        "(499: the caller left).",
        ("model", "provider", "status", "stream", "operation"), {}),
    "request_duration": (Histogram, "gateway_request_duration_seconds",
        "Whole request time in the gateway.",
        ("model", "stream", "operation"), {"buckets": DURATION_BUCKETS}),
    "overhead": (Histogram, "gateway_overhead_seconds",
        "Time in the gateway itself: the request's time minus the time waiting on providers.",
        ("model", "stream"), {"buckets": OVERHEAD_BUCKETS}),
    "operation": (Histogram, "gen_ai_client_operation_duration_seconds",
        "Provider time of a request.",
        (*GENAI, "error_type"), {"buckets": DURATION_BUCKETS}),
    "token_usage": (Histogram, "gen_ai_client_token_usage",
        "Tokens per request, by type (input, output).",
        (*GENAI, "gen_ai_token_type"), {"buckets": TOKEN_BUCKETS}),
    "tokens": (Counter, "gateway_tokens", "Tokens, by type (input, output).",
        ("model", "provider", "type"), {}),
    "ttft": (Histogram, "gen_ai_server_time_to_first_token_seconds",
        "Streams: arrival to the first text sent to the caller.",
        GENAI_SERVER, {"buckets": TTFT_BUCKETS}),
    "tpot": (Histogram, "gen_ai_server_time_per_output_token_seconds",
        "Streams: time per output token after the first.",
        GENAI_SERVER, {"buckets": TPOT_BUCKETS}),
    "attempts": (Counter, "gateway_upstream_attempts",
        "Calls to providers, by outcome (ok, error; skipped: not made, the circuit was open).",
        ("provider", "outcome"), {}),
    "upstream_errors": (Counter, "gateway_upstream_errors",
        "Failed provider calls, by kind (the upstream's status, timeout or unreachable).",
        ("provider", "kind"), {}),
    "circuit_state": (Gauge, "gateway_circuit_state",
        "Circuit breaker of a target: 0 closed, 1 half-open (probing), 2 open (skipped). "
        "upstream_model `*`: the provider's models that are not in the config.",
        ("provider", "upstream_model"), {"multiprocess_mode": "livemax"}),
    "circuit_transitions": (Counter, "gateway_circuit_transitions",
        "Circuit breaker changes, by the state entered.",
        ("provider", "upstream_model", "state"), {}),
    "inflight": (Gauge, "gateway_inflight_requests", "Inference requests being served.",
        (), {"multiprocess_mode": "livesum"}),
    "decisions": (Counter, "gateway_ratelimit_decisions",
        "Rate-limit decisions: allowed, rejected (429), unfit (400), open (backend down, "
        "admitted unchecked), unavailable (backend down, 503).",
        ("model", "result", "limit", "backend"), {}),
    "backend_errors": (Counter, "gateway_ratelimit_backend_errors",
        "Failed calls to the rate-limit backend (Redis), by on_backend_error mode.",
        ("mode",), {}),
    "backend_up": (Gauge, "gateway_ratelimit_backend_up",
        "1 while the rate-limit backend is in use, 0 while its breaker is open.",
        (), {"multiprocess_mode": "livemin"}),
    "reloads": (Counter, "gateway_config_reloads",
        "Config reloads (SIGHUP, file change), by result: ok, or error (refused: the running "
        "config stays).",
        ("result",), {}),
    "reload_ok": (Gauge, "gateway_config_last_reload_success",
        "1 if the last config reload succeeded (or none was tried), 0 if it was refused.",
        (), {"multiprocess_mode": "livemin"}),
    "files_stored": (Counter, "gateway_files_stored",
        "Files stored: uploads by their purpose, and the gateway's batch_output files.",
        ("purpose",), {}),
    "file_bytes": (Counter, "gateway_file_bytes_stored",
        "Bytes of the files stored, by purpose.", ("purpose",), {}),
    "files_deleted": (Counter, "gateway_files_deleted", "Files deleted by their owners.",
        (), {}),
    "batches": (Counter, "gateway_batches",
        "Batches that entered each status (validating: created; the others as their runner "
        "moved them there).",
        ("status",), {}),
    "batch_lines": (Counter, "gateway_batch_lines",
        "Batch lines answered, by the batch's operation and outcome (completed: a 200; "
        "failed: an error the line's caller would have had).",
        ("operation", "outcome"), {}),
    "batch_lines_inflight": (Gauge, "gateway_batch_lines_in_flight",
        "Batch lines being served.", (), {"multiprocess_mode": "livesum"}),
    "batches_running": (Gauge, "gateway_batches_running",
        "Batches whose lease this process holds and runs.", (),
        {"multiprocess_mode": "livesum"}),
    "config_loaded": (Gauge, "gateway_config_loaded_timestamp_seconds",
        "When the config in use was loaded (Unix time; with several workers, the oldest).",
        (), {"multiprocess_mode": "livemin"}),
    "spend": (Counter, "gateway_spend_usd",
        "What requests cost, in US dollars at the providers' configured prices, by team "
        "(none: keys without one; other: teams past metrics.team_labels), model alias and "
        "provider.",
        ("team", "model", "provider"), {}),
    "unpriced": (Counter, "gateway_unpriced_requests",
        "Requests answered by a target without a price (they cost 0).",
        ("model", "provider"), {}),
    "budget_used": (Gauge, "gateway_budget_used_ratio",
        "The share of a budget spent or reserved in its current period: a team's own (scope "
        "team), and the highest of its keys' (scope key; team none: keys without one).",
        ("scope", "team"), {"multiprocess_mode": "livemax"}),
    "renders": (Counter, "gateway_metrics_renders",
        "Renders of /metrics: the scrapes during one, or within metrics.min_interval_s of the "
        "last, share one.", (), {}),
    "request_log_dropped": (Counter, "gateway_request_log_dropped_lines",
        "Request log lines dropped: its writer was behind (a slow or full disk) or a write "
        "failed.", (), {}),
    "cache_requests": (Counter, "gateway_cache_requests",
        "Requests to a cache-enabled model, by their cache status: hit, miss, refresh "
        "(looked up anew), disabled (no-store, or an answer that cannot repeat).",
        ("model", "result"), {}),
    "cache_entries": (Gauge, "gateway_cache_entries",
        "Entries in the response cache: a memory backend's in each serving process (sum "
        "them), Redis's shared count (the same in each: take one).",
        ("backend",), {"multiprocess_mode": "liveall"}),
    "cache_backend_errors": (Counter, "gateway_cache_backend_errors",
        "Cache calls that failed (Redis down or too slow): the request was served uncached.",
        ("operation",), {}),
    "spans_dropped": (Counter, "gateway_telemetry_dropped_spans",
        "Trace spans dropped: the exporter was behind, or the collector refused, failed or did "
        "not answer in time.", (), {}),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Format:
    """An exposition format: the content type a scrape is answered with, and its renderer."""

    content_type: str
    generate: Callable[[CollectorRegistry], bytes]


TEXT = Format(CONTENT_TYPE_LATEST, generate_latest)
OPENMETRICS = Format(openmetrics.CONTENT_TYPE_LATEST, openmetrics.generate_latest)
OPENMETRICS_MEDIA = "application/openmetrics-text"


def negotiated(accept: str) -> Format:
    """OpenMetrics when the Accept header lists it (at any version; not with q=0), else the text
    format. Other q-values are not weighed, as prometheus_client's own server does not: a
    scraper that lists OpenMetrics can read it."""
    for part in accept.split(","):
        media, *params = (p.strip().lower() for p in part.split(";"))
        if media == OPENMETRICS_MEDIA and not any(_refused(p) for p in params):
            return OPENMETRICS
    return TEXT


def _refused(param: str) -> bool:
    name, _, value = param.partition("=")
    try:
        return name.strip() == "q" and float(value) == 0
    except ValueError:
        return False


# A traced observation, an exemplar: (trace id, value, time.time() when observed).
Traced = tuple[str, float, float]
EXEMPLAR_LABEL = "trace_id"


# One try of a request at a target, as the request log and traces tell it: the target's label
# (provider/model), its outcome ("ok", or the attempt metric's error kind: a status, "timeout",
# "unreachable", "request_timeout"; "cancelled" when the caller left), when it began
# (perf_counter()), how long it took and how long the retry policy waited before it, in
# seconds, and the traceparent it was sent with ("" when the request is not traced).
AttemptRecord = tuple[str, str, float, float, float, str]


@dataclass(slots=True)
class RequestRecord:
    """What one inference request did, filled in along its path and observed once at its end."""

    start: float  # perf_counter() at arrival
    operation: str = OP_TEXT_COMPLETION  # or OP_CHAT, OP_EMBEDDINGS
    model: str = OTHER_MODEL  # the label: a configured alias, or `other`
    stream: bool = False
    provider: str = ""  # the provider that served it (last tried); "" if none was reached
    status: int = 0
    upstream_s: float = 0.0  # time spent waiting on providers
    first_token: float = 0.0  # perf_counter() when the first text went out (streams)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error_type: str = ""  # the error's type, for gen_ai's error_type; "" on success

    usage: Mapping[str, Any] | None = None  # the answer's, as reported (what it cost)
    attempts: list[AttemptRecord] | None = None  # each try, in order (None: no target tried)
    cost: int | None = None  # what it was charged, in pico-dollars (None: nothing is priced)
    error_code: str | None = None  # the OpenAI error's `code`, when it failed with one
    trace_id: str = ""  # its trace's id (32 hex digits) when it is traced; "" when not

    def tried(self, attempt: AttemptRecord) -> None:
        if self.attempts is None:
            self.attempts = [attempt]
        else:
            self.attempts.append(attempt)

    def use(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.usage = usage
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")

    @property
    def total_tokens(self) -> int | None:
        if self.operation == OP_EMBEDDINGS:  # an embedding has input tokens only
            return self.prompt_tokens
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


class Metrics:
    def __init__(
        self, enabled: bool = True, min_interval_s: float = 0.0, team_labels: int = 100
    ) -> None:
        self.enabled = enabled
        self.min_interval_s = min_interval_s
        self.team_labels = team_labels
        self._teams: set[str] = set()  # the teams labelled by id
        self._shared = {TEXT: Shared(), OPENMETRICS: Shared()}  # each format's renders
        self.multiprocess_dir = os.environ.get(MULTIPROC_ENV) or None
        # prometheus_client drops exemplars in multiprocess mode: not even kept, there
        self._exemplars = self.multiprocess_dir is None
        self.registry = CollectorRegistry()
        if self.multiprocess_dir is None:
            ProcessCollector(registry=self.registry)
        else:
            _forget_dead_workers(Path(self.multiprocess_dir))
        self._children: dict[Hashable, Any] = {}
        self._pending: dict[Labels, Alike] = {}  # the tallies not yet in the registry
        self._flush_at: asyncio.TimerHandle | None = None
        self._inflight = 0
        self.m: dict[str, Any] = {
            attr: cls(name, text, labels, registry=self.registry, **options)
            for attr, (cls, name, text, labels, options) in METRICS.items()
        }
        self._tasks: Gauge | None = None
        if self.multiprocess_dir is None:  # a count of one loop's tasks, not to be summed
            # set on the loop's thread before each render: the render's thread has no loop
            self._tasks = Gauge("gateway_event_loop_tasks", TASKS_HELP, registry=self.registry)
        inflight = self.m["inflight"]
        if self.multiprocess_dir is None:  # read when scraped
            inflight.set_function(lambda: float(self._inflight))
            self._inflight_value = None
        else:  # each worker's in its file, added to directly, as a handle is
            self._inflight_value = inflight._value
        self._ok: dict[str, int] = {}  # successful attempts by provider, not yet in the registry
        # spend by (team, model, provider), in pico-dollars, not yet in the registry
        self._spent: dict[tuple[str, str, str], int] = {}
        self._cached: dict[tuple[str, str], int] = {}  # cache requests by (model, result), too

    def _child(self, metric: str, *labels: str) -> Any:
        """labels() takes a lock and builds a key each time: cache the children (counters and
        histograms as their values' handles, which every request updates)."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self.m[metric].labels(*labels)
            handle = HANDLES.get(METRICS[metric][0])
            child = self._children[key] = child if handle is None else handle(child)
        return child

    # ------------------------------------------------------------ observations

    def observe(self, rec: RequestRecord, end: float | None = None) -> None:
        """The request's observation, tallied with the requests alike."""
        if not self.enabled:
            return
        took = (time.perf_counter() if end is None else end) - rec.start
        key = (rec.model, rec.provider, rec.status, rec.stream, rec.operation, rec.error_type)
        alike = self._pending.get(key) or self._alike(key)
        alike.n += 1
        alike.duration.append(took)
        if rec.provider:
            alike.overhead.append(max(0.0, took - rec.upstream_s))
            alike.upstream.append(rec.upstream_s)
            if rec.prompt_tokens is not None:
                alike.tokens_in.append(rec.prompt_tokens)
            if rec.completion_tokens is not None:
                alike.tokens_out.append(rec.completion_tokens)
            if rec.first_token:
                alike.ttft.append(rec.first_token - rec.start)
                if rec.completion_tokens and rec.completion_tokens > 1:
                    alike.tpot.append(
                        (took - rec.first_token + rec.start) / (rec.completion_tokens - 1)
                    )
        if rec.trace_id and self._exemplars:
            _exemplify(alike, rec, took)
        self._flush_due()

    def _alike(self, key: Labels) -> Alike:
        alike = self._pending[key] = Alike()
        return alike

    def _flush_due(self) -> None:
        """Now while no request is in flight (what was observed is in the registry when its
        caller can look); else once FLUSH_S from the first observation waiting."""
        if not self._inflight:
            self.flush()
        elif self._flush_at is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._flush_at = loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """The tallies into the registry's values."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        pending, self._pending = self._pending, {}
        for key, alike in pending.items():
            self._move(key, alike)
        ok, self._ok = self._ok, {}
        for provider, count in ok.items():
            self._child("attempts", provider, "ok").inc(count)
        cached, self._cached = self._cached, {}
        for (model, result), count in cached.items():
            self._child("cache_requests", model, result).inc(count)
        spent, self._spent = self._spent, {}
        for (team, model, provider), amount in spent.items():
            label = self._team_label(team)
            self._child("spend", label, model, provider or "none").inc(amount / PICO)

    def _move(self, key: Labels, alike: Alike) -> None:
        model, provider, status, streamed, op, error_type = key
        stream = "true" if streamed else "false"
        self._child("requests", model, provider or "none", str(status), stream, op).inc(alike.n)
        duration = self._child("request_duration", model, stream, op)
        duration.add(alike.duration)
        if alike.duration_traced:
            duration.exemplify(alike.duration_traced)
        if not provider:
            return
        self._child("overhead", model, stream).add(alike.overhead)
        genai = (op, provider, model)
        self._child("operation", *genai, error_type).add(alike.upstream)
        for kind, tokens in (("input", alike.tokens_in), ("output", alike.tokens_out)):
            if tokens:
                self._child("token_usage", *genai, kind).add(tokens)
                self._child("tokens", model, provider, kind).inc(sum(tokens))
        if alike.ttft:
            ttft = self._child("ttft", model, provider)
            ttft.add(alike.ttft)
            if alike.ttft_traced:
                ttft.exemplify(alike.ttft_traced)
        if alike.tpot:
            self._child("tpot", model, provider).add(alike.tpot)

    def inflight_add(self, n: int) -> None:
        if self.enabled:
            self._inflight += n
            if self._inflight_value is not None:
                self._inflight_value.inc(n)

    def attempt(self, provider: str, error_kind: str | None) -> None:
        if not self.enabled:
            return
        if error_kind is None:  # every request's: tallied, as observations are
            self._ok[provider] = self._ok.get(provider, 0) + 1
            return
        self._child("attempts", provider, "error").inc()
        self._child("upstream_errors", provider, error_kind).inc()

    def request_log_dropped(self, n: int) -> None:
        if self.enabled:
            self.m["request_log_dropped"].inc(n)

    def spans_dropped(self, n: int) -> None:
        if self.enabled and n:
            self.m["spans_dropped"].inc(n)

    def skipped(self, provider: str) -> None:
        if self.enabled:
            self._child("attempts", provider, "skipped").inc()

    def circuit(self, provider: str, model: str, state: int, moved: bool) -> None:
        if not self.enabled:
            return
        self._child("circuit_state", provider, model).set(state)
        if moved:
            self._child("circuit_transitions", provider, model, STATE_NAMES[state]).inc()

    def ratelimit_decision(self, model: str, result: str, limit: str, backend: str) -> None:
        if self.enabled:
            self._child("decisions", model, result, limit, backend).inc()

    def ratelimit_counter(
        self, model: str, result: str, limit: str, backend: str
    ) -> Callable[[], None]:
        if not self.enabled:
            return _nothing
        inc: Callable[[], None] = self._child("decisions", model, result, limit, backend).inc
        return inc

    def spend(self, team: str, model: str, provider: str, amount: int) -> None:
        """`amount`: pico-dollars (gateway.governance.money), tallied exactly until the flush;
        the counter's unit is the dollar."""
        if self.enabled:
            key = (team, model, provider)
            self._spent[key] = self._spent.get(key, 0) + amount
            self._flush_due()

    def unpriced(self, model: str, provider: str) -> None:
        if self.enabled:
            self._child("unpriced", model, provider).inc()

    def budget_used(self, scope: str, team: str, ratio: float) -> None:
        if self.enabled:
            self._child("budget_used", scope, self._team_label(team)).set(ratio)

    def _team_label(self, team: str) -> str:
        """Teams by id, the first `team_labels` of them (teams made at runtime are unbounded)."""
        if not team:
            return "none"
        if team in self._teams or len(self._teams) < self.team_labels:
            self._teams.add(team)
            return team
        return "other"

    def cache_request(self, model: str, result: str) -> None:
        """Tallied (one dict update a request), as observations are."""
        if self.enabled:
            key = (model, result)
            self._cached[key] = self._cached.get(key, 0) + 1
            self._flush_due()

    def cache_entries(self, backend: str, n: int) -> None:
        if self.enabled:
            self._child("cache_entries", backend).set(n)

    def cache_backend_error(self, operation: str) -> None:
        if self.enabled:
            self._child("cache_backend_errors", operation).inc()

    def ratelimit_backend_error(self, mode: str) -> None:
        if self.enabled:
            self._child("backend_errors", mode).inc()

    def ratelimit_backend_started(self, mode: str) -> None:
        if self.enabled:
            self._child("backend_errors", mode)
            self.m["backend_up"].set(1)

    def ratelimit_backend_up(self, up: bool) -> None:
        if self.enabled:
            self.m["backend_up"].set(1 if up else 0)

    def config_started(self) -> None:
        """The config the process started with is in use (both results shown from 0)."""
        if self.enabled:
            for result in RELOAD_RESULTS.values():
                self._child("reloads", result)
            self._config_state(True)

    def config_reloaded(self, ok: bool) -> None:
        """ok: the new config serves new requests; else it was refused and the old one stays."""
        if self.enabled:
            self._child("reloads", RELOAD_RESULTS[ok]).inc()
            self._config_state(ok)

    def _config_state(self, ok: bool) -> None:
        self.m["reload_ok"].set(1 if ok else 0)
        if ok:
            self.m["config_loaded"].set_to_current_time()

    def file_stored(self, purpose: str, size: int) -> None:
        if self.enabled:
            self._child("files_stored", purpose).inc()
            self._child("file_bytes", purpose).inc(size)

    def file_deleted(self) -> None:
        if self.enabled:
            self.m["files_deleted"].inc()

    def batch_status(self, status: str) -> None:
        if self.enabled:
            self._child("batches", status).inc()

    def batch_line(self, operation: str, ok: bool) -> None:
        if self.enabled:
            self._child("batch_lines", operation, "completed" if ok else "failed").inc()

    def batch_lines_add(self, n: int) -> None:
        if self.enabled:
            self.m["batch_lines_inflight"].inc(n)

    def batches_running_add(self, n: int) -> None:
        if self.enabled:
            self.m["batches_running"].inc(n)

    # ------------------------------------------------------------ exposition

    def render(self, fmt: Format = TEXT) -> tuple[bytes, str]:
        """The exposition now, rendered on the caller's thread."""
        self._before_render()
        return self.exposition(fmt), fmt.content_type

    async def scrape(self, accept: str = "") -> tuple[bytes, str]:
        """In the format `accept` (a scrape's Accept header) asks for: the text of that format's
        last render if it began within min_interval_s, else of its render running now, else of
        a new one."""
        fmt = negotiated(accept)
        shared = self._shared[fmt]
        if shared.next is None and time.monotonic() - shared.rendered_at < self.min_interval_s:
            return shared.text, fmt.content_type
        if shared.next is None:
            shared.next = asyncio.ensure_future(self._render(fmt, shared))
        # shielded: a scraper that leaves does not cancel the others' render
        return await asyncio.shield(shared.next), fmt.content_type

    async def _render(self, fmt: Format, shared: Shared) -> bytes:
        try:
            began = time.monotonic()
            self._before_render()
            text = await asyncio.to_thread(self.exposition, fmt)
            if self.min_interval_s > 0:
                shared.text, shared.rendered_at = text, began
            return text
        finally:
            shared.next = None

    def _before_render(self) -> None:
        """On the loop's thread: what only it may touch, into the registry."""
        self.flush()
        if self._tasks is not None:
            self._tasks.set(_tasks())
        self.m["renders"].inc()

    def exposition(self, fmt: Format = TEXT) -> bytes:
        """Every value in `fmt` (any thread): this process's, or every worker's."""
        if self.multiprocess_dir is None:
            return fmt.generate(self.registry)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        return fmt.generate(merged)


class Shared:
    """One format's renders, shared by its scrapes: the one running, and the last one's text
    while min_interval_s keeps it."""

    __slots__ = ("next", "rendered_at", "text")

    def __init__(self) -> None:
        self.next: asyncio.Future[bytes] | None = None  # the render scrapes share
        self.rendered_at = -math.inf  # monotonic() when the last render began
        self.text = b""  # what it rendered


def _exemplify(alike: Alike, rec: RequestRecord, took: float) -> None:
    """A traced request kept as the exemplar of the buckets its duration and time to first
    token fall in (the bucket found as HistogramHandle finds it), replacing an earlier one."""
    at = time.time()
    if alike.duration_traced is None:
        alike.duration_traced = {}
    alike.duration_traced[bisect_left(DURATION_BUCKETS, took)] = (rec.trace_id, took, at)
    if rec.provider and rec.first_token:
        ttft = rec.first_token - rec.start
        if alike.ttft_traced is None:
            alike.ttft_traced = {}
        alike.ttft_traced[bisect_left(TTFT_BUCKETS, ttft)] = (rec.trace_id, ttft, at)


# A request's labels: model, provider ("" if none was reached), status, stream, operation and
# error type.
Labels = tuple[str, str, int, bool, str, str]


class Alike:
    """The tally of requests alike (the same labels) since the registry last had them."""

    __slots__ = (
        "duration", "duration_traced", "n", "overhead", "tokens_in", "tokens_out", "tpot", "ttft",
        "ttft_traced", "upstream",
    )  # fmt: skip

    def __init__(self) -> None:
        self.n = 0
        self.duration: list[float] = []
        self.overhead: list[float] = []
        self.upstream: list[float] = []  # gen_ai's operation duration
        self.tokens_in: list[int] = []
        self.tokens_out: list[int] = []
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        # by bucket index, the latest traced observation (None: none was traced)
        self.duration_traced: dict[int, Traced] | None = None
        self.ttft_traced: dict[int, Traced] | None = None


class CounterHandle:
    """A counter child's value, added to directly. prometheus_client's `inc` checks that the
    metric has its labels and that the amount is not negative on every call; the handle is made
    from a child (labels given) and is only given counts. The metrics cost a quarter of the
    gateway's CPU a request before the handles (measured against `metrics: {enabled: false}`)."""

    __slots__ = ("_value",)

    def __init__(self, child: Any) -> None:
        self._value = child._value

    def inc(self, amount: float = 1) -> None:
        self._value.inc(amount)


class HistogramHandle:
    """A histogram child's values: the bucket found by bisection (prometheus_client walks the
    bounds one by one) and the sum, added to directly. Samples are the same: the first bucket
    whose bound is at or above the value (the last bound is +Inf)."""

    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(self, child: Any) -> None:
        self._bounds: list[float] = list(child._upper_bounds)
        self._buckets = child._buckets
        self._sum = child._sum

    def observe(self, value: float) -> None:
        self._sum.inc(value)
        self._buckets[bisect_left(self._bounds, value)].inc(1)

    def add(self, values: list[float] | list[int]) -> None:
        """Many observations at once, binned in C."""
        for i, count in Tally(map(partial(bisect_left, self._bounds), values)).items():
            self._buckets[i].inc(count)
        self._sum.inc(sum(values))

    def exemplify(self, traced: Mapping[int, Traced]) -> None:
        """Each bucket's traced observation as its exemplar, as prometheus_client's `observe`
        sets one: the trace id's label, the value, when it was observed."""
        for i, (trace_id, value, at) in traced.items():
            self._buckets[i].set_exemplar(Exemplar({EXEMPLAR_LABEL: trace_id}, value, at))


HANDLES: dict[type[Any], Callable[[Any], Any]] = {
    Counter: CounterHandle,
    Histogram: HistogramHandle,
}


def _forget_dead_workers(path: Path) -> None:
    """Live gauges of workers that died (uvicorn restarts them; nothing else tells
    prometheus_client) would be summed forever: drop them when a worker starts."""
    for f in path.glob("gauge_live*_*.db"):
        pid = f.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            multiprocess.mark_process_dead(int(pid), str(path))  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tasks() -> float:
    """Tasks alive on the event loop, counted when scraped (a leak shows as growth)."""
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # no running loop
        return 0.0


def _nothing() -> None:
    return None

"""Gateway benchmark: the same wrk load against the mock upstream (direct) and through the gateway.

Starts bench/mock_upstream.py, `gateway serve --workers 1` and the yardsticks of
bench/passthrough.py on the gateway's own stack (uvicorn, the gateway's own client):
`passthrough`, a Starlette app, `raw`, a bare ASGI callable, the floor under which no gateway on
this stack can go (and `raw` on the client libraries the gateway's was chosen over), and
`minimal`, the floor plus the least a gateway does to a JSON request (run on latency, throughput
and chat only). For the scaling run it also starts the gateway and the raw pass-through with 2
workers. Then
for each scenario it runs a warm-up and a measured wrk run against each target:

    latency     1 connection:   p50/p99; added latency = target - direct
    throughput  32 connections: requests/s and the ratio to direct (also with 2 workers)
    streaming   8 connections, 64-chunk SSE streams: requests/s and p50
    embeddings  8 connections, 16 inputs a request, 1536-dimension answers in base64 (the openai
                SDK's default, passed through from an `openai` upstream): requests/s and p50
    embeddings-float  the same with floats (each array checked to hold numbers, relayed as written)
    chat        32 connections, POST /v1/chat/completions: requests/s and the ratio to direct
    chat-streaming   8 connections, 64-chunk chat streams: requests/s and p50
    responses   32 connections, POST /v1/responses (`"store": false`) through an alias of type
                `openai`, passed through to the mock's own /v1/responses: as chat, held to its
                budget (direct, the gateway and the pass-throughs passthrough and raw only)
    responses-streaming   8 connections, Responses streams of 64 text deltas: as chat-streaming
    responses-translated(-streaming)   the same requests through an `openai-compatible` alias:
                translated to a chat completion to the mock's chat route and back (the chat
                stream made OpenAI's event sequence); the gateway only, reported against the
                native gateway's row (requests/s, and p50) and the gateway's chat; no budget
    responses-stored   responses with `"store": true` (kept in the files store, a temporary
                directory): the gateway only, against the responses row; no budget
    throughput-tls   throughput with the upstream over TLS: a second mock serving HTTPS with a
                certificate from a test CA made at the start (trustme), the gateway's alias
                `bench-model-tls` routed to it with the CA as its provider's `tls.ca_file`
                (verified), and direct = wrk to that mock over https; requests/s, the ratio to
                that direct and to the plain gateway's throughput. Run last, no budget
    cache-hit   throughput's request, 32 connections, to `bench-cached` (the same target as
                `bench-model`, with `cache: {ttl_s: 3600}`): every answer from the gateway's
                memory cache (a probe's second call says `x-portkey-cache-status: HIT`, and the
                mock must see no request during the run); the gateway only, requests/s against
                its own uncached throughput row

Budgets are held against direct; where the raw floor itself misses one on the machine at hand,
the bench says so and reports the gateway's share of the floor instead (FLOOR, not FAIL). The
cache's budget is against the gateway itself (hits at least 2x its uncached requests/s): no floor.

Prints a markdown table, writes bench/results.json and checks the budgets (exit 1 on a failed
budget with --check). A run with any socket error or HTTP status >= 400 fails the bench (exit 2).

    .venv/bin/python bench/run.py [--duration 10] [--warmup 2] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")
BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
LUA_SCRIPT = BENCH_DIR / "post.lua"
API_KEY = "sk-bench-key"
HOST = "127.0.0.1"
DEFAULT_GATEWAY_CMD = (
    "{python} -m gateway serve --config {config} --host {host} --port {port} --workers {workers}"
)
READY_TIMEOUT_S = 60.0
MIN_THROUGHPUT_RATIO = 0.20
MIN_STREAMING_RATIO = 0.9
# Embeddings against the Starlette pass-through (the same bytes relayed with no checks): the
# work of a gateway that reads, checks and re-renders every answer.
MIN_EMBEDDINGS_VS_PASSTHROUGH = {"embeddings": 0.5, "embeddings-float": 0.6}
MIN_SCALING = 1.6  # 2 workers against 1, requests/s at 32 connections
WORKERS = 2  # the scaled targets' workers
CHAT = "chat/completions"
RESPONSES = "responses"
# The models' key of the Responses API on the translated path: an alias whose provider speaks
# chat completions only (the plain one, RESPONSES, is an alias of type `openai`: native).
TRANSLATED = "responses/chat"
# The models' key of the cached alias: completions to `bench-model`'s target, with `cache:`.
CACHED = "completions/cached"
CACHE_TTL_S = 3600  # longer than a whole run: the probe's entry serves every request after it
MOCK_MODELS = {
    "completions": "mock-model", CHAT: "mock-model", "embeddings": "mock-embed",
    RESPONSES: "mock-model",
}  # fmt: skip
GATEWAY_MODELS = {
    "completions": "bench-model", CHAT: "bench-model", "embeddings": "bench-embed",
    RESPONSES: "bench-responses", TRANSLATED: "bench-model", CACHED: "bench-cached",
}  # fmt: skip
GATEWAY_TLS_MODELS = {"completions": "bench-model-tls", CHAT: "bench-model-tls"}
CHAT_MESSAGES = ({"role": "user", "content": "Say this is a test"},)
EMBED_INPUTS = tuple(f"The quick brown fox number {i} jumps over the lazy dog." for i in range(16))
MAX_ADDED_P50_MS = 0.25
# Answers from the cache against the same gateway's uncached throughput (requests/s at 32
# connections): against the gateway itself, so no floor.
MIN_CACHE_HIT_RATIO = 2.0
BUSY_GATEWAY_CPU_PERCENT = 90.0


@dataclass(frozen=True)
class Scenario:
    name: str
    threads: int
    connections: int
    stream: bool = False
    endpoint: str = "completions"  # POST /v1/<endpoint>
    encoding: str = "float"  # embeddings' encoding_format
    tls: bool = False  # the gateway's upstream (and direct) over TLS: the HTTPS mock's targets
    models: str = ""  # the key of the targets' models, when not the endpoint's
    targets: tuple[str, ...] = ()  # the targets it runs on: all when empty
    store: bool = False  # a Responses request's `store`

    @property
    def model_key(self) -> str:
        return self.models or self.endpoint

    @property
    def plain(self) -> str:
        """The scenario this one is the TLS variant of (itself when plain)."""
        return self.name.removesuffix(TLS_SUFFIX) if self.tls else self.name


TLS_SUFFIX = "-tls"
SCENARIOS = (
    Scenario("latency", threads=1, connections=1),
    Scenario("throughput", threads=2, connections=32),
    Scenario("streaming", threads=1, connections=8, stream=True),
    Scenario("embeddings", threads=1, connections=8, endpoint="embeddings", encoding="base64"),
    Scenario("embeddings-float", threads=1, connections=8, endpoint="embeddings"),
    Scenario("chat", threads=2, connections=32, endpoint=CHAT),
    Scenario("chat-streaming", threads=1, connections=8, stream=True, endpoint=CHAT),
)
STREAMING = SCENARIOS[2]
# The scenarios held to the throughput budget: completions, and chat and the Responses API (its
# native path) to the same; and to the streaming budget.
THROUGHPUT_SCENARIOS = {
    "throughput": "throughput", "chat": "chat throughput", "responses": "responses throughput",
}  # fmt: skip
STREAMING_SCENARIOS = {
    "streaming": "streams", "chat-streaming": "chat streams",
    "responses-streaming": "responses streams",
}  # fmt: skip
SCALED = "throughput"  # the scenario also run against the 2-worker targets
# The Responses API, `"store": false` (nothing kept): run by this script (and ab.py when asked),
# not by default by the benches that take SCENARIOS. The native path (an `openai` alias, passed
# through to the mock's /v1/responses) against direct and the two pass-throughs that say most
# (the client libraries' and uvicorn's protocol say nothing new here), held to chat's budgets;
# the translated path (an `openai-compatible` alias: a chat completion to the mock) and a
# stored variant on the gateway only, each against the native gateway's row.
RESPONSES_TARGETS = ("direct", "gateway", "passthrough", "raw")
RESPONSES_SCENARIOS = (
    Scenario("responses", threads=2, connections=32, endpoint=RESPONSES,
             targets=RESPONSES_TARGETS),
    Scenario("responses-streaming", threads=1, connections=8, stream=True, endpoint=RESPONSES,
             targets=RESPONSES_TARGETS),
    Scenario("responses-translated", threads=2, connections=32, endpoint=RESPONSES,
             models=TRANSLATED, targets=("gateway",)),
    Scenario("responses-translated-streaming", threads=1, connections=8, stream=True,
             endpoint=RESPONSES, models=TRANSLATED, targets=("gateway",)),
    Scenario("responses-stored", threads=2, connections=32, endpoint=RESPONSES, store=True,
             targets=("gateway",)),
)  # fmt: skip
# The gateway-only scenarios: each against the gateway's row of the native scenario, and (the
# translated ones, which make a chat call upstream) of the chat scenario it calls.
BESIDE = {
    "responses-translated": ("responses", "chat"),
    "responses-translated-streaming": ("responses-streaming", "chat-streaming"),
    "responses-stored": ("responses", None),
}
# The TLS scenarios: run by this script only (after the plain ones, on the same gateway, whose
# config holds the HTTPS mock's alias), not by the benches that take SCENARIOS (ab.py, …).
TLS_SCENARIOS = (Scenario("throughput-tls", threads=2, connections=32, tls=True),)
TLS_NAMES = frozenset(s.name for s in TLS_SCENARIOS)
# The response cache: throughput's request to the cached alias, answered from the gateway's
# memory cache (the probe puts the entry), against the gateway's own uncached throughput row
# (the scenario it is measured beside). Run by this script only, in its default set: the
# benches that take SCENARIOS (ab.py, …) do not run it.
# Beside the gateway, its floor: the raw pass-through answering repeats from a dict
# (bench/passthrough.py --raw-cache), against raw's relay of the uncached row.
RAW_CACHE = "raw-cache"
CACHE_SCENARIOS = (
    Scenario("cache-hit", threads=2, connections=32, models=CACHED,
             targets=("gateway", RAW_CACHE)),
)  # fmt: skip
CACHE_BESIDE = {"cache-hit": "throughput"}
CACHE_NAMES = frozenset(s.name for s in CACHE_SCENARIOS)
ALL_SCENARIOS = SCENARIOS + RESPONSES_SCENARIOS + CACHE_SCENARIOS + TLS_SCENARIOS
# The 1-worker targets beside direct, and the scaled ones (the gateway's and the floor's).
# The pass-throughs of bench/passthrough.py: on the gateway's own client, and the raw one on
# each client library it was chosen over.
BARE = ("passthrough", "raw", "raw-aiohttp", "raw-rnet")
# bench/passthrough.py's minimal gateway: the least a gateway does to a JSON request, on the
# floor. Run where that is all a request asks (JSON completions and chat), it shows how much of
# the floor a gateway's essential work leaves, and how much the gateway's own features take.
MINIMAL = "minimal"
MINIMAL_SCENARIOS = ("latency", "throughput", "chat")
COMPARED = (
    "gateway", "gateway-uvicorn", *BARE, MINIMAL, f"gateway-{WORKERS}w", f"raw-{WORKERS}w",
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    name: str
    root: str  # http://host:port
    models: dict[str, str]  # endpoint → the model to ask for there
    authorization: str
    pid: int
    ca_file: str | None = None  # an https root's CA (the bench's test CA)

    def url(self, endpoint: str) -> str:
        return f"{self.root}/v1/{endpoint}"

    def context(self) -> ssl.SSLContext | None:
        return None if self.ca_file is None else ssl.create_default_context(cafile=self.ca_file)


@dataclass
class Run:
    scenario: str
    target: str
    connections: int
    duration_s: float
    requests: int
    requests_per_s: float
    latency_ms: dict[str, float]
    errors: dict[str, int]
    cpu_percent: dict[str, float] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


# ---------------------------------------------------------------- processes


class Processes:
    """Owns the subprocesses: each in its own session, stopped (TERM, then KILL) on close."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        for proc in self.procs.values():
            signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in self.procs.values():
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                signal_group(proc, signal.SIGKILL)
                proc.wait()


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(
    url: str,
    procs: Processes,
    name: str,
    timeout: float = READY_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> None:
    """Polls url until it answers 200 (https: verified with `context`); fails fast if the
    process exits."""
    proc = procs.procs[name]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited with {proc.returncode}:\n{procs.log_tail(name)}")
        with (
            suppress(OSError),
            urllib.request.urlopen(url, timeout=1.0, context=context) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.02)
    raise BenchError(f"{name} not ready at {url} after {timeout:.0f} s:\n{procs.log_tail(name)}")


class BenchError(Exception):
    pass


# ---------------------------------------------------------------- process CPU


def tree_pids(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with suppress(OSError):
                todo.extend(int(child) for child in children.read_text().split())
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants (0 where /proc is absent)."""
    ticks = 0
    for current in tree_pids(pid):
        with suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{current}/stat").read_text()
            fields = stat.rpartition(")")[2].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- wrk


def body_file(tmp: Path, target: Target, scenario: Scenario) -> Path:
    model = target.models[scenario.model_key]
    body: dict[str, Any] = {"model": model}
    if scenario.endpoint == "embeddings":
        body |= {"input": list(EMBED_INPUTS), "encoding_format": scenario.encoding}
    elif scenario.endpoint == RESPONSES:
        body |= {"input": "Say this is a test", "max_output_tokens": 16, "temperature": 0,
                 "store": scenario.store}  # fmt: skip
    elif scenario.endpoint == CHAT:
        body |= {"messages": list(CHAT_MESSAGES), "max_tokens": 16, "temperature": 0}
    else:
        body |= {"prompt": "Say this is a test", "max_tokens": 16, "temperature": 0}
    if scenario.stream:
        body["stream"] = True
    path = tmp / f"body-{target.name}-{scenario.name}.json"
    path.write_text(json.dumps(body))
    return path


def wrk(target: Target, scenario: Scenario, duration: int, tmp: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["BENCH_BODY_FILE"] = str(body_file(tmp, target, scenario))
    env["BENCH_AUTHORIZATION"] = target.authorization
    cmd = [
        "wrk",
        f"-t{scenario.threads}",
        f"-c{scenario.connections}",
        f"-d{duration}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(LUA_SCRIPT),
        target.url(scenario.endpoint),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration + 60)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            parsed: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
            return parsed
    raise BenchError(f"wrk printed no result (exit {out.returncode}):\n{out.stdout}{out.stderr}")


def measure(
    target: Target, scenario: Scenario, duration: int, tmp: Path, cpu_pids: dict[str, int]
) -> Run:
    before = {name: cpu_seconds(pid) for name, pid in cpu_pids.items()}
    started = time.monotonic()
    raw = wrk(target, scenario, duration, tmp)
    elapsed = time.monotonic() - started
    cpu = {
        name: round(100 * (cpu_seconds(pid) - before[name]) / elapsed, 1)
        for name, pid in cpu_pids.items()
    }
    return to_run(raw, target, scenario, cpu)


def to_run(raw: dict[str, Any], target: Target, scenario: Scenario, cpu: dict[str, float]) -> Run:
    seconds = raw["duration_us"] / 1e6
    latency = {key: round(value / 1000, 4) for key, value in raw["latency_us"].items()}
    return Run(
        scenario=scenario.name,
        target=target.name,
        connections=scenario.connections,
        duration_s=round(seconds, 3),
        requests=raw["requests"],
        requests_per_s=round(raw["requests"] / seconds, 1),
        latency_ms=latency,
        errors=raw["errors"],
        cpu_percent=cpu,
    )


# ---------------------------------------------------------------- probes


def probe(target: Target, scenario: Scenario, tmp: Path) -> None:
    """One request before the load, so a broken target fails with its own answer, not a count
    (a cache scenario's: `probe_cache`)."""
    if scenario.name in CACHE_NAMES and target.name != RAW_CACHE:
        probe_cache(target, scenario, tmp)
        return
    text, _ = post(target, scenario, tmp)
    check_probe(target.name, text, scenario)


def post(target: Target, scenario: Scenario, tmp: Path) -> tuple[str, dict[str, str]]:
    """The scenario's request, once: the answer's text and headers (names in lower case)."""
    body = body_file(tmp, target, scenario).read_bytes()
    headers = {"Content-Type": "application/json"}
    if target.authorization:
        headers["Authorization"] = target.authorization
    url = target.url(scenario.endpoint)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10, context=target.context()) as response:
            text = response.read().decode(errors="replace")
            return text, {name.lower(): value for name, value in response.headers.items()}
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise BenchError(f"{target.name} probe: HTTP {exc.code}: {detail}") from exc


CACHE_STATUS = "x-portkey-cache-status"


def probe_cache(target: Target, scenario: Scenario, tmp: Path) -> None:
    """The cached alias's request twice, both answers checked: the first a miss (it puts the
    entry the load is served from), the second a hit. And the request of the row the hits are
    held against (`CACHE_BESIDE`): not answered from the cache."""
    statuses = []
    for _ in range(2):
        text, headers = post(target, scenario, tmp)
        check_probe(target.name, text, scenario)
        statuses.append(headers.get(CACHE_STATUS))
    if statuses != ["MISS", "HIT"]:
        raise BenchError(
            f"{target.name} {scenario.name} probe: {CACHE_STATUS} {statuses[0]!r}, then "
            f"{statuses[1]!r} (expected 'MISS', then 'HIT'): the alias "
            f"{target.models[scenario.model_key]} does not answer from the cache"
        )
    uncached = next(s for s in ALL_SCENARIOS if s.name == CACHE_BESIDE[scenario.name])
    for _ in range(2):
        _, headers = post(target, uncached, tmp)
        if headers.get(CACHE_STATUS) == "HIT":
            raise BenchError(
                f"{target.name} {uncached.name} probe: answered from the cache, so the "
                f"{scenario.name} row would be measured against cached answers"
            )


def check_probe(name: str, text: str, scenario: Scenario) -> None:
    if scenario.endpoint == "embeddings":
        data = json.loads(text).get("data")
        if not isinstance(data, list) or len(data) != len(EMBED_INPUTS):
            raise BenchError(f"{name} embeddings probe: not {len(EMBED_INPUTS)} embeddings")
        return
    if scenario.endpoint == RESPONSES:
        check_response_probe(name, text, scenario)
        return
    if scenario.stream:
        chunks = [line for line in text.splitlines() if line.startswith("data: {")]
        if not text.rstrip().endswith("data: [DONE]") or len(chunks) < 2:
            raise BenchError(f"{name} stream probe: unexpected body:\n{text[:2000]}")
        return
    answer = json.loads(text)
    if not answer.get("choices"):
        raise BenchError(f"{name} probe: no choices in {text[:2000]}")


ENDS = ("response.completed", "response.incomplete")  # a Responses stream's last events


def check_response_probe(name: str, text: str, scenario: Scenario) -> None:
    """A response (`store` as asked), or OpenAI's event sequence: numbered from 0, each `data:`
    of its `event:`'s type, from response.created to the response's end, whose response's text
    is the deltas'. Completed, or incomplete: the mock's chat answers stop at `length`, which
    the translated path tells as OpenAI does (max_output_tokens)."""
    if not scenario.stream:
        response = json.loads(text)
    else:
        events: list[dict[str, Any]] = []
        for block in text.split("\n\n"):
            if not block.strip():
                continue
            head, _, data = block.partition("\ndata: ")
            event = json.loads(data)
            if head != f"event: {event.get('type')}" or event.get("sequence_number") != len(events):
                raise BenchError(f"{name} responses probe: event {len(events)}: {block[:2000]}")
            events.append(event)
        kinds = [event["type"] for event in events]
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        if kinds[:1] != ["response.created"] or kinds[-1] not in ENDS:
            raise BenchError(f"{name} responses probe: events {kinds}")
        response = events[-1]["response"]
        if len(deltas) < 2 or response_text(response) != "".join(deltas):
            raise BenchError(f"{name} responses probe: {len(deltas)} deltas, {response}")
    if response.get("status") not in ("completed", "incomplete") or not response_text(response):
        raise BenchError(f"{name} responses probe: {json.dumps(response)[:2000]}")
    if response.get("store") is not scenario.store:
        raise BenchError(f"{name} responses probe: store {response.get('store')!r}")


def response_text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response.get("output", ())
        if item.get("type") == "message"
        for part in item.get("content", ())
    )


# ---------------------------------------------------------------- report


def index(runs: list[Run]) -> dict[tuple[str, str], Run]:
    return {(run.scenario, run.target): run for run in runs}


def comparisons(runs: list[Run], target: str = "gateway") -> dict[str, dict[str, float]]:
    """`target` against direct, per scenario."""
    by = index(runs)
    out: dict[str, dict[str, float]] = {}
    for scenario in dict.fromkeys(run.scenario for run in runs):
        direct, other = by.get((scenario, "direct")), by.get((scenario, target))
        if direct is None or other is None:
            continue
        out[scenario] = {
            "throughput_ratio": round(other.requests_per_s / direct.requests_per_s, 4),
            "added_p50_ms": round(other.latency_ms["p50"] - direct.latency_ms["p50"], 3),
            "added_p99_ms": round(other.latency_ms["p99"] - direct.latency_ms["p99"], 3),
        }
    return out


Compared = dict[str, dict[str, dict[str, float]]]  # target → scenario → its figures vs direct


def check(name: str, value: str, budget: str, ok: bool, floor: str | None = None) -> dict[str, Any]:
    """A budget's verdict; `floor`: the raw pass-through misses the budget too, and this is the
    gateway's share of what the floor reached (reported, not failed)."""
    return {"name": name, "value": value, "budget": budget, "ok": ok or floor is not None,
            "floor": floor}  # fmt: skip


def budgets(compared: Compared) -> list[dict[str, Any]]:
    gateway, raw = compared["gateway"], compared.get("raw", {})
    checks = [
        *ratio_budgets(gateway, raw, THROUGHPUT_SCENARIOS, 32, MIN_THROUGHPUT_RATIO),
        *ratio_budgets(gateway, raw, STREAMING_SCENARIOS, 8, MIN_STREAMING_RATIO),
    ]
    if "latency" in gateway:
        added, floor_added = gateway["latency"]["added_p50_ms"], None
        if "latency" in raw:
            floor_added = raw["latency"]["added_p50_ms"]
        own = None
        if floor_added is not None and floor_added > MAX_ADDED_P50_MS:
            own = f"raw adds {floor_added:.3f} ms; the gateway {added - floor_added:+.3f} ms more"
        checks.append(
            check("added p50 latency at 1 connection", f"{added:.3f} ms",
                  f"<= {MAX_ADDED_P50_MS} ms", added <= MAX_ADDED_P50_MS, own)
        )  # fmt: skip
    checks.extend(embeddings_budgets(gateway, compared.get("passthrough", {})))
    checks.extend(scaling_budgets(compared))
    return checks


def ratio_check(
    name: str, minimum: float, mine: dict[str, float] | None, floor: dict[str, float] | None
) -> dict[str, Any]:
    """Requests/s against direct held to `minimum`, or to the floor's share when raw misses it."""
    assert mine is not None
    ratio = mine["throughput_ratio"]
    floor_ratio = None if floor is None else floor["throughput_ratio"]
    share = None
    if floor_ratio is not None and floor_ratio < minimum:
        share = f"raw reached {100 * floor_ratio:.1f}%; the gateway {ratio / floor_ratio:.1%} of it"
    return check(name, f"{100 * ratio:.1f}%", f">= {100 * minimum:.0f}%", ratio >= minimum, share)


def ratio_budgets(
    gateway: dict[str, dict[str, float]],
    raw: dict[str, dict[str, float]],
    scenarios: dict[str, str],
    connections: int,
    minimum: float,
) -> list[dict[str, Any]]:
    """Each of `scenarios` (scenario: what it is called) run, held to `minimum` of direct."""
    return [
        ratio_check(f"{what} at {connections} connections, gateway / direct req/s", minimum,
                    gateway[scenario], raw.get(scenario))
        for scenario, what in scenarios.items()
        if scenario in gateway
    ]  # fmt: skip


def embeddings_budgets(
    gateway: dict[str, dict[str, float]], passthrough: dict[str, dict[str, float]]
) -> list[dict[str, Any]]:
    checks = []
    for scenario, minimum in MIN_EMBEDDINGS_VS_PASSTHROUGH.items():
        if scenario in gateway and scenario in passthrough:
            ratio = (
                gateway[scenario]["throughput_ratio"] / passthrough[scenario]["throughput_ratio"]
            )
            name = f"{scenario} (16 inputs) at 8 connections, gateway / pass-through"
            checks.append(check(name, f"{100 * ratio:.1f}%", f">= {100 * minimum:.0f}%",
                                ratio >= minimum))  # fmt: skip
    return checks


def scaling_budgets(compared: Compared) -> list[dict[str, Any]]:
    """2 workers against 1 on the same machine, the gateway's and the raw floor's."""

    def scaled(name: str) -> float | None:
        one = compared.get(name, {}).get(SCALED)
        many = compared.get(f"{name}-{WORKERS}w", {}).get(SCALED)
        if one is None or many is None:
            return None
        return many["throughput_ratio"] / one["throughput_ratio"]

    mine, floor = scaled("gateway"), scaled("raw")
    if mine is None:
        return []
    share = None
    if floor is not None and floor < MIN_SCALING:
        share = f"raw scaled {floor:.2f}x; the gateway {100 * mine / floor:.1f}% of that"
    name = f"{WORKERS} workers / 1 at 32 connections, gateway req/s"
    return [check(name, f"{mine:.2f}x", f">= {MIN_SCALING}x", mine >= MIN_SCALING, share)]


Cache = dict[str, dict[str, Any]]  # cache scenario → its figures against the uncached row


def cache_ratios(runs: list[Run]) -> Cache:
    """Each cache scenario's gateway against the gateway's run of the uncached scenario it is
    measured beside (`CACHE_BESIDE`): requests/s and p50, where both ran."""
    by = index(runs)
    out: Cache = {}
    for scenario, uncached in CACHE_BESIDE.items():
        mine, theirs = by.get((scenario, "gateway")), by.get((uncached, "gateway"))
        if mine is None or theirs is None:
            continue
        floor, relayed = by.get((scenario, RAW_CACHE)), by.get((uncached, "raw"))
        out[scenario] = {
            "scenario": uncached,
            # the floor's: raw answering repeats from a dict against raw's relay
            "floor_ratio": None
            if floor is None or relayed is None
            else round(floor.requests_per_s / relayed.requests_per_s, 4),
            "hit_requests_per_s": mine.requests_per_s,
            "uncached_requests_per_s": theirs.requests_per_s,
            "throughput_ratio": round(mine.requests_per_s / theirs.requests_per_s, 4),
            "hit_p50_ms": mine.latency_ms["p50"],
            "uncached_p50_ms": theirs.latency_ms["p50"],
            "hit_cpu_us": cpu_a_request(mine),
            "uncached_cpu_us": cpu_a_request(theirs),
        }
    return out


def cpu_a_request(run: Run) -> float | None:
    """The gateway's CPU time a request in µs (its CPU share over the run's requests), which
    moves less with the machine's load than requests/s."""
    cpu = run.cpu_percent.get(run.target)
    return None if cpu is None else round(cpu / 100 * run.duration_s / run.requests * 1e6, 1)


def cache_text(c: dict[str, Any], cpu: bool = False) -> str:
    """The hits against the uncached row; with `cpu`, the gateway's CPU a request too."""
    text = (
        f"{c['throughput_ratio']:.2f}x the gateway's uncached req/s ({c['scenario']}: "
        f"{c['uncached_requests_per_s']:,.0f}), p50 {c['hit_p50_ms']:.3f} against "
        f"{c['uncached_p50_ms']:.3f} ms"
    )
    if c.get("floor_ratio") is not None:
        text += f"; the floor (raw-cache / raw) {c['floor_ratio']:.2f}x"
    hit, uncached = c["hit_cpu_us"], c["uncached_cpu_us"]
    if cpu and hit is not None and uncached is not None:
        text += f", gateway CPU a request {hit:.0f} against {uncached:.0f} µs"
    return text


def cache_budgets(cache: Cache) -> list[dict[str, Any]]:
    """Hits against the gateway's own uncached requests/s; when the floor's hits (raw-cache
    against raw) miss the budget too, the gateway's share of the floor's ratio (FLOOR)."""
    connections = {s.name: s.connections for s in CACHE_SCENARIOS}
    checks = []
    for scenario, c in cache.items():
        ratio, floor = c["throughput_ratio"], c.get("floor_ratio")
        share = None
        if floor is not None and floor < MIN_CACHE_HIT_RATIO:
            share = f"raw-cache reached {floor:.2f}x of raw; the gateway {ratio / floor:.1%} of it"
        checks.append(check(
            f"{scenario} at {connections[scenario]} connections, gateway from the cache / "
            "uncached req/s", f"{ratio:.2f}x", f">= {MIN_CACHE_HIT_RATIO:g}x",
            ratio >= MIN_CACHE_HIT_RATIO, share,
        ))  # fmt: skip
    return checks


def tls_ratios(runs: list[Run]) -> dict[str, dict[str, float]]:
    """Each TLS scenario's direct and gateway against the same target in its plain scenario
    (requests/s), where both ran."""
    by = index(runs)
    out: dict[str, dict[str, float]] = {}
    for scenario in TLS_SCENARIOS:
        for target in ("direct", "gateway"):
            tls, plain = by.get((scenario.name, target)), by.get((scenario.plain, target))
            if tls is not None and plain is not None:
                ratio = round(tls.requests_per_s / plain.requests_per_s, 4)
                out.setdefault(scenario.name, {})[target] = ratio
    return out


def versus(
    run: Run,
    compared: dict[str, dict[str, dict[str, float]]],
    over_plain: dict[str, dict[str, float]] | None = None,
    beside: Beside | None = None,
    cache: Cache | None = None,
) -> str:
    """The run against direct; a TLS run's also against its plain scenario's (`tls_ratios`); a
    gateway-only run's against the gateway's rows it is measured beside (`beside_ratios`,
    `cache_ratios`)."""
    plain = (over_plain or {}).get(run.scenario, {}).get(run.target)
    if run.scenario in BESIDE:
        return beside_text(run.scenario, beside or {})
    if run.scenario in CACHE_NAMES:
        c = (cache or {}).get(run.scenario)
        if c is not None and run.target == RAW_CACHE:
            floor = c.get("floor_ratio")
            return "" if floor is None else f"the floor: {floor:.2f}x raw's relay ({c['scenario']})"
        return "" if c is None else cache_text(c)
    c = compared.get(run.target, {}).get(run.scenario)
    if run.scenario in TLS_NAMES:
        parts = [] if c is None else [f"{100 * c['throughput_ratio']:.1f}% of direct req/s"]
        if plain is not None:
            parts.append(f"{100 * plain:.1f}% of the plain {run.target}'s")
        return "; ".join(parts)
    if c is None:
        return ""
    ratio = f"{100 * c['throughput_ratio']:.1f}% of direct req/s"
    added = f"{c['added_p50_ms']:+.3f} ms p50, {c['added_p99_ms']:+.3f} ms p99"
    if run.scenario == "latency":
        return f"added {added}"
    if run.scenario not in THROUGHPUT_SCENARIOS:
        return f"{ratio}; {c['added_p50_ms']:+.3f} ms p50"
    return ratio


Beside = dict[str, dict[str, dict[str, Any]]]  # scenario → {"native"|"chat": its figures}


def beside_ratios(runs: list[Run]) -> Beside:
    """Each gateway-only scenario (BESIDE) against the gateway's run of its native scenario, and
    of the chat scenario it calls: requests/s and p50, where both ran."""
    by = index(runs)
    out: Beside = {}
    for scenario, (native, chat) in BESIDE.items():
        mine = by.get((scenario, "gateway"))
        for key, other in (("native", native), ("chat", chat)):
            theirs = None if other is None else by.get((other, "gateway"))
            if mine is None or theirs is None:
                continue
            out.setdefault(scenario, {})[key] = {
                "scenario": other,
                "throughput_ratio": round(mine.requests_per_s / theirs.requests_per_s, 4),
                "p50_ratio": round(mine.latency_ms["p50"] / theirs.latency_ms["p50"], 4),
                "added_p50_ms": round(mine.latency_ms["p50"] - theirs.latency_ms["p50"], 3),
            }
    return out


def beside_text(scenario: str, beside: Beside) -> str:
    parts = []
    for key, c in beside.get(scenario, {}).items():
        what = "native" if key == "native" else "chat"
        parts.append(
            f"{100 * c['throughput_ratio']:.1f}% of the {what} gateway's req/s "
            f"({c['scenario']}), p50 {c['p50_ratio']:.2f}x ({c['added_p50_ms']:+.3f} ms)"
        )
    return "; ".join(parts)


def responses_shares(runs: list[Run]) -> dict[str, dict[str, float]]:
    """The Responses API's native scenarios: the gateway's requests/s against direct and the two
    pass-throughs (its share of what a bare relay of the same bytes serves)."""
    by = index(runs)
    out: dict[str, dict[str, float]] = {}
    for scenario in RESPONSES_SCENARIOS:
        gateway = by.get((scenario.name, "gateway"))
        if gateway is None or scenario.name in BESIDE:
            continue
        for other in ("direct", "passthrough", "raw"):
            theirs = by.get((scenario.name, other))
            if theirs is not None:
                ratio = round(gateway.requests_per_s / theirs.requests_per_s, 4)
                out.setdefault(scenario.name, {})[other] = ratio
    return out


def contention_warnings(runs: list[Run]) -> list[str]:
    """Under load one gateway worker should use a whole CPU; less means others took the CPUs."""
    warnings = []
    for run in runs:
        cpu = run.cpu_percent.get("gateway")
        if run.connections > 1 and cpu is not None and cpu < BUSY_GATEWAY_CPU_PERCENT:
            warnings.append(
                f"{run.scenario}: the gateway used only {cpu:.0f}% CPU under load; "
                "the machine was probably busy with other work, so rerun on a quiet machine"
            )
    return warnings


def beside_plain(runs: list[Run]) -> list[Run]:
    """The runs in the table's order: each TLS scenario's right after its plain one, and each
    cache scenario's right after the uncached one it is held against."""
    order = {s.name: i for i, s in enumerate(SCENARIOS + RESPONSES_SCENARIOS)}
    after = {s.name: s.plain for s in TLS_SCENARIOS} | CACHE_BESIDE
    moved = {name: order.get(plain, len(order)) for name, plain in after.items()}
    return sorted(runs, key=lambda run: (moved.get(run.scenario, order.get(run.scenario, -1)),
                                         run.scenario in moved))  # fmt: skip


def markdown(
    runs: list[Run],
    compared: dict[str, dict[str, dict[str, float]]],
    env: dict[str, Any],
    over_plain: dict[str, dict[str, float]] | None = None,
    beside: Beside | None = None,
    cache: Cache | None = None,
) -> str:
    lines = [
        "| scenario | target | req/s | p50 ms | p99 ms | server CPU | vs direct |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in beside_plain(runs):
        label = f"{run.scenario}, {run.connections} conn"
        cpu = " + ".join(f"{name} {value:.0f}%" for name, value in run.cpu_percent.items())
        lines.append(
            f"| {label} | {run.target} | {run.requests_per_s:,.0f} | "
            f"{run.latency_ms['p50']:.3f} | {run.latency_ms['p99']:.3f} | {cpu} | "
            f"{versus(run, compared, over_plain, beside, cache)} |"
        )
    lines.append("")
    lines.append(
        f"{env['cpus']} CPUs, Python {env['python']}, {env['wrk']}, {env['duration_s']} s per run "
        f"after a {env['warmup_s']} s warm-up; gateway with 1 worker; streams of "
        f"{env['chunks']} chunks; gateway-uvicorn = the gateway on uvicorn's own protocol "
        f"(--http uvicorn); passthrough = bare Starlette, raw = bare ASGI, both on the gateway's "
        f"own HTTP client; raw-aiohttp, raw-rnet = raw on those libraries; minimal = raw plus "
        f"the least a gateway does to a JSON request (key, parse, type checks, alias, answer "
        f"checked and rendered); all under uvicorn (bench/passthrough.py); -{WORKERS}w: "
        f"{WORKERS} workers."
    )
    if any(run.scenario in TLS_NAMES for run in runs):
        lines[-1] += (
            " -tls: the upstream over TLS, a second mock serving HTTPS with a certificate of a "
            "test CA (the gateway's provider trusts it by tls.ca_file and verifies it), direct = "
            "wrk to that mock over https; the same gateway process, its alias bench-model-tls; "
            "no budget."
        )
    if any(run.scenario.startswith("responses") for run in runs):
        lines[-1] += (
            " responses: POST /v1/responses with store false, through bench-responses (provider "
            "type openai: passed through to the mock's /v1/responses); -translated: through "
            "bench-model (openai-compatible: a chat completion to the mock, made a response and "
            "its events by the gateway), the gateway only, against its native and chat rows; "
            "-stored: store true (the files store in a temporary directory), no budget."
        )
    if any(run.scenario in CACHE_NAMES for run in runs):
        lines[-1] += (
            f" cache-hit: throughput's request to bench-cached (bench-model's target with cache "
            f"ttl_s {CACHE_TTL_S}, the memory backend), every answer from the cache (the mock "
            f"saw none of them), the gateway only, against its uncached throughput row; budget "
            f">= {MIN_CACHE_HIT_RATIO:g}x."
        )
    return "\n".join(lines)


def environment(args: argparse.Namespace) -> dict[str, Any]:
    version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "wrk": " ".join(version.split()[:2]),
        "commit": commit or None,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "chunks": args.chunks,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ---------------------------------------------------------------- orchestration


def write_config(
    tmp: Path,
    gateway_port: int,
    mock_port: int,
    tls_mock: Target | None = None,
    files: Path | None = None,
    cached: bool = False,
) -> Path:
    """The gateway's config; with `tls_mock` (the HTTPS mock), its provider `mock-tls` (the
    bench's CA in `tls.ca_file`) and the alias `bench-model-tls` on it; with `files`, the files
    store there (where stored responses go). `bench-model` (openai-compatible) serves the
    Responses API translated to chat, `bench-responses` (openai) passes it through. With
    `cached`, `bench-cached`: `bench-model`'s target with its answers cached (the memory
    backend); only then, so that a gateway from before the cache (ab.py's `--before`) takes
    the config."""
    tls_provider = tls_model = ""
    if tls_mock is not None:
        assert tls_mock.ca_file is not None
        base_url, ca_file = json.dumps(f"{tls_mock.root}/v1"), json.dumps(tls_mock.ca_file)
        tls_provider = (
            f"  mock-tls: {{type: openai-compatible, base_url: {base_url}, "
            f"tls: {{ca_file: {ca_file}}}}}\n"
        )
        tls_model = "  bench-model-tls: {targets: [{provider: mock-tls, model: mock-model}]}\n"
    files_store = "" if files is None else f"files: {{store: {json.dumps(str(files))}}}\n"
    cached_model = ""
    if cached:
        cached_model = (
            "  bench-cached:\n"
            "    targets: [{provider: mock, model: mock-model}]\n"
            f"    cache: {{ttl_s: {CACHE_TTL_S}}}\n"
        )
    path = tmp / "gateway.yaml"
    path.write_text(
        f"server: {{host: {HOST}, port: {gateway_port}}}\n"
        "auth:\n"
        "  keys:\n"
        f'    - {{id: bench, key: {API_KEY}, models: ["*"]}}\n'
        "providers:\n"
        f'  mock: {{type: openai-compatible, base_url: "http://{HOST}:{mock_port}/v1"}}\n'
        f'  mock-openai: {{type: openai, base_url: "http://{HOST}:{mock_port}/v1"}}\n'
        f"{tls_provider}"
        "models:\n"
        "  bench-model: {targets: [{provider: mock, model: mock-model}]}\n"
        f"{cached_model}"
        "  bench-responses: {targets: [{provider: mock-openai, model: mock-model}]}\n"
        "  bench-embed:\n"
        "    endpoint: embeddings\n"
        "    targets: [{provider: mock-openai, model: mock-embed}]\n"
        f"{tls_model}"
        f"{files_store}"
    )
    return path


def gateway_command(template: str, config: Path, port: int, workers: int = 1) -> list[str]:
    values = {
        "python": sys.executable, "config": str(config), "host": HOST, "port": str(port),
        "workers": str(workers),
    }  # fmt: skip
    return [part.format(**values) for part in shlex.split(template)]


@dataclass(frozen=True)
class BenchCa:
    """The TLS scenarios' files: a test CA's certificate, and the HTTPS mock's certificate for
    127.0.0.1 (with its key) that the CA signed."""

    ca_file: Path
    cert_file: Path


def make_ca(tmp: Path) -> BenchCa:
    """A fresh test CA (trustme) in the bench's temporary directory."""
    try:
        import trustme
    except ImportError as exc:
        raise BenchError("the TLS scenarios need trustme: pip install trustme") from exc
    ca = trustme.CA(organization_name="gateway bench")
    files = BenchCa(tmp / "bench-ca.pem", tmp / "mock-tls.pem")
    ca.cert_pem.write_to_path(str(files.ca_file))
    ca.issue_cert(HOST).private_key_and_cert_chain_pem.write_to_path(str(files.cert_file))
    return files


def start_mock(procs: Processes, chunks: int, ca: BenchCa | None = None) -> Target:
    """The mock upstream; with `ca`, the HTTPS one (`mock-tls`), its CA in the target."""
    port = free_port()
    script = str(BENCH_DIR / "mock_upstream.py")
    cmd = [sys.executable, script, "--host", HOST, "--port", str(port), "--chunks", str(chunks)]
    name, scheme, ca_file = "mock", "http", None
    if ca is not None:
        name, scheme, ca_file = "mock-tls", "https", str(ca.ca_file)
        cmd += ["--tls-cert", str(ca.cert_file)]
    proc = procs.start(name, cmd)
    target = Target("direct", f"{scheme}://{HOST}:{port}", MOCK_MODELS, "", proc.pid, ca_file)
    wait_ready(f"{target.root}/health", procs, name, context=target.context())
    return target


def mock_stats(mock: Target) -> dict[str, Any]:
    """The mock's GET /stats (this request's own connection counted in)."""
    url = f"{mock.root}/stats"
    with urllib.request.urlopen(url, timeout=10, context=mock.context()) as response:
        stats: dict[str, Any] = json.loads(response.read())
        return stats


def upstream_seen(run: Run, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the HTTPS mock saw during a TLS run (its warm-up included): every connection over
    TLS, and at least the requests wrk counted, else BenchError (the load did not reach it)."""
    requests = after["requests"] - before["requests"]
    connections = after["connections"] - before["connections"] - 1  # less the /stats call's
    if sum(after["tls"].values()) != after["connections"]:
        raise BenchError(f"the HTTPS mock saw connections without TLS: {after}")
    if requests < run.requests:
        raise BenchError(
            f"{run.scenario} {run.target}: the HTTPS mock answered {requests} requests, wrk "
            f"counted {run.requests}: the load did not all go over TLS to it"
        )
    return {
        "scenario": run.scenario,
        "target": run.target,
        "upstream_requests": requests,
        "upstream_new_tls_connections": connections,
    }


def start_passthrough(procs: Processes, mock: Target, name: str, workers: int = 1) -> Target:
    """bench/passthrough.py: `raw…` the bare ASGI app, else Starlette; `…-aiohttp` and `…-rnet`
    on those client libraries, else on the gateway's own client."""
    port = free_port()
    script = str(BENCH_DIR / "passthrough.py")
    cmd = [sys.executable, script, "--upstream", mock.root, "--host", HOST, "--port", str(port)]
    kind = "--raw-cache" if name == RAW_CACHE else "--raw"
    cmd += ["--workers", str(workers), *([kind] if name.startswith("raw") else [])]
    library = name.rsplit("-", 1)[-1]
    cmd += ["--client", library if library in ("aiohttp", "rnet") else "http1"]
    proc = procs.start(name, cmd)
    wait_ready(f"http://{HOST}:{port}/health", procs, name)
    models = {**MOCK_MODELS, CACHED: MOCK_MODELS["completions"]}  # the cached row's too
    return Target(name, f"http://{HOST}:{port}", models, "", proc.pid)


def start_minimal(procs: Processes, mock: Target) -> Target:
    """bench/passthrough.py's minimal gateway, with the gateway's key and aliases."""
    port = free_port()
    script = str(BENCH_DIR / "passthrough.py")
    models = ",".join(f"{GATEWAY_MODELS[e]}={MOCK_MODELS[e]}" for e in MOCK_MODELS)
    cmd = [sys.executable, script, "--upstream", mock.root, "--host", HOST, "--port", str(port)]
    cmd += ["--minimal", API_KEY, "--models", models]
    proc = procs.start(MINIMAL, cmd)
    wait_ready(f"http://{HOST}:{port}/health", procs, MINIMAL)
    return Target(MINIMAL, f"http://{HOST}:{port}", GATEWAY_MODELS, f"Bearer {API_KEY}", proc.pid)


def start_gateway(
    procs: Processes,
    template: str,
    mock_url: str,
    tmp: Path,
    name: str,
    workers: int = 1,
    extra: tuple[str, ...] = (),
    tls_mock: Target | None = None,
    cached: bool = False,
) -> Target:
    """A gateway on the mock at `mock_url` (and with `tls_mock`, on the HTTPS one too; with
    `cached`, with the cached alias)."""
    port = free_port()
    mock_port = urllib.parse.urlsplit(mock_url).port
    assert mock_port is not None
    config = write_config(tmp, port, mock_port, tls_mock, tmp / "files", cached)
    proc = procs.start(name, [*gateway_command(template, config, port, workers), *extra])
    wait_ready(f"http://{HOST}:{port}/readyz", procs, name)
    root = f"http://{HOST}:{port}"
    return Target(name, root, GATEWAY_MODELS, f"Bearer {API_KEY}", proc.pid)


Servers = tuple[list[Target], list[Target], list[Target]]


@contextmanager
def servers(args: argparse.Namespace, tmp: Path) -> Iterator[Servers]:
    """Starts the mock, the gateway and the pass-throughs, with the scaled scenario chosen the
    2-worker gateway and raw pass-through, with a TLS scenario chosen the HTTPS mock (its CA
    made now), and with a cache scenario chosen the cached alias in the config; yields the
    targets (direct first), the scaled ones, and the TLS ones: the HTTPS mock as direct and the
    gateway on its alias there (the same process)."""
    procs = Processes(tmp)
    try:
        direct = start_mock(procs, args.chunks)
        tls_mock = None
        if TLS_NAMES.intersection(args.scenarios):
            tls_mock = start_mock(procs, args.chunks, make_ca(tmp))
        # Every gateway gets the same providers: they share the config's file, and each one
        # reloads it when the next one's config is written there.
        cached = bool(CACHE_NAMES.intersection(args.scenarios))
        start = partial(
            start_gateway, procs, tmp=tmp, tls_mock=tls_mock, mock_url=direct.root, cached=cached
        )
        gateway = start(args.gateway_cmd, name="gateway")
        single = [direct, gateway]
        if args.gateway_cmd == DEFAULT_GATEWAY_CMD:  # the protocol it was chosen over
            stock = ("--http", "uvicorn")
            cmd, name = DEFAULT_GATEWAY_CMD, "gateway-uvicorn"
            single.append(start(cmd, name=name, extra=stock))
        single += [start_passthrough(procs, direct, name) for name in BARE]
        single.append(start_minimal(procs, direct))
        if cached:
            single.append(start_passthrough(procs, direct, RAW_CACHE))
        scaled = []
        if SCALED in args.scenarios:
            name = f"gateway-{WORKERS}w"
            scaled = [
                start(args.gateway_cmd, name=name, workers=WORKERS),
                start_passthrough(procs, direct, f"raw-{WORKERS}w", WORKERS),
            ]
        tls = [] if tls_mock is None else [tls_mock, replace(gateway, models=GATEWAY_TLS_MODELS)]
        yield single, scaled, tls
    finally:
        procs.close()


# The runs, and what the mocks saw: the HTTPS one's (`upstream`, `mock_stats_at_end`) and the
# plain one's during the cache runs (`cache_upstream`).
Measured = tuple[list[Run], dict[str, Any]]


def bench(args: argparse.Namespace, tmp: Path) -> Measured:
    chosen = [s for s in ALL_SCENARIOS if s.name in args.scenarios]
    plain = [s for s in chosen if not s.tls]
    runs: list[Run] = []
    seen: list[dict[str, Any]] = []
    cache_seen: list[dict[str, Any]] = []
    with servers(args, tmp) as (single, scaled, tls):
        for target in single + scaled:
            for scenario in plain:
                if runs_on(target, scenario):
                    probe(target, scenario, tmp)
        for target in tls:
            for scenario in chosen:
                if scenario.tls:
                    probe(target, scenario, tmp)
        direct = single[0]
        for scenario in plain:
            for target in single + (scaled if scenario.name == SCALED else []):
                if not runs_on(target, scenario):
                    continue
                pids = {target.name: target.pid, "mock": direct.pid}
                if target is direct:
                    pids = {"mock": direct.pid}
                before = mock_stats(direct) if scenario.name in CACHE_NAMES else None
                runs.append(run_one(target, scenario, args, tmp, pids))
                if before is not None:
                    cache_seen.append(upstream_unseen(runs[-1], before, mock_stats(direct)))
        for scenario in chosen:  # the TLS scenarios, after the plain ones
            if scenario.tls:
                seen += run_tls(scenario, tls, args, tmp, runs)
        tls_mock = {} if not tls else {"mock_stats_at_end": mock_stats(tls[0])}
    return runs, {"upstream": seen, **tls_mock, "cache_upstream": cache_seen}


def upstream_unseen(run: Run, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the mock saw during a cache run (its warm-up included): no request, else
    BenchError (some answers were not the cache's)."""
    requests = after["requests"] - before["requests"]
    if requests:
        raise BenchError(
            f"{run.scenario} {run.target}: the mock answered {requests} requests during the run "
            f"(wrk counted {run.requests}): not every answer came from the cache"
        )
    return {"scenario": run.scenario, "target": run.target, "upstream_requests": requests,
            "requests": run.requests}  # fmt: skip


def run_tls(
    scenario: Scenario, tls: list[Target], args: argparse.Namespace, tmp: Path, runs: list[Run]
) -> list[dict[str, Any]]:
    """The TLS scenario on the HTTPS mock (direct) and the gateway to it, appended to `runs`;
    what the mock saw of each run."""
    mock, seen = tls[0], []
    for target in tls:
        pids = {"mock": mock.pid} if target is mock else {target.name: target.pid, "mock": mock.pid}
        before = mock_stats(mock)
        run = run_one(target, scenario, args, tmp, pids)
        runs.append(run)
        seen.append(upstream_seen(run, before, mock_stats(mock)))
    return seen


def runs_on(target: Target, scenario: Scenario) -> bool:
    if scenario.targets and target.name not in scenario.targets:
        return False
    if target.name == RAW_CACHE:  # the cache's floor: its own scenarios only
        return scenario.name in CACHE_NAMES
    return target.name != MINIMAL or scenario.name in MINIMAL_SCENARIOS


def run_one(
    target: Target, scenario: Scenario, args: argparse.Namespace, tmp: Path, pids: dict[str, int]
) -> Run:
    label = f"{scenario.name} ({scenario.connections} conn) {target.name}"
    print(f"  {label}: warm-up {args.warmup} s, run {args.duration} s", file=sys.stderr, flush=True)
    if args.warmup > 0:
        wrk(target, scenario, args.warmup, tmp)
    run = measure(target, scenario, args.duration, tmp, pids)
    if run.error_count:
        print(
            f"  ERROR {label}: {run.errors} (status = responses with HTTP status >= 400)",
            file=sys.stderr,
        )
    return run


def report(measured: Measured, args: argparse.Namespace) -> int:
    runs, tls_seen = measured
    env = environment(args)
    compared = {name: comparisons(runs, name) for name in COMPARED}
    over_plain = tls_ratios(runs)
    beside = beside_ratios(runs)
    shares = responses_shares(runs)
    cache = cache_ratios(runs)
    checks = budgets(compared) + cache_budgets(cache)
    failed_runs = [run for run in runs if run.error_count]
    print(markdown(runs, compared, env, over_plain, beside, cache))
    print()
    for c in checks:
        verdict = "FAIL" if not c["ok"] else "FLOOR" if c["floor"] else "PASS"
        floor = f"; the floor misses it too: {c['floor']}" if c["floor"] else ""
        print(f"{verdict}  {c['name']}: {c['value']} (budget {c['budget']}){floor}")
    for run in failed_runs:
        print(f"FAIL  {run.scenario} {run.target}: errors {run.errors}")
    for warning in contention_warnings(runs):
        print(f"NOTE  {warning}")
    for seen in tls_seen.get("upstream", ()):
        print(
            f"TLS   {seen['scenario']} {seen['target']}: the HTTPS mock answered "
            f"{seen['upstream_requests']:,} requests on {seen['upstream_new_tls_connections']} "
            "new TLS connections (warm-up included)"
        )
    for scenario, share in shares.items():
        print(f"RESP  {scenario}: gateway / " + ", ".join(
            f"{other} {100 * ratio:.1f}%" for other, ratio in share.items()))  # fmt: skip
    for scenario in beside:
        print(f"RESP  {scenario}: {beside_text(scenario, beside)}")
    for seen in tls_seen.get("cache_upstream", ()):
        name = seen["scenario"]
        if seen["target"] == RAW_CACHE:  # the floor: in the gateway's line
            continue
        mine = next(run for run in runs if (run.scenario, run.target) == (name, seen["target"]))
        against = (
            cache_text(cache[name], cpu=True) if name in cache
            else f"no {CACHE_BESIDE[name]} row to hold it against (run that scenario too)"
        )  # fmt: skip
        print(
            f"CACHE {name}: {seen['target']} {mine.requests_per_s:,.0f} req/s from the cache, "
            f"{against}; the mock answered {seen['upstream_requests']} requests meanwhile "
            "(warm-up included)"
        )
    results: dict[str, Any] = {
        "environment": env,
        "runs": [asdict(run) for run in runs],
        "comparisons": compared,
        "budgets": checks,
    }
    if tls_seen.get("upstream"):
        # each TLS scenario's direct and gateway req/s over its plain scenario's; no budget
        results["tls"] = {"vs_plain": over_plain, **tls_seen}
    if shares or beside:
        # the native path's gateway against direct and the pass-throughs; the translated path
        # and the stored variant against the native gateway (and the chat one); no budget
        results["responses"] = {"gateway_share": shares, "beside": beside}
    if tls_seen.get("cache_upstream"):
        # the hits' req/s against the same gateway's uncached row, and what the mock saw
        results["cache"] = {"vs_uncached": cache, "upstream": tls_seen["cache_upstream"]}
    return finish(args, results, checks, failed=bool(failed_runs))


def finish(
    args: argparse.Namespace, results: dict[str, Any], checks: list[dict[str, Any]], failed: bool
) -> int:
    """Writes the results; the exit code: 2 a run failed, 1 a budget failed (with --check)."""
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    if failed:
        return 2
    return 1 if args.check and not all(check["ok"] for check in checks) else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = wrk_parser(__doc__, "results.json", duration=10, warmup=2)
    add_scenarios(parser, ALL_SCENARIOS)
    add_gateway_cmd(parser)
    return parser.parse_args(argv)


def add_scenarios(
    parser: argparse.ArgumentParser,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
    default: tuple[Scenario, ...] | None = None,
) -> None:
    """--chunks and --scenarios (of `scenarios`; `default`, else all, by default), as every
    bench on the mock takes them."""
    parser.add_argument("--chunks", type=int, default=64, help="chunks per mock stream")
    parser.add_argument(
        "--scenarios",
        type=lambda text: text.split(","),
        default=[s.name for s in (scenarios if default is None else default)],
        help="comma-separated subset of: " + ",".join(s.name for s in scenarios),
    )


def wrk_parser(
    doc: str | None, output: str, *, duration: int, warmup: int
) -> argparse.ArgumentParser:
    """The options every wrk bench has: the runs' lengths, --check, where the results go."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--duration", type=int, default=duration, help="seconds per measured run")
    parser.add_argument("--warmup", type=int, default=warmup, help="seconds of warm-up per run")
    parser.add_argument("--check", action="store_true", help="exit 1 when a budget fails")
    parser.add_argument("--output", type=Path, default=BENCH_DIR / output)
    return parser


def add_gateway_cmd(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateway-cmd",
        default=DEFAULT_GATEWAY_CMD,
        help="command starting the gateway; {python} {config} {host} {port} {workers} are "
        "filled in",
    )


def measured(prefix: str, work: Callable[[Path], T]) -> T | int:
    """Runs `work` in a fresh temporary directory, with wrk present and signals handled;
    an int is the exit code of a bench that could not measure."""
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install -y wrk", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            return work(Path(tmp))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def measured_report(
    prefix: str,
    args: argparse.Namespace,
    work: Callable[[Path], T],
    report: Callable[[T, argparse.Namespace], int],
) -> int:
    """`measured`, then the report of what it measured: the exit code either way."""
    out = measured(prefix, work)
    return out if isinstance(out, int) else report(out, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return measured_report("gateway-bench-", args, lambda tmp: bench(args, tmp), report)


if __name__ == "__main__":
    sys.exit(main())

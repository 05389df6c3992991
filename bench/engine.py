"""In-process engine vs vLLM's own OpenAI server: the same tiny model, the same prompts.

Starts vLLM's OpenAI server and the gateway with a `type: vllm` provider on models/tiny, with
identical engine settings (max_model_len 1024, float32, eager, seed 0, 1 GiB KV cache, vLLM's
default process layout), then streams the same requests to each at 1 and 8 concurrent streams:
each request generates exactly --max-tokens tokens (ignore_eos) and reports usage. Rounds
alternate between the two targets (one running at a time) so that drift on a shared machine
hits both alike; the table shows the median over rounds of

    tokens/s   completion tokens of all requests / wall time of the run
    TTFT p50   time from sending a request to its first text chunk

Budget: the gateway's tokens/s at least the server's, its TTFT p50 no worse. `--endpoint chat`
runs the same on POST /v1/chat/completions (each prompt as one user message through the model's
chat template; the first token is the first content delta after the role's).

Scale-out: `--workers N --clients C` runs `gateway serve --workers N` (one engine, N front-ends)
against `vllm serve --api-server-count N` (the same), C concurrent streams instead of 1 and 8:
many small requests (`--max-tokens 4`) are where the front-ends' work shows.

The response cache: in each of the gateway's rounds, after its load, the same JSON request
(greedy, seed 0, exactly 128 tokens whatever --max-tokens says) from 8 clients, first to the
alias `tiny` (uncached: the engine generates every answer), then to `tiny-cached` (the same
target with `cache: {ttl_s: 3600}`, the memory backend) once a probe's second call said
`x-portkey-cache-status: HIT`: every measured answer must be a hit. Budget: the hits' requests/s
at least 10x the uncached. `--cache-hit skip` leaves it out; `--cache-hit only` runs it alone
(the gateway only, no vLLM server).

    .venv/bin/python bench/engine.py [--endpoint chat] [--rounds 3] [--max-tokens 128] [--check]
    .venv/bin/python bench/engine.py --workers 2 --clients 32 --max-tokens 4 --requests 40
    .venv/bin/python bench/engine.py --cache-hit only --rounds 1 --output /tmp/engine_cache.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from run import HOST, BenchError, free_port

R = TypeVar("R")
BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
MODEL_DIR = ROOT / "models" / "tiny"
KEY = "sk-bench-engine"
SERVER, GATEWAY = "vllm-server", "gateway-engine"
START_TIMEOUT_S = 300.0
# Both engines alike: what the tests use, with vLLM's default process layout (engine core and
# worker in their own processes) and the KV cache from the environment.
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
ENGINE_ARGS = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True, "seed": 0}
POOLING_ARGS = {"runner": "pooling", "convert": "embed"}  # the same model as an embedder
PROMPTS = (
    "Once upon a time",
    "The weather today is",
    "In a hole in the ground there lived",
    "It was the best of times, it was the worst of times",
    "Call me Ishmael. Some years ago",
    "The quick brown fox jumps over",
    "A long time ago in a galaxy far",
    "All happy families are alike",
)


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # .../v1/completions (chat/completions, or embeddings for a pooling model)
    model: str
    headers: dict[str, str]

    @property
    def chat(self) -> bool:
        return self.url.endswith("/chat/completions")


@dataclass
class Result:
    """One run of one target: `amount` (tokens, or requests) in `seconds`, and a latency per
    request (time to first token, or the whole request)."""

    target: str
    concurrency: int  # streams, or clients
    round: int
    amount: int
    seconds: float
    latency_ms: list[float]

    @property
    def rate(self) -> float:
        return self.amount / self.seconds

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latency_ms)


@dataclass(frozen=True)
class Columns:
    """How a bench names what it measures: the table's headers and the results' keys."""

    concurrency: str  # "streams"
    rate: str  # "tokens/s"
    rate_key: str  # "tokens_per_s"
    latency: str  # "TTFT p50 ms"
    latency_key: str  # "ttft_p50_ms"
    short_latency: str  # "TTFT", in the comparison column


ENDPOINTS = {"completions": "completions", "chat": "chat/completions"}
OUTPUTS = {"completions": "engine_results.json", "chat": "engine_chat_results.json"}
COLUMNS = Columns("streams", "tokens/s", "tokens_per_s", "TTFT p50 ms", "ttft_p50_ms", "TTFT")
# The response cache's measurement: one request, to the uncached alias and to the cached one.
CACHED_ALIAS = "tiny-cached"  # `tiny` with `cache:`: the same provider, so the same engine
CACHE_TTL_S = 3600
CACHE_CLIENTS = 8
CACHE_MAX_TOKENS = 128  # a fixed request: the same figure from every run of the bench
CACHE_UNCACHED_REQUESTS = 4  # per client, generated by the engine
CACHE_WARMUP_REQUESTS = 25  # per client: every connection's worker then holds the entry
CACHE_HIT_REQUESTS = 500  # per client, from the cache
MIN_CACHE_HIT_RATIO = 10.0
UNCACHED, CACHE_HIT = "gateway-uncached", "gateway-cache-hit"  # their Results' targets
CACHE_STATUS = "x-portkey-cache-status"
CACHE_MODES = ("run", "skip", "only")


# ---------------------------------------------------------------- servers


def server_command(port: int, pooling: bool, workers: int = 1) -> list[str]:
    """`vllm serve`, with N API servers in front of the one engine core as it runs them."""
    return [
        sys.executable, str(BENCH_DIR / "vllm_serve.py"), "serve", str(MODEL_DIR),
        "--served-model-name", "tiny", "--host", HOST, "--port", str(port),
        "--max-model-len", "1024", "--dtype", "float32", "--enforce-eager", "--seed", "0",
        "--api-server-count", str(workers),
        *(("--runner", "pooling", "--convert", "embed") if pooling else ()),
    ]  # fmt: skip


def gateway_config(tmp: Path, pooling: bool) -> Path:
    engine_args = ENGINE_ARGS | POOLING_ARGS if pooling else ENGINE_ARGS
    alias: dict[str, Any] = {"targets": [{"provider": "engine"}], "timeout_s": 600}
    if pooling:
        alias["endpoint"] = "embeddings"
    models = {"tiny": alias}
    if not pooling:  # the same target, its answers cached: the cache-hit measurement's
        models[CACHED_ALIAS] = alias | {"cache": {"ttl_s": CACHE_TTL_S}}
    config = {
        "auth": {"keys": [{"id": "bench", "key": KEY, "models": ["*"]}]},
        "providers": {
            "engine": {"type": "vllm", "model": str(MODEL_DIR), "engine_args": engine_args}
        },
        "models": models,
    }
    path = tmp / "gateway.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@contextmanager
def serving(
    name: str, tmp: Path, pooling: bool = False, endpoint: str = "completions", workers: int = 1
) -> Iterator[Target]:
    """One target at a time: two CPU engines side by side would bind their workers to the same
    core and spin against each other (vLLM's default OpenMP binding), which is noise. Started
    in the bench's own session: in sessions of their own (setsid) both targets showed
    multi-second stalls on these machines."""
    os.environ.update(ENV)
    port = free_port()
    if name == SERVER:
        command = server_command(port, pooling, workers)
    else:
        command = gateway_command(tmp, port, pooling, workers)
    ready = f"http://{HOST}:{port}" + ("/health" if name == SERVER else "/readyz")
    log_path = tmp / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_up(proc, ready, log_path)
        auth = {"Authorization": f"Bearer {KEY}"} if name == GATEWAY else {}
        endpoint = "embeddings" if pooling else endpoint
        yield Target(name, f"http://{HOST}:{port}/v1/{endpoint}", "tiny", auth)
    finally:
        stop(proc)


def wait_up(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-30:]
            raise BenchError(f"{url}: exited with {proc.returncode}:\n" + "\n".join(tail))
        with suppress(OSError), urllib.request.urlopen(url, timeout=1.0) as response:
            if response.status == 200:
                return
        time.sleep(0.1)
    raise BenchError(f"not ready at {url} after {START_TIMEOUT_S:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """TERM the target, then KILL whatever is left of its process tree: an engine's worker that
    outlived its parent would keep spinning on a core and slow the next target down."""
    tree = [proc.pid, *descendants(proc.pid)]
    proc.terminate()
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=15)
    deadline = time.monotonic() + 30
    while alive := [pid for pid in tree if running(pid)]:
        if time.monotonic() > deadline:
            raise BenchError(f"processes {alive} would not exit")
        for pid in alive:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ..."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def running(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int(stat_fields(entry.name)[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        found.extend(frontier)
    return found


def gateway_command(tmp: Path, port: int, pooling: bool, workers: int = 1) -> list[str]:
    return [
        sys.executable, "-m", "gateway", "serve", "--config", str(gateway_config(tmp, pooling)),
        "--host", HOST, "--port", str(port), "--log-level", "warning", "--workers", str(workers),
    ]  # fmt: skip


# ---------------------------------------------------------------- load


def body(target: Target, i: int, max_tokens: int) -> dict[str, Any]:
    prompt = PROMPTS[i % len(PROMPTS)]
    asked: dict[str, Any] = (
        {"messages": [{"role": "user", "content": prompt}]} if target.chat else {"prompt": prompt}
    )
    return {
        "model": target.model,
        **asked,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": i,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def one(
    session: aiohttp.ClientSession, target: Target, i: int, max_tokens: int
) -> tuple[int, float]:
    """(completion tokens, ms to the first text) of one streamed request."""
    began = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with session.post(target.url, json=body(target, i, max_tokens)) as resp:
        if resp.status != 200:
            raise BenchError(f"{target.name}: HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if first is None and _token(event, target.chat):
                first = time.perf_counter()
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    if first is None or tokens != max_tokens:
        raise BenchError(f"{target.name}: request {i} gave {tokens} tokens, no text: {first}")
    return tokens, (first - began) * 1000


def _token(event: dict[str, Any], chat: bool) -> bool:
    """The event carries the first token, whatever its text (a chat's first delta holds only
    the role)."""
    choices = event.get("choices")
    if not choices:
        return False
    return not chat or any("role" not in c.get("delta", {}) for c in choices)


async def run_load(target: Target, streams: int, per_stream: int, max_tokens: int) -> Result:
    async with aiohttp.ClientSession(headers=target.headers) as session:

        async def worker(w: int) -> list[tuple[int, float]]:
            return [
                await one(session, target, w * per_stream + k, max_tokens)
                for k in range(per_stream)
            ]

        began = time.perf_counter()
        done = await asyncio.gather(*(worker(w) for w in range(streams)))
        seconds = time.perf_counter() - began
    flat = [item for part in done for item in part]
    return Result(target.name, streams, 0, sum(t for t, _ in flat), seconds, [m for _, m in flat])


# ---------------------------------------------------------------- the response cache


def cache_body(target: Target) -> dict[str, Any]:
    """The cache measurement's one request: greedy and seeded (an answer that repeats), exactly
    CACHE_MAX_TOKENS tokens, whole (not streamed)."""
    asked: dict[str, Any] = (
        {"messages": [{"role": "user", "content": PROMPTS[0]}]}
        if target.chat
        else {"prompt": PROMPTS[0]}
    )
    return {
        "model": target.model,
        **asked,
        "max_tokens": CACHE_MAX_TOKENS,
        "temperature": 0,
        "seed": 0,
        "ignore_eos": True,
    }


async def cached_one(session: aiohttp.ClientSession, target: Target) -> tuple[float, str | None]:
    """(ms, x-portkey-cache-status) of one request; its answer checked (all its tokens)."""
    began = time.perf_counter()
    async with session.post(target.url, json=cache_body(target)) as resp:
        text = await resp.text()
        status = resp.headers.get(CACHE_STATUS)
        if resp.status != 200:
            raise BenchError(f"{target.name} {target.model}: HTTP {resp.status}: {text[:2000]}")
    elapsed = (time.perf_counter() - began) * 1000
    answer = json.loads(text)
    tokens = (answer.get("usage") or {}).get("completion_tokens")
    if not answer.get("choices") or tokens != CACHE_MAX_TOKENS:
        raise BenchError(f"{target.name} {target.model}: {tokens} tokens: {text[:2000]}")
    return elapsed, status


async def cache_load(
    session: aiohttp.ClientSession, target: Target, label: str, per_client: int, want: set[str]
) -> Result:
    """CACHE_CLIENTS clients sending the request back to back, each answer's cache status one
    of `want` ("": none), else BenchError."""

    async def client() -> list[float]:
        latencies = []
        for _ in range(per_client):
            ms, status = await cached_one(session, target)
            if (status or "") not in want:
                raise BenchError(
                    f"{label} ({target.model}): {CACHE_STATUS} {status!r}, expected one of "
                    f"{sorted(want)}"
                )
            latencies.append(ms)
        return latencies

    began = time.perf_counter()
    done = await asyncio.gather(*(client() for _ in range(CACHE_CLIENTS)))
    seconds = time.perf_counter() - began
    flat = [ms for part in done for ms in part]
    return Result(label, CACHE_CLIENTS, 0, len(flat), seconds, flat)


async def probe_cache(session: aiohttp.ClientSession, target: Target) -> None:
    """The cached alias's request twice on one connection (one worker): a miss (the engine's
    answer, put), then a hit; else BenchError."""
    statuses = [(await cached_one(session, target))[1] for _ in range(2)]
    if statuses != ["MISS", "HIT"]:
        raise BenchError(
            f"{target.name} cache probe ({target.model}): {CACHE_STATUS} {statuses[0]!r}, "
            f"then {statuses[1]!r} (expected 'MISS', then 'HIT')"
        )


async def cache_hits(target: Target, rnd: int) -> list[Result]:
    """The request's requests/s on the uncached alias (no answer from the cache), then on the
    cached one after the probe and a warm-up (which leaves the entry in every worker that
    holds one of the session's connections): every measured answer a hit."""
    cached = replace(target, model=CACHED_ALIAS)
    async with aiohttp.ClientSession(headers=target.headers) as session:
        await cache_load(session, target, UNCACHED, 1, {""})  # warm-up: the request's prefix
        await settle()  # `--cache-hit only`: the engine just started
        uncached = await cache_load(session, target, UNCACHED, CACHE_UNCACHED_REQUESTS, {""})
        await probe_cache(session, cached)
        await cache_load(session, cached, CACHE_HIT, CACHE_WARMUP_REQUESTS, {"HIT", "MISS"})
        hits = await cache_load(session, cached, CACHE_HIT, CACHE_HIT_REQUESTS, {"HIT"})
    uncached.round = hits.round = rnd
    return [uncached, hits]


def cache_report(results: list[Result]) -> tuple[dict[str, Any], list[str]]:
    """Prints the uncached and the hits' medians over rounds; their figures, and the budget
    missed."""
    (uncached, uncached_p50), (hits, hits_p50) = (
        summary(results, name, CACHE_CLIENTS) for name in (UNCACHED, CACHE_HIT)
    )
    ratio = hits / uncached
    print(
        f"\n| clients | target | req/s | p50 ms | vs uncached |\n|---|---|---:|---:|---|\n"
        f"| {CACHE_CLIENTS} | gateway, `tiny` (uncached, {CACHE_MAX_TOKENS} tokens) | "
        f"{uncached:,.1f} | {uncached_p50:.1f} | |\n"
        f"| {CACHE_CLIENTS} | gateway, `{CACHED_ALIAS}` (cache hits) | {hits:,.1f} | "
        f"{hits_p50:.2f} | {ratio:,.1f}x req/s |"
    )
    figures = {
        "clients": CACHE_CLIENTS,
        "max_tokens": CACHE_MAX_TOKENS,
        "uncached_requests_per_s": round(uncached, 2),
        "uncached_p50_ms": round(uncached_p50, 3),
        "hit_requests_per_s": round(hits, 2),
        "hit_p50_ms": round(hits_p50, 3),
        "ratio": round(ratio, 2),
        "budget": MIN_CACHE_HIT_RATIO,
    }
    failures = []
    if ratio < MIN_CACHE_HIT_RATIO:
        failures.append(
            f"cache hits: {ratio:.1f}x the uncached requests/s (budget >= {MIN_CACHE_HIT_RATIO:g}x)"
        )
    return figures, failures


# ---------------------------------------------------------------- report


def summary(results: list[Result], name: str, concurrency: int) -> tuple[float, float]:
    """The median over rounds of a target's rate and p50 latency at one concurrency."""
    mine = [r for r in results if r.target == name and r.concurrency == concurrency]
    return statistics.median(r.rate for r in mine), statistics.median(r.p50_ms for r in mine)


def compare(
    results: list[Result], columns: Columns
) -> tuple[dict[str, Any], dict[int, tuple[float, float]]]:
    """Prints the table of the gateway against the server at each concurrency; returns the
    medians by concurrency and target, and (rate ratio, added p50 ms) by concurrency."""
    c = columns
    rows = [
        f"| {c.concurrency} | target | {c.rate} | {c.latency} | vs vLLM server |",
        "|---|---|---:|---:|---|",
    ]
    table: dict[str, Any] = {}
    deltas: dict[int, tuple[float, float]] = {}
    for level in sorted({r.concurrency for r in results}):
        medians = {name: summary(results, name, level) for name in (SERVER, GATEWAY)}
        table[str(level)] = {
            name: {c.rate_key: rate, c.latency_key: p50} for name, (rate, p50) in medians.items()
        }
        (server_rate, server_p50), (rate, p50) = medians[SERVER], medians[GATEWAY]
        deltas[level] = (rate / server_rate, p50 - server_p50)
        ratio, added = deltas[level]
        rows.append(f"| {level} | vLLM server | {server_rate:,.1f} | {server_p50:.1f} | |")
        rows.append(
            f"| {level} | gateway (in-process engine) | {rate:,.1f} | {p50:.1f} | "
            f"{ratio:.2f}x {c.rate}, {c.short_latency} {added:+.1f} ms |"
        )
    print("\n".join(rows))
    return table, deltas


def report(results: list[Result], args: argparse.Namespace) -> int:
    cache = [r for r in results if r.target in (UNCACHED, CACHE_HIT)]
    results = [r for r in results if r.target not in (UNCACHED, CACHE_HIT)]
    table, deltas = compare(results, COLUMNS) if results else ({}, {})
    failures: list[str] = []
    for streams, (ratio, ttft) in deltas.items():
        if ratio < 1.0:
            failures.append(f"{streams} streams: tokens/s {ratio:.2f}x the server's (budget >= 1)")
        if ttft > 0:
            failures.append(f"{streams} streams: TTFT p50 {ttft:+.1f} ms over the server's")
    output = {
        "endpoint": args.endpoint,
        "workers": args.workers,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "results": table,
        "runs": [asdict(r) for r in results],
    }
    if cache:
        figures, missed = cache_report(cache)
        output["cache_hit"] = {**figures, "runs": [asdict(r) for r in cache]}
        failures += missed
    return write_report(args.output, output, failures, args.check)


async def settle(idle: float = 0.8, window_s: float = 1.0, timeout_s: float = 90.0) -> None:
    """Until the machine is mostly idle: a just-started engine keeps working for a while
    (warm-up, collections), which would land on whichever target is measured first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu_times()
        await asyncio.sleep(window_s)
        after = cpu_times()
        total = sum(after) - sum(before)
        if total > 0 and (after[3] - before[3]) / total >= idle:
            return


def cpu_times() -> list[int]:
    """The machine's CPU times (user, nice, system, idle, ...) from /proc/stat."""
    with open("/proc/stat") as stat:
        return [int(v) for v in stat.readline().split()[1:]]


async def measure(target: Target, rnd: int, args: argparse.Namespace) -> list[Result]:
    await run_load(target, 8, 1, args.max_tokens)  # warm-up: first requests compile, allocate
    await settle()
    results = []
    levels: tuple[tuple[int, int], ...] = ((1, args.requests), (8, max(1, args.requests // 4)))
    if args.clients:
        levels = ((args.clients, args.requests),)
    for streams, per_stream in levels:
        result = await run_load(target, streams, per_stream, args.max_tokens)
        result.round = rnd
        results.append(result)
    return results


def alternate(
    rounds: int,
    tmp: Path,
    pooling: bool,
    work: Callable[[Target, int], Coroutine[Any, Any, list[R]]],
    endpoint: str = "completions",
    workers: int = 1,
    names: tuple[str, ...] = (SERVER, GATEWAY),
) -> list[R]:
    """`work` on each target (of `names`) in each round, one target running at a time, the
    order alternating from round to round."""
    results: list[R] = []
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            with serving(name, tmp, pooling, endpoint, workers) as target:
                results.extend(asyncio.run(work(target, rnd)))
    return results


def bench(args: argparse.Namespace, tmp: Path) -> list[Result]:
    only = args.cache_hit == "only"

    async def work(target: Target, rnd: int) -> list[Result]:
        if args.hold:
            print(target.name, target.url, flush=True)
            await asyncio.sleep(3600)
        results = [] if only else await measure(target, rnd, args)
        if target.name == GATEWAY and args.cache_hit != "skip":
            results += await cache_hits(target, rnd)
        return results

    names = (GATEWAY,) if only else (SERVER, GATEWAY)
    endpoint = ENDPOINTS[args.endpoint]
    return alternate(args.rounds, tmp, False, work, endpoint, args.workers, names)


def run_bench(
    prefix: str, work: Callable[[Path], list[R]], report: Callable[[list[R]], int]
) -> int:
    """Builds the tiny model, runs `work` in a temporary directory and reports; 2 when the
    bench could not measure."""
    from providers import tiny_model

    tiny_model.build(MODEL_DIR)
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            results = work(Path(tmp))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 2
    return report(results)


def write_report(path: Path, output: dict[str, Any], failures: list[str], check: bool) -> int:
    """Writes the results; prints the missed budgets; 1 for them with --check."""
    path.write_text(json.dumps({**output, "failures": failures}, indent=2) + "\n")
    for failure in failures:
        print(f"budget missed: {failure}", file=sys.stderr)
    return 1 if failures and check else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="each starts both targets anew")
    parser.add_argument("--requests", type=int, default=12, help="requests per stream at 1")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--check", action="store_true", help="exit 1 when a budget fails")
    parser.add_argument("--hold", action="store_true", help="print the URLs and keep serving")
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="completions")
    parser.add_argument("--workers", type=int, default=1, help="front-ends of each target")
    parser.add_argument("--clients", type=int, default=0, help="one level of C streams")
    parser.add_argument(
        "--cache-hit", choices=CACHE_MODES, default="run",
        help="the response cache's measurement on the gateway: after its load (run), not at all "
        "(skip), or alone (only: no vLLM server)",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, default=None, help="default: by endpoint")
    args = parser.parse_args(argv)
    if args.output is None:
        scaled = f"_{args.workers}w" if args.workers > 1 else ""
        scaled += "_cache" if args.cache_hit == "only" else ""
        args.output = BENCH_DIR / OUTPUTS[args.endpoint].replace("_results", f"{scaled}_results")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(
        "engine-bench-", lambda tmp: bench(args, tmp), lambda results: report(results, args)
    )


if __name__ == "__main__":
    sys.exit(main())

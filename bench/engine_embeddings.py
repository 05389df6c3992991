"""Embeddings: the in-process engine vs vLLM's own OpenAI server, both running the tiny model on
vLLM's pooling runner with identical settings (bench/engine.py's, plus runner pooling).

Each request embeds a batch of 16 inputs and asks for base64 (what the openai SDK asks for);
1 and 8 clients send requests back to back. The targets run one at a time, alternating over
rounds, and the table shows the median over rounds of

    req/s      requests of the run / its wall time (16 embeddings each)
    p50 ms     the median request's time

Budget: the gateway's requests/s at least the server's.

    .venv/bin/python bench/engine_embeddings.py [--rounds 2] [--requests 40] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from engine import GATEWAY, SERVER, Target, alternate, run_bench, settle, write_report
from run import BenchError

BENCH_DIR = Path(__file__).resolve().parent
BATCH = 16
CLIENTS = (1, 8)


@dataclass
class Result:
    target: str
    clients: int
    round: int
    requests: int
    seconds: float
    latency_ms: list[float]

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latency_ms)


def body(i: int) -> dict[str, Any]:
    inputs = [
        f"Request {i}, input {k}: the quick brown fox jumps over the lazy dog" for k in range(BATCH)
    ]
    return {"model": "tiny", "input": inputs, "encoding_format": "base64"}


async def one(session: aiohttp.ClientSession, target: Target, i: int) -> float:
    """The ms one request took; its answer checked."""
    began = time.perf_counter()
    async with session.post(target.url, json=body(i)) as resp:
        answer = await resp.json()
        if resp.status != 200:
            raise BenchError(f"{target.name}: HTTP {resp.status}: {answer}")
    data = answer.get("data")
    if not isinstance(data, list) or len(data) != BATCH:
        raise BenchError(f"{target.name}: request {i}: not {BATCH} embeddings")
    return (time.perf_counter() - began) * 1000


async def run_load(target: Target, clients: int, per_client: int) -> Result:
    async with aiohttp.ClientSession(headers=target.headers) as session:

        async def client(c: int) -> list[float]:
            return [await one(session, target, c * per_client + k) for k in range(per_client)]

        began = time.perf_counter()
        done = await asyncio.gather(*(client(c) for c in range(clients)))
        seconds = time.perf_counter() - began
    latencies = [ms for part in done for ms in part]
    return Result(target.name, clients, 0, len(latencies), seconds, latencies)


async def measure(target: Target, rnd: int, args: argparse.Namespace) -> list[Result]:
    await run_load(target, 8, 2)  # warm-up
    await settle()
    results = []
    for clients in CLIENTS:
        result = await run_load(target, clients, max(1, args.requests // clients))
        result.round = rnd
        results.append(result)
    return results


def bench(args: argparse.Namespace, tmp: Path) -> list[Result]:
    return alternate(args.rounds, tmp, True, lambda target, rnd: measure(target, rnd, args))


def summary(results: list[Result], name: str, clients: int) -> dict[str, float]:
    mine = [r for r in results if r.target == name and r.clients == clients]
    return {
        "requests_per_s": statistics.median(r.requests_per_s for r in mine),
        "p50_ms": statistics.median(r.p50_ms for r in mine),
    }


def report(results: list[Result], args: argparse.Namespace) -> int:
    rows = [
        f"| clients | target | req/s ({BATCH} inputs) | p50 ms | vs vLLM server |",
        "|---|---|---:|---:|---|",
    ]
    failures: list[str] = []
    table: dict[str, Any] = {}
    for clients in CLIENTS:
        server = summary(results, SERVER, clients)
        gateway = summary(results, GATEWAY, clients)
        table[str(clients)] = {SERVER: server, GATEWAY: gateway}
        ratio = gateway["requests_per_s"] / server["requests_per_s"]
        added = gateway["p50_ms"] - server["p50_ms"]
        rows.append(
            f"| {clients} | vLLM server | {server['requests_per_s']:,.1f} | "
            f"{server['p50_ms']:.1f} | |"
        )
        rows.append(
            f"| {clients} | gateway (in-process engine) | {gateway['requests_per_s']:,.1f} | "
            f"{gateway['p50_ms']:.1f} | {ratio:.2f}x req/s, p50 {added:+.1f} ms |"
        )
        if ratio < 1.0:
            failures.append(f"{clients} clients: req/s {ratio:.2f}x the server's (budget >= 1)")
    print("\n".join(rows))
    output = {
        "rounds": args.rounds,
        "batch": BATCH,
        "results": table,
        "runs": [asdict(r) for r in results],
    }
    return write_report(args.output, output, failures, args.check)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="each starts both targets anew")
    parser.add_argument("--requests", type=int, default=40, help="requests per run")
    parser.add_argument("--check", action="store_true", help="exit 1 when a budget fails")
    parser.add_argument("--output", type=Path, default=BENCH_DIR / "engine_embeddings_results.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(
        "engine-embeddings-bench-",
        lambda tmp: bench(args, tmp),
        lambda results: report(results, args),
    )


if __name__ == "__main__":
    sys.exit(main())

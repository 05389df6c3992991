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
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
from engine import (
    Columns,
    Result,
    Target,
    alternate,
    compare,
    run_bench,
    settle,
    write_report,
)
from run import BenchError

BENCH_DIR = Path(__file__).resolve().parent
BATCH = 16
CLIENTS = (1, 8)


COLUMNS = Columns("clients", f"req/s ({BATCH} inputs)", "requests_per_s", "p50 ms", "p50_ms", "p50")


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


def report(results: list[Result], args: argparse.Namespace) -> int:
    table, deltas = compare(results, COLUMNS)
    failures = [
        f"{clients} clients: req/s {ratio:.2f}x the server's (budget >= 1)"
        for clients, (ratio, _) in deltas.items()
        if ratio < 1.0
    ]
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

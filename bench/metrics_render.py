"""What a /metrics render costs, and what 20 scrapes at once cost the event loop.

The metrics are filled as traffic would fill them (gateway.metrics.Metrics, in process): for
each alias, completions and chat, streamed or not, answered (200), failed upstream (502),
refused (400) and limited (429), and embeddings; a circuit per target; the limiter's decisions.
Two configs: the default config.yaml's size (4 aliases, 4 providers) and 100 aliases.

For each: the text's size and the time of one render, in one process and with two workers
(multiprocess mode: PROMETHEUS_MULTIPROC_DIR, each worker's values in its files); then 20
scrapes at once, as HEAD rendered them (each on the event loop, one after another) and as they
are now (Metrics.scrape: one render, in a thread, shared), with the loop's longest stall (a
task that wakes every millisecond measures how late it wakes).

    .venv/bin/python bench/metrics_render.py [--renders 20] [--scrapers 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from gateway.metrics import (
    MULTIPROC_ENV,
    OP_CHAT,
    OP_EMBEDDINGS,
    OP_TEXT_COMPLETION,
    Metrics,
    RequestRecord,
)

PROVIDERS = 4
CONFIGS = {"default config (4 aliases)": 4, "100 aliases": 100}
# status → provider reached: answered and failed upstream reach one; refused and limited do not
OUTCOMES = {200: True, 502: True, 400: False, 429: False}


def fill(metrics: Metrics, aliases: int) -> None:
    for i in range(aliases):
        alias, provider = f"alias-{i}", f"provider-{i % PROVIDERS}"
        for op in (OP_TEXT_COMPLETION, OP_CHAT):
            for stream in (False, True):
                for status, reached in OUTCOMES.items():
                    metrics.observe(record(alias, provider if reached else "", op, stream, status))
        metrics.observe(record(alias, provider, OP_EMBEDDINGS, False, 200))
        metrics.attempt(provider, None)
        metrics.attempt(provider, "500")
        metrics.circuit(provider, f"upstream-model-{i}", 0, moved=False)
        for result, limit in (("allowed", ""), ("rejected", "key_requests")):
            metrics.ratelimit_decision(alias, result, limit, "memory")
    metrics.flush()


def record(alias: str, provider: str, op: str, stream: bool, status: int) -> RequestRecord:
    rec = RequestRecord(0.0, operation=op, model=alias, stream=stream, provider=provider)
    rec.status = status
    if provider:
        rec.upstream_s, rec.prompt_tokens, rec.completion_tokens = (
            0.2,
            40,
            0 if op == OP_EMBEDDINGS else 60,
        )
        rec.first_token = 0.05 if stream else 0.0
    if status != 200:
        rec.error_type = "UpstreamError"
    return rec


def render_ms(metrics: Metrics, renders: int) -> tuple[int, float]:
    sizes, took = [], []
    for _ in range(renders):
        start = time.perf_counter()
        sizes.append(len(metrics.render()[0]))
        took.append(time.perf_counter() - start)
    return sizes[-1], statistics.median(took) * 1000


async def loop_stall(scrapes: Callable[[], Awaitable[object]]) -> float:
    """The longest the loop was late waking a 1 ms sleeper while `scrapes` ran, in ms."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    await scrapes()
    done = True
    await tick
    return worst * 1000


async def concurrent(metrics: Metrics, scrapers: int) -> dict[str, float]:
    async def before() -> None:  # HEAD's handler: each scrape rendered on the loop
        async def one() -> None:
            metrics.render()

        await asyncio.gather(*(one() for _ in range(scrapers)))

    async def after() -> None:
        await asyncio.gather(*(metrics.scrape() for _ in range(scrapers)))

    renders = metrics.m["renders"]._value.get()
    stall_after = await loop_stall(after)
    shared = metrics.m["renders"]._value.get() - renders
    stall_before = await loop_stall(before)
    return {"stall_before_ms": stall_before, "stall_after_ms": stall_after, "renders": shared}


def multiprocess(aliases: int, renders: int) -> tuple[int, float]:
    """Two workers' values in a fresh directory (each a child process), rendered here."""
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as path:
        env = {**os.environ, MULTIPROC_ENV: path}
        for _ in range(2):
            subprocess.run([sys.executable, __file__, "--fill", str(aliases)], env=env, check=True)
        os.environ[MULTIPROC_ENV] = path
        try:
            return render_ms(Metrics(), renders)
        finally:
            del os.environ[MULTIPROC_ENV]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--renders", type=int, default=20)
    p.add_argument("--scrapers", type=int, default=20)
    p.add_argument("--fill", type=int, help=argparse.SUPPRESS)  # a worker of multiprocess()
    args = p.parse_args()
    if args.fill is not None:
        fill(Metrics(), args.fill)
        return
    print(f"{'':28} {'bytes':>9} {'ms/render':>10} {'2 workers: bytes':>17} {'ms/render':>10}"
          f"   {args.scrapers} scrapes: loop stall before → after (renders)")  # fmt: skip
    for name, aliases in CONFIGS.items():
        metrics = Metrics(min_interval_s=0)
        fill(metrics, aliases)
        size, ms = render_ms(metrics, args.renders)
        mp_size, mp_ms = multiprocess(aliases, args.renders)
        c = asyncio.run(concurrent(metrics, args.scrapers))
        print(f"{name:28} {size:>9} {ms:>10.1f} {mp_size:>17} {mp_ms:>10.1f}"
              f"   {c['stall_before_ms']:.1f} ms → {c['stall_after_ms']:.1f} ms"
              f" ({int(c['renders'])})")  # fmt: skip


if __name__ == "__main__":
    main()

"""What the rate limiter costs: the same wrk load through four gateways on the mock upstream,
one without limits, one with the memory limiter, one with the Redis limiter (a real
redis-server), and one with the Redis limiter and budgets, each with 1 worker and with metrics
on.

The limited gateways check every kind of limit on every request (the key's rpm, tpm and
parallel slots, high enough never to refuse), so each request is reserved and settled. The
budgeted one also prices the mock's model and gives the key and its team a budget (too large to
refuse): each request reserves its most at admission, in the same Redis call as the limits, and
is charged its cost to the budgets and the spend ledger when it ends.
The targets run one at a time, alternating over many short rounds (this machine's speed drifts
by tens of percent over seconds), every other round in the reverse order; each round compares
the limiters with the run without limits of that round, and the report is the median over
rounds.

    .venv/bin/python bench/limiter.py [--rounds 15] [--duration 3] [--check]

Budgets: memory >= 95% and redis >= 80% of the requests/s without limits, at 32 connections;
budgets >= 90% of the Redis limiter's (limits only).
Writes bench/limiter_results.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from run import (
    API_KEY,
    GATEWAY_MODELS,
    HOST,
    SCENARIOS,
    STREAMING,
    BenchError,
    Processes,
    Run,
    Target,
    environment,
    finish,
    free_port,
    gateway_command,
    measure,
    measured_report,
    probe,
    start_mock,
    wait_ready,
    wrk,
    wrk_parser,
)

BUDGETS = {"memory": 0.95, "redis": 0.80}
BUDGETED = 0.90  # the budgeted gateway against the Redis limiter's, limits only
LIMITS = "{rpm: 1000000000, tpm: 1000000000000, max_parallel: 100000}"
BUDGET = "{usd: 1000000, period: month}"
PRICING = '{"*": {input: 0.15, cached_input: 0.075, output: 0.6}}'

THROUGHPUT = next(s for s in SCENARIOS if s.name == "throughput")


def config(port: int, mock_port: int, limiter: str, redis_url: str) -> str:
    limits = f", limits: {LIMITS}" if limiter != "none" else ""
    backend = "redis" if limiter in ("redis", "budget") else "memory"
    budgeted = limiter == "budget"
    budget = f", team: bench-team, budget: {BUDGET}" if budgeted else ""
    pricing = f", pricing: {PRICING}" if budgeted else ""
    team = f"teams:\n  bench-team: {{budget: {BUDGET}}}\n" if budgeted else ""
    return (
        f"server: {{host: {HOST}, port: {port}}}\n"
        f"{team}"
        "auth:\n"
        "  keys:\n"
        f"    - {{id: bench, key: {API_KEY}{limits}{budget}}}\n"
        "providers:\n"
        f'  mock: {{type: openai-compatible, base_url: "http://{HOST}:{mock_port}/v1"{pricing}}}\n'
        "models:\n"
        "  bench-model: {targets: [{provider: mock, model: mock-model}]}\n"
        f'rate_limit: {{backend: {backend}, redis_url: "{redis_url}"}}\n'
    )


def start_redis(procs: Processes) -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise BenchError("redis-server not found: apt-get install -y redis-server")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    procs.start("redis-server", argv)
    deadline = time.monotonic() + 10
    while (
        subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
        ).stdout.strip()
        != "PONG"
    ):
        if time.monotonic() > deadline:
            raise BenchError("redis-server did not answer PING:\n" + procs.log_tail("redis-server"))
        time.sleep(0.05)
    return f"redis://{HOST}:{port}/0"


def start_gateway(procs: Processes, name: str, mock: Target, redis_url: str, tmp: Path) -> Target:
    port = free_port()
    mock_port = int(mock.root.rsplit(":", 1)[1])
    path = tmp / f"{name}.yaml"
    path.write_text(config(port, mock_port, name, redis_url))
    template = "{python} -m gateway serve --config {config} --host {host} --port {port}"
    proc = procs.start(name, gateway_command(template, path, port))
    wait_ready(f"http://{HOST}:{port}/readyz", procs, name)
    return Target(name, f"http://{HOST}:{port}", GATEWAY_MODELS, f"Bearer {API_KEY}", proc.pid)


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, list[Run]]:
    procs = Processes(tmp)
    runs: dict[str, list[Run]] = {"none": [], "memory": [], "redis": [], "budget": []}
    try:
        mock = start_mock(procs, 64)
        redis_url = start_redis(procs)
        targets = [start_gateway(procs, name, mock, redis_url, tmp) for name in runs]
        for target in targets:
            probe(target, THROUGHPUT, tmp)
            probe(target, STREAMING, tmp)
        for target in targets:  # once: later rounds follow each other closely
            wrk(target, THROUGHPUT, args.warmup, tmp)
        for n in range(args.rounds):
            # every other round backwards: a drift within a round favours no target
            for target in targets if n % 2 == 0 else targets[::-1]:
                pids = {"gateway": target.pid, "mock": mock.pid}
                runs[target.name].append(measure(target, THROUGHPUT, args.duration, tmp, pids))
    finally:
        procs.close()
    return runs


def ratios(runs: dict[str, list[Run]], name: str, base: str = "none") -> list[float]:
    """Per round, against the run of `base` of the same round: the machine's drift between
    rounds cancels out."""
    return [
        r.requests_per_s / b.requests_per_s for r, b in zip(runs[name], runs[base], strict=True)
    ]


def report(runs: dict[str, list[Run]], args: argparse.Namespace) -> int:
    median = {name: statistics.median(r.requests_per_s for r in rs) for name, rs in runs.items()}
    ratio = {name: statistics.median(ratios(runs, name)) for name in (*BUDGETS, "budget")}
    print("| limiter | req/s (median) | runs | vs no limits (median of rounds) |")
    print("| --- | ---: | --- | --- |")
    for name, value in median.items():
        each = ", ".join(f"{r.requests_per_s:,.0f}" for r in runs[name])
        versus = f"{100 * ratio[name]:.1f}%" if name in ratio else ""
        print(f"| {name} | {value:,.0f} | {each} | {versus} |")
    checks = [
        {
            "name": f"{name} limiter / no limits, req/s at 32 connections",
            "value": f"{100 * ratio[name]:.1f}%",
            "budget": f">= {100 * floor:.0f}%",
            "ok": ratio[name] >= floor,
        }
        for name, floor in BUDGETS.items()
    ]
    budgeted = statistics.median(ratios(runs, "budget", "redis"))
    ratio["budget_vs_redis"] = budgeted
    print(f"\nbudgets: {100 * budgeted:.1f}% of the Redis limiter's req/s (median of rounds)")
    checks.append(
        {
            "name": "redis limiter with budgets / limits only, req/s at 32 connections",
            "value": f"{100 * budgeted:.1f}%",
            "budget": f">= {100 * BUDGETED:.0f}%",
            "ok": budgeted >= BUDGETED,
        }
    )
    print()
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['name']}: {c['value']} (budget {c['budget']})")
    failed = [r for rs in runs.values() for r in rs if r.error_count]
    for r in failed:
        print(f"FAIL  {r.target}: errors {r.errors}")
    args.chunks = 64
    out = {
        "environment": environment(args),
        "median_requests_per_s": median,
        "median_ratio": ratio,
        "runs": {name: [r.__dict__ for r in rs] for name, rs in runs.items()},
        "budgets": checks,
    }
    return finish(args, out, checks, failed=bool(failed))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = wrk_parser(__doc__, "limiter_results.json", duration=3, warmup=3)
    parser.add_argument("--rounds", type=int, default=15)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return measured_report("gateway-bench-limiter-", args, lambda tmp: bench(args, tmp), report)


if __name__ == "__main__":
    sys.exit(main())

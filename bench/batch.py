"""The Batch API's throughput, and what a running batch costs live traffic.

Starts bench/mock_upstream.py and `gateway serve --workers 1` (files in a temporary directory,
`batches.max_concurrency` C, `batches.live_concurrency` set) on free ports, then, after a
warm-up (a small batch and a few live requests):

    live         --lines (10,000) /v1/completions requests sent by C aiohttp clients: req/s
    batch        the same requests as the lines of one batch: lines/s from its creation to
                 status completed (its output file read back and checked)
    live again   the first run repeated: the batch is compared with the mean of the two
    during       wrk at 32 connections (bench/run.py's throughput scenario) for --duration s
                 without a batch, then while a batch of --big-lines (50,000) runs (cancelled
                 afterwards), then without again: req/s of each, and the batch's lines/s
                 meanwhile (from GET /v1/batches/{id}'s request_counts)

Budgets: batch lines/s >= 80% of live req/s at the same concurrency; wrk's req/s during the
batch >= 80% of the mean of the runs without. Prints a markdown table, writes
bench/batch_results.json; exit 1 on a failed budget with --check, 2 when a request or a line
failed or the bench could not measure (as bench/run.py).

    .venv/bin/python bench/batch.py [--duration 10] [--warmup 2] [--concurrency 16] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from run import (
    API_KEY,
    BUSY_GATEWAY_CPU_PERCENT,
    HOST,
    SCENARIOS,
    BenchError,
    Processes,
    Run,
    Target,
    add_gateway_cmd,
    body_file,
    contention_warnings,
    cpu_seconds,
    environment,
    finish,
    free_port,
    gateway_command,
    measured_report,
    probe,
    run_one,
    start_mock,
    wait_ready,
    write_config,
    wrk_parser,
)

MIN_BATCH_VS_LIVE = 0.8
MIN_LIVE_DURING_BATCH = 0.8
THROUGHPUT = next(s for s in SCENARIOS if s.name == "throughput")
POLL_S = 0.05  # how often the bench asks for a batch's status
# A batch's end (completed, or cancelled) is awaited at most this long, and a line this often.
FINISH_TIMEOUT_S = 60.0
MIN_LINES_PER_S = 100
WARMUP_LINES = 500  # the batch path's warm-up: one small batch before the measured one
T = TypeVar("T")


@dataclass
class Phase:
    """A timed piece of work: a batch carried out, or requests sent by the bench's own client."""

    name: str
    concurrency: int
    count: int  # lines or requests
    seconds: float
    per_s: float
    failed: int
    cpu_percent: dict[str, float]  # gateway, mock, and the bench's own client where it sends
    # A batch: seconds from its creation to when the bench first saw each status.
    statuses_s: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- the gateway


def start_gateway(procs: Processes, args: argparse.Namespace, mock: Target, tmp: Path) -> Target:
    """run.py's gateway config with files in `tmp` and the batch runner's settings."""
    port = free_port()
    mock_port = int(mock.root.rsplit(":", 1)[1])
    config = write_config(tmp, port, mock_port)
    config.write_text(
        config.read_text()
        + f'files: {{store: "{tmp / "files"}"}}\n'
        + "batches:\n"
        + f"  max_concurrency: {args.concurrency}\n"
        # The lines a batch keeps in flight while live requests are served (batch work yields
        # to live traffic): set here so that a change of the gateway's default shows in the bench.
        + f"  live_concurrency: {args.live_concurrency}\n"
        + f"  poll_s: {POLL_S}\n"
    )
    proc = procs.start("gateway", gateway_command(args.gateway_cmd, config, port))
    wait_ready(f"http://{HOST}:{port}/readyz", procs, "gateway")
    root = f"http://{HOST}:{port}"
    models = {"completions": "bench-model"}
    return Target("gateway", root, models, f"Bearer {API_KEY}", proc.pid)


def custom_id(number: int) -> str:
    return f"line-{number}"


def bodies(base: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The throughput scenario's request, its prompt numbered: `count` small distinct prompts."""
    return [{**base, "prompt": f"{base['prompt']} ({i})"} for i in range(count)]


class Api:
    """The Files and Batch API calls the bench makes, as the benchmark key."""

    def __init__(self, session: aiohttp.ClientSession, gateway: Target) -> None:
        self.session = session
        self.root = gateway.root

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        async with self.session.request(method, f"{self.root}{path}", **kwargs) as response:
            text = await response.text()
            if response.status != 200:
                raise BenchError(f"{method} {path}: HTTP {response.status}: {text[:2000]}")
            return json.loads(text) if "json" in response.content_type else text

    async def upload(self, lines: list[dict[str, Any]]) -> str:
        data = "".join(
            json.dumps(
                {"custom_id": custom_id(i), "method": "POST", "url": "/v1/completions", "body": b}
            )
            + "\n"
            for i, b in enumerate(lines)
        )
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data.encode(), filename="bench.jsonl")
        file_id: str = (await self.call("POST", "/v1/files", data=form))["id"]
        return file_id

    async def create(self, file_id: str) -> dict[str, Any]:
        asked = {
            "input_file_id": file_id,
            "endpoint": "/v1/completions",
            "completion_window": "24h",
        }
        batch: dict[str, Any] = await self.call("POST", "/v1/batches", json=asked)
        return batch

    async def get(self, batch_id: str) -> dict[str, Any]:
        batch: dict[str, Any] = await self.call("GET", f"/v1/batches/{batch_id}")
        return batch

    async def until(
        self,
        batch_id: str,
        done: Callable[[dict[str, Any]], bool],
        what: str,
        seen: dict[str, float] | None = None,
        within_s: float = FINISH_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Polls the batch until `done(batch)`; a batch that ends otherwise fails the bench.
        `seen`: when each status was first seen (time.monotonic())."""
        deadline = time.monotonic() + within_s
        while True:
            batch = await self.get(batch_id)
            if seen is not None:
                seen.setdefault(batch["status"], time.monotonic())
            if done(batch):
                return batch
            if batch["status"] in ("failed", "expired", "cancelled", "completed"):
                raise BenchError(f"batch {batch_id} is {batch['status']}, not {what}: {batch}")
            if time.monotonic() > deadline:
                raise BenchError(f"batch {batch_id} not {what} after {within_s:.0f} s: {batch}")
            await asyncio.sleep(POLL_S)


# ---------------------------------------------------------------- the phases


async def run_batch(
    api: Api, lines: list[dict[str, Any]], concurrency: int, pids: dict[str, int]
) -> Phase:
    """One batch from creation to completed, its output file read back."""
    file_id = await api.upload(lines)
    before = cpu_now(pids)
    started = time.monotonic()
    batch = await api.create(file_id)
    seen: dict[str, float] = {}
    within_s = FINISH_TIMEOUT_S + len(lines) / MIN_LINES_PER_S
    batch = await api.until(
        batch["id"], lambda b: b["status"] == "completed", "completed", seen, within_s
    )
    elapsed = time.monotonic() - started
    cpu = cpu_percent(pids, before, elapsed)
    counts = batch["request_counts"]
    answered = await answers(api, batch)
    wrong = [a for a in answered if a["response"]["status_code"] != 200]
    ids = {a["custom_id"] for a in answered}
    if counts["completed"] != len(lines) or ids != {custom_id(i) for i in range(len(lines))}:
        shown = json.dumps(wrong[0] if wrong else counts)[:2000]
        raise BenchError(f"batch {batch['id']}: {len(answered)} answers, counts {counts}: {shown}")
    statuses = {status: round(at - started, 3) for status, at in seen.items()}
    per_s = round(len(lines) / elapsed, 1)
    return Phase("batch", concurrency, len(lines), round(elapsed, 3), per_s, 0, cpu, statuses)


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def cpu_percent(pids: dict[str, int], before: dict[str, float], seconds: float) -> dict[str, float]:
    return {n: round(100 * (cpu_seconds(p) - before[n]) / seconds, 1) for n, p in pids.items()}


async def answers(api: Api, batch: dict[str, Any]) -> list[dict[str, Any]]:
    if batch["output_file_id"] is None:
        return []
    text: str = await api.call("GET", f"/v1/files/{batch['output_file_id']}/content")
    return [json.loads(line) for line in text.splitlines() if line]


async def run_live(
    session: aiohttp.ClientSession,
    gateway: Target,
    lines: list[dict[str, Any]],
    concurrency: int,
    pids: dict[str, int],
) -> Phase:
    """The lines sent as live requests by `concurrency` clients, each taking the next line."""
    url = gateway.url("completions")
    headers = {"Authorization": gateway.authorization, "Content-Type": "application/json"}
    payloads = iter([json.dumps(line).encode() for line in lines])
    statuses: Counter[int] = Counter()

    async def client() -> None:
        for payload in payloads:
            async with session.post(url, data=payload, headers=headers) as response:
                await response.read()
                statuses[response.status] += 1

    before, own = cpu_now(pids), time.process_time()  # own: this process, not its children
    started = time.monotonic()
    try:
        await asyncio.gather(*(client() for _ in range(concurrency)))
    except aiohttp.ClientError as exc:
        raise BenchError(f"live request failed: {exc!r}") from exc
    elapsed = time.monotonic() - started
    cpu = cpu_percent(pids, before, elapsed)
    cpu["client"] = round(100 * (time.process_time() - own) / elapsed, 1)
    failed = sum(count for status, count in statuses.items() if status != 200)
    if failed:
        print(f"  ERROR live: statuses {dict(statuses)}", file=sys.stderr)
    return Phase(
        "live",
        concurrency,
        len(lines),
        round(elapsed, 3),
        round(len(lines) / elapsed, 1),
        failed,
        cpu,
    )


@dataclass
class During:
    """wrk's throughput runs: without a batch, while one runs, and without again."""

    before: Run
    with_batch: Run
    after: Run
    batch_lines: int
    batch_lines_per_s: float  # the batch's progress over the wrk run (with its warm-up)
    batch_failed: int  # its lines that failed by the end of the wrk run

    @property
    def ratio(self) -> float:
        """Against the mean of the runs around it: the machine's drift cancels out."""
        without = (self.before.requests_per_s + self.after.requests_per_s) / 2
        return self.with_batch.requests_per_s / without


async def run_during(
    api: Api, gateway: Target, args: argparse.Namespace, tmp: Path, pids: dict[str, int]
) -> During:
    before = await asyncio.to_thread(run_one, gateway, THROUGHPUT, args, tmp, pids)
    base = json.loads(body_file(tmp, gateway, THROUGHPUT).read_text())
    file_id = await api.upload(bodies(base, args.big_lines))
    batch_id = (await api.create(file_id))["id"]
    say(f"during: a batch of {args.big_lines} lines")
    try:
        # Under way: lines answered, so the runner has read and checked its input file.
        started = await api.until(batch_id, lambda b: b["request_counts"]["completed"] > 0, "run")
        started_at = time.monotonic()
        with_batch = await asyncio.to_thread(run_one, gateway, THROUGHPUT, args, tmp, pids)
        now = await api.get(batch_id)
        elapsed = time.monotonic() - started_at
    finally:
        with suppress(BenchError):  # an error of its own is the one to see
            await api.call("POST", f"/v1/batches/{batch_id}/cancel")
    if now["status"] != "in_progress":
        raise BenchError(
            f"the batch of {args.big_lines} lines was {now['status']} before wrk ended: "
            "it must outlast the run (a shorter --duration, or more --big-lines up to 50,000)"
        )
    await api.until(batch_id, lambda b: b["status"] == "cancelled", "cancelled")
    after = await asyncio.to_thread(run_one, gateway, THROUGHPUT, args, tmp, pids)
    done = lines_done(now) - lines_done(started)
    failed = now["request_counts"]["failed"]
    return During(before, with_batch, after, args.big_lines, round(done / elapsed, 1), failed)


def lines_done(batch: dict[str, Any]) -> int:
    return sum(batch["request_counts"][k] for k in ("completed", "failed"))


async def bench_async(
    args: argparse.Namespace, gateway: Target, mock: Target, tmp: Path
) -> dict[str, Any]:
    """Live, the batch, live again (the batch compared with the mean of the two), then wrk
    around a batch."""
    pids = {"gateway": gateway.pid, "mock": mock.pid}
    base = json.loads(body_file(tmp, gateway, THROUGHPUT).read_text())
    lines = bodies(base, args.lines)
    c = args.concurrency
    connector = aiohttp.TCPConnector(limit=max(c, 4))
    auth = {"Authorization": gateway.authorization}
    async with aiohttp.ClientSession(connector=connector, headers=auth) as session:
        api = Api(session, gateway)
        if args.warmup > 0:
            say(f"warm-up: a batch of {WARMUP_LINES} lines, {WARMUP_LINES} live requests")
            await run_batch(api, lines[:WARMUP_LINES], c, pids)
            await run_live(session, gateway, lines[:WARMUP_LINES], c, pids)
        say(f"live: {args.lines} requests by {c} clients")
        live = [await run_live(session, gateway, lines, c, pids)]
        say(f"batch: {args.lines} lines, max_concurrency {c}")
        batch = await run_batch(api, lines, c, pids)
        say(f"live: {args.lines} requests by {c} clients")
        live.append(await run_live(session, gateway, lines, c, pids))
        during = await run_during(api, gateway, args, tmp, pids)
    return {"batch": batch, "live": live, "during": during}


def say(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """On uvloop where it is installed: the live client's own cost kept low."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    procs = Processes(tmp)
    try:
        mock = start_mock(procs, 64)
        gateway = start_gateway(procs, args, mock, tmp)
        probe(gateway, THROUGHPUT, tmp)
        return run_loop(bench_async(args, gateway, mock, tmp))
    finally:
        procs.close()


# ---------------------------------------------------------------- report


def cpu_text(cpu: dict[str, float]) -> str:
    return " + ".join(f"{name} {value:.0f}%" for name, value in cpu.items())


def serving_per_s(batch: Phase) -> float | None:
    """The lines/s of the batch's in_progress status: without validating and finalizing."""
    began, ended = batch.statuses_s.get("in_progress"), batch.statuses_s.get("finalizing")
    if began is None or ended is None or ended <= began:
        return None
    return round(batch.count / (ended - began), 1)


def live_per_s(live: list[Phase]) -> float:
    return sum(phase.per_s for phase in live) / len(live)


def markdown(batch: Phase, live: list[Phase], during: During, env: dict[str, Any]) -> str:
    c = batch.concurrency
    wrk_rows = (
        ("no batch", during.before, ""),
        (
            f"during a {during.batch_lines:,}-line batch",
            during.with_batch,
            f"{100 * during.ratio:.1f}% of no batch (mean of before and after); "
            f"the batch meanwhile {during.batch_lines_per_s:,.0f} lines/s",
        ),
        ("no batch, after", during.after, ""),
    )
    rows = [
        "| scenario | rate | CPU | versus |",
        "| --- | ---: | --- | --- |",
        f"| live, {live[0].count:,} requests, {c} aiohttp clients | {live[0].per_s:,.0f} req/s "
        f"| {cpu_text(live[0].cpu_percent)} | |",
        f"| batch, {batch.count:,} lines, max_concurrency {c} | {batch.per_s:,.0f} lines/s | "
        f"{cpu_text(batch.cpu_percent)} | {100 * batch.per_s / live_per_s(live):.1f}% of live "
        "(mean of before and after) |",
        f"| live again | {live[1].per_s:,.0f} req/s | {cpu_text(live[1].cpu_percent)} | |",
        *(
            f"| wrk, {run.connections} conn, {label} | {run.requests_per_s:,.0f} req/s | "
            f"{cpu_text(run.cpu_percent)} | {versus} |"
            for label, run, versus in wrk_rows
        ),
        "",
        f"{env['cpus']} CPUs, Python {env['python']}, {env['wrk']}, wrk {env['duration_s']} s per "
        f"run after a {env['warmup_s']} s warm-up; gateway with 1 worker, batches.max_concurrency "
        f"{c}, live_concurrency {env['live_concurrency']}; CPU: the gateway's and the mock's "
        "processes, client = this script's aiohttp client.",
    ]
    if batch.statuses_s:
        seen = ", ".join(f"{status} at {at:.2f} s" for status, at in batch.statuses_s.items())
        rows.append(f"The batch of {batch.count:,} lines after its creation: {seen}.")
        serving = serving_per_s(batch)
        if serving is not None:
            rows[-1] += f" Serving its lines (in_progress to finalizing): {serving:,.0f} lines/s."
    return "\n".join(rows)


def checks_of(batch: Phase, live: list[Phase], during: During) -> list[dict[str, Any]]:
    ratio = batch.per_s / live_per_s(live)
    return [
        {
            "name": f"batch lines/s / live req/s at concurrency {batch.concurrency}",
            "value": f"{100 * ratio:.1f}%",
            "budget": f">= {100 * MIN_BATCH_VS_LIVE:.0f}%",
            "ok": ratio >= MIN_BATCH_VS_LIVE,
        },
        {
            "name": "live req/s at 32 connections during a batch / without",
            "value": f"{100 * during.ratio:.1f}%",
            "budget": f">= {100 * MIN_LIVE_DURING_BATCH:.0f}%",
            "ok": during.ratio >= MIN_LIVE_DURING_BATCH,
        },
    ]


def notes(live: list[Phase], during: During) -> list[str]:
    """bench/run.py's warning where one gateway worker under load used less than a CPU."""
    warnings = contention_warnings([during.before, during.with_batch, during.after])
    for phase in live:
        cpu = phase.cpu_percent["gateway"]
        if cpu < BUSY_GATEWAY_CPU_PERCENT:
            warnings.append(
                f"live: the gateway used only {cpu:.0f}% CPU under {phase.concurrency} clients; "
                "the machine was probably busy with other work, so rerun on a quiet machine"
            )
    return warnings


def report(measured_: dict[str, Any], args: argparse.Namespace) -> int:
    batch, live, during = measured_["batch"], measured_["live"], measured_["during"]
    env = environment(args)
    env["concurrency"] = args.concurrency
    env["live_concurrency"] = args.live_concurrency
    checks = checks_of(batch, live, during)
    print(markdown(batch, live, during, env))
    print()
    for check in checks:
        verdict = "PASS" if check["ok"] else "FAIL"
        print(f"{verdict}  {check['name']}: {check['value']} (budget {check['budget']})")
    failures = [f"live: {phase.failed} requests failed" for phase in live if phase.failed]
    if during.batch_failed:
        failures.append(f"the batch during wrk: {during.batch_failed} lines failed")
    failures += [
        f"wrk {run.connections} conn: errors {run.errors}"
        for run in (during.before, during.with_batch, during.after)
        if run.error_count
    ]
    for failure in failures:
        print(f"FAIL  {failure}")
    for warning in notes(live, during):
        print(f"NOTE  {warning}")
    results = {
        "environment": env,
        "batch": asdict(batch),
        "live": [asdict(phase) for phase in live],
        "during_batch": asdict(during),
        "batch_serving_lines_per_s": serving_per_s(batch),
        "batch_vs_live": round(batch.per_s / live_per_s(live), 4),
        "live_during_batch_ratio": round(during.ratio, 4),
        "budgets": checks,
    }
    return finish(args, results, checks, failed=bool(failures))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = wrk_parser(__doc__, "batch_results.json", duration=10, warmup=2)
    parser.add_argument("--lines", type=int, default=10_000, help="the measured batch's lines")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="batches.max_concurrency and live clients"
    )
    parser.add_argument(
        "--live-concurrency",
        type=int,
        default=1,
        help="batches.live_concurrency: a batch's lines in flight while live requests are served",
    )
    parser.add_argument(
        "--big-lines", type=int, default=50_000, help="lines of the batch run during wrk"
    )
    add_gateway_cmd(parser)
    parser.set_defaults(chunks=64)  # for run.environment()
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return measured_report("gateway-bench-batch-", args, lambda tmp: bench(args, tmp), report)


if __name__ == "__main__":
    sys.exit(main())

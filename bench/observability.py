"""What the request log and tracing cost: the same wrk load through gateways on the mock
upstream that differ only in them, each with 1 worker and with metrics on:

    off     no request log, no tracing
    log     request_log: {path: /dev/null}
    traced  telemetry: {otlp_endpoint: <receiver>, sample_ratio: 1.0}
    both    the request log and tracing, as above
    floor   the least `both` can cost with the SDK: the request log (into a pipe), and beside
            the gateway a feeder that makes each logged request's record (as the gateway's
            tracing does) and hands it to the same export child: the SDK's spans and OTLP
            exporter, none of the gateway's own tracing work
    before  (with --before TREE) the `off` config on the gateway of an older tree: a git
            worktree, run with that tree's code (`python -m gateway` from it) and this venv

The traced gateways export to a tiny OTLP/HTTP receiver (this script with --receiver, a process
of its own) that answers each `POST /v1/traces` at once: 200, `application/x-protobuf`, an empty
body (an empty ExportTraceServiceResponse). It counts the exports, their bytes and their spans
(each body decoded as an ExportTraceServiceRequest after the answer), one port per gateway; a
traced run that exported no span fails the bench, as does a wrk run with a socket error or an
HTTP status >= 400 (exit 2).

Each gateway runs the throughput scenario (completions) and chat, at 32 connections, one at a
time, over short rounds, every other round in the reverse order; each round compares each
gateway with `off` of the same round and scenario, and the report is the median over rounds.

    .venv/bin/python bench/observability.py [--rounds 3] [--duration 5] [--warmup 1] [--check]
        [--before /tmp/before] [--no-tracing]

Budgets: both >= 85% of off's requests/s (with --no-tracing, log instead); with --before,
off >= 98% of before's. Where the floor itself misses 85% of off (the SDK's encoding takes the
CPU the load and the upstream need on a small machine), the bench says FLOOR and reports both's
share of the floor. Writes bench/observability_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from random import getrandbits
from typing import Any

import orjson
from run import (
    API_KEY,
    BUSY_GATEWAY_CPU_PERCENT,
    DEFAULT_GATEWAY_CMD,
    GATEWAY_MODELS,
    HOST,
    SCENARIOS,
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
    tree_pids,
    wait_ready,
    wrk,
    wrk_parser,
)

BOTH = 0.85  # both (request log and tracing) against off
BEFORE = 0.98  # off against the gateway from before the feature
GATEWAYS = {
    "off": "no request log, no tracing",
    "log": "request_log: {path: /dev/null}",
    "traced": "telemetry: sample_ratio 1.0 to the receiver",
    "both": "request_log /dev/null and telemetry sample_ratio 1.0",
    "before": "the off config on the --before tree",
    "floor": "request_log into a pipe, its lines traced by a feeder's export child (the SDK)",
}
LOGGED = frozenset({"log", "both", "floor"})
TRACED = frozenset({"traced", "both"})
EXPORTED = TRACED | {"floor"}  # a port of the receiver each
EXPORTER = "gateway.observability.export"  # the export child's command line holds it
CHOSEN = ("throughput", "chat")
MEASURED = tuple(s for s in SCENARIOS if s.name in CHOSEN)
SETTLE_S = 20.0  # at most this long at the end for the last exports to arrive
QUIET_S = 3.0  # ...or until none has for this long (the gateway's exporter waits 0.5 s at most)
DROPPED = {
    "request_log_lines": "gateway_request_log_dropped_lines_total",
    "spans": "gateway_telemetry_dropped_spans_total",
}


# ---------------------------------------------------------------- the OTLP receiver


@dataclass
class Seen:
    """What one port of the receiver got."""

    requests: int = 0
    bytes: int = 0  # the bodies as read (decompressed when sent with a content-encoding)
    spans: int = 0
    undecoded: int = 0  # bodies that are not an ExportTraceServiceRequest
    content_types: Counter[str] = field(default_factory=Counter)
    content_encodings: Counter[str] = field(default_factory=Counter)
    paths: Counter[str] = field(default_factory=Counter)


def receive(ports: list[int]) -> None:
    """The receiver's process: `POST /v1/traces` answered at once on each port, counted per
    port; `GET /stats` tells that port's counts."""
    import asyncio

    from aiohttp import web
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    def count(seen: Seen, body: bytes) -> None:
        try:
            message = ExportTraceServiceRequest.FromString(body)
        except DecodeError:
            seen.undecoded += 1
            return
        seen.spans += sum(
            len(scope.spans)
            for resource in message.resource_spans
            for scope in resource.scope_spans
        )

    def app() -> web.Application:
        seen = Seen()

        async def traces(request: web.Request) -> web.Response:
            body = await request.read()
            seen.requests += 1
            seen.bytes += len(body)
            seen.paths[request.path] += 1
            seen.content_types[request.headers.get("content-type", "")] += 1
            seen.content_encodings[request.headers.get("content-encoding", "identity")] += 1
            asyncio.get_running_loop().call_soon(count, seen, body)  # once answered
            return web.Response(body=b"", content_type="application/x-protobuf")

        async def stats(request: web.Request) -> web.Response:
            return web.json_response(seen.__dict__)

        application = web.Application(client_max_size=64 * 1024 * 1024)
        application.router.add_post("/v1/traces", traces)
        application.router.add_get("/stats", stats)
        application.router.add_post("/{tail:.*}", traces)  # counted by path: a wrong one shows
        return application

    async def serve() -> None:
        for port in ports:
            runner = web.AppRunner(app(), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, HOST, port).start()
        await asyncio.Event().wait()

    asyncio.run(serve())


def start_receiver(procs: Processes, names: list[str]) -> dict[str, str]:
    """The receiver with one port per traced gateway: its root URL for each."""
    roots = {name: f"http://{HOST}:{free_port()}" for name in names}
    ports = ",".join(root.rsplit(":", 1)[1] for root in roots.values())
    procs.start("otlp-receiver", [sys.executable, __file__, "--receiver", ports])
    for root in roots.values():
        wait_ready(f"{root}/stats", procs, "otlp-receiver")
    return roots


def receiver_stats(root: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{root}/stats", timeout=10) as response:
        stats: dict[str, Any] = json.loads(response.read())
        return stats


# ---------------------------------------------------------------- the floor's feeder


def feed(fifo: str, receiver: str) -> None:
    """The feeder's process: each request log line the floor gateway writes into `fifo` made
    into the record the gateway's tracing would send for that request (its ids, times, alias,
    target, tokens and try, from the line), handed to an export child (the gateway's Tracing:
    the same child, SDK and exporter as a traced gateway's) exporting to `receiver`."""
    import asyncio

    from gateway.observability.tracing import Tracing

    async def run() -> None:
        exporter = {"endpoint": f"{receiver}/v1/traces", "protocol": "http/protobuf"}
        tracing = Tracing(exporter | {"headers": None}, 1.0, False, lambda n: None)
        tracing.start()
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        keep = os.open(fifo, os.O_WRONLY)  # never at its end while the gateway reopens it
        held = [b""]

        def readable() -> None:
            with suppress(BlockingIOError):
                *lines, held[0] = (held[0] + os.read(reader, 1 << 20)).split(b"\n")
                for line in lines:
                    tracing.emit(traced(orjson.loads(line)))

        asyncio.get_running_loop().add_reader(reader, readable)
        try:
            await asyncio.Event().wait()
        finally:
            os.close(keep)

    asyncio.run(run())


OPERATIONS = {"completions": "text_completion", "chat/completions": "chat"}


def traced(line: dict[str, Any]) -> list[Any]:
    """A request log line as the record (gateway.observability.tracing.Record) a traced
    gateway sends for it: a request answered at its tries, no events, no content."""
    end = time.perf_counter()
    start = end - line["latency_ms"] / 1e3
    trace = f"{getrandbits(128) or 1:032x}"
    tries, at = [], start
    for attempt in line["attempts"] or ():
        took = attempt["duration_ms"] / 1e3
        parent = f"00-{trace}-{getrandbits(64) or 1:016x}-01"
        tries.append([attempt["target"], attempt["outcome"], at, took, attempt["wait_ms"] / 1e3,
                      parent])  # fmt: skip
        at += took
    usage = line["usage"] or {}
    endpoint = line["endpoint"]
    return [
        trace, "", False, start, start, end, "POST", f"/v1/{endpoint}", line["status"],
        line["request_id"], "wrk", None, None, OPERATIONS.get(endpoint, endpoint),
        line["model"], line["provider"], line["upstream_model"], f"cmpl-{trace[:24]}", ["length"],
        usage.get("prompt"), usage.get("completion"), [16, None, None, None, None, None],
        None, None, [], None, tries, None,
    ]  # fmt: skip


def exporter_pid(pid: int) -> int | None:
    """A traced gateway's export child, among its process's descendants."""
    for current in tree_pids(pid):
        with suppress(OSError):
            if EXPORTER in Path(f"/proc/{current}/cmdline").read_text():
                return current
    return None


# ---------------------------------------------------------------- the gateways


def config(name: str, port: int, mock_port: int, receiver: str | None, log: str) -> str:
    text = (
        f"server: {{host: {HOST}, port: {port}}}\n"
        "auth:\n"
        "  keys:\n"
        f"    - {{id: bench, key: {API_KEY}}}\n"
        "providers:\n"
        f'  mock: {{type: openai-compatible, base_url: "http://{HOST}:{mock_port}/v1"}}\n'
        "models:\n"
        "  bench-model: {targets: [{provider: mock, model: mock-model}]}\n"
    )
    if name in LOGGED:
        text += f'request_log: {{path: "{log}"}}\n'
    if name in TRACED:
        assert receiver is not None
        text += f'telemetry: {{otlp_endpoint: "{receiver}", sample_ratio: 1.0}}\n'
    return text


def start_gateway(
    procs: Processes,
    name: str,
    mock: Target,
    receiver: str | None,
    tmp: Path,
    before: Path | None,
) -> Target:
    port = free_port()
    mock_port = int(mock.root.rsplit(":", 1)[1])
    path, log = tmp / f"{name}.yaml", "/dev/null"
    if name == "floor":
        assert receiver is not None
        log = str(tmp / "floor.fifo")
        os.mkfifo(log)
        procs.start("floor-feeder", [sys.executable, __file__, "--feeder", f"{log},{receiver}"])
    path.write_text(config(name, port, mock_port, receiver if name in TRACED else None, log))
    cmd = gateway_command(DEFAULT_GATEWAY_CMD, path, port)
    if name == "before":  # that tree's packages first on the path, this venv's dependencies
        assert before is not None
        cmd = ["env", "-C", str(before), f"PYTHONPATH={before}", *cmd]
    proc = procs.start(name, cmd)
    try:
        wait_ready(f"http://{HOST}:{port}/readyz", procs, name)
    except BenchError as exc:
        if name in TRACED:
            hint = (
                "\n(a gateway without the `telemetry` config yet? --no-tracing measures the rest)"
            )
            raise BenchError(f"{exc}{hint}") from exc
        raise
    return Target(name, f"http://{HOST}:{port}", GATEWAY_MODELS, f"Bearer {API_KEY}", proc.pid)


def dropped(target: Target) -> dict[str, float]:
    """The gateway's counters of dropped request log lines and spans (those it has)."""
    request = urllib.request.Request(
        f"{target.root}/metrics", headers={"Authorization": target.authorization}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        for key, metric in DROPPED.items():
            if line.startswith((f"{metric} ", f"{metric}{{")):
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# ---------------------------------------------------------------- the bench


@dataclass
class Measured:
    runs: dict[str, dict[str, list[Run]]]  # scenario → gateway → its runs, round by round
    spans: dict[str, list[int]]  # traced gateway → spans received from each run's start on
    sent: dict[str, int]  # gateway → requests sent (probes, warm-ups and runs)
    received: dict[str, dict[str, Any]]  # traced gateway → the receiver's counts at the end
    dropped: dict[str, dict[str, float]]  # gateway → its dropped lines and spans
    settle_s: float = 0.0
    before: dict[str, str] = field(default_factory=dict)


def names(args: argparse.Namespace) -> list[str]:
    chosen = ["off", "log"] if args.no_tracing else ["off", "log", "traced", "both", "floor"]
    return chosen + (["before"] if args.before is not None else [])


def bench(args: argparse.Namespace, tmp: Path) -> Measured:
    procs = Processes(tmp)
    gateways = names(args)
    runs: dict[str, dict[str, list[Run]]] = {s.name: {n: [] for n in gateways} for s in MEASURED}
    traced = [n for n in gateways if n in EXPORTED]
    marks: dict[str, list[int]] = {n: [] for n in traced}  # spans received at each run's start
    sent = dict.fromkeys(gateways, 0)
    try:
        mock = start_mock(procs, 64)
        roots = start_receiver(procs, traced) if traced else {}
        targets = [start_gateway(procs, n, mock, roots.get(n), tmp, args.before) for n in gateways]
        pids = {"mock": mock.pid}
        if traced:
            pids["receiver"] = procs.procs["otlp-receiver"].pid
        exporters = {t.name: exporter_pid(t.pid) for t in targets if t.name in TRACED}
        if "floor" in gateways:
            exporters["floor"] = procs.procs["floor-feeder"].pid  # and its export child
        for target in targets:
            for scenario in MEASURED:
                probe(target, scenario, tmp)
                sent[target.name] += 1
        for target in targets:  # once: later rounds follow each other closely
            for scenario in MEASURED:
                sent[target.name] += wrk(target, scenario, args.warmup, tmp)["requests"]
        for n in range(args.rounds):
            # every other round backwards: a drift within a round favours no gateway
            for scenario in MEASURED:
                for target in targets if n % 2 == 0 else targets[::-1]:
                    if target.name in roots:
                        marks[target.name].append(receiver_stats(roots[target.name])["spans"])
                    print(f"  round {n + 1} {scenario.name} {target.name}", file=sys.stderr)
                    watched = {"gateway": target.pid} | pids
                    if exporters.get(target.name):
                        watched["exporter"] = exporters[target.name]  # (also in the gateway's)
                    run = measure(target, scenario, args.duration, tmp, watched)
                    runs[scenario.name][target.name].append(run)
                    sent[target.name] += run.requests
        started = time.monotonic()
        received = settle(roots)
        spans = {
            n: [b - a for a, b in zip(marks[n], [*marks[n][1:], received[n]["spans"]], strict=True)]
            for n in traced
        }
        measured = Measured(
            runs, spans, sent, received, {t.name: dropped(t) for t in targets},
            settle_s=round(time.monotonic() - started, 1),
        )  # fmt: skip
    finally:
        procs.close()
    if args.before is not None:
        commit = subprocess.run(
            ["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        measured.before = {"path": str(args.before), "commit": commit}
    return measured


def settle(roots: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The receiver's counts once the last exports arrived: none new for QUIET_S, or at most
    SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    last: dict[str, dict[str, Any]] = {}
    changed = time.monotonic()
    while True:
        now = {name: receiver_stats(root) for name, root in roots.items()}
        if any(now[n]["requests"] != last.get(n, {}).get("requests") for n in roots):
            changed = time.monotonic()
        last = now
        if time.monotonic() - changed > QUIET_S or time.monotonic() > deadline:
            return last
        time.sleep(0.25)


# ---------------------------------------------------------------- the report


def ratios(runs: dict[str, list[Run]], name: str, base: str = "off") -> list[float]:
    """Per round, against the run of `base` of the same round: the machine's drift between
    rounds cancels out."""
    return [
        r.requests_per_s / b.requests_per_s for r, b in zip(runs[name], runs[base], strict=True)
    ]


def spans_by_scenario(measured: Measured, name: str) -> dict[str, list[int]]:
    """A traced gateway's spans per run, split back by scenario (the runs' order in `bench`)."""
    out: dict[str, list[int]] = {s.name: [] for s in MEASURED}
    for i, spans in enumerate(measured.spans.get(name, [])):
        out[MEASURED[i % len(MEASURED)].name].append(spans)
    return out


def budget(name: str, value: float, minimum: float, floor: float | None = None) -> dict[str, Any]:
    """A budget's verdict; `floor`: what the floor gateway reached against the same base. Where
    it misses `minimum` too, the share of it `value` is is reported (FLOOR), not failed."""
    share = None
    if floor is not None and floor < minimum and value < minimum:
        share = f"the floor reached {100 * floor:.1f}%; this is {100 * value / floor:.1f}% of it"
    return {"name": name, "value": f"{100 * value:.1f}%", "budget": f">= {100 * minimum:.0f}%",
            "ok": value >= minimum or share is not None, "floor": share}  # fmt: skip


def exporter_cost(runs: dict[str, dict[str, list[Run]]]) -> dict[str, float]:
    """Per gateway with an export child: its CPU a request, in µs (the floor's: the feeder's)."""
    each: dict[str, list[float]] = {}
    for by in runs.values():
        for name, rs in by.items():
            for r in rs:
                if "exporter" in r.cpu_percent and r.requests:
                    used = r.cpu_percent["exporter"] / 100 * r.duration_s
                    each.setdefault(name, []).append(1e6 * used / r.requests)
    return {name: statistics.median(costs) for name, costs in each.items()}


def report(measured: Measured, args: argparse.Namespace) -> int:
    runs = measured.runs
    median = {
        scenario: {name: statistics.median(r.requests_per_s for r in rs) for name, rs in by.items()}
        for scenario, by in runs.items()
    }
    ratio = {
        scenario: {name: statistics.median(ratios(by, name)) for name in by if name != "off"}
        for scenario, by in runs.items()
    }
    spans = {name: spans_by_scenario(measured, name) for name in measured.spans}
    print("| scenario | gateway | req/s (median) | runs | vs off (median of rounds) | spans |")
    print("| --- | --- | ---: | --- | --- | ---: |")
    for scenario, by in runs.items():
        for name, rs in by.items():
            each = ", ".join(f"{r.requests_per_s:,.0f}" for r in rs)
            versus = ""
            if name == "before":
                versus = f"off is {100 / ratio[scenario][name]:.1f}% of it"
            elif name != "off":
                versus = f"{100 * ratio[scenario][name]:.1f}%"
            if name == "both" and "floor" in by:
                of_floor = statistics.median(ratios(by, "both", "floor"))
                versus += f" ({100 * of_floor:.1f}% of floor)"
            got = spans.get(name, {}).get(scenario)
            per = ""
            if got:
                per = f"{sum(got):,} ({sum(got) / sum(r.requests for r in rs):.2f} a request)"
            print(f"| {scenario}, 32 conn | {name} | {median[scenario][name]:,.0f} | {each} | "
                  f"{versus} | {per} |")  # fmt: skip
    args.chunks = 64  # the mock's streams (none here): environment() reports it
    env = environment(args)
    note = (
        f"\n{env['cpus']} CPUs, {args.rounds} rounds of {args.duration} s per gateway and "
        f"scenario after a {args.warmup} s warm-up; 1 worker each, metrics on."
    )
    if measured.spans:
        note += (
            " spans: received by the OTLP receiver from the start of each run to the next run of "
            "that gateway (its warm-up in the first)."
        )
    print(note)
    held = "log" if args.no_tracing else "both"
    checks = [
        budget(
            f"{held} / off, {scenario} req/s at 32 connections",
            ratio[scenario][held],
            BOTH,
            ratio[scenario].get("floor"),
        )
        for scenario in runs
    ]
    off_vs_before: dict[str, float] = {}
    if args.before is not None:
        for scenario in runs:
            off_vs_before[scenario] = statistics.median(ratios(runs[scenario], "off", "before"))
            commit = measured.before["commit"]
            before = f"before ({commit})" if commit else "before"
            name = f"off / {before}, {scenario} req/s at 32 connections"
            checks.append(budget(name, off_vs_before[scenario], BEFORE))
    print()
    for c in checks:
        verdict = "FAIL" if not c["ok"] else "FLOOR" if c.get("floor") else "PASS"
        floor = f"; the floor misses it too: {c['floor']}" if c.get("floor") else ""
        print(f"{verdict}  {c['name']}: {c['value']} (budget {c['budget']}){floor}")
    for name, cost in exporter_cost(runs).items():
        print(f"CPU   {name}: its export child {cost:,.0f} µs of CPU a request (median of runs)")
    if args.no_tracing:
        print("NOTE  --no-tracing: the traced gateways were not run; log stands in for both")
    failed = [r for by in runs.values() for rs in by.values() for r in rs if r.error_count]
    for r in failed:
        print(f"FAIL  {r.scenario} {r.target}: errors {r.errors}")
    silent = [n for n, each in measured.spans.items() if not each or min(each) <= 0]
    for name in silent:
        print(f"FAIL  {name}: a run exported no span (spans from each run on: {spans[name]})")
    for name, seen in measured.received.items():
        kinds = ", ".join(f"{k} {v}" for k, v in seen["content_encodings"].items())
        print(
            f"OTLP  {name}: {seen['requests']:,} exports ({kinds}), {seen['bytes']:,} bytes, "
            f"{seen['spans']:,} spans for {measured.sent[name]:,} requests sent "
            f"({seen['undecoded']} undecodable); paths {seen['paths']}"
        )
    if measured.received:
        print(f"OTLP  waited {measured.settle_s} s at the end for the last exports")
    for name, counts in measured.dropped.items():
        if any(counts.values()):
            print(f"NOTE  {name} dropped: {counts}")
    busy = [r.cpu_percent["gateway"] for by in runs.values() for rs in by.values() for r in rs]
    starved = [cpu for cpu in busy if cpu < BUSY_GATEWAY_CPU_PERCENT]
    if starved:
        print(
            f"NOTE  in {len(starved)} of {len(busy)} runs the gateway used less than "
            f"{BUSY_GATEWAY_CPU_PERCENT:.0f}% CPU under load (least {min(starved):.0f}%): the "
            "machine was probably busy with other work, so rerun on a quiet machine"
        )
    out = {
        "environment": env,
        "gateways": {name: GATEWAYS[name] for name in names(args)},
        "before": measured.before or None,
        "median_requests_per_s": median,
        "median_ratio_to_off": ratio,
        "median_off_vs_before": off_vs_before or None,
        "runs": {
            scenario: {
                name: [
                    r.__dict__ | ({"spans": spans[name][scenario][i]} if name in spans else {})
                    for i, r in enumerate(rs)
                ]
                for name, rs in by.items()
            }
            for scenario, by in runs.items()
        },
        "otlp_received": measured.received,
        "requests_sent": measured.sent,
        "dropped": measured.dropped,
        "budgets": checks,
    }
    return finish(args, out, checks, failed=bool(failed or silent))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = wrk_parser(__doc__, "observability_results.json", duration=5, warmup=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--before",
        type=Path,
        help="a git worktree of an older commit: its gateway (the off config) is measured too",
    )
    parser.add_argument(
        "--no-tracing", action="store_true", help="only off and log (and before): no telemetry"
    )
    parser.add_argument("--receiver", help=argparse.SUPPRESS)  # PORT,…: the receiver's process
    parser.add_argument("--feeder", help=argparse.SUPPRESS)  # FIFO,RECEIVER: the floor's feeder
    args = parser.parse_args(argv)
    if args.before is not None:
        args.before = args.before.resolve()
        if not (args.before / "gateway" / "__main__.py").is_file():
            parser.error(f"--before {args.before}: not a tree of the gateway (no gateway/)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.receiver:
        receive([int(port) for port in args.receiver.split(",")])
        return 0
    if args.feeder:
        fifo, receiver = args.feeder.split(",", 1)
        feed(fifo, receiver)
        return 0
    prefix = "gateway-bench-observability-"
    return measured_report(prefix, args, lambda tmp: bench(args, tmp), report)


if __name__ == "__main__":
    sys.exit(main())

"""The long soak, `make soak` (never part of `make test`: pytest collects this file only when its
path is on the command line, as `make soak` gives it, since its name is not test_*.py).

GATEWAY_SOAK_S (600) seconds of mixed traffic through one gateway worker on the scripted
upstreams: CONCURRENCY (16) clients cycle through completions and chat (plain, streamed, upstream
500s, 429s, slow first bytes, dropped connections, streams failing midway, callers leaving a
stream) and embeddings (plain, 500s, 429s, dropped connections), while tests/e2e/test_soak.py's
saboteur queues resets, cut streams, delays and 503s on each upstream in turn, and a batch of
BATCH_LINES completions is always in progress (a new one started when the last one finishes;
each finished one must be `completed`, every line in its output or its error file). Every
request must end answered or with an OpenAI-shaped error (test_soak's checks).

Every GATEWAY_SOAK_SAMPLE_S (10) s it samples the gateway's resident memory, open files and
asyncio tasks (its /metrics: process_resident_memory_bytes, process_open_fds,
gateway_event_loop_tasks) and its established TCP connections to the two upstreams (its socket
fds matched by inode with /proc/<pid>/net/tcp{,6}): once under load, then, the callers held,
once no live request is in flight any more (about a second; the batch goes on). The counts
under load follow the requests in flight at that instant (tasks between 28 and 43 from one
sample to the next), which would hide a leak or fake one; the quiet sample is what stays
behind, and is what the rule reads. It prints both and writes them, with the verdict, to
GATEWAY_SOAK_OUT (tests/soak/soak_results.json).

The rule, for each of the four: `start` is the mean of the quiet samples of the first window
after the warm-up, [W, W + V) with W = GATEWAY_SOAK_WARMUP_S (120) and V = GATEWAY_SOAK_WINDOW_S
(60); `end` is the largest quiet sample of the last window, (S - V, S]. It fails when
end > start * 1.05 + slack (METRICS: none for memory, a few units for the counts).

    make soak
    GATEWAY_SOAK_S=240 make soak          # shorter: W + 2 V at least
    GATEWAY_SOAK_S=90 GATEWAY_SOAK_WARMUP_S=20 GATEWAY_SOAK_WINDOW_S=20 make soak   # a smoke run:
                                          # memory still climbs for the first 90 s or so
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from openai.types import Batch

from tests.e2e.batches import finished, lines_of, requests, start
from tests.e2e.metrics_text import scrape
from tests.e2e.support import FULL_KEY
from tests.e2e.test_soak import (
    CLIENT_TIMEOUT_S,
    CONCURRENCY,
    QUICK,
    WORKLOAD,
    Tally,
    Usage,
    check_json,
    config,
    exchange,
    saboteur,
    settled,
)
from tests.gateway_proc import GatewayProcess
from tests.upstreams.fixtures import (  # noqa: F401  (pytest fixtures)
    scripted_fireworks_server,
    scripted_openai_server,
)
from tests.upstreams.procs import REPO_ROOT, ScriptedUpstream, free_port


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


SOAK_S = _env("GATEWAY_SOAK_S", 600)
WARMUP_S = _env("GATEWAY_SOAK_WARMUP_S", 120)
WINDOW_S = _env("GATEWAY_SOAK_WINDOW_S", 60)
SAMPLE_S = _env("GATEWAY_SOAK_SAMPLE_S", 10)
OUT = Path(os.environ.get("GATEWAY_SOAK_OUT", REPO_ROOT / "tests/soak/soak_results.json"))
MAX_GROWTH = 0.05
QUIET_DEADLINE_S = 15.0  # a sample waits at most this long for the requests in flight to end
# name: (what it is, absolute slack over the 5%): the noise of a quiet sample. The callers'
# kept-alive connections to the gateway (up to CONCURRENCY, fewer after a caller left or an
# error) move the fds by ±3; a batch in progress or not adds 3 tasks and a connection.
METRICS = {
    "rss_mib": ("resident memory, MiB", 0.0),
    "open_fds": ("open file descriptors", 6.0),
    "tasks": ("asyncio tasks", 5.0),
    "upstream_conns": ("TCP connections to the upstreams", 4.0),
}
RULE = (
    "quiet samples (no live request in flight); start = mean of the window [warm-up, warm-up + "
    "window), end = max of the window (soak - window, soak]; fails when end > start * 1.05 + slack"
)
BATCH_LINES = 1000  # some 15 s under load, one line at a time
BATCH_POLL_S = 0.5
BATCH_END_S = 120.0  # the batch in progress when the traffic stops finishes within this
EMBED_MODELS = {"oai": "text-embedding-3-small", "fw": "nomic-ai/nomic-embed-text-v1.5"}

Check = Callable[[httpx.Response, Tally], None]
# (kind, path, body, leave after k events or None, check of a non-stream answer)
Job = tuple[str, str, dict[str, Any], int | None, Check]


def soak_config(openai_url: str, fireworks_url: str, store: Path) -> str:
    """test_soak's gateway (alias `mix`: OpenAI then Fireworks, one quick retry) plus `emb`
    (embeddings, the same way), a file store and batches."""
    doc = yaml.safe_load(config(openai_url, fireworks_url, free_port()))
    targets = [{"provider": p, "model": m} for p, m in EMBED_MODELS.items()]
    doc["models"]["emb"] = {
        "endpoint": "embeddings",
        "strategy": "fallback",
        "retry": QUICK,
        "targets": targets,
    }
    doc["files"] = {"store": str(store)}
    # One line at a time, as while live requests are served anyway: a quiet sample counts at
    # most one line's connection and the batch's three tasks (its runner, its status, a worker).
    doc["batches"] = {"poll_s": 0.2, "max_concurrency": 1}
    return yaml.safe_dump(doc, sort_keys=False)


def check_embeddings(r: httpx.Response, tally: Tally) -> None:
    if r.status_code != 200:
        return check_json(r, tally)
    body = r.json()
    if not body.get("data") or body.get("usage") is None:
        return tally.bad(f"200 without data or usage: {body}")
    if any(not e.get("embedding") for e in body["data"]):
        return tally.bad(f"an empty embedding: {body}")
    tally.outcomes["ok"] += 1
    return None


def jobs() -> list[Job]:
    """test_soak's completions workload, the same prompts as chat, and embeddings."""
    out: list[Job] = []
    for prompt, stream, leave in WORKLOAD:
        body = {"model": "mix", "prompt": prompt, "max_tokens": 8, "stream": stream}
        out.append(("completions", "/v1/completions", body, leave, check_json))
    for prompt, stream, leave in WORKLOAD:
        messages = [{"role": "user", "content": prompt}]
        body = {"model": "mix", "messages": messages, "max_tokens": 8, "stream": stream}
        out.append(("chat", "/v1/chat/completions", body, leave, check_json))
    for text in ("plain", "fails __status_500__", "throttled __status_429__", "dropped __close__"):
        body = {"model": "emb", "input": [text, "and another"]}
        out.append(("embeddings", "/v1/embeddings", body, None, check_embeddings))
    return out


# ---------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    t_s: float  # when it was due, since the traffic began
    rss_mib: float
    open_fds: int
    tasks: int
    upstream_conns: int
    inflight: int  # live requests being served
    batch_lines: int  # batch lines being served
    requests: int  # answered so far, all kinds


def upstream_connections(pid: int, ports: set[int]) -> int:
    """`pid`'s established TCP connections to any of `ports`: its socket fds' inodes looked up
    in the kernel's TCP tables (no psutil, no ss)."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()  # sl local remote st tx:rx tr:when retrnsmt uid timeout inode
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port in ports and fields[9] in inodes:  # ESTABLISHED
                count += 1
    return count


def sample(gw: GatewayProcess, ports: set[int], t_s: float, requests_done: int) -> Sample:
    metrics = scrape(gw.url)
    return Sample(
        t_s=t_s,
        rss_mib=round(metrics.value("process_resident_memory_bytes") / 2**20, 1),
        open_fds=int(metrics.value("process_open_fds")),
        tasks=int(metrics.value("gateway_event_loop_tasks")),
        upstream_conns=upstream_connections(gw.pid, ports),
        inflight=int(metrics.value("gateway_inflight_requests")),
        batch_lines=int(metrics.value("gateway_batch_lines_in_flight")),
        requests=requests_done,
    )


def quiet_sample(gw: GatewayProcess, ports: set[int], t_s: float, requests_done: int) -> Sample:
    """A sample once no live request is in flight (the callers are held meanwhile); after
    QUIET_DEADLINE_S, whatever it is then."""
    deadline = time.monotonic() + QUIET_DEADLINE_S
    while (s := sample(gw, ports, t_s, requests_done)).inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    return s


HEADER = (
    "   t s  RSS MiB   fds  tasks  upstream  batch lines │ under load: fds tasks upstream "
    "inflight │ requests  pause ms"
)


def row(quiet: Sample, busy: Sample, pause_s: float) -> str:
    return (
        f"{quiet.t_s:>6.0f} {quiet.rss_mib:>8.1f} {quiet.open_fds:>5} {quiet.tasks:>6} "
        f"{quiet.upstream_conns:>9} {quiet.batch_lines:>12} │ {busy.open_fds:>15} "
        f"{busy.tasks:>5} {busy.upstream_conns:>8} {busy.inflight:>8} │ {quiet.requests:>8} "
        f"{1000 * pause_s:>9.0f}"
    )


@dataclass(frozen=True)
class Verdict:
    name: str
    start: float  # mean of the first window after the warm-up
    end: float  # largest sample of the last window
    growth_pct: float
    limit: float  # start * 1.05 + slack
    ok: bool


def verdicts(samples: list[Sample]) -> list[Verdict]:
    first = [s for s in samples if WARMUP_S <= s.t_s < WARMUP_S + WINDOW_S]
    last = [s for s in samples if SOAK_S - WINDOW_S < s.t_s <= SOAK_S]
    assert first and last, f"no samples in a window: soak {SOAK_S} s, warm-up {WARMUP_S} s"
    assert first[-1].t_s < last[0].t_s, "the windows overlap: a longer soak or shorter windows"
    out = []
    for name, (_, slack) in METRICS.items():
        begin = statistics.mean(float(getattr(s, name)) for s in first)
        end = max(float(getattr(s, name)) for s in last)
        limit = begin * (1 + MAX_GROWTH) + slack
        growth = 100 * (end / begin - 1) if begin else 0.0
        ok = end <= limit
        out.append(Verdict(name, round(begin, 2), end, round(growth, 1), round(limit, 2), ok))
    return out


# ---------------------------------------------------------------- the run


@dataclass
class Run:
    tallies: dict[str, Tally]  # per kind of request
    busy: list[Sample] = field(default_factory=list)  # under load
    quiet: list[Sample] = field(default_factory=list)  # once nothing was in flight: the rule's
    pauses_s: list[float] = field(default_factory=list)  # how long the callers were held
    batches: list[dict[str, Any]] = field(default_factory=list)
    batch_problems: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set: the callers may go on

    def answered(self) -> int:
        return sum(sum(t.outcomes.values()) for t in self.tallies.values())


def check_batch(sdk: openai.OpenAI, batch: Batch, run: Run) -> None:
    """A finished batch completed, and each of its lines is in its output or its error file."""
    counts = batch.request_counts
    done: dict[str, Any] = {"id": batch.id, "status": batch.status}
    if batch.completed_at is not None:
        done["seconds"] = batch.completed_at - batch.created_at
    if counts is not None:
        done |= {"total": counts.total, "completed": counts.completed, "failed": counts.failed}
    run.batches.append(done)
    if batch.status != "completed" or counts is None or counts.total != BATCH_LINES:
        return run.batch_problems.append(f"batch not completed with its lines: {batch}")
    out = lines_of(sdk, batch.output_file_id) if counts.completed else []
    errors = lines_of(sdk, batch.error_file_id) if counts.failed else []
    ids = sorted(x["custom_id"] for x in out + errors)
    if ids != sorted(f"req-{i}" for i in range(BATCH_LINES)):
        run.batch_problems.append(f"{batch.id}: lines missing or repeated: {ids}")
    if (len(out), len(errors)) != (counts.completed, counts.failed):
        run.batch_problems.append(f"{batch.id}: files of {len(out)}+{len(errors)} lines: {counts}")
    if any(x["response"]["status_code"] != 200 for x in out):
        run.batch_problems.append(f"{batch.id}: an output line not a 200")
    return None


async def keep_a_batch_running(url: str, end: float, run: Run) -> None:
    """Starts a batch, and another whenever it finishes, until `end`; then waits for the last."""
    content = requests(BATCH_LINES, model="mix")
    with openai.OpenAI(base_url=url + "/v1", api_key=FULL_KEY, max_retries=0) as sdk:
        while time.monotonic() < end:
            batch = await asyncio.to_thread(start, sdk, content)
            while not finished(batch):
                if time.monotonic() >= end:
                    timeout = time.monotonic() + BATCH_END_S
                    while not finished(batch) and time.monotonic() < timeout:
                        await asyncio.sleep(0.2)
                        batch = await asyncio.to_thread(sdk.batches.retrieve, batch.id)
                    break
                await asyncio.sleep(BATCH_POLL_S)
                batch = await asyncio.to_thread(sdk.batches.retrieve, batch.id)
            await asyncio.to_thread(check_batch, sdk, batch, run)


async def sampler(gw: GatewayProcess, ports: set[int], began: float, run: Run) -> None:
    """Every SAMPLE_S: a sample under load, then the callers held until nothing is in flight,
    the quiet sample the rule reads, and the callers let go."""
    print(f"\n{HEADER}", flush=True)
    for k in itertools.count():
        due = k * SAMPLE_S
        if due > SOAK_S:
            return
        await asyncio.sleep(max(0.0, began + due - time.monotonic()))
        busy = await asyncio.to_thread(sample, gw, ports, due, run.answered())
        paused = time.monotonic()
        run.gate.clear()
        try:
            quiet = await asyncio.to_thread(quiet_sample, gw, ports, due, run.answered())
        finally:
            run.gate.set()
        pause_s = time.monotonic() - paused
        run.busy.append(busy)
        run.quiet.append(quiet)
        run.pauses_s.append(round(pause_s, 3))
        print(row(quiet, busy, pause_s), flush=True)


async def soak(gw: GatewayProcess, upstreams: tuple[ScriptedUpstream, ...]) -> Run:
    run = Run({kind: Tally() for kind in ("completions", "chat", "embeddings")})
    work = itertools.cycle(jobs())
    ports = {u.port for u in upstreams}
    run.gate.set()
    began = time.monotonic()
    end = began + SOAK_S
    timeout = httpx.Timeout(CLIENT_TIMEOUT_S)
    async with httpx.AsyncClient(base_url=gw.url, timeout=timeout, trust_env=False) as client:

        async def worker() -> None:
            while time.monotonic() < end:
                await run.gate.wait()
                kind, path, body, leave, check = next(work)
                await exchange(client, path, body, leave, run.tallies[kind], check)

        await asyncio.gather(
            sampler(gw, ports, began, run),
            saboteur(upstreams, end),
            keep_a_batch_running(gw.url, end, run),
            *(worker() for _ in range(CONCURRENCY)),
        )
    return run


def report(run: Run, found: list[Verdict], after: Usage) -> dict[str, Any]:
    lines = {k: sum(b.get(k, 0) for b in run.batches) for k in ("total", "completed", "failed")}
    busy_s = sum(b.get("seconds", 0) for b in run.batches)  # a batch in progress, about
    figures = {
        "soak_s": SOAK_S,
        "warmup_s": WARMUP_S,
        "window_s": WINDOW_S,
        "sample_s": SAMPLE_S,
        "concurrency": CONCURRENCY,
        "rule": RULE,
        "slack": {name: slack for name, (_, slack) in METRICS.items()},
        "verdicts": [asdict(v) for v in found],
        "outcomes": {kind: dict(t.outcomes) for kind, t in run.tallies.items()},
        "batches": {
            "count": len(run.batches),
            "lines": lines,
            "in_progress_s": busy_s,
            "each": run.batches,
        },
        "settled_after": asdict(after),
        "pauses_s": {"mean": statistics.mean(run.pauses_s), "max": max(run.pauses_s)},
        "quiet_samples": [asdict(s) for s in run.quiet],
        "busy_samples": [asdict(s) for s in run.busy],
    }
    OUT.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\n{'':<34} {'start':>10} {'end':>10} {'growth':>8} {'limit':>10}")
    for v in found:
        what = METRICS[v.name][0]
        status = "ok" if v.ok else "GREW"
        print(f"{what:<34} {v.start:>10} {v.end:>10} {v.growth_pct:>7}% {v.limit:>10} {status}")
    for kind, tally in run.tallies.items():
        print(f"{kind}: {dict(tally.outcomes)}")
    print(f"batches: {len(run.batches)}, lines {lines}, in progress {busy_s} s in all")
    print(f"pauses for the quiet samples: mean {statistics.mean(run.pauses_s):.2f} s")
    print(f"settled afterwards: {after}")
    print(f"written to {OUT}", flush=True)
    return figures


def test_ten_minutes_of_mixed_traffic(
    scripted_openai_server: ScriptedUpstream,  # noqa: F811  (the imported fixture)
    scripted_fireworks_server: ScriptedUpstream,  # noqa: F811
    tmp_path: Path,
) -> None:
    upstreams = (scripted_openai_server, scripted_fireworks_server)
    for upstream in upstreams:
        upstream.reset()
    urls = (scripted_openai_server.url, scripted_fireworks_server.url)
    with GatewayProcess(soak_config(*urls, tmp_path / "store"), tmp_path) as gw:
        run = asyncio.run(soak(gw, upstreams))
        after = settled(gw)  # nothing left in flight
    for upstream in upstreams:
        upstream.reset()
    found = verdicts(run.quiet)
    report(run, found, after)
    for kind, tally in run.tallies.items():
        assert not tally.problems, (kind, tally.problems, tally.outcomes)
        assert tally.outcomes["ok"], (kind, tally.outcomes)
        assert any(k.startswith("error ") for k in tally.outcomes), (kind, tally.outcomes)
    for kind in ("completions", "chat"):
        outcomes = run.tallies[kind].outcomes
        assert outcomes["stream ok"] and outcomes["left"] and outcomes["stream error event"]
    assert not run.batch_problems, run.batch_problems
    assert run.batches and all(b["status"] == "completed" for b in run.batches), run.batches
    grew = [v for v in found if not v.ok]
    assert not grew, grew

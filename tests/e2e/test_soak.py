"""A half-minute soak (`make soak` runs ten minutes): mixed faults under concurrency (errors,
throttling, slow first bytes, dropped and reset connections, streams cut or failing in the
middle, callers leaving). Every request ends answered or with a clear error, none hangs, and
afterwards the gateway holds no more connections, file descriptors or tasks than it did
before."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import yaml

from tests.e2e.metrics_text import scrape
from tests.e2e.support import (
    FIREWORKS_MODEL,
    FULL_KEY,
    auth,
    scripted_gateway,
    scripted_providers,
)
from tests.gateway_proc import GatewayProcess
from tests.upstreams.procs import ScriptedUpstream

SOAK_S = float(os.environ.get("GATEWAY_SOAK_S", "30"))
WARMUP_S = 3.0
CONCURRENCY = 16
CLIENT_TIMEOUT_S = 30.0  # far beyond any wait the config allows: reaching it means a hang
QUICK = {"attempts": 1, "backoff_s": 0.02, "max_backoff_s": 0.05, "max_wait_s": 1}
SLACK_FDS, SLACK_TASKS = 12, 8
COOLDOWN_S = 0.3  # the circuit breaker's: a target the faults cut off is tried again after it

# (prompt, stream, leave after k events or None): the workload, cycled through.
WORKLOAD = (
    ("plain one", False, None),
    ("plain two", True, None),
    ("fails __status_500__", False, None),
    ("throttled __status_429__", True, None),
    ("slow __sleep_700__", False, None),
    ("dropped __close__", True, None),
    ("breaks __midstream_error__", True, None),
    ("caller leaves", True, 2),
    ("plain three", False, None),
    ("plain four", True, None),
)
# Per-server faults for one upstream at a time (prompt markers reach both).
SCRIPTS = (
    {"reset": True, "times": 2},
    {"cut_after": 2, "times": 2},
    {"delay_ms": 700, "times": 1},
    {"status": 503, "times": 3},
)


def config(openai_url: str, fireworks_url: str, _dead_port: int) -> str:
    oai = {"provider": "oai", "model": "m-soak", "timeout": {"first_byte_s": 0.3}}
    fw = {"provider": "fw", "model": FIREWORKS_MODEL, "timeout": {"first_byte_s": 0.3}}
    return yaml.safe_dump(
        {
            "auth": {"keys": [{"id": "full", "key": FULL_KEY}]},
            "providers": scripted_providers(openai_url, fireworks_url),
            "models": {"mix": {"strategy": "fallback", "retry": QUICK, "targets": [oai, fw]}},
            "circuit_breaker": {"failures": 15, "cooldown_s": COOLDOWN_S},
        }
    )


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def bad(self, what: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(what)
        self.outcomes["bad"] += 1


def check_json(r: httpx.Response, tally: Tally) -> None:
    body = orjson.loads(r.content)
    if r.status_code == 200:
        if not body["choices"] or body["usage"] is None:
            tally.bad(f"200 without choices or usage: {body}")
        tally.outcomes["ok"] += 1
        return
    error = body.get("error") or {}
    if set(error) != {"message", "type", "param", "code"} or not error["message"]:
        tally.bad(f"{r.status_code} not in OpenAI's shape: {body}")
    tally.outcomes[f"error {r.status_code}"] += 1


def check_stream(status: int, raw: bytes, tally: Tally) -> None:
    """A 200 stream ends with [DONE], after either an error event or every choice's finish."""
    if status != 200:
        return check_json(httpx.Response(status, content=raw), tally)
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    if not events or events[-1] != b"[DONE]":
        return tally.bad(f"stream without [DONE]: {raw[-200:]!r}")
    last = orjson.loads(events[-2]) if len(events) > 1 else {}
    if "error" in last:
        tally.outcomes["stream error event"] += 1
        return None
    finished = any(c.get("finish_reason") for e in events[:-1] for c in orjson.loads(e)["choices"])
    if not finished:
        return tally.bad(f"stream ended without a finish or an error: {raw[-300:]!r}")
    tally.outcomes["stream ok"] += 1
    return None


async def one(
    client: httpx.AsyncClient, prompt: str, stream: bool, leave: int | None, tally: Tally
) -> None:
    body = {"model": "mix", "prompt": prompt, "max_tokens": 8, "stream": stream}
    await exchange(client, "/v1/completions", body, leave, tally)


async def exchange(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    leave: int | None,
    tally: Tally,
    check: Callable[[httpx.Response, Tally], None] = check_json,
) -> None:
    """POST `body` to `path` and check the answer (a stream's with check_stream, another's with
    `check`); with `leave`, a 200 stream's caller goes away after that many events."""
    stream = bool(body.get("stream"))
    try:
        async with client.stream("POST", path, json=body, headers=auth()) as r:
            if leave is not None and r.status_code == 200:
                events = 0
                async for line in r.aiter_lines():
                    events += line.startswith("data: ")
                    if events >= leave:
                        break
                tally.outcomes["left"] += 1
                return  # closing the response here is the caller leaving
            raw = await r.aread()
    except httpx.TimeoutException:
        tally.bad(f"hung: {path} {body!r}")
        return
    if stream:
        check_stream(r.status_code, raw, tally)
    else:
        check(httpx.Response(r.status_code, content=raw), tally)


async def load(url: str, seconds: float, upstreams: tuple[ScriptedUpstream, ...]) -> Tally:
    tally = Tally()
    work = itertools.cycle(WORKLOAD)
    end = time.monotonic() + seconds
    timeout = httpx.Timeout(CLIENT_TIMEOUT_S)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, trust_env=False) as client:

        async def worker() -> None:
            while time.monotonic() < end:
                await one(client, *next(work), tally)

        await asyncio.gather(saboteur(upstreams, end), *(worker() for _ in range(CONCURRENCY)))
    return tally


async def saboteur(upstreams: tuple[ScriptedUpstream, ...], end: float) -> None:
    """Until `end` (monotonic), the next of SCRIPTS queued on each upstream every 0.5 s."""
    for step in itertools.cycle(SCRIPTS):
        if time.monotonic() >= end:
            return
        for upstream in upstreams:
            await asyncio.to_thread(upstream.script, step)
        await asyncio.sleep(0.5)


@dataclass(frozen=True)
class Usage:
    fds: int
    tasks: float
    inflight: float


def usage(gw: GatewayProcess) -> Usage:
    metrics = scrape(gw.url)
    return Usage(
        len(os.listdir(f"/proc/{gw.pid}/fd")),
        metrics.value("gateway_event_loop_tasks"),
        metrics.value("gateway_inflight_requests"),
    )


def settled(gw: GatewayProcess) -> Usage:
    """Usage once nothing is in flight (connections the callers left may take a moment)."""
    deadline = time.monotonic() + 15
    while (now := usage(gw)).inflight > 0:
        assert time.monotonic() < deadline, f"requests still in flight: {now}"
        time.sleep(0.1)
    return now


soak_gateway = scripted_gateway(config, "soak_gateway")


def test_half_a_minute_of_mixed_faults(
    soak_gateway: GatewayProcess,
    scripted_openai_server: ScriptedUpstream,
    scripted_fireworks_server: ScriptedUpstream,
) -> None:
    upstreams = (scripted_openai_server, scripted_fireworks_server)
    for upstream in upstreams:
        upstream.reset()
    warm = asyncio.run(load(soak_gateway.url, WARMUP_S, upstreams))
    assert not warm.problems, warm.problems
    before = settled(soak_gateway)
    tally = asyncio.run(load(soak_gateway.url, SOAK_S, upstreams))
    after = settled(soak_gateway)
    for upstream in upstreams:
        upstream.reset()
    assert not tally.problems, (tally.problems, tally.outcomes)
    assert tally.outcomes["ok"] and tally.outcomes["stream ok"] and tally.outcomes["left"]
    assert tally.outcomes["stream error event"]  # the faults did reach the callers
    assert sum(n for k, n in tally.outcomes.items() if k.startswith("error ")), tally.outcomes
    assert after.fds <= before.fds + SLACK_FDS, (before, after)
    assert after.tasks <= before.tasks + SLACK_TASKS, (before, after)
    r = once_cooled_down(soak_gateway)
    assert r.status_code == 200, r.text  # and it still serves


def once_cooled_down(gw: GatewayProcess) -> httpx.Response:
    """A plain request's answer, once the circuits that the soak's last faults opened have
    cooled down: until then the gateway rightly answers 503 circuit_open."""
    deadline = time.monotonic() + 10 * COOLDOWN_S
    while True:
        r = httpx.post(
            gw.url + "/v1/completions",
            json={"model": "mix", "prompt": "still fine"},
            headers=auth(),
            timeout=CLIENT_TIMEOUT_S,
        )
        opened = r.status_code == 503 and r.json()["error"]["code"] == "circuit_open"
        if not opened or time.monotonic() > deadline:
            return r
        time.sleep(COOLDOWN_S)

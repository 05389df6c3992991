"""Limits shared by every replica through Redis: one Lua script (admit.lua) decides admissions
atomically on the server's clock.

Admissions that arrive while a call is in flight go together in the next call, with the
settlements queued meanwhile: each admission is still all-or-nothing inside the script, and a
busy replica makes one round trip for many requests instead of one each. The client has no
retries and short timeouts: a dead Redis fails fast, and the limiter's breaker takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib import resources
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.ratelimit.rules import Ask, RateLimitConfig, Rule, State, Verdict

log = logging.getLogger("gateway.ratelimit")
KIND_CODE = {"requests": "r", "tokens": "t", "parallel": "p"}
MAX_BATCH = 256  # admissions per call: bounds the script's time on the server


class BackendDown(Exception):
    """The backend could not answer (connection, timeout, or a reply it could not parse)."""


class RedisBackend:
    name = "redis"

    def __init__(self, cfg: RateLimitConfig) -> None:
        timeout = cfg.timeout_ms / 1000
        pool = aioredis.BlockingConnectionPool.from_url(
            cfg.redis_url,
            max_connections=cfg.pool_size,
            timeout=timeout,  # waiting for a free connection
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._client = aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
        script = resources.files(__package__).joinpath("admit.lua").read_text()
        self._script = self._client.register_script(script)
        self._timeout = timeout * 2  # a whole call: connect, then send and answer
        self._prefix = "{" + cfg.key_prefix + "}:"
        self._lease_s = cfg.lease_s
        self._admits: list[tuple[Ask, asyncio.Future[Verdict]]] = []
        self._settles: list[tuple[Ask, int]] = []
        self._leases: dict[str, tuple[Rule, ...]] = {}  # held parallel slots, refreshed
        self._refresh_due = False
        self._drainer: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.lost_settlements = 0  # settlements a failed call could not apply

    async def start(self) -> None:
        self._refresher = asyncio.create_task(self._refresh_loop())

    async def admit(self, ask: Ask) -> Verdict:
        fut: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._admits.append((ask, fut))
        self._kick()
        return await fut  # a caller that leaves cancels it: see _drain

    def settle(self, ask: Ask, delta_tokens: int) -> None:
        parallel = self._leases.pop(ask.lease, None)
        if parallel is None and not (delta_tokens and _has(ask, "tokens")):
            return
        self._settles.append((ask, delta_tokens))
        self._kick()

    def _kick(self) -> None:
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._admits or self._settles or self._refresh_due:
            admits, self._admits = self._admits[:MAX_BATCH], self._admits[MAX_BATCH:]
            admits = [(a, f) for a, f in admits if not f.done()]  # callers that left
            settles, self._settles = self._settles, []
            refresh = self._refresh_due
            self._refresh_due = False
            try:
                verdicts = await self._call(admits, settles, refresh)
            except Exception as exc:  # any failure of the backend: the limiter decides
                self.lost_settlements += len(settles)
                down = BackendDown(f"{type(exc).__name__}: {exc}")
                for _, fut in admits:
                    if not fut.done():
                        fut.set_exception(down)
                continue
            for (ask, fut), verdict in zip(admits, verdicts, strict=True):
                if verdict.admitted and _has(ask, "parallel"):
                    self._leases[ask.lease] = ask.rules
                if not fut.done():
                    fut.set_result(verdict)
                elif verdict.admitted:  # its caller left while the call was out: give it back
                    self.settle(ask, -ask.tokens)

    async def _call(
        self, admits: list[tuple[Ask, Any]], settles: list[tuple[Ask, int]], refresh: bool
    ) -> list[Verdict]:
        keys: dict[str, int] = {}

        def refs(rules: tuple[Rule, ...]) -> list[list[Any]]:
            return [
                [
                    keys.setdefault(self._prefix + r.bucket, len(keys) + 1),
                    KIND_CODE[r.kind],
                    r.limit,
                ]
                for r in rules
            ]

        spec = {
            "a": [{"r": refs(a.rules), "c": a.tokens, "m": a.lease} for a, _ in admits],
            "s": [{"r": refs(s.rules), "d": d, "m": s.lease} for s, d in settles],
            "l": self._refreshes(keys) if refresh else [],
            "x": self._lease_s,
        }
        async with asyncio.timeout(self._timeout):
            raw = await self._script(keys=list(keys), args=[orjson.dumps(spec)])
        answers = orjson.loads(raw)
        return [_verdict(ask, a) for (ask, _), a in zip(admits, answers, strict=True)]

    def _refreshes(self, keys: dict[str, int]) -> list[list[Any]]:
        out = []
        for member, rules in self._leases.items():
            for r in rules:
                if r.kind == "parallel":
                    index = keys.setdefault(self._prefix + r.bucket, len(keys) + 1)
                    out.append([index, member])
        return out

    async def _refresh_loop(self) -> None:
        """Held slots are leases: refreshed while their requests run, gone if we vanish."""
        while True:
            await asyncio.sleep(self._lease_s / 3)
            if self._leases:
                self._refresh_due = True
                self._kick()

    async def ping(self) -> None:
        async with asyncio.timeout(self._timeout):
            await self._client.ping()

    async def aclose(self) -> None:
        for task in (self._refresher, self._drainer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._client.aclose()
        await self._client.connection_pool.disconnect()


def _has(ask: Ask, kind: str) -> bool:
    return any(r.kind == kind for r in ask.rules)


def _verdict(ask: Ask, answer: list[Any]) -> Verdict:
    admitted, states = answer
    return Verdict(
        bool(admitted),
        tuple(
            State(rule, int(s[0]), float(s[1]), float(s[2]))
            for rule, s in zip(ask.rules, states, strict=True)
        ),
    )

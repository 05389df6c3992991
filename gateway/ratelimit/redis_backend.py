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
import itertools
import logging
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.ratelimit.rules import Ask, RateLimitConfig, Rule, RuleSet, Spend, Values, Verdict

log = logging.getLogger("gateway.ratelimit")
KIND_CODE = {"requests": "r", "tokens": "t", "parallel": "p", "budget": "b"}
LEDGER_TTL_S = 400 * 86400  # a day's spend is kept this long
# Adjustments queued while Redis cannot take them (each merged into one per counter): past it,
# the oldest are dropped, and counted.
MAX_ADJUSTMENTS = 100_000
MAX_REPLAYS = 1000  # calls without an answer kept to send again; past it, the oldest dropped
MAX_BATCH = 256  # admissions per call: bounds the script's time on the server
MAX_IN_FLIGHT = 2  # calls out at once: one can fill while the other is answered


@dataclass(slots=True)
class Batch:
    """One call's work: the admissions (and their callers), settlements, money, and whether
    held slots are refreshed. `marker`: set when it carries money (see admit.lua)."""

    admits: list[tuple[Ask, asyncio.Future[Verdict]]]
    settles: list[tuple[Ask, int]]
    adjust: dict[tuple[str, str, int], int]
    refresh: bool
    marker: str = ""
    replay: bool = False  # sent again: the script looks for the reply it stored first


def _gone() -> asyncio.Future[Verdict]:
    """A caller's place for an admission sent again: its caller already had its answer."""
    fut: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
    fut.cancel()
    return fut


class BackendDown(Exception):
    """The backend could not answer (connection, timeout, or a reply it could not parse)."""


class RedisBackend:
    name = "redis"

    def __init__(self, cfg: RateLimitConfig) -> None:
        timeout = cfg.timeout_ms / 1000
        self._client = connect(cfg, timeout)
        script = resources.files(__package__).joinpath("admit.lua").read_text()
        self._script = self._client.register_script(script)
        self._timeout = timeout * 2  # a whole call: connect, then send and answer
        self._prefix = "{" + cfg.key_prefix + "}:"
        self._lease_s = cfg.lease_s
        self._admits: list[tuple[Ask, asyncio.Future[Verdict]]] = []
        self._settles: list[tuple[Ask, int]] = []
        # Budgets settled and spend added: (key, field or "-", ttl) → amount, merged while
        # queued; a failed call puts its own back (money is not dropped with the connection).
        self._adjust: dict[tuple[str, str, int], int] = {}
        # Settlements' money by rule set (id of its budgets, which the entry keeps alive), until
        # the next call spreads it over the budgets' counters: one tally a request.
        self._settled: dict[int, tuple[tuple[tuple[str, int, int], ...], int]] = {}
        self._spent: dict[tuple[str, tuple[str, ...]], int] = {}  # the ledger's, likewise
        self._leases: dict[str, tuple[Rule, ...]] = {}  # held parallel slots, refreshed
        self._refresh_due = False
        self._drainers: set[asyncio.Task[None]] = set()
        # Drainers whose loop has not ended: counted by the loop itself, since a task's own
        # done-callbacks run a step after it ended, and work queued in that step would wait
        # for a drainer that is gone (until some later request kicked one).
        self._draining = 0
        self._starting = False  # a drainer was made and has not begun
        self._refresher: asyncio.Task[None] | None = None
        # Calls that carried money and had no answer, to send again (oldest first), and the
        # markers of calls answered, dropped with the next call.
        self._replays: list[Batch] = []
        self._acks: list[str] = []
        self._marks = secrets.token_hex(6) + "-"  # this process's markers
        self._count: Iterator[int] = itertools.count(1)
        self.lost_settlements = 0  # settlements a failed call could not apply
        self.lost_adjustments = 0  # amounts of money dropped past MAX_ADJUSTMENTS

    async def start(self) -> None:
        self._refresher = asyncio.create_task(self._refresh_loop())

    async def admit(self, ask: Ask) -> Verdict:
        fut: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._admits.append((ask, fut))
        self._kick()
        return await fut  # a caller that leaves cancels it: see _drain

    def settle(self, ask: Ask, delta_tokens: int, delta_cost: int = 0) -> None:
        if delta_cost:  # one tally per rule set: spread over its budgets when a call is made
            budgets = ask.limits.budgets
            held = self._settled.get(id(budgets))
            self._settled[id(budgets)] = (budgets, delta_cost + (held[1] if held else 0))
        parallel = self._leases.pop(ask.lease, None)
        if parallel is None and not (delta_tokens and _has(ask, "tokens")):
            if delta_cost:
                self._kick()
            return
        self._settles.append((ask, delta_tokens))
        self._kick()

    def spend(self, entry: Spend, now: bool = True) -> None:
        """Adds to the spend ledger; with `now` False, only queued for the next call (the
        limiter's breaker is open: the call would fail). Tallied by day and fields until the
        next call splits the tallies into the fields' adjustments: one sum a request."""
        day, names, amount = entry
        spent = self._spent
        held = spent.get((day, names))
        if held is not None:
            spent[(day, names)] = held + amount
        else:
            if len(spent) >= MAX_ADJUSTMENTS:  # a long outage: bounded where the fields are
                self._split_spent()
            spent[(day, names)] = amount
        if now:
            self._kick()

    def _split_spent(self) -> None:
        spent, self._spent = self._spent, {}
        for (day, names), amount in spent.items():
            if amount:
                for name in names:
                    self._add(day, name, LEDGER_TTL_S, amount)

    def charged(self, ask: Ask, amount: int) -> None:
        """A request admitted while Redis was away (the `local` fallback) was charged this:
        queued for the budgets' counters here, for the next call."""
        if amount:
            for bucket, _, ttl in ask.limits.budgets:
                self._add(bucket, "-", ttl, amount)

    async def read_ledger(self, days: Sequence[str]) -> dict[str, dict[str, int]]:
        """Each day's hash of the spend ledger: field → pico-dollars."""
        async with asyncio.timeout(self._timeout * 5):
            async with self._client.pipeline(transaction=False) as pipe:
                for day in days:
                    pipe.hgetall(self._prefix + day)
                replies = await pipe.execute()
        return {
            day: {k.decode(): int(v) for k, v in reply.items()}
            for day, reply in zip(days, replies, strict=True)
        }

    async def read_counters(self, buckets: Sequence[str]) -> dict[str, int]:
        """Budget counters: pico-dollars spent or reserved (0 for one never used)."""
        if not buckets:
            return {}
        async with asyncio.timeout(self._timeout * 5):
            values = await self._client.mget([self._prefix + b for b in buckets])
        return {b: int(v) if v is not None else 0 for b, v in zip(buckets, values, strict=True)}

    def _add(self, key: str, name: str, ttl: int, amount: int) -> None:
        slot = (key, name, ttl)
        adjust = self._adjust
        if slot not in adjust and len(adjust) >= MAX_ADJUSTMENTS:
            self.lost_adjustments += 1
            del adjust[next(iter(adjust))]
        adjust[slot] = adjust.get(slot, 0) + amount

    def _spread(self) -> None:
        """The settlements' and the ledger's tallies onto their counters and fields."""
        self._split_spent()
        settled, self._settled = self._settled, {}
        for budgets, amount in settled.values():
            if amount:
                for bucket, _, ttl in budgets:
                    self._add(bucket, "-", ttl, amount)

    def _kick(self) -> None:
        """A call goes out now if fewer than MAX_IN_FLIGHT are out; otherwise the work waits
        for the next one, with whatever else arrives meanwhile. A drainer that has not begun
        yet takes this work too: no second one for it (a request's settlement and its spend
        come one after the other)."""
        if self._draining < MAX_IN_FLIGHT and not self._starting:
            self._draining += 1
            self._starting = True
            task = asyncio.get_running_loop().create_task(self._drain())
            self._drainers.add(task)
            task.add_done_callback(self._drainers.discard)

    async def _drain(self) -> None:
        self._starting = False  # from here, what is queued is this drainer's or a new one's
        try:
            await self._drain_queued()
        finally:
            self._draining -= 1  # in the same step as the loop's last look at the queues

    async def _drain_queued(self) -> None:
        while (
            self._replays or self._admits or self._settles or self._refresh_due or self._adjust
            or self._settled or self._spent
        ):  # fmt: skip
            replayed = not self._replays or await self._replay()
            if not (replayed or self._admits or self._settles):
                return  # Redis is still away: the next call tries again, not a loop
            if not (
                self._admits or self._settles or self._refresh_due or self._adjust
                or self._settled or self._spent
            ):  # fmt: skip
                continue  # only replays were waiting
            batch = self._next_batch()
            try:
                verdicts = await self._call(batch)
            except Exception as exc:  # any failure of the backend: the limiter decides
                self._failed(batch, exc)
                await self._drop_connections()
                if not (self._admits or self._settles):
                    return  # money alone waits for the next call, not a loop against a dead Redis
                continue
            if batch.marker:
                self._acks.append(batch.marker)
            for (ask, fut), verdict in zip(batch.admits, verdicts, strict=True):
                if verdict.admitted and _has(ask, "parallel"):
                    self._leases[ask.lease] = ask.rules
                if not fut.done():
                    fut.set_result(verdict)
                elif verdict.admitted:  # its caller left while the call was out: give it back
                    self.settle(ask, -ask.tokens, -ask.cost)

    def _next_batch(self) -> Batch:
        admits, self._admits = self._admits[:MAX_BATCH], self._admits[MAX_BATCH:]
        admits = [(a, f) for a, f in admits if not f.done()]  # callers that left
        settles, self._settles = self._settles[:MAX_BATCH], self._settles[MAX_BATCH:]
        self._spread()
        adjust, self._adjust = self._adjust, {}
        refresh, self._refresh_due = self._refresh_due, False
        money = bool(adjust) or any(a.limits.budgets for a, _ in admits)
        marker = f"mark:{self._marks}{next(self._count):x}" if money else ""
        return Batch(admits, settles, adjust, refresh, marker)

    def _failed(self, batch: Batch, exc: Exception) -> None:
        """A call without an answer. One that carries money may still have run: it is sent
        again under its marker, so that it counts once (its admissions given back if it ran);
        one without money loses its settlements, as a lost connection would."""
        down = BackendDown(f"{type(exc).__name__}: {exc}")
        for _, fut in batch.admits:
            if not fut.done():
                fut.set_exception(down)
        if not batch.marker:
            self.lost_settlements += len(batch.settles)
            return
        if len(self._replays) >= MAX_REPLAYS:
            dropped = self._replays.pop(0)
            self.lost_settlements += len(dropped.settles)
            self.lost_adjustments += len(dropped.adjust)
        admitted = [(a, _gone()) for a, _ in batch.admits]
        self._replays.append(Batch(admitted, batch.settles, batch.adjust, False, batch.marker))

    async def _replay(self) -> bool:
        """The oldest call without an answer, sent again with no admissions: applied now if it
        never ran, else its stored reply, whose admissions are given back. False: no answer
        again (it stays first in line)."""
        batch = self._replays.pop(0)
        again = Batch([], batch.settles, batch.adjust, False, batch.marker, replay=True)
        try:
            reply = await self._send(again)
        except Exception:
            self._replays.insert(0, batch)
            await self._drop_connections()
            return False
        self._acks.append(batch.marker)
        if reply[:1] == [b"R"]:  # it had run: what it admitted holds money nobody will settle
            asks = [a for a, _ in batch.admits]
            for ask, verdict in zip(asks, _verdicts(asks, reply[1:]), strict=True):
                if not verdict.admitted:
                    continue
                if _has(ask, "parallel"):  # its slots too: settle() frees held leases
                    self._leases[ask.lease] = ask.rules
                self.settle(ask, -ask.tokens, -ask.cost)
        return True

    async def _call(self, batch: Batch) -> list[Verdict]:
        reply = await self._send(batch)
        return _verdicts([a for a, _ in batch.admits], reply)

    async def _send(self, batch: Batch) -> list[bytes]:
        call = _Call(self._prefix)
        mark = call.key(batch.marker) if batch.marker else 0
        if batch.replay:
            mark = -mark
        acks, self._acks = self._acks[:MAX_BATCH], self._acks[MAX_BATCH:]
        ack_args = [call.key(m) for m in acks]
        settle_args = [f"{call.ruleset(s.limits)} {s.lease or '-'} {d}" for s, d in batch.settles]
        adjust_args = [f"{call.key(k)} {n} {a} {t}" for (k, n, t), a in batch.adjust.items() if a]
        admit_args = [
            f"{call.ruleset(a.limits)} {a.lease or '-'} {a.tokens} {a.cost}"
            for a, _ in batch.admits
        ]
        refresh_args = self._refreshes(call) if batch.refresh else []
        words = " ".join(
            [
                str(mark),
                str(len(ack_args)), *map(str, ack_args),
                str(self._lease_s),
                str(len(call.sets)), *map(str, call.set_args),
                str(len(batch.settles)), *settle_args,
                str(len(adjust_args)), *adjust_args,
                str(len(refresh_args) // 2), *map(str, refresh_args),
                str(len(batch.admits)), *admit_args,
            ]
        )  # fmt: skip
        try:
            async with asyncio.timeout(self._timeout):
                reply: bytes = await self._script(keys=list(call.keys), args=[words])
        except BaseException:
            self._acks[:0] = acks  # not dropped: the next call drops them
            raise
        return reply.split()

    def _refreshes(self, call: _Call) -> list[Any]:
        out: list[Any] = []
        for member, rules in self._leases.items():
            for r in rules:
                if r.kind == "parallel":
                    out += (call.key(r.bucket), member)
        return out

    async def _drop_connections(self) -> None:
        await drop_connections(self._client)

    async def _refresh_loop(self) -> None:
        """Held slots are leases: refreshed while their requests run, gone if we vanish."""
        while True:
            await asyncio.sleep(self._lease_s / 3)
            if self._leases:
                self._refresh_due = True
                self._kick()

    async def aclose(self) -> None:
        for task in (self._refresher, *self._drainers):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._client.aclose()
        await self._drop_connections()


async def drop_connections(client: aioredis.Redis | aioredis.RedisCluster) -> None:
    """After a failure the pooled connections may all be dead (a restarted Redis): drop
    them, so that the next call (the breaker's probe) opens a fresh one. (A Cluster client
    rediscovers its nodes by itself.)"""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        with contextlib.suppress(Exception):
            await pool.disconnect()


def connect(cfg: RateLimitConfig, timeout: float) -> aioredis.Redis | aioredis.RedisCluster:
    """No retries and short timeouts, on a pool that waits for a free connection rather than
    failing (the batching keeps at most MAX_IN_FLIGHT calls out anyway)."""
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if cfg.cluster:
        return aioredis.RedisCluster.from_url(
            cfg.redis_url, max_connections=cfg.pool_size, **common
        )
    pool = aioredis.BlockingConnectionPool.from_url(
        cfg.redis_url, max_connections=cfg.pool_size, timeout=timeout, **common
    )
    return aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))


def _has(ask: Ask, kind: str) -> bool:
    return any(r.kind == kind for r in ask.rules)


class _Call:
    """One script call's KEYS and rule sets, each numbered once (1-based, as Lua counts)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.keys: dict[str, int] = {}
        self.sets: dict[int, int] = {}  # id(rules) → index: a key's rules are one cached tuple
        self.set_args: list[Any] = []

    def key(self, bucket: str) -> int:
        name = self.prefix + bucket
        index = self.keys.get(name)
        if index is None:
            index = self.keys[name] = len(self.keys) + 1
        return index

    def ruleset(self, found: RuleSet) -> int:
        rules = found.rules
        index = self.sets.get(id(rules))
        if index is None:
            index = self.sets[id(rules)] = len(self.sets) + 1
            self.set_args.append(len(rules))
            ttls = iter([ttl for _, _, ttl in found.budgets])  # the budget rules' own, in order
            for r in rules:
                self.set_args += (self.key(r.bucket), KIND_CODE[r.kind], r.limit)
                if r.kind == "budget":
                    self.set_args.append(next(ttls))
        return index


def _verdicts(asks: list[Ask], flat: list[bytes]) -> list[Verdict]:
    out, i = [], 0
    for ask in asks:
        admitted = flat[i] == b"1"
        values: list[Values] = []
        for _ in ask.rules:
            values.append((int(flat[i + 1]), int(flat[i + 2]) / 1000, int(flat[i + 3]) / 1000))
            i += 3
        out.append(Verdict(admitted, ask.rules, values))
        i += 1
    return out

"""The memory backend's money kept in the files store, so that a restart loses nothing: its
budget counters and its spend ledger, in one object (`_gateway/spend.json`), flushed every
second when something changed, and on close.

Several processes may share the store (workers, or a restart beside a draining process): each
flush adds what this process changed since its last one to what the object holds (a
read-modify-write, under a file lock when the store is a local directory), and takes back what
the others added. A budget on the memory backend needs one process anyway
(`Config.check_workers`); the ledger is summed over all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import logging
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import obstore
import orjson
from obstore.exceptions import NotFoundError

from gateway.governance.ledger import KEEP_DAYS, day_hash
from gateway.jobs.filestore import FileStore
from gateway.ratelimit.memory import MemoryBackend

log = logging.getLogger("gateway.governance")
OBJECT = "_gateway/spend.json"  # beside the owners' prefixes, which are hex digests
FLUSH_S = 1.0

Counters = dict[str, int]  # bucket → pico-dollars
Expiry = dict[str, float]  # bucket → epoch seconds it is kept to (inf: for ever)
Ledger = dict[tuple[str, str], int]  # (day's hash, field) → pico-dollars
Key = TypeVar("Key", str, tuple[str, str])


class State:
    """What the object holds: budget counters with their expiry, and the ledger."""

    def __init__(self, spent: Counters, expiry: Expiry, ledger: Ledger) -> None:
        self.spent, self.expiry, self.ledger = spent, expiry, ledger

    @classmethod
    def of(cls, backend: MemoryBackend) -> State:
        return cls(dict(backend.spent), dict(backend.expiry), dict(backend.ledger))

    @classmethod
    def parse(cls, data: bytes) -> State:
        doc = orjson.loads(data) if data else {}
        spent = {b: int(v[0]) for b, v in doc.get("spent", {}).items()}
        expiry = {b: _expiry(v[1]) for b, v in doc.get("spent", {}).items()}
        ledger = {
            (day, name): int(amount)
            for day, fields in doc.get("ledger", {}).items()
            for name, amount in fields.items()
        }
        return cls(spent, expiry, ledger)

    def dump(self) -> bytes:
        days: dict[str, dict[str, int]] = {}
        for (day, name), amount in self.ledger.items():
            days.setdefault(day, {})[name] = amount
        spent = {b: [v, _stored(self.expiry.get(b, math.inf))] for b, v in self.spent.items()}
        return orjson.dumps({"spent": spent, "ledger": days})

    def plus(self, other: State, minus: State) -> State:
        """self + (other - minus): what another state changed since `minus`, added here."""
        spent = _added(self.spent, other.spent, minus.spent)
        expiry = {**self.expiry, **other.expiry}
        return State(
            spent,
            {b: expiry.get(b, math.inf) for b in spent},
            _added(self.ledger, other.ledger, minus.ledger),
        )

    def pruned(self, now: float) -> State:
        """Without the counters whose period has gone, and the days past KEEP_DAYS."""
        oldest = day_hash(
            (dt.datetime.fromtimestamp(now, dt.UTC) - dt.timedelta(days=KEEP_DAYS)).date()
        )
        spent = {b: v for b, v in self.spent.items() if self.expiry.get(b, math.inf) > now}
        ledger = {k: v for k, v in self.ledger.items() if k[0] >= oldest}
        return State(spent, {b: self.expiry.get(b, math.inf) for b in spent}, ledger)


def _added(
    base: Mapping[Key, int], new: Mapping[Key, int], old: Mapping[Key, int]
) -> dict[Key, int]:
    out = dict(base)
    for k, v in new.items():
        change = v - old.get(k, 0)
        if change:
            out[k] = out.get(k, 0) + change
    return out


def _expiry(v: float | None) -> float:
    return math.inf if v is None else float(v)


def _stored(v: float) -> float | None:
    return None if math.isinf(v) else v


class Keeper:
    """Loads the object into the backend at start, flushes what changed every FLUSH_S."""

    def __init__(self, backend: MemoryBackend, files: FileStore) -> None:
        self._backend = backend
        self._files = files  # its directory is made only once there is money to keep
        location = files.location
        # A directory store: a lock file beside the object serializes the processes' flushes.
        self._lock = (
            None if "://" in location else Path(location).expanduser() / "_gateway" / "spend.lock"
        )
        self._saved = State({}, {}, {})  # what the backend held at its last flush
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.flush()
        self._task = asyncio.create_task(self._every())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                await self.flush()
            except Exception:  # a store that fails now may not later: the next flush retries
                log.exception("could not keep the spend in the files store")

    async def flush(self) -> None:
        """This process's changes added to the object; the others' taken into the backend."""
        mine = State.of(self._backend)
        merged = await asyncio.to_thread(self._merge, mine, self._saved)
        now = State.of(self._backend)  # what requests changed while the object was written
        self._apply(merged.plus(now, mine))
        self._saved = merged

    def _merge(self, mine: State, saved: State) -> State:
        if not (self._files.present() or not _same(mine, saved)):
            return State({}, {}, {})  # no store yet, and nothing to keep in one
        store = self._files.store
        with self._locked():
            try:
                held = State.parse(bytes(obstore.get(store, OBJECT).bytes()))
            except (NotFoundError, FileNotFoundError):  # the first flush ever
                held = State({}, {}, {})
            merged = held.plus(mine, saved).pruned(time.time())
            if not _same(mine, saved):  # nothing of ours to add: only read the others'
                obstore.put(store, OBJECT, merged.dump())
        return merged

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock is None:
            yield
            return
        self._lock.parent.mkdir(parents=True, exist_ok=True)
        with self._lock.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _apply(self, state: State) -> None:
        b = self._backend
        b.spent.clear()
        b.spent.update(state.spent)
        b.expiry.clear()
        b.expiry.update(state.expiry)
        b.ledger.clear()
        b.ledger.update(state.ledger)


def _same(a: State, b: State) -> bool:
    return a.spent == b.spent and a.ledger == b.ledger

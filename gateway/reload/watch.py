"""Reloads the config file on SIGHUP and when it changes (checked every
`server.watch_config_s`). One reload at a time; a trigger during one runs one more after it.

A change is seen by the file's (mtime, size, inode), from os.stat, which follows symlinks: a
Kubernetes ConfigMap's symlink swap is a change. The bytes then decide: a file that says what the
running config says (a touch) changes nothing. A valid config swaps in a new runtime
(gateway.reload.handover) for new requests; requests under way finish on the old one, and what
only the old one used closes after them. An invalid one is refused with one ERROR line naming
its YAML path, and the running config stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from core.errors import ConfigError
from gateway.config import Config, parse
from gateway.reload.handover import Handover, Leftovers, successor
from gateway.runtime import Build, Runtime, build_provider

log = logging.getLogger("gateway.reload")

Signature = tuple[int, int, int]  # st_mtime_ns, st_size, st_ino


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A config file as read: its signature (taken before the bytes, so that a change made
    while reading shows at the next check) and its bytes."""

    path: Path
    signature: Signature | None
    data: bytes


def signature(path: Path) -> Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def read(path: Path) -> Snapshot:
    seen = signature(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the config file ({exc.strerror})") from None
    return Snapshot(path, seen, data)


def parse_snapshot(snapshot: Snapshot) -> Config:
    try:
        text = snapshot.data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(str(snapshot.path), f"not UTF-8 (byte {exc.start})") from None
    return parse(text, source=str(snapshot.path))


class Host(Protocol):
    """The app: where new requests find their runtime."""

    @property
    def runtime(self) -> Runtime: ...

    def swap(self, runtime: Runtime) -> None: ...


class Reloader:
    def __init__(
        self, host: Host, running: Snapshot, build: Build = build_provider, workers: int = 1
    ) -> None:
        self._host = host
        self._build = build
        self._workers = workers
        self._path = running.path
        self._running = running.data  # the bytes the runtime in use was built from
        self._seen = running.signature  # the file at the last check
        self._refused = False  # the last reload was refused
        self._wanted = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._every = 0.0
        self._draining: list[Runtime] = []  # swapped out, maybe with requests left
        self._hangup = False  # a SIGHUP handler is installed

    def start(self) -> None:
        self._host.runtime.metrics.config_started()
        self._spawn(self._work())
        self._poll(self._host.runtime.config.server.watch_config_s)
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, self._wanted.set)
            self._hangup = True
        except (NotImplementedError, RuntimeError, ValueError) as exc:  # not the main thread
            log.warning("SIGHUP will not reload the config here: %s", exc)

    async def stop(self) -> None:
        """Stop watching; close what swapped-out runtimes left, requests or not (the server
        has stopped serving)."""
        if self._hangup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------ triggers

    def _poll(self, every: float) -> None:
        """Check the file every `every` seconds from now on (0: not at all)."""
        if every == self._every:
            return
        if self._poller is not None:
            self._poller.cancel()
        self._every = every
        self._poller = self._spawn(self._check_every(every)) if every > 0 else None

    async def _check_every(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            seen = await asyncio.to_thread(signature, self._path)
            if seen != self._seen:
                self._seen = seen
                self._wanted.set()

    async def _work(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self._reload()

    # ------------------------------------------------------------ one reload

    async def _reload(self) -> None:
        old = self._host.runtime
        try:
            snapshot = await asyncio.to_thread(read, self._path)
            if snapshot.data == self._running:
                self._unchanged()
                return
            config = await asyncio.to_thread(parse_snapshot, snapshot)
            config.check_workers(self._workers)
            handover = await successor(old, config, self._build)
        except ConfigError as err:
            self._refuse(str(err))
        except Exception as exc:  # a bug, not the file: refuse all the same, and say where
            self._refuse(f"{type(exc).__name__}: {exc}", exc_info=True)
        else:
            self._host.swap(handover.runtime)
            self._running = snapshot.data
            self._refused = False
            self._retire(old, handover.leftovers)
            self._accepted(handover)

    def _unchanged(self) -> None:
        if self._refused:  # the file is back to what runs: nothing is refused any more
            self._refused = False
            self._host.runtime.metrics.config_reloaded(True)
            log.info("config reload: %s is back to the running config", self._path)

    def _refuse(self, error: str, exc_info: bool = False) -> None:
        self._refused = True
        self._host.runtime.metrics.config_reloaded(False)
        flat = " ".join(error.split())  # YAML errors span lines; the log line must not
        log.error("config reload refused: %s; keeping the running config", flat, exc_info=exc_info)

    def _accepted(self, h: Handover) -> None:
        h.runtime.metrics.config_reloaded(True)
        log.info("config reloaded from %s: %s", self._path, _summary(h))
        if h.pinned:
            log.warning(
                "config reload: %s changed, which takes a restart; the running values stay",
                ", ".join(h.pinned),
            )
        self._poll(h.runtime.config.server.watch_config_s)

    def _retire(self, old: Runtime, leftovers: Leftovers) -> None:
        """Close what only `old` used once its requests are over, and those of every runtime
        swapped out before it that still has some (they may use the same providers)."""
        self._draining = [rt for rt in self._draining if rt.inflight] + [old]
        if leftovers:
            self._spawn(_close_after(tuple(self._draining), leftovers))


async def _close_after(runtimes: tuple[Runtime, ...], leftovers: Leftovers) -> None:
    try:
        for runtime in runtimes:
            await runtime.drained()
    finally:  # cancelled at shutdown too: close all the same
        with contextlib.suppress(Exception):
            await leftovers.aclose()


def _summary(h: Handover) -> str:
    parts = [f"changed: {', '.join(h.changed)}"] if h.changed else []
    for label, names in (("providers rebuilt", h.rebuilt), ("providers removed", h.removed)):
        if names:
            parts.append(f"{label}: {', '.join(names)}")
    if h.fresh_limiter:
        parts.append("rate_limit changed: the rate limiter's counts start afresh")
    if h.fresh_accounts:
        parts.append("the runtime keys and teams are read from their new store")
    return "; ".join(parts) or "no setting that applies live changed"

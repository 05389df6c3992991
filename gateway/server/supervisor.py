"""`gateway serve --workers N` when providers share a core among the workers (the engine).

The serving process binds the listening socket and starts N workers, each one uvicorn server on
that socket with its own app and runtime, and with its slot of every shared core (what reaches
it: `core.provider.SLOTS_ENV`); with `server.tls`, each worker reads the certificates itself
when uvicorn loads its config (gateway.server.tls), and the socket stays plain TCP. It then
launches the cores one after the other (a core's start-up handshake must not wait on another's
load) and watches them and the workers:

* a core ready, failed or dead is reported to every worker on the core's status pipes, and the
  worker's provider acts on it as it would on its own engine (503s naming why, /readyz down);
* a worker that ends takes the pod down: its slot in a core cannot be filled again (vLLM's own
  multi-server front end does the same), and Kubernetes restarts the pod;
* SIGHUP is passed on (each worker reloads its config); SIGTERM or SIGINT stops the workers
  first, which drain their requests, then the cores.

uvicorn's own supervisor cannot do this: its workers are all alike (no slot of their own), it
replaces a worker that ends, and a SIGHUP starts new workers before the old ones stop.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import cast

import uvicorn

from core.provider import SLOTS_ENV, CoreStatus, SharedCore

log = logging.getLogger("gateway.supervisor")
STOP_GRACE_S = 10.0  # past the drain: a worker's own shutdown (lifespan, clients)
CORE_STOP_S = 10.0  # a core's processes, once no worker uses them


class Stop(Exception):
    """SIGTERM or SIGINT: raised out of whatever the serving process is waiting on."""


@dataclass(slots=True)
class Worker:
    process: BaseProcess
    status: dict[str, Connection]  # per core: the writing end of its status pipe

    def tell(self, core: str, status: CoreStatus, detail: str = "") -> None:
        with suppress(OSError):  # the worker is gone: the watch sees it
            self.status[core].send((status, detail))


@dataclass(slots=True)
class Supervisor:
    config: uvicorn.Config
    cores: Sequence[SharedCore]
    count: int
    drain_s: float
    workers: list[Worker] = field(default_factory=list)
    stopping: bool = False

    def run(self) -> int:
        """Serve until stopped (0) or until a worker ends (1)."""
        signal.signal(signal.SIGHUP, self._hangup)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        sock = self.config.bind_socket()
        try:
            self._start_workers(sock)
            sock.close()  # the workers hold it
            self._launch_cores()
            return self._watch()
        except Stop:
            return 0
        finally:
            self.stopping = True
            self._stop_workers()  # first: they drain their requests on the cores
            for core in self.cores:
                core.shutdown(CORE_STOP_S)

    def _start_workers(self, sock: socket.socket) -> None:
        spawn = multiprocessing.get_context("spawn")
        for index in range(self.count):
            ends = {core.name: spawn.Pipe(duplex=False) for core in self.cores}
            slots = {core.name: dict(core.slot(index)) for core in self.cores}
            reading = {name: pair[0] for name, pair in ends.items()}
            process = spawn.Process(
                target=run_worker,
                args=(self.config, sock, slots, reading),
                name=f"gateway-worker-{index}",
            )
            process.start()
            for read, _ in ends.values():
                read.close()  # the worker's now
            self.workers.append(Worker(process, {name: pair[1] for name, pair in ends.items()}))

    def _launch_cores(self) -> None:
        for core in self.cores:
            began = time.monotonic()
            try:
                core.launch()
            except Exception as exc:  # its models answer 503 naming this; the others serve
                log.exception("provider %r: the shared engine core failed to start", core.name)
                self._tell(core.name, "failed", f"{type(exc).__name__}: {exc}")
                continue
            log.info(
                "provider %r: shared core ready in %.1f s for %d workers",
                core.name, time.monotonic() - began, self.count,
            )  # fmt: skip
            self._tell(core.name, "ready")

    def _watch(self) -> int:
        watched: dict[int, str] = {}  # a core's sentinel → its name
        for core in self.cores:
            watched.update(dict.fromkeys(core.sentinels(), core.name))
        by_sentinel = {w.process.sentinel: w for w in self.workers}
        while True:
            for handle in wait([*by_sentinel, *watched]):
                sentinel = cast(int, handle)  # only sentinels are waited on
                worker = by_sentinel.get(sentinel)
                if worker is not None:
                    log.error(
                        "%s exited (code %s): its slot in the shared engine cannot be filled "
                        "again; stopping the gateway",
                        worker.process.name, worker.process.exitcode,
                    )  # fmt: skip
                    return 1
                name = watched.pop(sentinel)
                if name not in watched.values():  # the first of its processes to end
                    log.error("provider %r: the shared engine core died", name)
                    self._tell(name, "dead", "its process exited")

    def _tell(self, core: str, status: CoreStatus, detail: str = "") -> None:
        for worker in self.workers:
            worker.tell(core, status, detail)

    def _stop_workers(self) -> None:
        """SIGTERM to each (uvicorn drains for up to `drain_s`), then SIGKILL to any left."""
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.terminate()
        deadline = time.monotonic() + self.drain_s + STOP_GRACE_S
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.error("%s did not stop in time: killed", worker.process.name)
                worker.process.kill()
                worker.process.join()
            for end in worker.status.values():
                end.close()

    def _hangup(self, signum: int, frame: FrameType | None) -> None:
        for worker in self.workers:
            if worker.process.pid is not None and worker.process.is_alive():
                os.kill(worker.process.pid, signal.SIGHUP)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            self.stopping = True
            raise Stop


def run_worker(
    config: uvicorn.Config,
    sock: socket.socket,
    slots: Mapping[str, dict[str, object]],
    status: Mapping[str, Connection],
) -> None:
    """One worker: its slots where its providers find them, then uvicorn on the shared socket."""
    found = {}
    for name, slot in slots.items():
        found[name] = {**slot, "status_fd": os.dup(status[name].fileno())}
        status[name].close()
    os.environ[SLOTS_ENV] = json.dumps(found)
    # A SIGHUP passed on before the app's reload watch is up must not end the worker (the
    # default action): the watch reads the config when it starts anyway.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    config.configure_logging()
    uvicorn.Server(config).run(sockets=[sock])


def serve(config: uvicorn.Config, cores: Sequence[SharedCore], count: int, drain_s: float) -> int:
    return Supervisor(config, cores, count, drain_s).run()

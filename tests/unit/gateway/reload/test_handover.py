"""Config reload without processes: the successor runtime (what it reuses, what it rebuilds, what
it refuses, what waits for a restart) and the reloader inside a running app (file changes, a
request under way keeping its runtime and the providers it uses, refusals)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from core.errors import ConfigError, RateLimited
from core.provider import Adapter
from gateway.api.app import GatewayApp, create_app
from gateway.asgi import Message
from gateway.config import Config, ProviderConfig, parse
from gateway.reload import parse_snapshot, read, successor
from gateway.routing.circuits import OPEN, CircuitPolicy
from gateway.runtime import Runtime

pytestmark = pytest.mark.asyncio
KEY = "sk-reload-unit"
DEADLINE_S = 5.0


class Fake(Adapter[None, None, None]):
    type_tags: ClassVar[tuple[str, ...]] = ("fake",)
    reloadable: ClassVar[bool] = True

    def __init__(self, name: str, fail: Exception | None = None) -> None:
        self.name = name
        self.fail = fail
        self.started = self.closed = False

    async def start(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.started = True

    async def aclose(self) -> None:
        self.closed = True

    def ready(self) -> bool:
        return True

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        return None


class FakeEngine(Fake):
    reloadable: ClassVar[bool] = False


def document(providers: Sequence[str] = ("a", "b"), **changes: Any) -> dict[str, Any]:
    """A config: one openai block per provider, alias `m` on the first; `changes` replace
    sections (`blocks`: changed provider blocks by name)."""
    blocks = {p: {"type": "openai", "base_url": f"http://{p}.invalid/v1"} for p in providers}
    blocks.update(changes.pop("blocks", {}))
    return {
        "server": {"watch_config_s": 0.02},
        "auth": {"keys": [{"id": "t", "key": KEY, "limits": {"rpm": 2}}]},
        "providers": blocks,
        "models": {"m": {"targets": [{"provider": providers[0], "model": "x"}]}},
        **changes,
    }


def config(doc: dict[str, Any]) -> Config:
    return parse(yaml.safe_dump(doc))


class Built:
    """Builds fakes from provider blocks, keeping the last one built under each name."""

    def __init__(self, make: Callable[[str], Fake] = Fake) -> None:
        self.make = make
        self.providers: dict[str, Fake] = {}

    def __call__(self, block: ProviderConfig) -> Fake:
        fake = self.providers[block.name] = self.make(block.name)
        return fake


async def running(doc: dict[str, Any], make: Callable[[str], Fake] = Fake) -> Runtime:
    runtime = Runtime.build(config(doc), build=Built(make))
    await runtime.start()
    return runtime


async def admit(runtime: Runtime, key: str = "t") -> None:
    await runtime.limiter.admit(key, "m", "m", lambda: (0, 0))


# ---------------------------------------------------------------- the successor


async def test_unchanged_providers_are_kept_and_the_others_rebuilt_before_the_swap() -> None:
    old = await running(document(("a", "b", "c")))
    changed = {"b": {"type": "openai", "base_url": "http://elsewhere.invalid/v1"}}
    new = Built()
    h = await successor(old, config(document(("a", "b", "d"), blocks=changed)), new)
    rt = h.runtime
    assert rt.providers["a"] is old.providers["a"]  # its sessions and pools go on
    assert rt.providers["b"] is new.providers["b"] and rt.providers["d"] is new.providers["d"]
    assert all(p.started for p in (new.providers["b"], new.providers["d"]))
    assert (h.rebuilt, h.removed) == (("b", "d"), ("c",))
    assert h.leftovers.providers == [old.providers["b"], old.providers["c"]]
    assert not any(p.closed for p in old.providers.values())  # type: ignore[attr-defined]
    assert set(rt.config.providers) == set(rt.providers)
    assert (rt.metrics, rt.circuits, rt.started) == (old.metrics, old.circuits, True)


async def test_an_engine_whose_block_changed_or_is_new_refuses_the_reload() -> None:
    engine = {"type": "openai", "base_url": "http://engine.invalid/v1"}
    old = await running(document(blocks={"e": engine}), make=FakeEngine)
    h = await successor(old, config(document(blocks={"e": engine}, metrics={})), Built(FakeEngine))
    assert h.runtime.providers["e"] is old.providers["e"]  # unchanged: kept
    for doc, message in (
        (document(blocks={"e": {**engine, "max_connections": 4}}), "change only with a restart"),
        (document(blocks={"e": engine, "e2": engine}), "added only with a restart"),
    ):
        new = Built(FakeEngine)
        with pytest.raises(ConfigError, match=message) as err:
            await successor(old, config(doc), new)
        assert err.value.path.startswith("providers.e")
        assert not any(p.started for p in new.providers.values())


async def test_a_provider_that_fails_to_start_refuses_and_what_started_closes() -> None:
    old = await running(document(("a",)))
    new = Built(lambda name: Fake(name, OSError("no route") if name == "y" else None))
    with pytest.raises(ConfigError, match=r"^providers\.y: failed to start: OSError"):
        await successor(old, config(document(("a", "x", "y"))), new)
    assert new.providers["x"].closed
    assert not old.providers["a"].closed  # type: ignore[attr-defined]


async def test_the_limiter_keeps_its_counts_and_takes_the_new_limits() -> None:
    old = await running(document())
    await admit(old)
    await admit(old)
    keys = {"keys": [{"id": "t", "key": KEY, "limits": {"rpm": 2}}, {"id": "u", "key": "sk-u"}]}
    h = await successor(old, config(document(auth=keys)), Built())
    assert h.runtime.limiter is old.limiter and not h.fresh_limiter
    with pytest.raises(RateLimited):
        await admit(h.runtime)  # the third of two per minute
    await admit(h.runtime, "u")  # the new key has no limits: its rules are the new config's


async def test_a_changed_rate_limit_section_brings_a_fresh_limiter() -> None:
    old = await running(document())
    await admit(old)
    await admit(old)
    h = await successor(old, config(document(rate_limit={"replicas": 2})), Built())
    assert h.fresh_limiter and h.leftovers.limiter is old.limiter
    await admit(h.runtime)  # counts start from zero


async def test_the_board_keeps_its_breakers_and_takes_the_new_policy() -> None:
    old = await running(document(circuit_breaker={"failures": 1}))
    old.circuits.get("a", "x").failed(time.monotonic())
    doc = document(circuit_breaker={"failures": 3, "cooldown_s": 7})
    h = await successor(old, config(doc), Built())
    breaker = h.runtime.circuits.get("a", "x")
    assert h.runtime.circuits is old.circuits
    assert (breaker.state, breaker.policy) == (OPEN, CircuitPolicy(3, 7.0))


async def test_host_port_and_metrics_switch_wait_for_a_restart() -> None:
    old = await running(document())
    server = {"host": "0.0.0.0", "port": 9999, "max_body_bytes": 2048, "watch_config_s": 0}
    h = await successor(old, config(document(server=server, metrics={"enabled": False})), Built())
    got = h.runtime.config
    assert h.pinned == ("server.host", "server.port", "metrics")
    assert (got.server.host, got.server.port) == ("127.0.0.1", 8080)
    assert got.metrics == old.config.metrics
    assert (got.server.max_body_bytes, got.server.watch_config_s) == (2048, 0.0)
    assert h.changed == ("server",)


async def test_the_listeners_limits_wait_for_a_restart() -> None:
    old = await running(document())
    server = {
        "max_head_bytes": 4096,
        "max_headers": 10,
        "max_connections": 3,
        "timeouts": {"head_s": 1, "body_s": 2, "keep_alive_s": 3},
        "watch_config_s": old.config.server.watch_config_s,
    }
    metrics = {"require_key": True, "min_interval_s": 5}
    h = await successor(old, config(document(server=server, metrics=metrics)), Built())
    assert h.pinned == (
        "server.max_head_bytes",
        "server.max_headers",
        "server.max_connections",
        "server.timeouts",
        "metrics",
    )
    assert h.runtime.config.server == old.config.server
    assert h.runtime.config.metrics == old.config.metrics


# ---------------------------------------------------------------- the reloader in an app


@contextlib.asynccontextmanager
async def serving(path: Path, workers: int = 1) -> AsyncIterator[GatewayApp]:
    """The app built from a file, its lifespan (and with it the reloader) running, as one of
    `workers` serving processes."""
    snapshot = read(path)
    app = create_app(parse_snapshot(snapshot), watch=snapshot, workers=workers)
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        yield app
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await task


async def until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(doc))


def reloads(app: GatewayApp, result: str) -> float:
    value = app.runtime.metrics.registry.get_sample_value(
        "gateway_config_reloads_total", {"result": result}
    )
    return value or 0.0


class HeldRequest:
    """A completion request under way: it waits for its body until `release()`."""

    def __init__(self, app: GatewayApp) -> None:
        self._body = asyncio.Event()
        headers = [(b"authorization", f"Bearer {KEY}".encode())]
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        await self._body.wait()
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def _send(self, message: Message) -> None:
        return None

    async def release(self) -> None:
        self._body.set()
        await self.task


async def test_a_changed_file_swaps_and_what_it_drops_closes_after_the_last_request(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gateway.yaml"
    write(path, document())
    async with serving(path) as app:
        old = app.runtime
        held = HeldRequest(app)
        await until(lambda: old.inflight == 1)
        write(path, document(("a",)))
        await until(lambda: app.runtime is not old)
        dropped, kept = old.providers["b"], old.providers["a"]
        assert app.runtime.providers["a"] is kept and "b" not in app.runtime.providers
        await asyncio.sleep(0.05)
        assert dropped.ready()  # the request under way may still use it
        await held.release()
        await until(lambda: not dropped.ready())
        assert kept.ready() and reloads(app, "ok") == 1
    assert not kept.ready()  # the shutdown closes the runtime in use


async def test_a_touch_changes_nothing_and_an_invalid_file_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gateway.yaml"
    write(path, document())
    async with serving(path) as app:
        first = app.runtime
        os.utime(path, ns=(1, 1))
        await asyncio.sleep(0.1)  # five checks
        assert app.runtime is first and reloads(app, "ok") == reloads(app, "error") == 0
        bad = document()
        bad["models"]["m"]["targets"][0]["provider"] = "nope"
        with caplog.at_level(logging.INFO, logger="gateway.reload"):
            write(path, bad)
            await until(lambda: reloads(app, "error") == 1)
        assert app.runtime is first
        [record] = caplog.records
        assert record.levelno == logging.ERROR
        assert record.getMessage() == (
            "config reload refused: models.m.targets[0].provider: unknown provider 'nope'; "
            "keeping the running config"
        )
        gauge = app.runtime.metrics.registry.get_sample_value
        assert gauge("gateway_config_last_reload_success") == 0
        write(path, document())  # back to what runs: nothing is refused any more
        await until(lambda: gauge("gateway_config_last_reload_success") == 1)
        assert app.runtime is first


async def test_with_several_workers_a_limit_on_the_memory_backend_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each worker would count the limit apart: the reload names it and the running config
    stays; on the redis backend the same limit is one count for all."""
    path = tmp_path / "gateway.yaml"
    unlimited = document()
    unlimited["auth"]["keys"][0].pop("limits")
    write(path, unlimited)
    async with serving(path, workers=2) as app:
        first = app.runtime
        limited = document()
        limited["models"]["m"]["limits"] = {"tpm": 100}
        with caplog.at_level(logging.ERROR, logger="gateway.reload"):
            write(path, limited)
            await until(lambda: reloads(app, "error") == 1)
        assert app.runtime is first
        [record] = caplog.records
        assert record.getMessage().startswith(
            "config reload refused: auth.keys[0]: a rate limit with 2 workers on the memory "
            "backend would be counted in each worker apart; set rate_limit.backend: redis"
        )

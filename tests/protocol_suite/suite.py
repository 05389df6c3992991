"""uvicorn's HTTP protocol tests, loaded from the copy scripts/uvicorn_suite.py fetched, with their
mock event loop completed for the gateway's protocol.

uvicorn's MockLoop has what uvicorn's protocols call: create_task (the coroutine, run later by
`run_one`) and call_later (its timers, fired by `run_later(with_delay)`). The gateway's protocol
also asks the loop for `time()` (its timeouts' one timer is moved, not re-armed, by the time
gone since the connection's last activity), `create_future()` (a request waiting for its body)
and `call_soon()` (the writes held to the end of the event loop's turn). MockLoop here adds
them as the tests mean them:

- the clock reads 0 until `run_later(with_delay)`, which sets it to `with_delay`: every timer
  armed before then is due when its delay is at most `with_delay`, which is uvicorn's own rule;
  a timer armed after that (by a timer's callback, say) is due `delay` after the clock's
  reading then;
- a future is the running loop's (uvicorn's protocols make their asyncio.Event there too);
- the end of the turn comes when the running loop next runs its callbacks, or when `run_one`
  returns (the test then reads what the loop's turn wrote), whichever is first.

The same loop runs uvicorn's own httptools protocol too (tests/protocol_suite/conftest.py): its
results show that these additions change nothing the tests see.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gateway.server.protocol import GatewayHttpProtocol

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "scripts" / "uvicorn_suite.py"
MODULE = "uvicorn_test_http"  # the name scripts/uvicorn_suite.py gives uvicorn's test module
HELPER = "tests.response"  # the name it imports its helper by


def suite_dir() -> Path:
    """The fetched copy's directory (fetched now if it is not yet): fails loudly, never skips."""
    done = subprocess.run([sys.executable, str(FETCH)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{FETCH.name} failed ({done.returncode}):\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


@contextmanager
def importable(folder: Path) -> Iterator[None]:
    """`folder` on sys.path, and its response.py as `tests.response`, while uvicorn's module is
    imported: it imports its helper from its own `tests` package, a name this tree's tests
    package already holds."""
    spec = importlib.util.spec_from_file_location(HELPER, folder / "response.py")
    assert spec is not None and spec.loader is not None
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    sys.modules[HELPER] = helper
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        del sys.modules[HELPER]


def load() -> ModuleType:
    """uvicorn's test module, its asserts rewritten by pytest, over this module's MockLoop; its
    tests that name uvicorn's httptools protocol (HttpToolsProtocol) get the gateway's, which
    reimplements it."""
    pytest.register_assert_rewrite(MODULE)
    with importable(suite_dir()):
        module = importlib.import_module(MODULE)
    base: type[Any] = module.MockLoop
    mock_loop = type("MockLoop", (MockLoopMixin, base), {})
    vars(module).update(MockLoop=mock_loop, HttpToolsProtocol=SuiteGatewayProtocol)
    return module


class SuiteGatewayProtocol(GatewayHttpProtocol):
    """The gateway's protocol with the one attribute of uvicorn's that the tests read to see what
    the app was given: `scope`, the last request's ASGI scope (the gateway's keeps it on the
    request's Cycle). Nothing else changes."""

    @property
    def scope(self) -> dict[str, Any]:
        assert self.cycle is not None, "no request yet"
        return self.cycle.scope


class MockLoopMixin:
    """What the gateway's protocol asks of the loop beyond uvicorn's MockLoop (module doc)."""

    _later: list[Any]  # uvicorn's MockTimerHandle: `delay` here is when it is due

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.soon: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        if not self.soon:
            asyncio.get_running_loop().call_soon(self.end_turn)
        self.soon.append((callback, args))

    def end_turn(self) -> None:
        soon, self.soon = self.soon, []
        for callback, args in soon:
            callback(*args)

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Any:
        return super().call_later(self.now + delay, callback, *args)  # type: ignore[misc]

    async def run_one(self) -> Any:
        try:
            return await super().run_one()  # type: ignore[misc]
        finally:
            self.end_turn()

    def run_later(self, with_delay: float) -> None:
        self.now = max(self.now, with_delay)
        for handle in [handle for handle in self._later if handle.delay <= self.now]:
            if not handle.cancelled:
                handle.cancel()  # fired: a cancel() from its callback is then a no-op
                handle.callback(*handle.args)

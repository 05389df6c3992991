"""The fixtures uvicorn's HTTP protocol tests take (its own conftest's, for the gateway's protocol),
and the harness's rules for them: test_uvicorn_http.py's tables applied (deselected, strict
xfails), a skip made a failure (a test is run or deselected with a reason, never silently
skipped), and a count of what ran at the end of the run."""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from uvicorn.config import HTTP_PROTOCOLS, LOGGING_CONFIG
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from tests.protocol_suite.suite import SuiteGatewayProtocol

SUITE_FILE = Path(__file__).parent / "test_uvicorn_http.py"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
OUTCOMES = pytest.StashKey[dict[str, tuple[str, str]]]()  # node id: its protocol, its outcome
DESELECTED = pytest.StashKey[int]()


@pytest.fixture(
    params=[SuiteGatewayProtocol, HttpToolsProtocol], ids=["gateway", "uvicorn"], scope="session"
)
def http_protocol_cls(request: pytest.FixtureRequest) -> type:
    """The protocol under test, and uvicorn's own as the control."""
    protocol: type = request.param
    return protocol


@pytest.fixture(scope="session")
def ws_protocol_cls() -> type:
    """The WebSocket protocol uvicorn[standard] installs (uvicorn's conftest adds wsproto's when
    present); the gateway's protocol upgrades to none."""
    return WebSocketsSansIOProtocol


@pytest.fixture(autouse=True)
def uvicorn_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As uvicorn's conftest: its loggers propagate, for caplog. Each Config the tests make
    configures them: their state is put back after each test. They start without filters: a
    test elsewhere in the session may have applied the gateway's own logging config (its
    QueryHidden filter on the access log), and these tests are of uvicorn's."""
    monkeypatch.setitem(LOGGING_CONFIG["loggers"]["uvicorn"], "propagate", True)
    loggers = [logging.getLogger(name) for name in UVICORN_LOGGERS]
    saved = [
        (log.handlers[:], log.filters[:], log.level, log.propagate, log.disabled) for log in loggers
    ]
    for log in loggers:
        log.filters[:] = []
    yield
    for log, (handlers, filters, level, propagate, disabled) in zip(loggers, saved, strict=True):
        log.handlers[:], log.filters[:] = handlers, filters
        log.setLevel(level)
        log.propagate, log.disabled = propagate, disabled


@pytest.fixture(autouse=True)
def httptools_is_the_gateways(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's server made with `http="httptools"` (test_fragmentation) runs the gateway's."""
    monkeypatch.setitem(HTTP_PROTOCOLS, "httptools", "gateway.server.protocol:GatewayHttpProtocol")


def _in_suite(item: pytest.Item) -> bool:
    return item.path == SUITE_FILE


def _side(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    control = callspec is not None and callspec.params.get("http_protocol_cls") is HttpToolsProtocol
    return "uvicorn's own protocol (control)" if control else "the gateway's protocol"


def _check_tables(module: ModuleType) -> None:
    """Every name in the tables is one of the suite's tests: a test renamed upstream shows."""
    for name in [*module.DESELECTED, *module.DIFFERENCES]:
        if name.partition("[")[0] not in module.TESTS:
            raise pytest.UsageError(f"{SUITE_FILE.name}: no test {name} in uvicorn's suite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite = [item for item in items if _in_suite(item)]
    if not suite:
        return
    module: ModuleType = suite[0].module  # type: ignore[attr-defined]
    _check_tables(module)
    dropped = [item for item in suite if item.originalname in module.DESELECTED]  # type: ignore[attr-defined]
    for item in suite:
        reason = module.DIFFERENCES.get(item.name)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
    config.stash[DESELECTED] = len(dropped)
    config.stash[OUTCOMES] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if _in_suite(item):
        _no_skip(report)
        _record(item.config.stash[OUTCOMES], _side(item), report)
    return report


def _no_skip(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped ({reason}): deselect it in {SUITE_FILE.name}, with why"


def _record(outcomes: dict[str, tuple[str, str]], side: str, report: pytest.TestReport) -> None:
    if report.when == "call" or not report.passed:
        xfailed = report.skipped and hasattr(report, "wasxfail")
        outcome = "xfailed" if xfailed else report.outcome
        when = "" if report.when == "call" else f" in {report.when}"
        outcomes[report.nodeid] = side, outcome + when


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    outcomes = config.stash.get(OUTCOMES, {})
    if not outcomes:
        return
    write = terminalreporter.write_line
    write(
        f"uvicorn's HTTP protocol tests ({SUITE_FILE.name}), {config.stash[DESELECTED]} deselected:"
    )
    for side in sorted({side for side, _ in outcomes.values()}):
        ran = [outcome for on, outcome in outcomes.values() if on == side]
        counts = ", ".join(f"{ran.count(outcome)} {outcome}" for outcome in sorted(set(ran)))
        write(f"  on {side}: {len(ran)} ({counts})")

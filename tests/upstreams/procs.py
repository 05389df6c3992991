"""Run test servers as subprocesses: a free port, readiness by polling, a clean stop.

Generic (reuse for the gateway under uvicorn, vLLM, …):
    free_port() -> int
    wait_http_ready(url, timeout=15.0, proc=None)   # polls every 50 ms, no fixed sleeps
    start_process(argv, port=…, ready_url=…, url=…) -> ServerProcess  (.url, .port, .stop())
    start_on_free_port(argv_for, ready_path=…, url_path=…)   # retries a port taken meanwhile
    start_on_free_port(…, tls=client)   # a server on https: probed with the ssl.SSLContext
Every server runs in a process group of its own, and stop() signals the whole group, so
children (uvicorn workers, vLLM's engine core) go with it.

Scripted upstreams:
    with start_scripted("fireworks", api_key="k") as up:
        up.url        # http://127.0.0.1:<port>/inference/v1 (openai: …/v1; azure: the root)
        up.requests() # what it received; up.reset(); up.stats(); up.script({"status": 503})
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 15.0
POLL_INTERVAL_S = 0.05
STOP_TIMEOUT_S = 5.0
OPENAI_TEST_KEY = "sk-scripted-openai"
FIREWORKS_TEST_KEY = "fw-scripted-fireworks"
AZURE_TEST_KEY = "az-scripted-azure"
# Where each dialect's API is (Azure's: the resource's endpoint, the paths are its own).
BASE_PATHS = {"openai": "/v1", "fireworks": "/inference/v1", "azure": ""}


class ServerStartError(RuntimeError):
    """The server exited or did not become ready in time; carries its output."""

    def __init__(self, message: str, exited: bool = False) -> None:
        super().__init__(message)
        self.exited = exited


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it; tiny race until it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _answers(url: str, verify: ssl.SSLContext | bool) -> bool:
    try:
        return httpx.get(url, verify=verify, timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def wait_http_ready(
    url: str,
    timeout: float = READY_TIMEOUT_S,
    proc: subprocess.Popen[bytes] | None = None,
    verify: ssl.SSLContext | bool = True,
) -> None:
    """Poll `url` until it answers 200; fail early if `proc` exits, or after `timeout` s.
    `verify`: for an https `url`, the client context the probe trusts the server with."""
    deadline = time.monotonic() + timeout
    while not _answers(url, verify):
        if proc is not None and proc.poll() is not None:
            message = f"process exited with {proc.returncode} before {url} was ready"
            raise ServerStartError(message, exited=True)
        if time.monotonic() > deadline:
            raise ServerStartError(f"{url} not ready after {timeout:.1f} s")
        time.sleep(POLL_INTERVAL_S)


class StopOnExit:
    """`with server:` stops it at the end."""

    def stop(self) -> int | None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ServerProcess(StopOnExit):
    """A server subprocess; output goes to a temp log file (see `output()`)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        port: int,
        url: str,
        log: IO[bytes],
        host: str = "127.0.0.1",
    ) -> None:
        self.proc = proc
        self.port = port
        self.host = host
        self.url = url
        self._log = log

    @property
    def root(self) -> str:
        """http(s)://host:port (the url's scheme), without any API prefix."""
        scheme = self.url.partition("://")[0]
        return f"{scheme}://{self.host}:{self.port}"

    def output(self) -> str:
        """Everything the process wrote to stdout/stderr so far."""
        return Path(self._log.name).read_text(errors="replace")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGINT, wait up to `timeout`, then SIGKILL. Idempotent; returns the exit code."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # whatever the group left behind
        self._close_log()
        return self.proc.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _close_log(self) -> None:
        if not self._log.closed:
            self._log.close()
            with contextlib.suppress(OSError):
                os.unlink(self._log.name)


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


S = TypeVar("S", bound=ServerProcess)


def start_process(
    argv: Sequence[str],
    *,
    port: int,
    ready_url: str,
    url: str,
    timeout: float = READY_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    host: str = "127.0.0.1",
    cls: type[S] = ServerProcess,  # type: ignore[assignment]
    verify: ssl.SSLContext | bool = True,
) -> S:
    """Start `argv`, wait until `ready_url` answers 200 (`verify`: as in wait_http_ready) and
    return the running server. On failure the process is stopped and its output is in the
    exception message."""
    log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=_env(env),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stop() reaches its children too
    )
    server = cls(proc, port, url, log, host)
    try:
        wait_http_ready(ready_url, timeout, proc, verify)
    except ServerStartError as exc:
        output = _read(log.name)
        server.stop()
        message = f"{exc}; argv={list(argv)}\n{output}"
        raise ServerStartError(message, exc.exited) from None
    return server


def start_on_free_port(
    argv_for: Callable[[int], Sequence[str]],
    *,
    ready_path: str,
    url_path: str = "",
    timeout: float = READY_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    cls: type[S] = ServerProcess,  # type: ignore[assignment]
    attempts: int = 3,
    cwd: Path = REPO_ROOT,
    tls: ssl.SSLContext | None = None,
) -> S:
    """`start_process` on a free port; another port when the first was taken before the server
    bound it (the process exits early then). `tls`: the server speaks https, and is probed
    with this client context."""
    scheme = "http" if tls is None else "https"
    for attempt in range(attempts):
        port = free_port(host)
        root = f"{scheme}://{host}:{port}"
        try:
            return start_process(
                argv_for(port),
                port=port,
                ready_url=root + ready_path,
                url=root + url_path,
                timeout=timeout,
                env=env,
                cwd=cwd,
                host=host,
                cls=cls,
                verify=True if tls is None else tls,
            )
        except ServerStartError as exc:
            if not exc.exited or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _read(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text(errors="replace")
    return "(output removed)"


class ScriptedUpstream(ServerProcess):
    """A running `tests.upstreams.scripted` server plus its test-control endpoints."""

    @property
    def dialect(self) -> str:
        if self.url.endswith(BASE_PATHS["fireworks"]):
            return "fireworks"
        return "openai" if self.url.endswith(BASE_PATHS["openai"]) else "azure"

    _http: httpx.Client | None = None

    def _control(self, method: str, path: str, payload: Any = None) -> Any:
        # One kept-alive client: a new one per call costs more than the call (SSL context).
        if self._http is None:
            self._http = httpx.Client(base_url=self.root, timeout=5.0, trust_env=False)
        r = self._http.request(method, path, json=payload)
        if r.is_error:  # with the server's reason (e.g. which /__script key is wrong)
            message = f"{method} {path}: {r.status_code} {r.text}"
            raise httpx.HTTPStatusError(message, request=r.request, response=r)
        return r.json()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        if self._http is not None:
            self._http.close()
            self._http = None
        return super().stop(timeout)

    def requests(self) -> list[dict[str, Any]]:
        """Every completions request received: {seq, time, path, query, headers (lower-case),
        body, outcome}."""
        result: list[dict[str, Any]] = self._control("GET", "/__requests")
        return result

    def last_request(self) -> dict[str, Any]:
        return self.requests()[-1]

    def reset(self) -> None:
        self._control("POST", "/__reset")

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._control("GET", "/__stats")
        return result

    def script(self, *steps: dict[str, Any]) -> None:
        """Queue reactions to the next requests, e.g. script({"status": 503, "times": 2});
        an invalid step raises httpx.HTTPStatusError naming the key, and queues nothing."""
        self._control("POST", "/__script", list(steps))


def scripted_argv(dialect: str, port: int, host: str, options: Mapping[str, Any]) -> list[str]:
    argv = [sys.executable, "-m", "tests.upstreams.scripted", "--dialect", dialect]
    argv += ["--port", str(port), "--host", host]
    for name, value in options.items():
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def start_scripted(
    dialect: str,
    *,
    api_key: str | None = None,
    models: Sequence[str] | None = None,
    context_window: int | None = None,
    chunk_delay_ms: float | None = None,
    host: str = "127.0.0.1",
    timeout: float = READY_TIMEOUT_S,
    attempts: int = 3,
) -> ScriptedUpstream:
    """Start a scripted upstream of `dialect` ("openai" | "fireworks" | "azure") on a free
    port."""
    options = {
        "api_key": api_key,
        "models": ",".join(models) if models else None,
        "context_window": context_window,
        "chunk_delay_ms": chunk_delay_ms,
    }
    return start_on_free_port(
        lambda port: scripted_argv(dialect, port, host, options),
        ready_path="/health",
        url_path=BASE_PATHS[dialect],
        timeout=timeout,
        host=host,
        cls=ScriptedUpstream,
        attempts=attempts,
    )

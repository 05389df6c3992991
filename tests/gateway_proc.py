"""Run the gateway as users do: `gateway serve` under uvicorn, in a subprocess, on a free port.

    gw = GatewayProcess(config_text, workdir)   # writes workdir/gateway.yaml, waits on /readyz
    gw.url                                      # http://127.0.0.1:<port>
    gw.logs(); gw.stop()                        # logs() still works after stop()
    gw.send_signal(signal.SIGHUP)               # to the server process (uvicorn's supervisor)
    GatewayProcess(text, workdir, tls=client)   # server.tls in the config: probed over https
                                                # with the ssl.SSLContext `client`; url https://

Process handling (free port, readiness polling, SIGINT then SIGKILL, output capture) is
`tests.upstreams.procs`; this only adds the gateway's command line, and the probe over TLS.
"""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from tests.upstreams.procs import (
    POLL_INTERVAL_S,
    ServerProcess,
    ServerStartError,
    StopOnExit,
    _env,
    free_port,
    start_on_free_port,
)

HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0


class _GatewayServer(ServerProcess):
    """Keeps the output when the log file is removed at stop()."""

    final_output: str | None = None

    def _close_log(self) -> None:
        if not self._log.closed:
            self.final_output = self.output()
        super()._close_log()

    def logs_after_stop(self) -> str:
        """What it wrote, before stop() or after it."""
        return self.final_output if self.final_output is not None else self.output()


class GatewayProcess(StopOnExit):
    def __init__(
        self,
        config_text: str,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        log_level: str = "warning",
        timeout: float = READY_TIMEOUT_S,
        workers: int = 1,
        extra_args: tuple[str, ...] = (),
        cwd: Path | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """`cwd`: where it runs (the workdir by default, so that a relative path in the config,
        such as the default file store's ./data/files, is the test's own). `tls`: the config
        has server.tls, and the readiness probe is made with this client context."""
        self.workers = workers
        self.extra_args = extra_args
        self.config = workdir / "gateway.yaml"
        self.config.write_text(config_text)
        where = workdir if cwd is None else cwd

        def argv(port: int) -> list[str]:
            return self._argv(port, log_level)

        if tls is None:
            self._server = start_on_free_port(
                argv,
                ready_path="/readyz",
                timeout=timeout,
                env=env,
                host=HOST,
                cls=_GatewayServer,
                cwd=where,
            )
        else:
            self._server = _start_tls(argv, tls, timeout, env, where)
        self.port = self._server.port
        self.url = self._server.url

    def _argv(self, port: int, log_level: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(self.config),
            "--host",
            HOST,
            "--port",
            str(port),
            "--log-level",
            log_level,
            "--workers",
            str(self.workers),
            *self.extra_args,
        ]

    @property
    def pid(self) -> int:
        return self._server.proc.pid

    def send_signal(self, sig: signal.Signals) -> None:
        self._server.proc.send_signal(sig)

    def logs(self) -> str:
        return self._server.logs_after_stop()

    def stop(self) -> int | None:
        return self._server.stop()


# ---------------------------------------------------------------- over TLS


def _start_tls(
    argv_for: Callable[[int], Sequence[str]],
    client: ssl.SSLContext,
    timeout: float,
    env: Mapping[str, str] | None,
    cwd: Path,
    attempts: int = 3,
) -> _GatewayServer:
    """start_on_free_port's, its probe over https with `client` (procs' speaks plain HTTP)."""
    for attempt in range(attempts):
        port = free_port(HOST)
        url = f"https://{HOST}:{port}"
        log = tempfile.NamedTemporaryFile(prefix="gateway-", suffix=".log", delete=False)  # noqa: SIM115
        proc = subprocess.Popen(
            list(argv_for(port)),
            cwd=cwd,
            env=_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() reaches the workers too
        )
        server = _GatewayServer(proc, port, url, log, HOST)
        try:
            _wait_ready(url + "/readyz", client, timeout, proc)
        except ServerStartError as exc:
            server.stop()
            if exc.exited and attempt < attempts - 1:
                continue  # the port was taken meanwhile
            raise ServerStartError(f"{exc}\n{server.logs_after_stop()}", exc.exited) from None
        return server
    raise AssertionError("unreachable")


def _wait_ready(
    url: str, client: ssl.SSLContext, timeout: float, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + timeout
    while not _answers(url, client):
        if proc.poll() is not None:
            raise ServerStartError(f"exited with {proc.returncode} before {url} was ready", True)
        if time.monotonic() > deadline:
            raise ServerStartError(f"{url} not ready after {timeout:.1f} s")
        time.sleep(POLL_INTERVAL_S)


def _answers(url: str, client: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=client, timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False

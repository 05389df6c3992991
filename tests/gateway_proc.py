"""Run the gateway as users do: `gateway serve` under uvicorn, in a subprocess, on a free port.

    gw = GatewayProcess(config_text, workdir)   # writes workdir/gateway.yaml, waits on /readyz
    gw.url                                      # http://127.0.0.1:<port>
    gw.logs(); gw.stop()                        # logs() still works after stop()
    gw.send_signal(signal.SIGHUP)               # to the server process (uvicorn's supervisor)
    GatewayProcess(text, workdir, tls=client)   # server.tls in the config: probed over https
                                                # with the ssl.SSLContext `client`; url https://

Process handling (free port, readiness polling over http or https, SIGINT then SIGKILL,
output capture) is `tests.upstreams.procs`; this only adds the gateway's command line.
"""

from __future__ import annotations

import signal
import ssl
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.upstreams.procs import ServerProcess, StopOnExit, start_on_free_port

HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0


class _GatewayServer(ServerProcess):
    """Keeps the output when the log file is removed at stop()."""

    final_output: str | None = None

    def _close_log(self) -> None:
        if not self._log.closed:
            self.final_output = self.output()
        super()._close_log()


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
        self._server = start_on_free_port(
            lambda port: self._argv(port, log_level),
            ready_path="/readyz",
            timeout=timeout,
            env=env,
            host=HOST,
            cls=_GatewayServer,
            cwd=workdir if cwd is None else cwd,
            tls=tls,
        )
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
        final = self._server.final_output
        return final if final is not None else self._server.output()

    def stop(self) -> int | None:
        return self._server.stop()

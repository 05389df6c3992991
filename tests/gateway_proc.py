"""Run the gateway as users do: `gateway serve` under uvicorn, in a subprocess, on a free port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    def __init__(self, config_text: str, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.config = workdir / "gateway.yaml"
        self.config.write_text(config_text)
        self.log = workdir / "gateway.log"
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(self.config),
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self._wait_ready(30.0)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited early:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"gateway not ready after {timeout}s:\n{self.log.read_text()}")

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()

"""A real redis-server for tests, on a free port, with no persistence.

    with RedisServer() as r:      # waits until it answers PING
        r.url                     # redis://127.0.0.1:<port>/0
        r.kill(); r.start()       # down and back up on the same port (state is gone)
        r.pause(); r.resume()     # SIGSTOP/SIGCONT: a Redis that accepts but never answers

`make test` installs redis-server (Debian); without it the fixture fails and says how to get it.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time

from tests.upstreams.procs import StopOnExit, free_port

READY_TIMEOUT_S = 10.0


class RedisServer(StopOnExit):
    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: `apt-get install redis-server` "
                "(make test installs it when run as root)"
            )
        self.binary = binary
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        argv = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--loglevel", "warning",
        ]  # fmt: skip
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.answers():
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited ({self._proc.returncode}): {argv}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING in time")
            time.sleep(0.02)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """One command over a raw connection (RESP inline), its raw reply."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
            s.sendall(" ".join(args).encode() + b"\r\n")
            return s.recv(1 << 16)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def pause(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> int | None:
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

"""A real redis-server for tests, on a free port, with no persistence.

    with RedisServer() as r:      # waits until it answers PING
        r.url                     # redis://127.0.0.1:<port>/0
        r.kill(); r.start()       # down and back up on the same port (state is gone)
        r.pause(); r.resume()     # SIGSTOP/SIGCONT: a Redis that accepts but never answers

`make test` installs redis-server (Debian); without it the fixture fails and says how to get it.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.upstreams.procs import StopOnExit, free_port

READY_TIMEOUT_S = 10.0


class RedisServer(StopOnExit):
    def __init__(self, port: int | None = None, extra: list[str] | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: `apt-get install redis-server` "
                "(make test installs it when run as root)"
            )
        self.binary = binary
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._extra = extra or []
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        argv = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--loglevel", "warning", *self._extra,
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


class RedisCluster(StopOnExit):
    """Three masters on free ports, joined by `redis-cli --cluster create` (no replicas).

    with RedisCluster(tmp_path) as c:
        c.url       # redis://127.0.0.1:<first port>/0: a Cluster client discovers the rest
    """

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.servers: list[RedisServer] = []
        try:
            for i in range(nodes):
                config = ["--cluster-enabled", "yes", "--cluster-config-file",
                          str(workdir / f"nodes-{i}.conf")]  # fmt: skip
                self.servers.append(RedisServer(port=_cluster_port(), extra=config))
            self._join()
        except BaseException:
            self.stop()
            raise

    def _join(self) -> None:
        self.url = f"redis://127.0.0.1:{self.servers[0].port}/0"
        addresses = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(b"cluster_state:ok" in s.command("CLUSTER", "INFO") for s in self.servers):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not become ready")
            time.sleep(0.05)

    def node_of(self, key: str) -> RedisServer:
        """The node that holds `key`'s slot (answers it without a MOVED)."""
        for s in self.servers:
            if not s.command("EXISTS", key).startswith(b"-MOVED"):
                return s
        raise LookupError(key)

    def stop(self) -> int | None:
        for s in self.servers:
            s.stop()
        return None


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free and valid too."""
    for _ in range(100):
        port = random.randrange(20000, 50000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")

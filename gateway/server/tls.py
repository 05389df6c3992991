"""TLS on the gateway's listener (`server.tls`): each connection's handshake, then its HTTP.

The loop's own TLS (what uvicorn's ssl_* settings turn on) would leave a connection uncounted
until its handshake is done, and give the handshake a minute: a client that opens connections
and never finishes a handshake would hold them past every limit of the listener. So uvicorn's
server stays plain TCP, and its protocol factory (`TlsConnection`, put in place by
`GatewayConfig.load`) wraps each connection in asyncio's SSL protocol from its accept (the one
written in Python, under uvloop too: uvloop's own is not to be had from a protocol factory):

- the connection counts toward `server.max_connections` from its accept (uvicorn's server
  state), and closes if its handshake is not done within the keep-alive or the head's timeout,
  whichever is shorter; a close waits as long for the peer's close_notify;
- once the handshake is done, the HTTP protocol (the gateway's, or uvicorn's own with
  `--http uvicorn`) takes the connection, with the scheme https;
- each serving process reads the certificates itself, and again when their files change
  (looked at, at most once a second, as a connection arrives): a certificate renewed in place
  (cert-manager, a Kubernetes Secret) is served to new connections without a restart or a
  SIGHUP. Files that do not load are logged, and the running certificate stays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from uvicorn.server import ServerState

from core.errors import ConfigError
from gateway.config.tls import TlsConfig, server_context

if TYPE_CHECKING:
    from gateway.server.protocol import GatewayConfig

log = logging.getLogger("gateway.tls")
CHECK_S = 1.0  # the files are looked at no more often than this
# asyncio's SSL protocol allocates its read buffer whole with each connection (256 KB by
# default): at this size 2,048 connections hold 64 MB. A TLS record is at most 16 KB.
READ_BYTES = 32 * 1024

Signature = tuple[int, int, int] | None  # st_mtime_ns, st_size, st_ino; None: not there


def signatures(files: Sequence[str]) -> tuple[Signature, ...]:
    """From os.stat, which follows symlinks: a Kubernetes Secret's symlink swap is a change."""
    seen: list[Signature] = []
    for file in files:
        try:
            st = os.stat(file)
        except OSError:
            seen.append(None)
        else:
            seen.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(seen)


class Certificates:
    """The listener's SSL context in one serving process, made again when its files change."""

    def __init__(self, tls: TlsConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.tls = tls
        self.clock = clock
        # Taken before the files are read: a change made while reading shows at the next look.
        self.seen = signatures(tls.files())
        self.context = server_context(tls)
        self.looked = clock()

    def current(self) -> ssl.SSLContext:
        """The context for a connection that has just arrived."""
        now = self.clock()
        if now - self.looked >= CHECK_S:
            self.looked = now
            self.refresh()
        return self.context

    def refresh(self) -> bool:
        """A new context if the files changed and load; True when it is in place."""
        seen = signatures(self.tls.files())
        if seen == self.seen:
            return False
        self.seen = seen  # a pair half written is tried again once the rest of it changes
        try:
            self.context = server_context(self.tls)
        except ConfigError as err:
            log.error("listener TLS: the files changed but do not load (%s); "
                      "new connections keep the running certificate", err)  # fmt: skip
            return False
        log.info("listener TLS: certificate files changed; new connections get them")
        return True


@dataclass(frozen=True, slots=True)
class TlsListener:
    """What a serving process's TLS connections share."""

    certificates: Certificates
    http: Callable[..., asyncio.Protocol]  # the HTTP protocol's class, as uvicorn calls it
    handshake_s: float  # the longest handshake, and the longest wait for the peer's close


class TlsConnection(SSLProtocol):
    """One connection, from its accept: the TLS handshake, then the HTTP protocol. Counted
    among the server's connections until the HTTP protocol counts it."""

    max_size = READ_BYTES

    def __init__(
        self,
        config: GatewayConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        listener = config.tls_listener
        assert listener is not None  # set by GatewayConfig.load, with this class
        loop = _loop or asyncio.get_event_loop()
        self.connections = server_state.connections
        self.raw: asyncio.BaseTransport | None = None  # the TCP connection
        http = listener.http(
            config=config, server_state=server_state, app_state=app_state, _loop=loop
        )
        # Nothing awaits the handshake: asyncio takes no future (its stubs want one), and the
        # stubs' int for the timeouts is a number of seconds all the same.
        waiter: Any = None
        seconds: dict[str, Any] = {
            "ssl_handshake_timeout": listener.handshake_s,
            "ssl_shutdown_timeout": listener.handshake_s,
        }
        context = listener.certificates.current()
        super().__init__(loop, Handshaken(self, http), context, waiter, server_side=True, **seconds)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        self.connections.add(self)  # type: ignore[arg-type]
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.connections.discard(self)
        super().connection_lost(exc)

    def handshaken(self) -> None:
        self.connections.discard(self)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown, while the handshake is under way: nothing to finish."""
        if self.raw is not None:
            self.raw.close()


class Handshaken(asyncio.Protocol):
    """The SSL protocol's app protocol until the handshake is done; then it hands the
    connection to the HTTP protocol, before any of the request's bytes are read."""

    def __init__(self, connection: TlsConnection, http: asyncio.Protocol) -> None:
        self.connection = connection
        self.http = http

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connection.handshaken()
        transport.set_protocol(self.http)
        self.http.connection_made(transport)


class HttpsNamed(logging.Filter):
    """uvicorn's "Uvicorn running on http://…" line, with https: its server is plain TCP, and
    it cannot know that every connection begins with the gateway's handshake."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args[:1] == ("http",) and "running on" in str(record.msg):
            record.args = ("https", *args[1:])
        return True

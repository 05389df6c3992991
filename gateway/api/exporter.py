"""The metrics listener (`metrics.listen`): /metrics on an address of its own, so that the API
port need not serve it (nor whoever reaches that port see the aliases, providers and upstream
models it names).

Deliberately small, beside the API's uvicorn: one request per connection (every answer closes
it), GET or HEAD /metrics only, a request head of at most HEAD_BYTES read within
`metrics.timeout_s`, the answer written within the same, and at most `metrics.max_connections`
open (another is answered 503 and closed). A request's body is never parsed (what the client
still sends after the head is read and dropped, bounded, once the answer is out). With
`metrics.require_key` a scrape presents an API key as the API's callers do (gateway.auth).

With several workers (`gateway serve --workers N`) each binds the address with SO_REUSEPORT
and the kernel spreads the connections among them; each renders every worker's values
(multiprocess mode, gateway.metrics), so whichever answers, it answers the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus

from core.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    ServiceUnavailable,
    error_json,
)
from gateway.config import MetricsConfig

log = logging.getLogger("gateway.exporter")

HEAD_BYTES = 8192  # Prometheus sends a few hundred bytes; a bearer key fits many times over
LINGER_BYTES = 1 << 20  # read and dropped after an answer, at most
PATH = "/metrics"
METHODS = ("GET", "HEAD")
_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) ([^ ]{1,2048}) HTTP/1\.[01]")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name (RFC 9110's token)
_JSON = "application/json"

Scrape = Callable[[str], Awaitable[tuple[bytes, str]]]  # given the Accept header
Authorize = Callable[[Mapping[str, str]], object]  # raises AuthenticationFailed


class HeadTooLarge(GatewayError):
    status = 431
    type = "invalid_request_error"


class Exporter:
    """`scrape`: the metrics' text and its content type (gateway.metrics' shared render), in the
    format the request's Accept header asks for (OpenMetrics or the text format).
    `authorize`: with metrics.require_key, the API's key check on the request's headers."""

    def __init__(self, config: MetricsConfig, scrape: Scrape, authorize: Authorize | None) -> None:
        if config.listen is None:
            raise ValueError("metrics.listen is not set")
        self._address = config.listen
        self._config = config
        self._scrape = scrape
        self._authorize = authorize
        self._open: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self, reuse_port: bool = False) -> None:
        """Listen; `reuse_port` lets the other workers bind the same address."""
        host, port = self._address
        self._server = await asyncio.start_server(
            self._accepted, host, port, limit=HEAD_BYTES, reuse_port=reuse_port or None
        )
        log.info("metrics on http://%s:%d%s", f"[{host}]" if ":" in host else host, port, PATH)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._open):
            task.cancel()
        await asyncio.gather(*self._open, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Called as each connection is accepted, so the cap counts exactly."""
        if len(self._open) >= self._config.max_connections:
            writer.writelines(_error(ServiceUnavailable("Too many metrics connections.")))
            writer.close()
            return
        task = asyncio.ensure_future(self._connection(reader, writer))
        self._open.add(task)
        task.add_done_callback(self._open.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closed = False
        try:
            answer = await self._answer(reader)
            if answer:
                async with asyncio.timeout(self._config.timeout_s):
                    for chunk in answer:  # apart: the body is shared, not copied into a join
                        writer.write(chunk)
                    await writer.drain()
                    await _linger(reader, writer)
            writer.close()
            closed = True
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # a slow or gone client: nothing more for it
        except Exception:
            log.exception("metrics listener: a connection failed")
        finally:
            if not closed:  # also when the listener stops (cancelled)
                writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader) -> list[bytes]:
        """The response to the connection's request, head and body ([]: none, it went quiet)."""
        try:
            async with asyncio.timeout(self._config.timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            return _error(HeadTooLarge(f"The request head is over {HEAD_BYTES} bytes."))
        except (TimeoutError, asyncio.IncompleteReadError):
            return []
        try:
            method, path, headers = _parse(head)
            if path != PATH:
                raise NotFound(f"Unknown path {method} {path[:200]}.")
            if method not in METHODS:
                raise MethodNotAllowed(
                    f"Method {method} is not allowed here.", headers={"allow": ", ".join(METHODS)}
                )
            if self._authorize is not None:
                self._authorize(headers)
        except GatewayError as err:
            return _error(err)
        body, ctype = await self._scrape(headers.get("accept", ""))
        return _response(200, ctype, body, send_body=method != "HEAD")


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The answer sent, the connection half-closed, what the client still sends (a body never
    read, a head past the bound) is read and dropped up to LINGER_BYTES: closing with bytes
    unread would reset the connection, and the client could lose the answer."""
    if writer.can_write_eof():
        writer.write_eof()
    left = LINGER_BYTES
    while left > 0 and (chunk := await reader.read(min(left, 65536))):
        left -= len(chunk)


def _parse(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, path (its query dropped) and headers (lower-case names, the first of each)."""
    line, *fields = head[:-4].split(b"\r\n")
    m = _REQUEST_LINE.fullmatch(line)
    if m is None:
        raise InvalidRequest("Malformed request line.")
    headers: dict[str, str] = {}
    for field in fields:
        name, colon, value = field.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise InvalidRequest("Malformed header line.")
        headers.setdefault(name.decode().lower(), value.strip(b" \t").decode("latin-1"))
    path = m.group(2).decode("latin-1").partition("?")[0]
    return m.group(1).decode(), path, headers


def _error(err: GatewayError) -> list[bytes]:
    return _response(err.status, _JSON, error_json(err), extra=err.headers)


def _response(
    status: int,
    ctype: str,
    body: bytes,
    send_body: bool = True,
    extra: Mapping[str, str] | None = None,
) -> list[bytes]:
    lines = [
        f"HTTP/1.1 {status} {_phrase(status)}",
        f"content-type: {ctype}",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{k}: {v}" for k, v in (extra or {}).items()),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return [head, body] if send_body else [head]


def _phrase(status: int) -> str:
    with contextlib.suppress(ValueError):
        return HTTPStatus(status).phrase
    return ""

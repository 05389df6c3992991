"""Egress proxies: which one an upstream is reached through, and the CONNECT exchange that
opens a tunnel through it.

An https upstream is reached through a tunnel: the proxy is asked to CONNECT to the upstream's
host and port, and once it answers 2xx the connection carries TLS to the upstream (http1.Pool
runs it). A plain http upstream is reached by absolute-form requests sent to the proxy
(`POST http://host:port/v1/completions HTTP/1.1`), which it forwards. The proxy comes from the
provider's config or from the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY and their
lower-case forms, as curl and httpx read them), never from a request.

Credentials in the proxy's URL go to the proxy only, as Basic Proxy-Authorization: in CONNECT
(never through the tunnel), or in each absolute-form request. A proxy is shown as
http://host:port, never with them.

What a proxy answers to CONNECT is bounded: all its heads (interim ones too) to
MAX_ANSWER_BYTES, each read as llhttp reads a response head. The tunnel opens on a 2xx with
nothing after its head: a TLS server speaks only once spoken to, so bytes there are the proxy's,
and nobody's answer.
"""

from __future__ import annotations

import asyncio
import base64
import urllib.request
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import unquote, urlsplit

import httptools

MAX_ANSWER_BYTES = 16 * 1024  # a proxy's answer to CONNECT: a status line and a few headers
HEAD_END = b"\r\n\r\n"
# How a proxy's refusal reads, by status (its reason phrase is its own, and not shown).
REFUSALS = {
    401: "unauthorized",  # tinyproxy's answer to credentials it does not know
    403: "forbidden",
    407: "proxy authentication required",
    502: "bad gateway",
    503: "service unavailable",
    504: "gateway timeout",
}
# Refusals the same proxy would repeat: its credentials or its rules, not a passing failure.
LASTING = frozenset({401, 403, 407})


class BadAnswer(Exception):
    """What the proxy sent is no answer to CONNECT (the text says what it was)."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy; `authorization` (Basic, from its URL's credentials) is never shown."""

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, url: str) -> Proxy:
        """The proxy of a URL ("http://user:pass@proxy.corp:3128"; "proxy.corp:3128" is read as
        http, as curl reads it). A ValueError's text never holds the URL: it may hold a
        password."""
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme.lower() != "http":
            raise ValueError(f"{parts.scheme}:// proxies are not supported: expected http://")
        try:
            host, port = parts.hostname, parts.port or 80
        except ValueError:
            raise ValueError("the proxy's port is not a number from 1 to 65535") from None
        if not host or not port:
            raise ValueError("expected http://host:port, e.g. http://proxy.corp:3128")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("a proxy's URL has no path, query or fragment: http://host:port")
        return cls(host, port, _basic(parts.username, parts.password))

    @property
    def authority(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def shown(self) -> str:
        """How logs and errors name it: without its credentials."""
        return f"http://{self.authority}"


def _basic(user: str | None, password: str | None) -> str | None:
    if user is None:
        return None
    pair = f"{unquote(user)}:{unquote(password or '')}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def from_environment(scheme: str, host: str, port: int) -> Proxy | None:
    """The proxy the environment names for an upstream (`scheme`: http or https), or None: none
    is set, or NO_PROXY names the upstream's host (urllib's reading: exact names, domain
    suffixes, host:port, `*`)."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url:
        return None
    where = host if ":" in host else f"{host}:{port}"  # an IPv6 address is matched whole
    # In urllib since Python 2, not in its type stubs.
    if urllib.request.proxy_bypass_environment(where, proxies):  # type: ignore[attr-defined]
        return None
    return Proxy.of(url)


def connect_request(host: str, port: int, proxy: Proxy) -> bytes:
    """The CONNECT request for a tunnel to host:port (its authority with the port, always)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"host: {authority}"]
    if proxy.authorization is not None:
        lines.append(f"proxy-authorization: {proxy.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")  # as the pool's host header


class _Head:
    """What llhttp says of one head: whether it was a whole response head."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = False

    def on_headers_complete(self) -> None:
        self.complete = True


def head_status(head: bytes) -> int:
    """The status of one response head (ending with its empty line), read by llhttp."""
    seen = _Head()
    parser = httptools.HttpResponseParser(seen)
    try:
        parser.feed_data(head)
    except httptools.HttpParserUpgrade:
        raise BadAnswer("answered CONNECT with a 101 (switching protocols)") from None
    except httptools.HttpParserError as exc:
        raise BadAnswer(f"sent an answer to CONNECT that is not HTTP/1.1 ({exc})") from None
    if not seen.complete:
        raise BadAnswer("sent an answer to CONNECT that is not HTTP/1.1")
    return parser.get_status_code()


class TunnelAnswer:
    """A proxy's answer to CONNECT, read as it arrives: interim (1xx) heads skipped, the final
    head's status returned once it is in."""

    __slots__ = ("_buffer", "_heads")

    def __init__(self) -> None:
        self._buffer = b""
        self._heads = 0  # the bytes of the heads read so far

    def feed(self, data: bytes) -> int | None:
        """The final status once its head is in; None while more is needed. BadAnswer: past
        the bound, not HTTP, a 101, or bytes after a 2xx's head."""
        buffer = self._buffer + data
        while (end := buffer.find(HEAD_END)) >= 0:
            head, buffer = buffer[: end + len(HEAD_END)], buffer[end + len(HEAD_END) :]
            self._heads += len(head)
            if self._heads > MAX_ANSWER_BYTES:
                break
            status = head_status(head)
            if status < 200:
                continue
            if status < 300 and buffer:
                raise BadAnswer(f"sent bytes after its {status} to CONNECT, before TLS began")
            return status
        if self._heads + len(buffer) > MAX_ANSWER_BYTES:
            raise BadAnswer(f"sent an answer to CONNECT over {MAX_ANSWER_BYTES} bytes")
        self._buffer = buffer
        return None


class Opening(asyncio.Protocol):
    """The CONNECT exchange on a new connection to the proxy: the request written once
    connected, the final status in `answered` once its head is in. Reading then pauses: what
    comes next is the tunnel's, for TLS to read (loop.start_tls takes the connection over)."""

    def __init__(self, request: bytes) -> None:
        self.answered: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._request = request
        self._answer = TunnelAnswer()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if self.answered.done():
            return  # a refusal's body: the connection is closed unread
        try:
            status = self._answer.feed(data)
        except BadAnswer as exc:
            self.answered.set_exception(exc)
            return
        if status is not None:
            assert self._transport is not None
            self._transport.pause_reading()
            self.answered.set_result(status)

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_exception(BadAnswer("closed the connection before answering CONNECT"))


def refusal(status: int) -> str:
    """A proxy's refusing status, in words: "407 (proxy authentication required)"."""
    reason = REFUSALS.get(status)
    return f"{status} ({reason})" if reason else str(status)

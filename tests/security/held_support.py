"""What the keep-passing probes share (test_smuggling, test_ssrf, test_tenancy,
test_key_secrecy): raw HTTP/1.1 over a socket, read back by an independent parser (h11's client
side), so that nothing normalizes the bytes either way; a listener that records every connection
made to it; the scripted OpenAI upstream, one per module.

    reply = exchange(port, request_bytes("GET", "/v1/files/../x", {"authorization": …}))
    reply.responses[0].status, reply.closed, reply.rest
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import h11
import orjson
import pytest

from tests.upstreams.procs import OPENAI_TEST_KEY, ScriptedUpstream, start_scripted

HOST = "127.0.0.1"
# A deadline on reading, not a timing assertion: a server that neither answers nor closes
# fails the test after it.
DEADLINE_S = 10.0
READ_SIZE = 65536
OPENAI_MODEL = "gpt-3.5-turbo-instruct"
# The protocol's own answer to bytes it cannot parse (gateway/server/protocol.py, _bad_request).
PARSER_400_BODY = b"Invalid HTTP request received."


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: tuple[tuple[str, str], ...]  # names lower-cased, in the order sent
    body: bytes

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k == name]
        assert len(found) <= 1, f"{name} sent {len(found)} times: {found}"
        return found[0] if found else None

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass(frozen=True)
class Exchange:
    responses: list[RawResponse]
    closed: bool  # the server closed the connection (read to its end)
    rest: bytes  # bytes that came after the last response parsed


def request_bytes(
    method: str,
    target: str,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    version: str = "HTTP/1.1",
) -> bytes:
    """One request, exactly as given: the target is not normalized, percent-escapes stay."""
    lines = [f"{method} {target} {version}", "Host: gateway"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def exchange(
    port: int, data: bytes, methods: Sequence[str] = ("GET",), until_close: bool = True
) -> Exchange:
    """Send `data` in one write, then read the responses to up to len(methods) requests (the
    methods they were, which h11 needs to frame HEAD's answer), stopping early when the server
    says it will close; with `until_close`, then read on until the server closes."""
    with socket.create_connection((HOST, port), timeout=DEADLINE_S) as sock:
        sock.sendall(data)
        conn = h11.Connection(h11.CLIENT)
        responses: list[RawResponse] = []
        for method in methods:
            if responses:
                if conn.their_state is not h11.DONE:  # MUST_CLOSE: no answer will follow
                    break
                conn.start_next_cycle()
            conn.send(h11.Request(method=method, target="/", headers=[("host", "gateway")]))
            conn.send(h11.EndOfMessage())
            response = _read_response(conn, sock)
            if response is None:
                break
            responses.append(response)
        rest, closed = conn.trailing_data
        if until_close and not closed:
            more, closed = _read_to_end(sock)
            rest += more
    return Exchange(responses, closed, rest)


def _read_response(conn: h11.Connection, sock: socket.socket) -> RawResponse | None:
    """The next response; None if the connection closed before one began."""
    head: h11.Response | None = None
    body: list[bytes] = []
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(READ_SIZE))
        elif isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            headers = tuple((k.decode().lower(), v.decode("latin-1")) for k, v in head.headers)
            return RawResponse(head.status_code, headers, b"".join(body))
        elif isinstance(event, h11.ConnectionClosed):
            return None
        # an InformationalResponse (100 Continue) precedes the response proper


def _read_to_end(sock: socket.socket) -> tuple[bytes, bool]:
    """Whatever else the server sends, and whether it closed (False: the deadline passed)."""
    parts: list[bytes] = []
    try:
        while chunk := sock.recv(READ_SIZE):
            parts.append(chunk)
    except TimeoutError:
        return b"".join(parts), False
    except ConnectionResetError:
        pass  # closed with unread bytes of ours left: a reset, a close all the same
    return b"".join(parts), True


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def json_request(
    target: str, key: str, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> bytes:
    body = orjson.dumps(payload)
    given = {**bearer(key), "Content-Type": "application/json", **(headers or {})}
    return request_bytes("POST", target, given, body)


# ---------------------------------------------------------------- a listener nobody should call


def _canary_host() -> str:
    """Another loopback address than the gateway's and the upstream's (Linux answers on all of
    127/8), so that only a connection made on purpose to it lands there."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.2", 0))
        except OSError:
            return HOST
    return "127.0.0.2"


class Canary:
    """A listening socket that nobody is told about but the probes: every connection made to it
    stays in its accept queue (the kernel completes the handshake without us), and
    `connections()` takes them all out, so a connection made before the call is never missed."""

    def __init__(self) -> None:
        self.host = _canary_host()
        self._sock = socket.socket()
        self._sock.bind((self.host, 0))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self._seen: list[tuple[str, int]] = []

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def root(self) -> str:
        return f"http://{self.authority}"

    def connections(self) -> list[tuple[str, int]]:
        """Every peer that has connected so far."""
        while True:
            try:
                conn, peer = self._sock.accept()
            except BlockingIOError:
                return list(self._seen)
            except OSError as exc:  # a connection reset in the queue still counts
                if exc.errno != errno.ECONNABORTED:
                    raise
                self._seen.append(("?", 0))
                continue
            self._seen.append(peer)
            conn.close()

    def close(self) -> None:
        self._sock.close()


@pytest.fixture(scope="module")
def canary() -> Iterator[Canary]:
    listener = Canary()
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    """The scripted OpenAI (key OPENAI_TEST_KEY), one for the module."""
    with start_scripted("openai", api_key=OPENAI_TEST_KEY) as server:
        yield server


def upstream_prompts(up: ScriptedUpstream) -> list[Any]:
    """The prompt of every completions request the upstream received, in order."""
    return [r["body"].get("prompt") for r in up.requests()]

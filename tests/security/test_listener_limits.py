"""The listener's limits (issue 33), probed in raw bytes against the gateway as users run it.

A request's head (its line and headers) past 64 KB, or with more than 100 headers, is a 431 and
the connection closes: a megabyte header is refused after its first bytes (the server stops
reading: the sender cannot get the megabyte out), an 8 MB URL likewise, and a pipelined request
gets a count of its own. A head that comes too slowly (slowloris), or a body the app waits for
that does not come, is a 408; an idle connection closes after the keep-alive without a word; and
past `server.max_connections` requests are answered 503. The timeouts are configured small
(0.5 s) so that none is waited out at its default.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.gateway_proc import HOST, GatewayProcess

KEY = "sk-listener-probe"
QUICK_S = 0.5  # the small timeouts configured for the probes
SOCKET_TIMEOUT_S = 10.0  # a probe that gets no answer fails after it
MEGABYTE = 1 << 20
CONFIG = f"""
auth:
  keys: [{{id: prober, key: {KEY}}}]
providers: {{}}
models: {{}}
"""


def _gateway(tmp_path_factory: pytest.TempPathFactory, name: str, server: str = "",
             *flags: str) -> GatewayProcess:  # fmt: skip
    workdir = tmp_path_factory.mktemp(name)
    return GatewayProcess(f"server: {{{server}}}\n{CONFIG}", workdir, extra_args=flags)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The default limits (none configured)."""
    with _gateway(tmp_path_factory, "listener-defaults") as gw:
        yield gw


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Small timeouts: the head's and the body's in the config, the keep-alive's by its flag."""
    timeouts = f"timeouts: {{head_s: {QUICK_S}, body_s: {QUICK_S}}}"
    with _gateway(tmp_path_factory, "listener-quick", timeouts, "--keep-alive", str(QUICK_S)) as gw:
        yield gw


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with _gateway(tmp_path_factory, "listener-capped", "max_connections: 2") as gw:
        yield gw


# ---------------------------------------------------------------- raw HTTP


def connect(gw: GatewayProcess, sndbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sndbuf is not None:  # before connecting: a small, fixed buffer (no autotuning)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.settimeout(SOCKET_TIMEOUT_S)
    sock.connect((HOST, gw.port))
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """All the server sends until it closes (a reset, when it closed on bytes it left unread,
    ends it too)."""
    got = bytearray()
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return bytes(got)


def one_answer(sock: socket.socket) -> bytes:
    """One answer on a connection kept open: its head, and a body of its content-length."""
    got = bytearray()
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {bytes(got)!r}"
        got += chunk
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def livez(*headers: bytes, target: bytes = b"/livez") -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: gw\r\n%s\r\n" % (target, b"".join(headers))


class Sender(threading.Thread):
    """Sends `data` in 16 KB pieces beside the reader, and keeps how far it got."""

    def __init__(self, sock: socket.socket, data: bytes) -> None:
        super().__init__(daemon=True)
        self.sock, self.data = sock, data
        self.sent = 0
        self.error: OSError | None = None

    def run(self) -> None:
        view = memoryview(self.data)
        try:
            for start in range(0, len(view), 16384):
                piece = view[start : start + 16384]
                self.sock.sendall(piece)
                self.sent += len(piece)
        except OSError as exc:
            self.error = exc


def refused_while_sending(gw: GatewayProcess, data: bytes) -> tuple[bytes, Sender]:
    """What the server answers to `data`, sent by a Sender through a small send buffer."""
    with connect(gw, sndbuf=65536) as sock:
        sender = Sender(sock, data)
        sender.start()
        answer = until_closed(sock)
        sender.join(SOCKET_TIMEOUT_S)
    return answer, sender


# ---------------------------------------------------------------- the head's size and count


def test_a_megabyte_header_is_refused_before_it_is_sent(gateway: GatewayProcess) -> None:
    """A header of a megabyte that never ends: a 431 once 64 KB of it came, the connection
    closed, and reading stopped (the sender could not get the megabyte out)."""
    answer, sender = refused_while_sending(gateway, livez(b"x-big: ") + b"a" * MEGABYTE)
    assert status(answer) == 431 and b"connection: close\r\n" in answer
    assert answer.endswith(b"Request Header Fields Too Large")
    assert sender.error is not None and sender.sent <= MEGABYTE // 2, sender.sent


def test_an_8mb_url_is_refused(gateway: GatewayProcess) -> None:
    url = b"/livez?q=" + b"a" * (8 * MEGABYTE)
    answer, sender = refused_while_sending(gateway, livez(target=url))
    assert status(answer) == 431
    assert sender.error is not None and sender.sent < 8 * MEGABYTE


@pytest.mark.parametrize(("count", "expected"), [(100, 200), (101, 431)])
def test_more_than_100_headers_are_refused(
    gateway: GatewayProcess, count: int, expected: int
) -> None:
    extra = [b"x-h%d: v\r\n" % i for i in range(count - 1)]  # and host
    with connect(gateway) as sock:
        sock.sendall(livez(*extra))
        answer = one_answer(sock)
        assert status(answer) == expected
        if expected == 431:
            assert until_closed(sock) == b""


def test_a_pipelined_request_has_a_head_count_of_its_own(gateway: GatewayProcess) -> None:
    """Sent in one piece: the small request is served, the large one behind it refused."""
    small = livez()
    large = livez(b"x-big: " + b"a" * 70_000 + b"\r\n")
    with connect(gateway) as sock:
        sock.sendall(small + large)
        answers = until_closed(sock)
    first, second = answers.split(b"HTTP/1.1 ")[1:]
    assert status(b"HTTP/1.1 " + first) == 200 and status(b"HTTP/1.1 " + second) == 431


# ---------------------------------------------------------------- timeouts


def test_a_slow_head_is_a_408(quick: GatewayProcess) -> None:
    """Slowloris: a header byte every 0.1 s keeps the connection busy, never idle; the head's
    timeout ends it."""
    with connect(quick) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nhost: gw\r\nx-slow: ")
        sock.settimeout(0.1)
        answer = b""
        for _ in range(100):  # 10 s at most
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                sock.sendall(b"a")
        sock.settimeout(SOCKET_TIMEOUT_S)
        answer += until_closed(sock)
    assert status(answer) == 408 and b"connection: close\r\n" in answer


def test_a_body_that_does_not_come_is_a_408(quick: GatewayProcess) -> None:
    """Content-Length and no body, with a key: the app waits for the body, the body's timeout
    answers, and the app sees its caller gone (no error of the app's in the log)."""
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %s\r\n"
        b"content-type: application/json\r\ncontent-length: 100\r\n\r\n" % KEY.encode()
    )
    with connect(quick) as sock:
        sock.sendall(head)
        answer = until_closed(sock)
    assert status(answer) == 408 and answer.endswith(b"Request Timeout")
    with connect(quick) as sock:  # still serving
        sock.sendall(livez())
        assert status(one_answer(sock)) == 200
    assert "Exception in ASGI application" not in quick.logs()


def test_an_idle_connection_is_closed_after_the_keep_alive(quick: GatewayProcess) -> None:
    with connect(quick) as sock:
        sock.sendall(livez())
        assert status(one_answer(sock)) == 200
        assert until_closed(sock) == b""  # closed without a word


# ---------------------------------------------------------------- connections


def test_past_max_connections_requests_are_a_503(capped: GatewayProcess) -> None:
    """max_connections: 2. Two connections kept open are served; a third's request is a 503,
    and that connection closes."""
    with connect(capped) as first, connect(capped) as second:
        for sock in (first, second):
            sock.sendall(livez())
            assert status(one_answer(sock)) == 200
        with connect(capped) as third:
            third.sendall(livez())
            answer = until_closed(third)
        assert status(answer) == 503 and b"connection: close\r\n" in answer

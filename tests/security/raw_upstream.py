"""An upstream that writes exactly the bytes a test scripts, for what no well-behaved server
sends: interim 1xx heads, oversized heads, compression bombs, TLS that refuses the gateway.

    with RawUpstream(answer) as up:      # answer(request) -> the bytes to write back
        up.url                           # http(s)://127.0.0.1:PORT/v1
        up.requests                      # every request read, in order
        up.connections                   # connections accepted (TLS ones before the handshake)

Each connection is served in a thread of its own, its requests one after the other (keep-alive),
each answered by `answer`. A blocking socket server: the gateway under test runs in another
process, so nothing here shares its event loop.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType

import orjson

HEAD_END = b"\r\n\r\n"
MAX_REQUEST_BYTES = 1 << 20


@dataclass(frozen=True)
class Request:
    head: bytes
    body: bytes
    connection: int  # which accepted connection carried it (0, 1, ...)

    @property
    def json(self) -> dict[str, object]:
        data = orjson.loads(self.body)
        assert isinstance(data, dict)
        return data


Answer = Callable[[Request], bytes]


class RawUpstream:
    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self._answer = answer
        self._tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}/v1"
        self.requests: list[Request] = []
        self.handshake_errors: list[str] = []
        self._stop = threading.Event()
        self._connections = 0
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)

    @property
    def connections(self) -> int:
        """The connections accepted so far (a TLS one counts before its handshake)."""
        return self._connections

    def __enter__(self) -> RawUpstream:
        self._accepter.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._accepter.join()
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            index, self._connections = self._connections, self._connections + 1
            thread = threading.Thread(target=self._serve, args=(sock, index), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, raw: socket.socket, index: int) -> None:
        raw.settimeout(0.2)
        sock = raw
        if self._tls is not None:
            try:  # the TLS socket takes the connection over: it is the one to close
                sock = self._tls.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                self.handshake_errors.append(str(exc))
                raw.close()
                return
        with contextlib.closing(sock):
            buffer = b""
            while not self._stop.is_set():
                request, buffer = self._read(sock, buffer, index)
                if request is None:
                    return
                self.requests.append(request)
                try:
                    sock.sendall(self._answer(request))
                except OSError:
                    return

    def _read(self, sock: socket.socket, buffer: bytes, index: int) -> tuple[Request | None, bytes]:
        while HEAD_END not in buffer or len(buffer) < _length(buffer):
            if len(buffer) > MAX_REQUEST_BYTES or self._stop.is_set():
                return None, b""
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except (ssl.SSLError, OSError) as exc:
                self.handshake_errors.append(str(exc))
                return None, b""
            if not data:
                return None, b""
            buffer += data
        head, _, rest = buffer.partition(HEAD_END)
        size = _length(buffer) - len(head) - len(HEAD_END)
        return Request(head, rest[:size], index), rest[size:]


def _length(buffer: bytes) -> int:
    """The whole request's size in bytes once its head is in (head, blank line, body)."""
    head, found, _ = buffer.partition(HEAD_END)
    if not found:
        return len(buffer) + 1
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return len(head) + len(HEAD_END) + length


def response(status: int, body: bytes, *headers: tuple[str, str]) -> bytes:
    """One response framed by its length."""
    lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def completion(text: str) -> bytes:
    """An OpenAI completion whose text is `text`."""
    return orjson.dumps(
        {
            "id": "cmpl-raw",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


def stream(text: str) -> bytes:
    """An OpenAI completion stream of one event carrying `text`, chunked."""
    event = orjson.loads(completion(text))
    del event["usage"]
    events = b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    return head + b"\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events)


def gateway_config(
    providers: Mapping[str, str],
    keys: Mapping[str, str],
    extra: Mapping[str, str] = MappingProxyType({}),
    models: Mapping[str, str] = MappingProxyType({}),
) -> str:
    """A gateway config: each provider (name: base URL, an openai-compatible upstream) served
    as the alias of its name, to every key (id: key); `extra`: more of a provider's block, in
    YAML flow style (", max_response_bytes: 1024"); `models`: more aliases (name: its block in
    flow style)."""
    lines = ["server: {host: 127.0.0.1, watch_config_s: 0}", "auth:", "  keys:"]
    lines += [f"    - {{id: {kid}, key: {key}, models: ['*']}}" for kid, key in keys.items()]
    lines.append("providers:")
    for name, url in providers.items():
        more = extra.get(name, "")
        lines.append(f"  {name}: {{type: openai-compatible, base_url: '{url}'{more}}}")
    lines.append("models:")
    lines += [f"  {name}: {{targets: [{{provider: {name}, model: m}}]}}" for name in providers]
    lines += [f"  {name}: {block}" for name, block in models.items()]
    lines.append("metrics: {enabled: false}")
    return "\n".join(lines) + "\n"

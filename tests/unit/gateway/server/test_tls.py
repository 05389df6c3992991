"""TLS on the listener (gateway/server/tls.py), on a real loopback server in this process: a
request served over TLS with the scheme https (under the gateway's protocol and uvicorn's); a
connection counted from its accept and closed when its handshake does not come in time, or
when the server shuts down; plain HTTP and a missing client certificate refused at the
handshake. The certificates renewed in place (a Kubernetes Secret's symlink swap) and served
after the next look; files that do not load leave the running certificate. Then serve and
check-config on the files, uvicorn's "running on" line, and a reload (server.tls is pinned)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import trustme
from uvicorn.server import ServerState

from gateway.config.tls import TlsConfig
from gateway.reload import successor
from gateway.server import cli
from gateway.server.protocol import GatewayConfig, GatewayHttpProtocol, ListenerLimits
from gateway.server.tls import CHECK_S, Certificates, HttpsNamed, TlsConnection
from tests.pki import trusting
from tests.unit.gateway.reload.test_handover import Built, config, document, running

HOST = "127.0.0.1"
DEADLINE_S = 5.0
HANDSHAKE_S = 0.2  # the head's timeout given below: shorter than the keep-alive


@dataclass(frozen=True)
class Pki:
    """A CA, the server's files under it, and client contexts."""

    ca: trustme.CA
    tls: TlsConfig  # the server's certificate and key (no client certificates asked for)
    root: Path

    def client(self, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
        return trusting(self.ca, cert)

    def mutual(self) -> TlsConfig:
        ca = self.root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(ca))
        return TlsConfig(self.tls.cert_file, self.tls.key_file, str(ca))


def issue(ca: trustme.CA, folder: Path) -> TlsConfig:
    folder.mkdir(parents=True, exist_ok=True)
    served = ca.issue_cert(HOST)
    served.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    served.private_key_pem.write_to_path(str(folder / "key.pem"))
    return TlsConfig(str(folder / "cert.pem"), str(folder / "key.pem"))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    return Pki(ca, issue(ca, tmp_path / "server"), tmp_path)


# ---------------------------------------------------------------- a server in this process


async def scheme_app(scope: Any, receive: Any, send: Any) -> None:
    """Answers with the request's scheme."""
    body = scope["scheme"].encode()
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Listening:
    port: int
    state: ServerState
    config: GatewayConfig


@contextlib.asynccontextmanager
async def listening(tls: TlsConfig, http: Any = GatewayHttpProtocol) -> AsyncIterator[Listening]:
    """uvicorn's way: a plain TCP server whose protocol factory is the config's class."""
    config = GatewayConfig(
        scheme_app,
        http=http,
        proxy_headers=False,
        log_config=None,
        timeout_keep_alive=5,
        listener=ListenerLimits(head_s=HANDSHAKE_S),
        tls=tls,
    )
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()

    def accept() -> asyncio.BaseProtocol:
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=state, app_state={}, _loop=loop
        )

    server = await loop.create_server(accept, HOST, 0)
    try:
        yield Listening(server.sockets[0].getsockname()[1], state, config)
    finally:
        server.close()
        for conn in list(state.connections):
            conn.shutdown()
        await until(lambda: not state.connections)


async def until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def get(port: int, context: ssl.SSLContext | None) -> bytes:
    """One request; what came back until the server closed."""
    reader, writer = await asyncio.open_connection(
        HOST, port, ssl=context, server_hostname=HOST if context else None
    )
    writer.write(b"GET / HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n")
    try:
        return await asyncio.wait_for(reader.read(), DEADLINE_S)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


async def refused(port: int, context: ssl.SSLContext) -> bool:
    """No answer: with TLS 1.3 the client's side of the handshake may end before the server
    has checked its certificate, and the refusal comes as the connection's end, or an alert."""
    try:
        return await get(port, context) == b""
    except (ssl.SSLError, ConnectionError):
        return True


@pytest.mark.parametrize("http", [GatewayHttpProtocol, "httptools"], ids=["gateway", "uvicorn"])
async def test_a_request_is_served_over_tls_as_https(pki: Pki, http: Any) -> None:
    async with listening(pki.tls, http) as server:
        answer = await get(server.port, pki.client())
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nhttps")
        await until(lambda: not server.state.connections)


async def test_a_handshake_never_begun_counts_and_is_closed_in_time(pki: Pki) -> None:
    """Counted among the connections from its accept (max_connections), closed when the
    shorter of the keep-alive and the head's timeout has passed."""
    async with listening(pki.tls) as server:
        began = time.monotonic()
        reader, writer = await asyncio.open_connection(HOST, server.port)
        await until(lambda: len(server.state.connections) == 1)
        assert isinstance(next(iter(server.state.connections)), TlsConnection)
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
        assert HANDSHAKE_S <= time.monotonic() - began < 5.0  # not the keep-alive's 5 s
        await until(lambda: not server.state.connections)
        writer.close()


async def test_shutdown_closes_a_connection_in_its_handshake(pki: Pki) -> None:
    async with listening(pki.tls) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        await until(lambda: len(server.state.connections) == 1)
        for conn in list(server.state.connections):
            conn.shutdown()
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
        await until(lambda: not server.state.connections)
        writer.close()


async def test_plain_http_is_refused_at_the_handshake(pki: Pki) -> None:
    async with listening(pki.tls) as server:
        assert await get(server.port, None) == b""
        await until(lambda: not server.state.connections)


async def test_with_a_ca_file_a_client_certificate_is_required(pki: Pki) -> None:
    async with listening(pki.mutual()) as server:
        answer = await get(server.port, pki.client(pki.ca.issue_cert("client@test")))
        assert answer.endswith(b"https")
        for stranger in (pki.client(), pki.client(trustme.CA().issue_cert("client@test"))):
            assert await refused(server.port, stranger)
        await until(lambda: not server.state.connections)


# ---------------------------------------------------------------- the config's TLS


def test_the_tls_block_goes_to_spawned_workers_and_the_context_does_not(pki: Pki) -> None:
    """uvicorn pickles its Config to each worker: the files' names go, and each worker reads
    them when it loads the config."""
    config = GatewayConfig("gateway.server.factory:app_from_env", factory=True, tls=pki.tls)
    copy = cast(GatewayConfig, pickle.loads(pickle.dumps(config)))
    assert (copy.tls, copy.tls_listener) == (pki.tls, None)


def test_loading_puts_the_handshake_before_the_http_protocol(pki: Pki) -> None:
    config = GatewayConfig(
        scheme_app,
        http=GatewayHttpProtocol,
        log_config=None,
        timeout_keep_alive=3,
        listener=ListenerLimits(head_s=7.5),
        tls=pki.tls,
    )
    config.load()
    listener = config.tls_listener
    assert cast(Any, config.http_protocol_class) is TlsConnection and listener is not None
    assert (listener.http, listener.handshake_s) == (GatewayHttpProtocol, 3)


def test_uvicorns_running_line_says_https() -> None:
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, "", 0, "Uvicorn running on %s://%s:%d (Press CTRL+C)",
        ("http", HOST, 8443), None,
    )  # fmt: skip
    assert HttpsNamed().filter(record) and record.getMessage().startswith(
        "Uvicorn running on https"
    )


# ---------------------------------------------------------------- certificates renewed


def presented(context: ssl.SSLContext) -> bytes:
    """The certificate a server with `context` presents, by a handshake in memory."""
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.check_hostname = False
    client_context.verify_mode = ssl.CERT_NONE
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    server = context.wrap_bio(s_in, s_out, server_side=True)
    client = client_context.wrap_bio(c_in, c_out, server_hostname=HOST)
    for _ in range(10):
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    cert = client.getpeercert(binary_form=True)
    assert cert is not None
    return cert


def der(tls: TlsConfig) -> bytes:
    return ssl.PEM_cert_to_DER_cert(Path(tls.cert_file).read_text())


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def secret(root: Path, version: str) -> None:
    """A Kubernetes Secret's volume: ..data is a symlink to the version in use, each file a
    symlink into it; an update swaps ..data at once."""
    swap = root / "..data.new"
    swap.symlink_to(version)
    os.replace(swap, root / "..data")


def mounted(root: Path) -> TlsConfig:
    for name in ("cert.pem", "key.pem"):
        (root / name).symlink_to(Path("..data") / name)
    return TlsConfig(str(root / "cert.pem"), str(root / "key.pem"))


def test_a_renewed_certificate_is_served_after_the_next_look(tmp_path: Path) -> None:
    first = issue(trustme.CA(), tmp_path / "v1")
    secret(tmp_path, "v1")
    tls = mounted(tmp_path)
    clock = Clock()
    certificates = Certificates(tls, clock)
    assert presented(certificates.current()) == der(first)
    second = issue(trustme.CA(), tmp_path / "v2")
    secret(tmp_path, "v2")
    assert presented(certificates.current()) == der(first)  # not looked at since
    clock.now += CHECK_S
    assert presented(certificates.current()) == der(second)
    context = certificates.current()
    clock.now += CHECK_S
    assert certificates.current() is context  # files unchanged: the same context


def test_files_that_do_not_load_leave_the_running_certificate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A certificate renewed before its key (a pair half written): logged, and the running one
    stays; once the key comes too, the renewed pair is served."""
    ca = trustme.CA()
    tls = issue(ca, tmp_path)
    first = der(tls)
    clock = Clock()
    certificates = Certificates(tls, clock)
    renewed = ca.issue_cert(HOST)
    replace(tmp_path, tls.cert_file, renewed.cert_chain_pems[0])
    clock.now += CHECK_S
    with caplog.at_level(logging.ERROR, "gateway.tls"):
        assert presented(certificates.current()) == first
    assert "server.tls.key_file" in caplog.text and "keep the running certificate" in caplog.text
    replace(tmp_path, tls.key_file, renewed.private_key_pem)
    clock.now += CHECK_S
    assert presented(certificates.current()) == der(tls) != first


def replace(folder: Path, file: str, pem: trustme.Blob) -> None:
    """At once, as a tool that renews certificates writes them."""
    new = folder / "new.pem"
    pem.write_to_path(str(new))
    os.replace(new, file)


# ---------------------------------------------------------------- serve, check-config, reload


def write_config(tmp_path: Path, tls: TlsConfig) -> str:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        f"server: {{tls: {{cert_file: {tls.cert_file}, key_file: {tls.key_file}}}}}\n"
        "providers: {}\nmodels: {}\n"
    )
    return str(path)


def test_check_config_reads_the_files(pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(pki.root, pki.tls)
    assert cli.main(["check-config", path]) == 0
    assert (
        f"listener: TLS with {pki.tls.cert_file}; no client certificate" in capsys.readouterr().out
    )
    Path(pki.tls.key_file).unlink()
    assert cli.main(["check-config", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("config error: server.tls.key_file: cannot read") and "key.pem" in err


def test_serve_refuses_files_that_do_not_load(pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(pki.root, TlsConfig(pki.tls.cert_file, pki.tls.cert_file))
    assert cli.main(["serve", "--config", path]) == 2
    assert "config error: server.tls.key_file:" in capsys.readouterr().err


async def test_a_reload_keeps_the_running_tls_until_a_restart() -> None:
    old = await running(document(server={"tls": {"cert_file": "a.pem", "key_file": "a.key"}}))
    new = config(document(server={"tls": {"cert_file": "b.pem", "key_file": "b.key"}}))
    h = await successor(old, new, Built())
    assert h.pinned == ("server.tls",)
    assert h.runtime.config.server.tls == TlsConfig("a.pem", "a.key")

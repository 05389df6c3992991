"""TLS on the gateway's own listener (`server.tls`), as users run it: `gateway serve` in a
subprocess under uvicorn, with a test CA (trustme) and the scripted OpenAI upstream.

The openai SDK, its httpx client trusting the CA, gets a completion and a stream; /readyz,
/livez and /metrics answer over TLS; plain HTTP to the port fails at the handshake, and the
gateway serves on. The listener's limits hold for TLS connections: one that never begins its
handshake, or stops half way, is closed after the head's timeout and counts toward
max_connections meanwhile; a head with too many headers is a 431, one too slow a 408. With
ca_file, a client without a certificate, or with one from another CA, is refused at the
handshake, and one with a certificate from the CA is served. With --workers 2 each connection
is served over TLS, whichever worker takes it. A certificate renewed in place reaches new
connections without a restart or a signal.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from openai import DefaultHttpxClient, OpenAI

from tests.gateway_proc import HOST, GatewayProcess
from tests.pki import trusting
from tests.upstreams.procs import OPENAI_TEST_KEY, POLL_INTERVAL_S, ScriptedUpstream

KEY = "sk-e2e-tls"
MODEL = "tls-model"
UPSTREAM_MODEL = "gpt-3.5-turbo-instruct"
QUICK_S = 0.5  # the head's timeout of the gateway probed for its limits: the handshake's too
KEEP_ALIVE_S = 5.0  # the default keep-alive: the handshake's bound is the shorter one
SOCKET_TIMEOUT_S = 10.0  # a probe that gets no answer fails after it
DEADLINE_S = 15.0


@dataclass(frozen=True)
class Pki:
    """A test CA, the gateway's certificate and key under it (for 127.0.0.1), and its clients'
    certificates: one from the CA, one from another CA."""

    ca: trustme.CA
    cert_file: str
    key_file: str
    ca_file: str
    client_cert: trustme.LeafCert
    stranger_cert: trustme.LeafCert

    def client(self, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
        return trusting(self.ca, cert)

    def http(self, cert: trustme.LeafCert | None = None) -> httpx.Client:
        return httpx.Client(verify=self.client(cert), timeout=SOCKET_TIMEOUT_S, trust_env=False)


def issue(ca: trustme.CA, folder: Path) -> tuple[str, str]:
    """The gateway's certificate and key, written to `folder` at once (each replaced whole)."""
    served = ca.issue_cert(HOST)
    files = []
    for name, pem in (("key.pem", served.private_key_pem), ("cert.pem", served.cert_chain_pems[0])):
        fresh = folder / f"{name}.new"
        pem.write_to_path(str(fresh))
        os.replace(fresh, folder / name)
        files.append(str(folder / name))
    return files[1], files[0]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    cert_file, key_file = issue(ca, folder)
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    client, stranger = ca.issue_cert("client@e2e"), trustme.CA().issue_cert("client@e2e")
    return Pki(ca, cert_file, key_file, str(folder / "ca.pem"), client, stranger)


def config(
    upstream: ScriptedUpstream, cert_file: str, key_file: str, ca_file: str = "", server: str = ""
) -> str:
    tls = f"cert_file: {cert_file}, key_file: {key_file}"
    tls += f", ca_file: {ca_file}" if ca_file else ""
    return f"""
server: {{tls: {{{tls}}}{", " + server if server else ""}}}
auth:
  keys: [{{id: e2e, key: {KEY}}}]
providers:
  oai: {{type: openai, base_url: "{upstream.url}", api_key: {OPENAI_TEST_KEY}}}
models:
  {MODEL}: {{targets: [{{provider: oai, model: {UPSTREAM_MODEL}}}]}}
"""


def start(
    pki: Pki,
    upstream: ScriptedUpstream,
    workdir: Path,
    *,
    mutual: bool = False,
    server: str = "",
    workers: int = 1,
) -> GatewayProcess:
    text = config(upstream, pki.cert_file, pki.key_file, pki.ca_file if mutual else "", server)
    probe = pki.client(pki.client_cert if mutual else None)
    return GatewayProcess(text, workdir, workers=workers, tls=probe)


def tls_gateway(name: str, *, mutual: bool = False, server: str = "") -> Any:
    """A module-scoped fixture `name`: a gateway of its own over TLS (`start`'s options) on the
    session's scripted OpenAI upstream."""

    @pytest.fixture(scope="module", name=name)
    def gateway(
        pki: Pki,
        scripted_openai_server: ScriptedUpstream,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[GatewayProcess]:
        workdir = tmp_path_factory.mktemp(name)
        with start(pki, scripted_openai_server, workdir, mutual=mutual, server=server) as gw:
            yield gw

    return gateway


# The head's timeout small (the handshake's bound); no client certificates.
gateway = tls_gateway("gateway", server=f"timeouts: {{head_s: {QUICK_S}}}")
# ca_file: client certificates from the CA required.
mutual = tls_gateway("mutual", mutual=True)
capped = tls_gateway("capped", server="max_connections: 2")


def sdk_over_tls(gw: GatewayProcess, context: ssl.SSLContext) -> OpenAI:
    """The SDK on its own HTTP client, trusting the CA (and with the client's certificate when
    `context` has one)."""
    http = DefaultHttpxClient(verify=context, timeout=SOCKET_TIMEOUT_S)
    return OpenAI(base_url=gw.url + "/v1", api_key=KEY, http_client=http, max_retries=0)


# ---------------------------------------------------------------- raw connections


def tcp(gw: GatewayProcess) -> socket.socket:
    sock = socket.create_connection((HOST, gw.port), timeout=SOCKET_TIMEOUT_S)
    sock.settimeout(SOCKET_TIMEOUT_S)
    return sock


def over_tls(gw: GatewayProcess, pki: Pki) -> ssl.SSLSocket:
    return pki.client().wrap_socket(tcp(gw), server_hostname=HOST)


def until_closed(sock: socket.socket) -> bytes:
    """All the server sends until it closes (a reset, or a TLS connection cut without its
    close_notify, ends it too)."""
    got = bytearray()
    with contextlib.suppress(ConnectionResetError, ssl.SSLEOFError):
        while chunk := sock.recv(65536):
            got += chunk
    return bytes(got)


def client_hello() -> bytes:
    """A client's first flight, made in memory."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=HOST)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def eventually(check: Callable[[], bool]) -> None:
    """Polls `check` (a readiness probe) until it holds, or fails after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(POLL_INTERVAL_S)


def status(url: str, context: ssl.SSLContext) -> int | None:
    """The status of a GET on a connection of its own; None when the connection failed."""
    try:
        return httpx.get(url, verify=context, timeout=SOCKET_TIMEOUT_S, trust_env=False).status_code
    except httpx.TransportError:
        return None


# ---------------------------------------------------------------- served over TLS


def test_the_sdk_gets_a_completion_and_a_stream(
    gateway: GatewayProcess, pki: Pki, scripted_openai_server: ScriptedUpstream
) -> None:
    scripted_openai_server.reset()
    with sdk_over_tls(gateway, pki.client()) as client:
        completion = client.completions.create(model=MODEL, prompt="Say hi", max_tokens=3)
        chunks = list(client.completions.create(model=MODEL, prompt="Say hi", stream=True))
    assert completion.object == "text_completion" and completion.choices[0].text
    assert chunks and "".join(c.choices[0].text for c in chunks if c.choices)
    assert [r["body"]["model"] for r in scripted_openai_server.requests()] == [UPSTREAM_MODEL] * 2


def test_health_and_metrics_answer_over_tls(gateway: GatewayProcess, pki: Pki) -> None:
    with pki.http() as http:
        for path in ("/readyz", "/livez", "/metrics"):
            response = http.get(gateway.url + path)
            assert (response.status_code, response.url.scheme) == (200, "https"), path
    assert "# TYPE" in response.text


def test_plain_http_fails_at_the_handshake(gateway: GatewayProcess, pki: Pki) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{HOST}:{gateway.port}/livez", timeout=SOCKET_TIMEOUT_S, trust_env=False)
    assert status(gateway.url + "/livez", pki.client()) == 200
    assert "Traceback" not in gateway.logs()


# ---------------------------------------------------------------- the listener's limits


def test_a_handshake_never_begun_is_closed_after_the_heads_timeout(
    gateway: GatewayProcess,
) -> None:
    began = time.monotonic()
    with tcp(gateway) as sock:
        assert until_closed(sock) == b""
    assert time.monotonic() - began < KEEP_ALIVE_S  # the head's 0.5 s, not asyncio's minute


def test_a_handshake_stopped_half_way_is_closed_too(gateway: GatewayProcess) -> None:
    hello = client_hello()
    with tcp(gateway) as sock:
        sock.sendall(hello[: len(hello) // 2])
        assert until_closed(sock) == b""


def test_too_many_headers_over_tls_are_a_431(gateway: GatewayProcess, pki: Pki) -> None:
    headers = b"".join(b"x-h%d: v\r\n" % i for i in range(101))
    with over_tls(gateway, pki) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nhost: h\r\n" + headers + b"\r\n")
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"connection: close\r\n" in answer


def test_a_slow_head_over_tls_is_a_408(gateway: GatewayProcess, pki: Pki) -> None:
    with over_tls(gateway, pki) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nhost: h\r\n")  # and the rest never comes
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_connections_in_their_handshake_count_toward_max_connections(
    capped: GatewayProcess, pki: Pki
) -> None:
    """max_connections: 2. Two connections that never begin their handshake take both; a
    third's request is a 503. Once they are gone, requests are served again."""
    with tcp(capped), tcp(capped):
        assert status(capped.url + "/livez", pki.client()) == 503
    eventually(lambda: status(capped.url + "/livez", pki.client()) == 200)


# ---------------------------------------------------------------- client certificates


def test_a_client_without_a_certificate_is_refused(mutual: GatewayProcess, pki: Pki) -> None:
    assert status(mutual.url + "/livez", pki.client()) is None


def test_a_certificate_from_another_ca_is_refused(mutual: GatewayProcess, pki: Pki) -> None:
    assert status(mutual.url + "/livez", pki.client(pki.stranger_cert)) is None


def test_a_certificate_from_the_ca_is_served(mutual: GatewayProcess, pki: Pki) -> None:
    with sdk_over_tls(mutual, pki.client(pki.client_cert)) as client:
        completion = client.completions.create(model=MODEL, prompt="Say hi", max_tokens=3)
    assert completion.choices[0].text
    assert status(mutual.url + "/metrics", pki.client(pki.client_cert)) == 200


# ---------------------------------------------------------------- workers, renewal


def test_two_workers_serve_tls(
    pki: Pki, scripted_openai_server: ScriptedUpstream, tmp_path: Path
) -> None:
    """Each worker loads the certificates itself (an SSLContext does not pickle): twenty
    connections of their own, whichever worker takes each, are all served."""
    with start(pki, scripted_openai_server, tmp_path, workers=2) as gw:
        for _ in range(20):
            assert status(gw.url + "/readyz", pki.client()) == 200
        with sdk_over_tls(gw, pki.client()) as client:
            assert client.completions.create(model=MODEL, prompt="Say hi", max_tokens=3).choices


def test_a_certificate_renewed_in_place_reaches_new_connections(
    scripted_openai_server: ScriptedUpstream, tmp_path: Path
) -> None:
    """The files replaced under the same names (as cert-manager renews a Secret): new
    connections get the new certificate, with no restart and no signal."""
    folder = tmp_path / "certs"
    folder.mkdir()
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert_file, key_file = issue(old_ca, folder)
    trusting_old, trusting_new = trusting(old_ca), trusting(new_ca)
    text = config(scripted_openai_server, cert_file, key_file)
    with GatewayProcess(text, tmp_path, tls=trusting_old) as gw:
        issue(new_ca, folder)
        eventually(lambda: status(gw.url + "/readyz", trusting_new) == 200)
        assert status(gw.url + "/readyz", trusting_old) is None
        assert "Traceback" not in gw.logs()

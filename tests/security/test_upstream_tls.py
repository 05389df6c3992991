"""A TLS failure with an upstream is a 502 that names its reason: an unknown CA, a host name the
certificate does not match, an expired certificate, or an upstream that wants a client
certificate. Before, the first three all read "CERTIFICATE_VERIFY_FAILED" and the last "closed
the connection".

Real TLS: upstreams with certificates from test CAs (trustme); the gateway trusts the test CA
through SSL_CERT_FILE, which the standard library's default context reads.
"""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import trustme

from tests.gateway_proc import GatewayProcess
from tests.security.raw_upstream import RawUpstream, Request, completion, gateway_config, response

KEY = "sk-tls"
# alias: what the 502 must say
EXPECTED = {
    "unknown-ca": "signed by an unknown CA",
    "wrong-host": "does not match the host name",
    "expired": "has expired",
    "wants-client-cert": "requires a client certificate",
}


def _ok(request: Request) -> bytes:
    return response(200, completion("fine"))


def _server(cert: trustme.LeafCert, want_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    if want_client_cert:
        trustme.CA().configure_trust(ctx)  # a CA the gateway has no certificate of
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    trusted, stranger = trustme.CA(), trustme.CA()
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    contexts = {
        "unknown-ca": _server(stranger.issue_cert("127.0.0.1")),
        "wrong-host": _server(trusted.issue_cert("upstream.example")),
        "expired": _server(
            trusted.issue_cert("127.0.0.1", not_before=past, not_after=past + datetime.timedelta(1))
        ),
        "wants-client-cert": _server(trusted.issue_cert("127.0.0.1"), want_client_cert=True),
        "good": _server(trusted.issue_cert("127.0.0.1")),
    }
    workdir: Path = tmp_path_factory.mktemp("tls")
    ca_file = workdir / "ca.pem"
    trusted.cert_pem.write_to_path(str(ca_file))
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(RawUpstream(_ok, tls=ctx)).url
            for name, ctx in contexts.items()
        }
        config = gateway_config(urls, {"tls": KEY})
        env = {"SSL_CERT_FILE": str(ca_file)}
        yield stack.enter_context(GatewayProcess(config, workdir, env=env))


def _ask(gw: GatewayProcess, alias: str) -> httpx.Response:
    body = {"model": alias, "prompt": "hi", "max_tokens": 1}
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(gw.url + "/v1/completions", json=body, headers=headers, timeout=10)


def test_a_trusted_upstream_answers(gateway: GatewayProcess) -> None:
    resp = _ask(gateway, "good")
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == "fine"


@pytest.mark.parametrize("alias", sorted(EXPECTED))
def test_the_502_names_the_reason(gateway: GatewayProcess, alias: str) -> None:
    resp = _ask(gateway, alias)
    assert resp.status_code == 502, resp.text
    message = resp.json()["error"]["message"]
    assert EXPECTED[alias] in message, message
    assert f"{alias}/m" in message  # the target that failed
